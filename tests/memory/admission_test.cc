// Admission and resource bounds of the server on the demo model (E=256, 8
// heads) with its default limits: requests that could crash the server or
// grow its memory without bound are batched apart, refused before compute,
// or slowed down, and everything accepted is still answered.
#include <grpcpp/grpcpp.h>

#include <random>
#include <thread>

#include "absl/time/clock.h"
#include "attention/v1/attention.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::RandomTensor;
using ::attention::testing::ToProto;
using ::testing::HasSubstr;

constexpr int64_t kEmbed = 256;

class ServerAdmissionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The demo layer twice: "demo" with the server's defaults, and "patient"
    // whose oldest request waits a whole second for company, so that
    // requests sent together are certainly queued together.
    testing::ModelFolder models("server_admission_models");
    testing::WriteModelDir(*MhaModel::Demo(), models.path() + "/demo", "");
    testing::WriteModelDir(*MhaModel::Demo(), models.path() + "/patient",
                           "\"max_queue_delay_us\": 1000000");
    server::ServerOptions options =
        testing::TestServerOptions(models.path(), /*rest=*/false, /*compute_threads=*/2);
    options.drain_grace = absl::Milliseconds(500);  // The library's default.
    options.repository.default_model = "demo";
    options.repository.batching.max_batch_tokens = 16384;  // attention-server's default.
    server_ = testing::StartServer(options).release();
    ASSERT_NE(server_, nullptr);
    // No message size limits on the client: the server's are what is tested.
    channel_ = new std::shared_ptr<grpc::Channel>(grpc::CreateCustomChannel(
        testing::Target(*server_), grpc::InsecureChannelCredentials(), ChannelArgs()));
  }
  static void TearDownTestSuite() {
    delete channel_;
    EXPECT_TRUE(server_->Drain());
    delete server_;
  }
  static grpc::ChannelArguments ChannelArgs() {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    return args;
  }

  std::unique_ptr<v1::AttentionService::Stub> Stub() {
    return v1::AttentionService::NewStub(*channel_);
  }
  static const server::ServedModel& Demo() { return *server_->repository()->Find("demo"); }
  static uint64_t Batches() { return Demo().metrics->batch_size->Collect().histogram.sample_count; }
  static grpc::Status Call(v1::AttentionService::Stub& stub, const v1::InferRequest& request,
                           v1::InferResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    return stub.Infer(&context, request, response);
  }

  // `request` on a stub of its own; its response is not kept.
  grpc::Status Call(const v1::InferRequest& request) {
    v1::InferResponse response;
    return Call(*Stub(), request, &response);
  }

  static server::AttentionServer* server_;
  static std::shared_ptr<grpc::Channel>* channel_;
};

server::AttentionServer* ServerAdmissionTest::server_ = nullptr;
std::shared_ptr<grpc::Channel>* ServerAdmissionTest::channel_ = nullptr;

// A request of random float32 tensors: (n, l, E) queries and, when s > 0,
// (n, s, E) keys and values.
v1::InferRequest MakeRequest(std::mt19937& rng, int64_t n, int64_t l, int64_t s,
                             const std::string& id) {
  v1::InferRequest r;
  r.set_request_id(id);
  ToProto(RandomTensor({n, l, kEmbed}, rng), r.mutable_query());
  if (s > 0) {
    ToProto(RandomTensor({n, s, kEmbed}, rng), r.mutable_key());
    ToProto(RandomTensor({n, s, kEmbed}, rng), r.mutable_value());
  }
  return r;
}

TEST_F(ServerAdmissionTest, LongAndManyShortCrossAttentionRequestsAreNotPaddedTogether) {
  // A: 1 x 1 query over 30000 keys (61 MB). B: 8000 x 1 over 1 key (24 MB).
  // Their 8001 padded query tokens fit max_batch_tokens, but padding B's
  // items to A's keys would take 8001 x 30000 x 256 floats (245 GB): the
  // server used to try, and crash.
  std::mt19937 rng(1);
  v1::InferRequest a = MakeRequest(rng, 1, 1, 30000, "A");
  v1::InferRequest b = MakeRequest(rng, 8000, 1, 1, "B");
  a.set_model("patient");
  b.set_model("patient");
  auto stub = Stub();
  v1::InferResponse response_a, response_b;
  grpc::Status status_a, status_b;
  std::thread first([&] { status_a = Call(*stub, a, &response_a); });
  std::thread second([&] { status_b = Call(*stub, b, &response_b); });
  first.join();
  second.join();
  ASSERT_TRUE(status_a.ok()) << status_a.error_message();
  ASSERT_TRUE(status_b.ok()) << status_b.error_message();
  EXPECT_EQ(response_a.batch_requests(), 1);
  EXPECT_EQ(response_b.batch_requests(), 1);
  EXPECT_EQ(testing::FromProto(response_b.output()).shape(), (Shape{8000, 1, kEmbed}));

  // A's result is the engine's own.
  Tensor q = testing::FromProto(a.query()), k = testing::FromProto(a.key()),
         v = testing::FromProto(a.value());
  MhaInputs in;
  in.query = q.view();
  in.key = k.view();
  in.value = v.view();
  auto solo = Demo().engine->Forward(in);
  ASSERT_TRUE(solo.ok()) << solo.status();
  Tensor got = testing::FromProto(response_a.output());
  ASSERT_EQ(got.shape(), solo->output.shape());
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    ASSERT_NEAR(got.as<float>()[i], solo->output.as<float>()[i], 1e-5) << i;
  }

  // And the server keeps serving.
  v1::InferResponse after;
  EXPECT_TRUE(Call(*stub, MakeRequest(rng, 2, 8, 0, "after"), &after).ok());
}

TEST_F(ServerAdmissionTest, OversizedResponseIsRefusedBeforeCompute) {
  // 16384 x 256 float32 outputs (16 MiB) plus 16384 x 1024 averaged weights
  // (64 MiB) exceed the 64 MiB message limit, though the weights alone do not.
  std::mt19937 rng(2);
  v1::InferRequest request = MakeRequest(rng, 1, 16384, 1024, "big");
  request.set_need_weights(true);
  const uint64_t batches = Batches();
  const grpc::Status status = Call(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("output 16777216, attn_weights 67108864"));
  EXPECT_THAT(status.error_message(), HasSubstr("max_message_bytes 67108864"));
  EXPECT_EQ(Batches(), batches) << "the request was computed before being refused";
}

TEST_F(ServerAdmissionTest, WeightsBufferOverTheBatchCapIsRefused) {
  // Averaged float16 weights of 4096 x 4100 are 34 MB, but computing them
  // takes per-head float32 ones: 8 x 4096 x 4100 x 4 = 537 MB, over 512 MiB.
  std::mt19937 rng(3);
  v1::InferRequest request;
  ToProto(RandomTensor({1, 4096, kEmbed}, rng).ConvertTo(DType::kFloat16), request.mutable_query());
  ToProto(RandomTensor({1, 4100, kEmbed}, rng).ConvertTo(DType::kFloat16), request.mutable_key());
  request.set_need_weights(true);
  const grpc::Status status = Call(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("computing the attention weights takes 537395200"));
}

TEST_F(ServerAdmissionTest, ShapesWhoseProductOverflowsAreInvalid) {
  v1::InferRequest request;
  request.mutable_query()->set_dtype(v1::DATA_TYPE_FLOAT32);
  for (int64_t d : {int64_t{1} << 20, int64_t{1} << 20, int64_t{1} << 24}) {
    request.mutable_query()->add_shape(d);
  }
  const grpc::Status status = Call(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("has more than 2^40 elements"));
}

TEST_F(ServerAdmissionTest, OversizedRequestOnAStreamIsItsOwnErrorAndTheStreamGoesOn) {
  std::mt19937 rng(4);
  auto stub = Stub();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto stream = stub->InferStream(&context);
  for (int i = 0; i < 11; ++i) {
    v1::InferRequest request = i == 5 ? MakeRequest(rng, 1, 16384, 1024, "big")
                                      : MakeRequest(rng, 1, 4, 0, "r" + std::to_string(i));
    request.set_need_weights(true);
    ASSERT_TRUE(stream->Write(request));
  }
  stream->WritesDone();
  int ok = 0, refused = 0;
  v1::InferResponse response;
  while (stream->Read(&response)) {
    if (response.request_id() == "big") {
      EXPECT_EQ(response.error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
      EXPECT_THAT(response.error().message(), HasSubstr("max_message_bytes"));
      ++refused;
    } else {
      EXPECT_FALSE(response.has_error()) << response.error().message();
      EXPECT_EQ(testing::FromProto(response.output()).shape(), (Shape{1, 4, kEmbed}));
      ++ok;
    }
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(ok, 10);
  EXPECT_EQ(refused, 1);
}

TEST_F(ServerAdmissionTest, StreamThatDoesNotReadIsHeldToItsCapAndGetsEverythingLater) {
  // Each request (1 x 512 x 256, 0.5 MB) asks for per-head weights (8.4 MB
  // back): about 9 MB pending each, so the default 256 MiB per-stream cap
  // pauses reading at 29 pending requests. Without it, all 100 (900 MB)
  // would be read, computed and queued.
  constexpr int kRequests = 100;
  constexpr int64_t kCap = 30;
  std::mt19937 rng(5);
  v1::InferRequest request = MakeRequest(rng, 1, 512, 0, "");
  request.set_need_weights(true);
  request.set_per_head_weights(true);
  auto stub = Stub();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto stream = stub->InferStream(&context);
  std::thread writer([&] {
    v1::InferRequest r = request;
    for (int i = 0; i < kRequests; ++i) {
      r.set_request_id("r" + std::to_string(i));
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
  });
  // Wait until the server holds as much as the cap lets it, then watch for a
  // while that it holds no more.
  prometheus::Gauge& inflight = server_->metrics().inflight_requests();
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (inflight.Value() < kCap - 2 && absl::Now() < give_up)
    absl::SleepFor(absl::Milliseconds(5));
  double most = 0;
  for (const absl::Time until = absl::Now() + absl::Seconds(1); absl::Now() < until;) {
    most = std::max(most, inflight.Value());
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(most, kCap - 2);
  EXPECT_LE(most, kCap);

  // A slow reader still gets every response, in order.
  v1::InferResponse response;
  int next = 0;
  while (stream->Read(&response)) {
    EXPECT_FALSE(response.has_error()) << response.error().message();
    EXPECT_EQ(response.request_id(), "r" + std::to_string(next));
    EXPECT_EQ(response.attn_weights().shape_size(), 4);
    ++next;
  }
  writer.join();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(next, kRequests);
}

}  // namespace
}  // namespace attention
