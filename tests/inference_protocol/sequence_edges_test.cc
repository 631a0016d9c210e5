// Review of issue 21's fixes (12f001e and the merges after it), where they
// meet the rest of the server: each test is a finding, and fails on the
// reviewed main. In-process servers listening on TCP (the metadata limits of
// a real transport matter to some findings), one small self-attention model.
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <random>
#include <string>

#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "server/frontends/protocol/oip_codec.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::AttentionServer;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

constexpr int64_t kE = 16;

// "small": E=16, H=2, max_session_tokens 8 (below max_batch_tokens, so an
// append too long for its session fails when it runs, not when it is read);
// "one": the same with max_sessions 1. Sessions are never evicted for being
// idle (1 h grace).
std::unique_ptr<AttentionServer> StartServer() {
  const std::string dir = ::testing::TempDir() + "/review_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(kE, 2), 1), dir + "/small",
                         "\"max_session_tokens\": 8");
  testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(kE, 2), 1), dir + "/one",
                         "\"max_session_tokens\": 8, \"max_sessions\": 1");
  server::ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.repository.path = dir;
  options.repository.default_model = "small";
  options.repository.compute_threads = 1;
  options.repository.warmup = false;
  options.sessions.memory_bytes = 1 << 20;
  options.sessions.evict_grace = absl::Hours(1);
  auto server = AttentionServer::Listen(options);
  if (!server.ok()) {
    ADD_FAILURE() << server.status();
    return nullptr;
  }
  const absl::Status loaded = (*server)->LoadModels();
  EXPECT_TRUE(loaded.ok()) << loaded;
  return *std::move(server);
}

class ReviewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer();
    ASSERT_NE(server_, nullptr);
    // A real TCP channel: its default 8 KiB metadata limit is what clients meet.
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Drain();
  }

  grpc::Status Infer(const ModelInferRequest& request, ModelInferResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return inference::GRPCInferenceService::NewStub(channel_)->ModelInfer(&context, request,
                                                                          response);
  }

  // A sequence step of `tokens` random tokens on sequence 7 of `model`.
  ModelInferRequest Step(int64_t tokens, bool start, bool end = false,
                         const std::string& model = "small") {
    const Tensor query = testing::RandomTensor({1, tokens, kE}, rng_);
    ModelInferRequest r;
    r.set_model_name(model);
    auto* input = r.add_inputs();
    input->set_name("query");
    input->set_datatype("FP32");
    input->mutable_shape()->Assign(query.shape().begin(), query.shape().end());
    r.add_raw_input_contents(
        std::string(static_cast<const char*>(query.data()), query.num_bytes()));
    (*r.mutable_parameters())["sequence_id"].set_uint64_param(7);
    if (start) (*r.mutable_parameters())["sequence_start"].set_bool_param(true);
    if (end) (*r.mutable_parameters())["sequence_end"].set_bool_param(true);
    return r;
  }

  std::unique_ptr<AttentionServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::mt19937 rng_{21};
};

// --- Focus 5: identifiers -------------------------------------------------

// GetSession and CloseSession take a session_id with no length check
// (FindForCaller checks only that it is non-empty), and NOT_FOUND quotes it
// whole (EndedSessions::NotFound). ToGrpcStatus cuts the message to 4096
// bytes, but gRPC percent-encodes grpc-message: 4096 '%' become 12 KiB of
// trailing metadata, over the client's 8 KiB limit, so the client gets
// RESOURCE_EXHAUSTED / INTERNAL instead of INVALID_ARGUMENT (issue 21, 3c).
TEST_F(ReviewTest, GetSessionRefusesALongSessionIdWithInvalidArgument) {
  auto stub = v1::SessionService::NewStub(channel_);
  grpc::ClientContext context;
  v1::GetSessionRequest request;
  request.set_session_id(std::string(5000, '%'));
  v1::SessionInfo info;
  const grpc::Status status = stub->GetSession(&context, request, &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
}

TEST_F(ReviewTest, CloseSessionRefusesALongSessionIdWithInvalidArgument) {
  auto stub = v1::SessionService::NewStub(channel_);
  grpc::ClientContext context;
  v1::CloseSessionRequest request;
  request.set_session_id(std::string(5000, '%'));
  v1::CloseSessionResponse response;
  const grpc::Status status = stub->CloseSession(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
}

// DecodeModelInfer quotes an unknown output name whole ("expected 'output'
// or 'attn_weights', got '...'"): same encoding blow-up past the limit.
TEST_F(ReviewTest, ModelInferRefusesALongOutputNameWithInvalidArgument) {
  ModelInferRequest r = Step(2, /*start=*/false);
  r.mutable_parameters()->erase("sequence_id");
  r.add_outputs()->set_name(std::string(5000, '%'));
  ModelInferResponse response;
  const grpc::Status status = Infer(r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
}

// ParseDatatype quotes the datatype whole; the input's name is quoted whole
// in every inputs[i] ('<name>') field of an error.
TEST_F(ReviewTest, ModelInferRefusesALongDatatypeOrInputNameWithInvalidArgument) {
  {
    ModelInferRequest r = Step(2, /*start=*/false);
    r.mutable_parameters()->erase("sequence_id");
    r.mutable_inputs(0)->set_datatype(std::string(5000, '%'));
    ModelInferResponse response;
    const grpc::Status status = Infer(r, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
  {
    ModelInferRequest r = Step(2, /*start=*/false);
    r.mutable_parameters()->erase("sequence_id");
    r.mutable_inputs(0)->set_name(std::string(5000, '%'));
    ModelInferResponse response;
    const grpc::Status status = Infer(r, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
}

// --- Focus 4 and 1: sequences ---------------------------------------------

// A restart whose step fails when it runs (here: 9 tokens over the model's
// max_session_tokens 8) must leave the live sequence as it was: the append
// was not applied, so neither was the restart. SequenceSessions::Start maps
// the new session and closes the old one before the step runs; the failed
// step then closes the new one too, and the sequence is gone.
TEST_F(ReviewTest, FailedRestartKeepsTheLiveSequence) {
  ModelInferResponse response;
  grpc::Status status = Infer(Step(2, /*start=*/true), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  status = Infer(Step(9, /*start=*/true), &response);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  status = Infer(Step(1, /*start=*/false), &response);
  EXPECT_TRUE(status.ok()) << "the failed restart ended the live sequence: "
                           << status.error_message();
}

// Likewise a sequence_end step that fails when it runs: the client is told
// the step failed, may retry it shorter, and must find its sequence.
TEST_F(ReviewTest, FailedEndStepKeepsTheSequence) {
  ModelInferResponse response;
  grpc::Status status = Infer(Step(4, /*start=*/true), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  status = Infer(Step(5, /*start=*/false, /*end=*/true), &response);  // 4 + 5 > 8.
  ASSERT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  status = Infer(Step(4, /*start=*/false, /*end=*/true), &response);  // 4 + 4 fits.
  EXPECT_TRUE(status.ok()) << "the failed end step ended the sequence: " << status.error_message();
}

// A restart replaces the sequence's session, so it needs no room of its
// own: at the model's max_sessions (1 here; the same at a tenant's
// --max_sessions_per_tenant), restarting the one live sequence must work.
// Create runs before Start closes the old session, so it is refused while
// the old session is within evict_grace.
TEST_F(ReviewTest, RestartAtTheSessionLimitReplacesTheSequence) {
  ModelInferResponse response;
  grpc::Status status = Infer(Step(2, /*start=*/true, /*end=*/false, "one"), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  status = Infer(Step(2, /*start=*/true, /*end=*/false, "one"), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

}  // namespace
}  // namespace attention
