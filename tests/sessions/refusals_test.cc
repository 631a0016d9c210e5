// Requests refused at a limit leave sessions and sequences as they were: a
// self session or a sequence on a model whose kdim or vdim differs from
// embed_dim, an append too large for the length it runs at, a refused
// sequence start, a missing tensor, an over-long session id. And the v1
// API's identifiers and stream refusals stay bounded. Allocation against
// admission, over every computing RPC: memory/accounting_test.cc.
#include <grpcpp/grpcpp.h>

#include <random>

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "server/requests/inflight_budget.h"
#include "tests/fixture/oip_requests.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/session_test_server.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::ServerOptions;
using ::inference::ModelInferRequest;
using ::inference::ModelInferResponse;

// Models: "small" (E=32, H=4; sessions up to 8192 tokens) and "wide" (E=48,
// kdim 20, vdim 28: no self-attention, no self sessions).
std::unique_ptr<AttentionServer> Start(const std::string& name,
                                       void (*configure)(ServerOptions&) = nullptr) {
  MhaSpec wide = testing::SelfAttentionSpec(48, 4);
  wide.kdim = 20;
  wide.vdim = 28;
  testing::ModelFolder models(name);
  models.Add("small", testing::SelfAttentionSpec(kE, 4), 1, "\"max_session_tokens\": 8192");
  models.Add("wide", wide, 2);
  ServerOptions options = testing::TestServerOptions(models.path(), false, 2);
  options.drain_grace = absl::Milliseconds(500);
  options.repository.default_model = "small";
  options.sessions.memory_bytes = int64_t{256} << 20;
  options.max_message_bytes = 8 << 20;
  if (configure != nullptr) configure(options);
  return testing::StartServer(options);
}

class SessionRefusalTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() { server_ = Start("session_refusals").release(); }
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
    v1::SessionInfo info;
    const grpc::Status status = testing::CreateSelfSession(*Sessions(), context, model, &info);
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
    ModelInferRequest r = testing::OipQuery(RandomTensor({1, t, e}, rng), model);
    return testing::AsSequenceStep(r, sequence, start);
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

AttentionServer* SessionRefusalTest::server_ = nullptr;

// The v1 API's identifiers and stream refusals, on the same server.
class InferLimitsTest : public SessionRefusalTest {};

// Issue 21, item 1: a self session, or a sequence (a self session too), on a model
// whose kdim or vdim differs from embed_dim once corrupted the heap.
TEST_F(SessionRefusalTest, SelfSessionsAndSequencesOnKdimModelsAreRefused) {
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

// Issue 21, item 2: an append pipelined behind a long prefill is sized against the
// length it runs at, and refused unapplied when its response is too large.
TEST_F(SessionRefusalTest, PipelinedAppendIsSizedAtTheLengthItRunsAt) {
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

// Issue 21, item 2, through sequences: a step too large for the sequence's length is
// refused, and the next step sees the sequence as it was.
TEST_F(SessionRefusalTest, RefusedSequenceStepIsNotApplied) {
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

// Issue 21, item 8: a missing tensor says it is missing; a cross session's float16
// key_padding_mask is accepted like Infer's.
TEST_F(SessionRefusalTest, MissingTensorsAndFloat16CrossMasks) {
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

// Issue 21, item 3c: a refused start holds no session and no key; over-long sequence
// ids are refused and never kept.
TEST(SequenceStartRefusalTest, RefusedSequenceStartsHoldNothing) {
  auto server =
      Start("sequence_start_refusals", [](ServerOptions& o) { o.sessions.max_sessions = 3; });
  auto oip = inference::GRPCInferenceService::NewStub(server->InProcessChannel());
  std::mt19937 rng(4);
  for (uint64_t s = 0; s < 4; ++s) {  // Wrong embedding size: refused.
    grpc::ClientContext context;
    ModelInferResponse response;
    EXPECT_EQ(
        oip->ModelInfer(&context, SessionRefusalTest::Step("small", 3, kE + 1, s + 1, true, rng),
                        &response)
            .error_code(),
        grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(server->sessions()->live_sessions(), 0);
  ModelInferRequest long_id = SessionRefusalTest::Step("small", 3, kE, 0, true, rng);
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
    const grpc::Status status = oip->ModelInfer(
        &context, SessionRefusalTest::Step("small", 3, kE, s + 1, true, rng), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(server->sessions()->live_sessions(), 3);
  EXPECT_TRUE(server->Drain());
}

// GetSession and CloseSession take a session_id with no length check
// (FindForCaller checks only that it is non-empty), and NOT_FOUND quotes it
// whole (EndedSessions::NotFound). ToGrpcStatus cuts the message to 4096
// bytes, but gRPC percent-encodes grpc-message: 4096 '%' become 12 KiB of
// trailing metadata, over the client's 8 KiB limit, so the client gets
// RESOURCE_EXHAUSTED / INTERNAL instead of INVALID_ARGUMENT (issue 21, 3c).
// On a real TCP channel: its default 8 KiB metadata limit is what clients meet.
template <typename Request, typename Response>
grpc::Status CallWithALongSessionId(AttentionServer& server,
                                    grpc::Status (v1::SessionService::Stub::*call)(
                                        grpc::ClientContext*, const Request&, Response*)) {
  auto stub = v1::SessionService::NewStub(testing::PlainChannel(server));
  grpc::ClientContext context;
  Request request;
  request.set_session_id(std::string(5000, '%'));
  Response response;
  return ((*stub).*call)(&context, request, &response);
}

TEST_F(SessionRefusalTest, GetSessionRefusesALongSessionIdWithInvalidArgument) {
  const grpc::Status status =
      CallWithALongSessionId(*server_, &v1::SessionService::Stub::GetSession);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
}

TEST_F(SessionRefusalTest, CloseSessionRefusesALongSessionIdWithInvalidArgument) {
  const grpc::Status status =
      CallWithALongSessionId(*server_, &v1::SessionService::Stub::CloseSession);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
}

// Issue 21, item 3c: identifiers are bounded, and errors never echo them whole.
TEST_F(InferLimitsTest, LongIdentifiersAreRefusedWithShortErrors) {
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

// Issue 21, item 3c: a stream's refused requests are admitted against the in-flight
// budget until their responses are written (they were never admitted, so a
// client that did not read could hold any memory with refusals).
TEST_F(InferLimitsTest, StreamRefusalsAreAdmittedUntilWritten) {
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

}  // namespace
}  // namespace attention
