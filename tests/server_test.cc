// In-process and loopback tests of the whole serving stack: every RPC, every
// error, health, reflection, streaming, the batching equivalence guarantee,
// queue limits, deadlines and cancellation, and the /metrics endpoint.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "attention/v1/attention.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/server_test_util.h"
#include "tests/test_util.h"

namespace attention {
namespace {

using ::attention::server::AttentionServer;
using ::attention::server::ServerOptions;
using ::attention::testing::FromProto;
using ::attention::testing::HttpGet;
using ::attention::testing::MetricValue;
using ::attention::testing::RandomMask;
using ::attention::testing::RandomTensor;
using ::attention::testing::ToProto;
using ::testing::HasSubstr;

MhaSpec Spec(int64_t e, int64_t h) {
  MhaSpec s;
  s.embed_dim = s.kdim = s.vdim = e;
  s.num_heads = h;
  return s;
}

// One server for the whole suite (prometheus' exposer is slow to stop).
class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = ::testing::TempDir() + "/server_test_models";
    std::filesystem::remove_all(dir);
    // "small": batches generously so concurrent requests share batches.
    testing::WriteModelDir(**MhaModel::Random(Spec(32, 4), 1), dir + "/small",
                           "\"max_batch_size\": 16, \"max_queue_delay_us\": 3000");
    MhaSpec cross = Spec(16, 2);
    cross.kdim = 12;
    cross.vdim = 10;
    cross.add_bias_kv = true;
    cross.add_zero_attn = true;
    testing::WriteModelDir(**MhaModel::Random(cross, 2), dir + "/cross",
                           "\"max_queue_delay_us\": 2000");
    testing::WriteModelDir(**MhaModel::Random(Spec(16, 2), 3), dir + "/tiny_queue",
                           "\"max_batch_size\": 1, \"max_queue_size\": 2");
    ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    metrics_port_ = testing::FreePort();
    options.metrics_port = metrics_port_;
    options.max_message_bytes = 1 << 20;
    options.repository.path = dir;
    options.repository.default_model = "small";
    options.repository.batching.max_batch_tokens = 4096;
    options.repository.compute_threads = 2;
    server_ = AttentionServer::Listen(options)->release();
    ASSERT_TRUE(server_->LoadModels().ok());
    channel_ = new std::shared_ptr<grpc::Channel>(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  }
  static void TearDownTestSuite() {
    delete channel_;
    EXPECT_TRUE(server_->Drain());
    delete server_;
  }

  std::unique_ptr<v1::AttentionService::Stub> InProcessStub() {
    return v1::AttentionService::NewStub(server_->InProcessChannel());
  }
  std::unique_ptr<v1::AttentionService::Stub> LoopbackStub() {
    return v1::AttentionService::NewStub(*channel_);
  }
  const MhaEngine& Engine(const std::string& model) {
    return *server_->repository()->Find(model)->engine;
  }
  const server::ModelMetrics& ModelMetricsOf(const std::string& model) {
    return *server_->repository()->Find(model)->metrics;
  }
  static double Count(const server::ModelMetrics& m, absl::StatusCode code) {
    return m.requests[0][static_cast<int>(code)]->Value();
  }

  static AttentionServer* server_;
  static std::shared_ptr<grpc::Channel>* channel_;
  static int metrics_port_;
};

AttentionServer* ServerTest::server_ = nullptr;
std::shared_ptr<grpc::Channel>* ServerTest::channel_ = nullptr;
int ServerTest::metrics_port_ = 0;

// A self-attention request for "small" with random data and options.
struct RequestCase {
  Tensor query, kpm, mask;
  v1::InferRequest request;
};

RequestCase MakeCase(std::mt19937& rng, int index) {
  RequestCase c;
  const int64_t n = 1 + index % 3, l = 1 + (index * 7) % 13;
  c.query = RandomTensor({n, l, 32}, rng);
  ToProto(c.query, c.request.mutable_query());
  c.request.set_model("small");
  c.request.set_request_id("r" + std::to_string(index));
  if (index % 2 == 0) {
    c.kpm = RandomMask({n, l}, rng, 0.3);
    ToProto(c.kpm, c.request.mutable_key_padding_mask());
  }
  if (index % 3 == 1) {
    c.mask = RandomTensor({n * 4, l, l}, rng, 1.0f);  // Per-head float mask.
    ToProto(c.mask, c.request.mutable_attn_mask());
  } else if (index % 3 == 2) {
    c.mask = RandomMask({l, l}, rng, 0.2);
    ToProto(c.mask, c.request.mutable_attn_mask());
  }
  c.request.set_is_causal(index % 4 == 3);
  c.request.set_need_weights(index % 5 == 0);
  c.request.set_per_head_weights(index % 10 == 0);
  return c;
}

// The engine's own result for a request run alone.
MhaOutputs Solo(const MhaEngine& engine, const RequestCase& c) {
  MhaInputs in;
  in.query = c.query.view();
  if (c.request.has_key_padding_mask()) in.key_padding_mask = c.kpm.view();
  if (c.request.has_attn_mask()) in.attn_mask = c.mask.view();
  in.is_causal = c.request.is_causal();
  in.need_weights = c.request.need_weights();
  in.average_attn_weights = !c.request.per_head_weights();
  return *engine.Forward(in);
}

void ExpectClose(const Tensor& expected, const v1::Tensor& actual, double atol) {
  Tensor got = FromProto(actual);
  ASSERT_EQ(got.shape(), expected.shape());
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    ASSERT_NEAR(got.as<float>()[i], expected.as<float>()[i], atol) << "element " << i;
  }
}

TEST_F(ServerTest, ListModelsAndGetModel) {
  auto stub = InProcessStub();
  grpc::ClientContext ctx;
  v1::ListModelsResponse list;
  ASSERT_TRUE(stub->ListModels(&ctx, {}, &list).ok());
  ASSERT_EQ(list.models_size(), 3);
  EXPECT_EQ(list.models(0).name(), "cross");
  EXPECT_EQ(list.models(1).name(), "small");
  EXPECT_TRUE(list.models(1).is_default());
  const v1::ModelInfo& cross = list.models(0);
  EXPECT_EQ(cross.embed_dim(), 16);
  EXPECT_EQ(cross.kdim(), 12);
  EXPECT_EQ(cross.vdim(), 10);
  EXPECT_TRUE(cross.add_bias_kv());
  EXPECT_TRUE(cross.add_zero_attn());
  EXPECT_EQ(cross.compute_dtype(), v1::DATA_TYPE_FLOAT32);
  EXPECT_EQ(cross.batching().max_queue_delay_us(), 2000);
  EXPECT_EQ(cross.batching().max_batch_tokens(), 4096);  // The server's default.

  grpc::ClientContext ctx2;
  v1::GetModelRequest get;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModel(&ctx2, get, &info).ok());  // Empty: the default.
  EXPECT_EQ(info.name(), "small");
  EXPECT_EQ(info.batching().max_batch_size(), 16);
  grpc::ClientContext ctx3;
  get.set_name("nope");
  const grpc::Status missing = stub->GetModel(&ctx3, get, &info);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), HasSubstr("'nope'"));
}

TEST_F(ServerTest, InferMatchesTheEngine) {
  auto stub = InProcessStub();
  std::mt19937 rng(7);
  for (int i = 0; i < 12; ++i) {
    RequestCase c = MakeCase(rng, i);
    grpc::ClientContext ctx;
    v1::InferResponse response;
    const grpc::Status status = stub->Infer(&ctx, c.request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.request_id(), c.request.request_id());
    MhaOutputs solo = Solo(Engine("small"), c);
    ExpectClose(solo.output, response.output(), 1e-6);
    EXPECT_EQ(response.has_attn_weights(), c.request.need_weights());
    if (c.request.need_weights()) ExpectClose(*solo.attn_weights, response.attn_weights(), 1e-6);
    EXPECT_GE(response.batch_requests(), 1);
    EXPECT_GE(response.compute_us(), 0);
  }
}

TEST_F(ServerTest, CrossAttentionUnbatchedAndDtypes) {
  auto stub = LoopbackStub();
  std::mt19937 rng(8);
  Tensor q = RandomTensor({5, 16}, rng), k = RandomTensor({7, 12}, rng),
         v = RandomTensor({7, 10}, rng);
  Tensor kpm = RandomMask({7}, rng, 0.3);
  v1::InferRequest request;
  request.set_model("cross");
  Tensor q16 = q.ConvertTo(DType::kBFloat16);
  ToProto(q16, request.mutable_query());
  ToProto(k, request.mutable_key());
  ToProto(v, request.mutable_value());
  ToProto(kpm, request.mutable_key_padding_mask());
  request.set_need_weights(true);
  request.set_per_head_weights(true);
  request.set_output_dtype(v1::DATA_TYPE_FLOAT32);
  grpc::ClientContext ctx;
  v1::InferResponse response;
  ASSERT_TRUE(stub->Infer(&ctx, request, &response).ok());
  EXPECT_EQ(response.output().dtype(), v1::DATA_TYPE_FLOAT32);
  EXPECT_THAT(response.output().shape(), ::testing::ElementsAre(5, 16));
  EXPECT_THAT(response.attn_weights().shape(), ::testing::ElementsAre(2, 5, 9));  // S' = 7 + 2.
  MhaInputs in;
  in.query = q16.view();
  in.key = k.view();
  in.value = v.view();
  in.key_padding_mask = kpm.view();
  in.need_weights = true;
  in.average_attn_weights = false;
  in.output_dtype = DType::kFloat32;
  MhaOutputs solo = *Engine("cross").Forward(in);
  ExpectClose(solo.output, response.output(), 1e-6);
  ExpectClose(*solo.attn_weights, response.attn_weights(), 1e-6);

  // No output_dtype: the query's (bfloat16).
  request.clear_output_dtype();
  grpc::ClientContext ctx2;
  ASSERT_TRUE(stub->Infer(&ctx2, request, &response).ok());
  EXPECT_EQ(response.output().dtype(), v1::DATA_TYPE_BFLOAT16);
  EXPECT_EQ(response.attn_weights().dtype(), v1::DATA_TYPE_BFLOAT16);
}

TEST_F(ServerTest, BadInputsGetSpecificErrorsAndTheServerKeepsServing) {
  auto stub = InProcessStub();
  std::mt19937 rng(9);
  RequestCase base;  // (2, 5, 32) with a bool key_padding_mask.
  base.query = RandomTensor({2, 5, 32}, rng);
  base.kpm = RandomMask({2, 5}, rng, 0.3);
  ToProto(base.query, base.request.mutable_query());
  ToProto(base.kpm, base.request.mutable_key_padding_mask());
  struct Bad {
    std::string name;
    std::function<void(v1::InferRequest&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {"unknown model", [](auto& r) { r.set_model("nope"); }, grpc::StatusCode::NOT_FOUND,
       "model: 'nope' is not served"},
      {"missing query", [](auto& r) { r.clear_query(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "query: dtype must be"},
      {"short data", [](auto& r) { r.mutable_query()->mutable_data()->resize(12); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "query: data has 12 bytes but shape [2, 5, 32] of float32 needs 1280"},
      {"wrong rank",
       [](auto& r) {
         r.mutable_query()->mutable_shape()->Set(0, 1);
         r.mutable_query()->mutable_shape()->Set(1, 10);
         r.mutable_query()->add_shape(1);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "query: expected rank 3 (N, L, E) or 2 (L, E)"},
      {"embed dim",
       [](auto& r) {
         r.mutable_query()->mutable_shape()->Set(2, 16);
         r.mutable_query()->mutable_shape()->Set(1, 10);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "query: expected shape [*, *, 32], got [2, 10, 16]"},
      {"mask shape",
       [](auto& r) {
         r.mutable_key_padding_mask()->mutable_shape()->Set(1, 2);
         r.mutable_key_padding_mask()->mutable_data()->resize(4);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "key_padding_mask: expected shape [2, 5], got [2, 2]"},
      {"mask dtype", [](auto& r) { r.mutable_key_padding_mask()->set_dtype(v1::DataType(9)); },
       grpc::StatusCode::INVALID_ARGUMENT, "key_padding_mask: dtype must be"},
      {"bool query",
       [](auto& r) {
         r.mutable_query()->set_dtype(v1::DATA_TYPE_BOOL);
         r.mutable_query()->mutable_data()->resize(320);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "query: expected dtype float32, bfloat16 or float16"},
      {"attn mask shape",
       [](auto& r) {
         Tensor m(DType::kBool, {1, 5});
         ToProto(m, r.mutable_attn_mask());
       },
       grpc::StatusCode::INVALID_ARGUMENT, "attn_mask: expected shape [5, 5] or [8, 5, 5]"},
      {"negative dim", [](auto& r) { r.mutable_query()->mutable_shape()->Set(0, -2); },
       grpc::StatusCode::INVALID_ARGUMENT, "query: every dimension must be in [1, 2^31]"},
      {"output bool", [](auto& r) { r.set_output_dtype(v1::DATA_TYPE_BOOL); },
       grpc::StatusCode::INVALID_ARGUMENT, "output_dtype"},
      {"too many tokens",
       [](auto& r) {
         Tensor big(DType::kFloat32, {2, 2100, 32});
         ToProto(big, r.mutable_query());
         r.clear_key_padding_mask();
       },
       grpc::StatusCode::INVALID_ARGUMENT, "4200 query tokens (batch x length) exceed"},
      {"over message size",
       [](auto& r) {
         Tensor huge(DType::kFloat32, {1, 9000, 32});
         ToProto(huge, r.mutable_query());
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, ""},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.name);
    v1::InferRequest request = base.request;
    bad.mutate(request);
    grpc::ClientContext ctx;
    v1::InferResponse response;
    const grpc::Status status = stub->Infer(&ctx, request, &response);
    EXPECT_EQ(status.error_code(), bad.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(bad.message));
    grpc::ClientContext ok_ctx;  // Still serving.
    ASSERT_TRUE(stub->Infer(&ok_ctx, base.request, &response).ok());
  }
}

TEST_F(ServerTest, StreamCarriesManyRequestsAndPerRequestErrors) {
  auto stub = LoopbackStub();
  grpc::ClientContext ctx;
  auto stream = stub->InferStream(&ctx);
  std::mt19937 rng(10);
  std::map<std::string, RequestCase> sent;
  for (int i = 0; i < 24; ++i) {
    RequestCase c = MakeCase(rng, i);
    if (i % 6 == 5) c.request.set_model("nope");  // An error must not end the stream.
    ASSERT_TRUE(stream->Write(c.request));
    sent.emplace(c.request.request_id(), std::move(c));
  }
  stream->WritesDone();
  v1::InferResponse response;
  int ok = 0, errors = 0;
  while (stream->Read(&response)) {
    auto it = sent.find(response.request_id());
    ASSERT_NE(it, sent.end()) << response.request_id();
    if (it->second.request.model() == "nope") {
      EXPECT_EQ(response.error().code(), grpc::StatusCode::NOT_FOUND);
      EXPECT_THAT(response.error().message(), HasSubstr("not served"));
      EXPECT_FALSE(response.has_output());
      ++errors;
    } else {
      EXPECT_FALSE(response.has_error());
      ExpectClose(Solo(Engine("small"), it->second).output, response.output(), 1e-6);
      ++ok;
    }
    sent.erase(it);
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(ok, 20);
  EXPECT_EQ(errors, 4);
  EXPECT_TRUE(sent.empty());
}

TEST_F(ServerTest, BatchedResultsEqualSoloResults) {
  // Many concurrent requests of mixed lengths, masks and options: each
  // response must equal the request run alone, whatever it was batched with.
  constexpr int kThreads = 8, kPerThread = 12;
  std::vector<std::thread> threads;
  std::atomic<int> shared_batches{0}, mismatches{0}, failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto stub = LoopbackStub();
      std::mt19937 rng(100 + t);
      for (int i = 0; i < kPerThread; ++i) {
        RequestCase c = MakeCase(rng, t * kPerThread + i);
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        v1::InferResponse response;
        if (!stub->Infer(&ctx, c.request, &response).ok()) {
          ++failures;
          continue;
        }
        if (response.batch_requests() > 1) ++shared_batches;
        MhaOutputs solo = Solo(Engine("small"), c);
        Tensor got = FromProto(response.output());
        for (int64_t j = 0; j < got.num_elements(); ++j) {
          if (std::abs(got.as<float>()[j] - solo.output.as<float>()[j]) > 1e-6) {
            ++mismatches;
            break;
          }
        }
        if (c.request.need_weights()) {
          Tensor w = FromProto(response.attn_weights());
          for (int64_t j = 0; j < w.num_elements(); ++j) {
            if (std::abs(w.as<float>()[j] - solo.attn_weights->as<float>()[j]) > 1e-6) {
              ++mismatches;
              break;
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GT(shared_batches.load(), 0) << "no request was ever batched with another";
}

// Sends `request` asynchronously; `done` is notified with the status.
struct AsyncCall {
  grpc::ClientContext ctx;
  v1::InferResponse response;
  grpc::Status status;
  absl::Notification done;
  void Start(v1::AttentionService::Stub* stub, const v1::InferRequest& request) {
    stub->async()->Infer(&ctx, &request, &response, [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
  }
};

// Waits (bounded) until `model`'s queue holds `depth` requests.
bool WaitForQueueDepth(server::ModelRepository* repo, const std::string& model, int64_t depth) {
  for (int i = 0; i < 2000; ++i) {
    if (repo->Find(model)->batcher->queue_depth() == depth) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

v1::InferRequest TinyRequest() {
  v1::InferRequest r;
  r.set_model("tiny_queue");
  Tensor q(DType::kFloat32, {1, 3, 16});
  ToProto(q, r.mutable_query());
  return r;
}

TEST_F(ServerTest, FullQueueAnswersResourceExhaustedAtOnce) {
  auto stub = InProcessStub();
  server::ModelRepository* repo = server_->repository();
  const v1::InferRequest request = TinyRequest();
  AsyncCall a, b, c;
  {
    absl::MutexLock hold(repo->compute_mutex());  // No batch can compute.
    a.Start(stub.get(), request);
    ASSERT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 0));  // A is taken, waiting to compute.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    b.Start(stub.get(), request);
    c.Start(stub.get(), request);
    ASSERT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 2));
    grpc::ClientContext ctx;
    v1::InferResponse response;
    const grpc::Status full = stub->Infer(&ctx, request, &response);
    EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(full.error_message(), HasSubstr("queue is full: 2 requests waiting"));
  }
  for (AsyncCall* call : {&a, &b, &c}) {
    call->done.WaitForNotification();
    EXPECT_TRUE(call->status.ok()) << call->status.error_message();
  }
}

TEST_F(ServerTest, ExpiredAndCancelledRequestsAreNeverComputed) {
  auto stub = InProcessStub();
  server::ModelRepository* repo = server_->repository();
  const server::ModelMetrics& m = ModelMetricsOf("tiny_queue");
  const double deadline_before = Count(m, absl::StatusCode::kDeadlineExceeded);
  const double cancelled_before = Count(m, absl::StatusCode::kCancelled);
  const v1::InferRequest request = TinyRequest();
  AsyncCall first, expiring, cancelled;
  double tokens_before;
  {
    absl::MutexLock hold(repo->compute_mutex());
    first.Start(stub.get(), request);
    ASSERT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    tokens_before = m.tokens->Value();
    expiring.ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
    expiring.Start(stub.get(), request);
    cancelled.Start(stub.get(), request);
    ASSERT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 2));
    cancelled.ctx.TryCancel();
    expiring.done.WaitForNotification();  // The client sees its deadline pass.
    cancelled.done.WaitForNotification();
  }
  first.done.WaitForNotification();
  EXPECT_TRUE(first.status.ok());
  EXPECT_EQ(expiring.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  // The server answers both without computing them: only the first's tokens count.
  for (int i = 0; i < 2000 && (Count(m, absl::StatusCode::kDeadlineExceeded) == deadline_before ||
                               Count(m, absl::StatusCode::kCancelled) == cancelled_before);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(Count(m, absl::StatusCode::kDeadlineExceeded), deadline_before + 1);
  EXPECT_EQ(Count(m, absl::StatusCode::kCancelled), cancelled_before + 1);
  EXPECT_EQ(m.tokens->Value(), tokens_before + 3);
  EXPECT_TRUE(WaitForQueueDepth(repo, "tiny_queue", 0));
}

// A generic bidi call to the reflection service listing the services.
class ReflectionCall : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ReflectionCall(const std::shared_ptr<grpc::Channel>& channel) : stub_(channel) {
    // ServerReflectionRequest { list_services (field 7) = "" }.
    const char request[] = {0x3a, 0x00};
    grpc::Slice slice(request, sizeof(request));
    request_ = grpc::ByteBuffer(&slice, 1);
    stub_.PrepareBidiStreamingCall(&ctx_,
                                   "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   grpc::StubOptions(), this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }
  void OnWriteDone(bool) override { StartWritesDone(); }
  void OnReadDone(bool ok) override {
    if (ok) {
      std::vector<grpc::Slice> slices;
      (void)response_.Dump(&slices);
      for (const auto& s : slices) body_.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  std::string Wait() {
    done_.WaitForNotification();
    return status_.ok() ? body_ : "error: " + status_.error_message();
  }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer request_, response_;
  std::string body_;
  grpc::Status status_;
  absl::Notification done_;
};

TEST_F(ServerTest, ReflectionListsTheService) {
  ReflectionCall call(*channel_);
  const std::string body = call.Wait();
  EXPECT_THAT(body, HasSubstr("attention.v1.AttentionService"));
  EXPECT_THAT(body, HasSubstr("grpc.health.v1.Health"));
}

TEST_F(ServerTest, HealthIsServing) {
  auto health = grpc::health::v1::Health::NewStub(*channel_);
  for (const std::string service : {"", "attention.v1.AttentionService"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
}

TEST_F(ServerTest, MetricsAreExposedAndMove) {
  const std::string before = HttpGet(metrics_port_, "/metrics");
  auto stub = InProcessStub();
  std::mt19937 rng(11);
  for (int i = 0; i < 3; ++i) {
    RequestCase c = MakeCase(rng, i);
    grpc::ClientContext ctx;
    v1::InferResponse response;
    ASSERT_TRUE(stub->Infer(&ctx, c.request, &response).ok());
  }
  const std::string after = HttpGet(metrics_port_, "/metrics");
  for (const char* name :
       {"attention_request_duration_seconds_bucket", "attention_queue_duration_seconds_count",
        "attention_compute_duration_seconds_sum", "attention_batch_size_count",
        "attention_padding_ratio_bucket", "attention_requests_total", "attention_tokens_total",
        "attention_flops_total", "attention_queue_depth", "attention_inflight_requests",
        "attention_build_info"}) {
    EXPECT_THAT(after, HasSubstr(name));
  }
  EXPECT_THAT(after, HasSubstr("le=\"5e-05\""));  // Buckets from 50 us ...
  EXPECT_THAT(after, HasSubstr("le=\"10\""));     // ... to 10 s.
  const std::vector<std::string> ok = {"model=\"small\"", "method=\"Infer\"", "code=\"OK\""};
  EXPECT_GE(MetricValue(after, "attention_requests_total", ok),
            MetricValue(before, "attention_requests_total", ok) + 3);
  const std::vector<std::string> small = {"model=\"small\""};
  EXPECT_GT(MetricValue(after, "attention_tokens_total", small),
            MetricValue(before, "attention_tokens_total", small));
  EXPECT_GT(MetricValue(after, "attention_flops_total", small),
            MetricValue(before, "attention_flops_total", small));
  EXPECT_GT(MetricValue(after, "attention_request_duration_seconds_count", small),
            MetricValue(before, "attention_request_duration_seconds_count", small));
  EXPECT_EQ(MetricValue(after, "attention_build_info", {"version=\""}), 1);
}

TEST(ServerLifecycleTest, NotServingUntilReadyAndUnavailableWhileDraining) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  auto server = AttentionServer::Listen(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = (*server)->InProcessChannel();
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto check = [&] {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse resp;
    EXPECT_TRUE(health->Check(&ctx, {}, &resp).ok());
    return resp.status();
  };
  auto stub = v1::AttentionService::NewStub(channel);
  v1::InferRequest request;
  Tensor q(DType::kFloat32, {1, 4, 256});
  ToProto(q, request.mutable_query());
  auto infer = [&] {
    grpc::ClientContext ctx;
    v1::InferResponse resp;
    return stub->Infer(&ctx, request, &resp);
  };
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(infer().error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE((*server)->LoadModels().ok());  // The demo model.
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(infer().ok());
  (*server)->service().StartDraining();
  const grpc::Status draining = infer();
  EXPECT_EQ(draining.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(draining.error_message(), HasSubstr("shutting down"));
  EXPECT_TRUE((*server)->Drain());
}

TEST(ServerLifecycleTest, BadRepositoryFailsToLoad) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.repository.path = "/nonexistent/models";
  auto server = AttentionServer::Listen(options);
  ASSERT_TRUE(server.ok());
  const absl::Status loaded = (*server)->LoadModels();
  EXPECT_EQ(loaded.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.message()), HasSubstr("/nonexistent/models"));
}

}  // namespace
}  // namespace attention
