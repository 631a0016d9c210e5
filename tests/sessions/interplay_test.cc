// Where features meet (issue 21): a model variant x a session kind, an
// estimate x a pipeline, a budget x a refusal, a token x the default model.
// Each test here failed on the code before its fix. Allocation against
// admission, over every computing RPC: server_memory_accounting_test.cc.
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/escaping.h"
#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "server/frontends/protocol/oip_codec.h"
#include "server/requests/inflight_budget.h"
#include "server/security/token_authenticator.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::AttentionServer;
using ::attention::server::ServerOptions;
using ::attention::testing::RandomTensor;
using ::attention::testing::ToProto;
using ::inference::ModelInferRequest;
using ::inference::ModelInferResponse;
using ::testing::HasSubstr;

constexpr int64_t kE = 32;

// Models: "small" (E=32, H=4; sessions up to 8192 tokens) and "wide" (E=48,
// kdim 20, vdim 28: no self-attention, no self sessions).
std::unique_ptr<AttentionServer> Start(const std::string& name,
                                       void (*configure)(ServerOptions&) = nullptr) {
  const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(kE, 4), 1), dir + "/small",
                         "\"max_session_tokens\": 8192");
  MhaSpec wide = testing::SelfAttentionSpec(48, 4);
  wide.kdim = 20;
  wide.vdim = 28;
  testing::WriteModelDir(**MhaModel::Random(wide, 2), dir + "/wide");
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.repository.path = dir;
  options.repository.default_model = "small";
  options.repository.compute_threads = 2;
  options.repository.warmup = false;
  options.sessions.memory_bytes = int64_t{256} << 20;
  options.max_message_bytes = 8 << 20;
  if (configure != nullptr) configure(options);
  auto server = AttentionServer::Listen(options);
  EXPECT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->LoadModels().ok());
  return *std::move(server);
}

class InterplayTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() { server_ = Start("interplay").release(); }
  static void TearDownTestSuite() {
    EXPECT_TRUE(server_->Drain());
    delete server_;
  }

  static std::unique_ptr<v1::SessionService::Stub> Sessions() {
    return v1::SessionService::NewStub(server_->InProcessChannel());
  }
  static std::unique_ptr<inference::GRPCInferenceService::Stub> Oip() {
    return inference::GRPCInferenceService::NewStub(server_->InProcessChannel());
  }
  static grpc::Status Create(const std::string& model, std::string* id) {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_model(model);
    request.set_kind(v1::SESSION_KIND_SELF);
    v1::SessionInfo info;
    const grpc::Status status = Sessions()->CreateSession(&context, request, &info);
    *id = info.session_id();
    return status;
  }
  static int64_t Length(const std::string& id) {
    grpc::ClientContext context;
    v1::GetSessionRequest request;
    request.set_session_id(id);
    v1::SessionInfo info;
    EXPECT_TRUE(Sessions()->GetSession(&context, request, &info).ok());
    return info.length();
  }
  // A sequence step of `t` tokens on `model`.
  static ModelInferRequest Step(const std::string& model, int64_t t, int64_t e, uint64_t sequence,
                                bool start, std::mt19937& rng) {
    ModelInferRequest r;
    r.set_model_name(model);
    const Tensor q = RandomTensor({1, t, e}, rng);
    auto* input = r.add_inputs();
    input->set_name("query");
    input->set_datatype("FP32");
    input->mutable_shape()->Assign(q.shape().begin(), q.shape().end());
    r.add_raw_input_contents(std::string(static_cast<const char*>(q.data()), q.num_bytes()));
    (*r.mutable_parameters())["sequence_id"].set_uint64_param(sequence);
    if (start) (*r.mutable_parameters())["sequence_start"].set_bool_param(true);
    return r;
  }
  static bool StillServes() {
    auto stub = v1::AttentionService::NewStub(server_->InProcessChannel());
    std::mt19937 rng(5);
    v1::InferRequest request;
    ToProto(RandomTensor({1, 4, kE}, rng), request.mutable_query());
    grpc::ClientContext context;
    v1::InferResponse response;
    return stub->Infer(&context, request, &response).ok();
  }

  static AttentionServer* server_;
};

AttentionServer* InterplayTest::server_ = nullptr;

// Item 1: a self session, or a sequence (a self session too), on a model
// whose kdim or vdim differs from embed_dim once corrupted the heap.
TEST_F(InterplayTest, SelfSessionsAndSequencesOnKdimModelsAreRefused) {
  std::string id;
  const grpc::Status created = Create("wide", &id);
  EXPECT_EQ(created.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(created.error_message(), HasSubstr("kdim 20 and vdim 28"));
  std::mt19937 rng(1);
  for (int64_t t : {5, 64}) {
    grpc::ClientContext context;
    ModelInferResponse response;
    const grpc::Status status =
        Oip()->ModelInfer(&context, Step("wide", t, 48, 7, /*start=*/true, rng), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("kdim 20 and vdim 28"));
  }
  EXPECT_TRUE(StillServes());
}

// Item 2: an append pipelined behind a long prefill is sized against the
// length it runs at, and refused unapplied when its response is too large.
TEST_F(InterplayTest, PipelinedAppendIsSizedAtTheLengthItRunsAt) {
  std::string id;
  ASSERT_TRUE(Create("small", &id).ok());
  grpc::ClientContext context;
  auto stream = Sessions()->SessionStream(&context);
  std::mt19937 rng(2);
  v1::AppendRequest prefill;
  prefill.set_session_id(id);
  prefill.set_request_id("prefill");
  ToProto(RandomTensor({4000, kE}, rng).ConvertTo(DType::kFloat16), prefill.mutable_tokens());
  v1::AppendRequest append;
  append.set_session_id(id);
  append.set_request_id("append");
  ToProto(RandomTensor({128, kE}, rng).ConvertTo(DType::kFloat16), append.mutable_tokens());
  append.set_need_weights(true);
  append.set_per_head_weights(true);  // 4 x 128 x 4128 float32: 8.45 MB > 8 MiB.
  append.set_output_dtype(v1::DATA_TYPE_FLOAT32);
  ASSERT_TRUE(stream->Write(prefill));
  ASSERT_TRUE(stream->Write(append));
  stream->WritesDone();
  // Responses come in any order: the append may be refused before the
  // prefill is computed (its estimate counts the queued prefill's tokens).
  v1::AppendResponse first, second;
  ASSERT_TRUE(stream->Read(&first));
  ASSERT_TRUE(stream->Read(&second));
  if (first.request_id() == "append") std::swap(first, second);
  ASSERT_EQ(first.request_id(), "prefill");
  EXPECT_EQ(first.error().code(), 0) << first.error().message();
  EXPECT_EQ(second.error().code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(second.error().message(), HasSubstr("max_message_bytes"));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(Length(id), 4000);  // The refused append is not in the cache.
}

// Item 2 through sequences: a step too large for the sequence's length is
// refused, and the next step sees the sequence as it was.
TEST_F(InterplayTest, RefusedSequenceStepIsNotApplied) {
  std::mt19937 rng(3);
  ModelInferResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(
        Oip()->ModelInfer(&context, Step("small", 4000, kE, 11, true, rng), &response).ok());
  }
  ModelInferRequest big = Step("small", 128, kE, 11, false, rng);
  (*big.mutable_parameters())["need_weights"].set_bool_param(true);
  (*big.mutable_parameters())["average_attn_weights"].set_bool_param(false);
  {
    grpc::ClientContext context;
    EXPECT_EQ(Oip()->ModelInfer(&context, big, &response).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  ModelInferRequest next = Step("small", 1, kE, 11, false, rng);
  (*next.mutable_parameters())["need_weights"].set_bool_param(true);
  grpc::ClientContext context;
  ASSERT_TRUE(Oip()->ModelInfer(&context, next, &response).ok());
  ASSERT_EQ(response.outputs_size(), 2);
  EXPECT_EQ(response.outputs(1).shape(2), 4001);  // Not 4129.
}

// Item 3c: a refused start holds no session and no key; over-long sequence
// ids are refused and never kept.
TEST(InterplayLimitsTest, RefusedSequenceStartsHoldNothing) {
  auto server = Start("interplay_starts", [](ServerOptions& o) { o.sessions.max_sessions = 3; });
  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  std::mt19937 rng(4);
  for (uint64_t s = 0; s < 4; ++s) {  // Wrong embedding size: refused.
    grpc::ClientContext context;
    ModelInferResponse response;
    EXPECT_EQ(oip->ModelInfer(&context, InterplayTest::Step("small", 3, kE + 1, s + 1, true, rng),
                              &response)
                  .error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(server->sessions()->live_sessions(), 0);
  ModelInferRequest long_id = InterplayTest::Step("small", 3, kE, 0, true, rng);
  (*long_id.mutable_parameters())["sequence_id"].set_string_param(std::string(1 << 20, 'x'));
  {
    grpc::ClientContext context;
    ModelInferResponse response;
    const grpc::Status status = oip->ModelInfer(&context, long_id, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_LT(status.error_message().size(), 512u);
    EXPECT_LT(response.id().size(), 2048u);
  }
  for (uint64_t s = 0; s < 3; ++s) {  // Every slot is still free.
    grpc::ClientContext context;
    ModelInferResponse response;
    const grpc::Status status =
        oip->ModelInfer(&context, InterplayTest::Step("small", 3, kE, s + 1, true, rng), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(server->sessions()->live_sessions(), 3);
  EXPECT_TRUE(server->Drain());
}

// Item 3c: identifiers are bounded, and errors never echo them whole.
TEST_F(InterplayTest, LongIdentifiersAreRefusedWithShortErrors) {
  const std::string huge(1 << 20, 'm');
  auto stub = v1::AttentionService::NewStub(server_->InProcessChannel());
  std::mt19937 rng(6);
  v1::InferRequest request;
  ToProto(RandomTensor({1, 4, kE}, rng), request.mutable_query());
  request.set_model(huge);
  grpc::ClientContext c1;
  v1::InferResponse response;
  grpc::Status status = stub->Infer(&c1, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(status.error_message().size(), 512u);
  request.set_model("small");
  request.set_request_id(huge);
  grpc::ClientContext c2;
  status = stub->Infer(&c2, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("request_id"));

  auto health = grpc::health::v1::Health::NewStub(server_->InProcessChannel());
  grpc::health::v1::HealthCheckRequest check;
  check.set_service(huge);
  grpc::health::v1::HealthCheckResponse answer;
  grpc::ClientContext c3;
  status = health->Check(&c3, check, &answer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  EXPECT_LT(status.error_message().size(), 512u);
}

// Item 3c: a stream's refused requests are admitted against the in-flight
// budget until their responses are written (they were never admitted, so a
// client that did not read could hold any memory with refusals).
TEST_F(InterplayTest, StreamRefusalsAreAdmittedUntilWritten) {
  auto stub = v1::AttentionService::NewStub(server_->InProcessChannel());
  server::InflightBudget& budget = server_->service().budget();
  const int64_t before = budget.used();
  budget.ResetPeak();
  grpc::ClientContext context;
  auto stream = stub->InferStream(&context);
  v1::InferRequest request;
  request.set_model("no-such-model");
  constexpr int kRequests = 8;
  for (int i = 0; i < kRequests; ++i) {
    request.set_request_id(std::to_string(i));
    ASSERT_TRUE(stream->Write(request));
  }
  stream->WritesDone();
  v1::InferResponse response;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_GE(budget.peak() - before, 4096);  // At least one refusal was held.
  // And every one released, once written (the server may see its last write
  // complete a moment after the client read it).
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (budget.used() != before && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(budget.used(), before);
}

// Item 8: a missing tensor says it is missing; a cross session's float16
// key_padding_mask is accepted like Infer's.
TEST_F(InterplayTest, MissingTensorsAndFloat16CrossMasks) {
  std::string id;
  ASSERT_TRUE(Create("small", &id).ok());
  grpc::ClientContext c1;
  v1::AppendRequest append;
  append.set_session_id(id);
  v1::AppendResponse response;
  const grpc::Status missing = Sessions()->Append(&c1, append, &response);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(missing.error_message(), HasSubstr("tokens: required"));
  EXPECT_THAT(missing.error_message(), ::testing::Not(HasSubstr("BOOL")));

  std::mt19937 rng(7);
  v1::CreateSessionRequest cross;
  cross.set_model("wide");
  cross.set_kind(v1::SESSION_KIND_CROSS);
  ToProto(RandomTensor({9, 20}, rng), cross.mutable_key());
  ToProto(RandomTensor({9, 28}, rng), cross.mutable_value());
  Tensor mask(DType::kFloat16, {9});
  ToProto(mask, cross.mutable_key_padding_mask());
  grpc::ClientContext c2;
  v1::SessionInfo info;
  const grpc::Status created = Sessions()->CreateSession(&c2, cross, &info);
  EXPECT_TRUE(created.ok()) << created.error_message();
  EXPECT_EQ(info.keys(), 9);
}

std::string HashHex(const std::string& token) {
  const server::TokenAuthenticator::Sha256 h = server::TokenAuthenticator::Hash(token);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(h.data()), 32));
}

// Item 6: an empty model name resolves among the caller's own models; a
// limited token never learns the server's default's name.
TEST(InterplayTokensTest, EmptyModelNameResolvesAmongTheCallersModels) {
  static std::string tokens;
  tokens = ::testing::TempDir() + "/interplay_token_file_" + std::to_string(getpid());
  {
    std::ofstream out(tokens);
    out << HashHex("bob-secret") << " bob wide\n";
  }
  auto server = Start("interplay_tokens", [](ServerOptions& o) { o.auth_tokens_file = tokens; });
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  grpc::ClientContext c1;
  c1.AddMetadata("authorization", "Bearer bob-secret");
  v1::GetModelRequest get;  // Empty: the default among bob's models.
  v1::ModelInfo info;
  const grpc::Status got = stub->GetModel(&c1, get, &info);
  EXPECT_TRUE(got.ok()) << got.error_message();
  EXPECT_EQ(info.name(), "wide");
  std::mt19937 rng(8);
  v1::InferRequest request;  // On "wide" it needs a key: refused, but not naming "small".
  ToProto(RandomTensor({1, 4, 48}, rng), request.mutable_query());
  grpc::ClientContext c2;
  c2.AddMetadata("authorization", "Bearer bob-secret");
  v1::InferResponse response;
  const grpc::Status status = stub->Infer(&c2, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), ::testing::Not(HasSubstr("small")));
  EXPECT_TRUE(server->Drain());
}

}  // namespace
}  // namespace attention
