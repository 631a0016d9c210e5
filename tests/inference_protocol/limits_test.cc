// The Open Inference Protocol at its limits: a sequence step that fails
// when it runs (a restart, an end step) leaves the live sequence as it was,
// a restart at max_sessions replaces its sequence, and names too long to
// quote whole are refused INVALID_ARGUMENT (issue 21's fixes). In-process
// servers listening on TCP (the metadata limits of a real transport matter
// to the long names), one small self-attention model. Long session ids:
// sessions/refusals_test.cc.
#include <grpcpp/grpcpp.h>

#include <functional>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "tests/fixture/oip_requests.h"
#include "tests/fixture/test_server.h"
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
  testing::ModelFolder models("oip_limits");
  models.Add("small", testing::SelfAttentionSpec(kE, 2), 1, "\"max_session_tokens\": 8");
  models.Add("one", testing::SelfAttentionSpec(kE, 2), 1,
             "\"max_session_tokens\": 8, \"max_sessions\": 1");
  server::ServerOptions options = testing::TestServerOptions(models.path());
  options.drain_grace = absl::Milliseconds(500);
  options.repository.default_model = "small";
  options.sessions.memory_bytes = 1 << 20;
  options.sessions.evict_grace = absl::Hours(1);
  return testing::StartServer(options);
}

class SequenceLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer();
    ASSERT_NE(server_, nullptr);
    // A real TCP channel: its default 8 KiB metadata limit is what clients meet.
    channel_ = grpc::CreateChannel(testing::Target(*server_), grpc::InsecureChannelCredentials());
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
    ModelInferRequest r = testing::OipQuery(testing::RandomTensor({1, tokens, kE}, rng_), model);
    return testing::AsSequenceStep(r, 7, start, end);
  }

  std::unique_ptr<AttentionServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::mt19937 rng_{21};
};

// The inference protocol's names, on the same server.
class InferenceProtocolLimitsTest : public SequenceLimitsTest {
 protected:
  // ModelInfer of 2 random tokens on "small", not in a sequence, once
  // `spoil` changed the request: its status.
  grpc::Status InferSpoiled(const std::function<void(ModelInferRequest&)>& spoil) {
    ModelInferRequest r = Step(2, /*start=*/false);
    r.mutable_parameters()->erase("sequence_id");
    spoil(r);
    ModelInferResponse response;
    return Infer(r, &response);
  }
};

// DecodeModelInfer quotes an unknown output name whole ("expected 'output'
// or 'attn_weights', got '...'"). gRPC percent-encodes grpc-message: 4096
// '%' become 12 KiB of trailing metadata, over the client's 8 KiB limit, so
// the client got RESOURCE_EXHAUSTED / INTERNAL instead of INVALID_ARGUMENT.
TEST_F(InferenceProtocolLimitsTest, ModelInferRefusesALongOutputNameWithInvalidArgument) {
  const grpc::Status status =
      InferSpoiled([](ModelInferRequest& r) { r.add_outputs()->set_name(std::string(5000, '%')); });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
}

// ParseDatatype quotes the datatype whole; the input's name is quoted whole
// in every inputs[i] ('<name>') field of an error.
TEST_F(InferenceProtocolLimitsTest, ModelInferRefusesALongDatatypeOrInputNameWithInvalidArgument) {
  const grpc::Status datatype = InferSpoiled(
      [](ModelInferRequest& r) { r.mutable_inputs(0)->set_datatype(std::string(5000, '%')); });
  EXPECT_EQ(datatype.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << datatype.error_message();
  const grpc::Status name = InferSpoiled(
      [](ModelInferRequest& r) { r.mutable_inputs(0)->set_name(std::string(5000, '%')); });
  EXPECT_EQ(name.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name.error_message();
}

// A restart whose step fails when it runs (here: 9 tokens over the model's
// max_session_tokens 8) must leave the live sequence as it was: the append
// was not applied, so neither was the restart. SequenceSessions::Start maps
// the new session and closes the old one before the step runs; the failed
// step then closes the new one too, and the sequence is gone.
TEST_F(SequenceLimitsTest, FailedRestartKeepsTheLiveSequence) {
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
TEST_F(SequenceLimitsTest, FailedEndStepKeepsTheSequence) {
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
TEST_F(SequenceLimitsTest, RestartAtTheSessionLimitReplacesTheSequence) {
  ModelInferResponse response;
  grpc::Status status = Infer(Step(2, /*start=*/true, /*end=*/false, "one"), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  status = Infer(Step(2, /*start=*/true, /*end=*/false, "one"), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

}  // namespace
}  // namespace attention
