// Refusals that name the fix (issue 38, wall 3): a request over a server
// limit names the limit and the flag that sets it (working memory:
// --max_batch_working_bytes; the attention weights of a batch: the same
// flag), an unknown model lists the models the caller may use and the
// closest ("did you mean"), and a missing token says how each client takes
// one (--token_file, token=, ATTENTION_TOKEN).
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <random>

#include "attention/v1/attention.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"
#include "tests/fixture/token_files.h"

namespace attention {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kE = 32;

// Models "demo" and "small" (E=32, 4 heads), with `tweak` on the options.
std::unique_ptr<server::AttentionServer> Start(
    const std::string& name, const std::function<void(server::ServerOptions&)>& tweak = {}) {
  testing::ModelFolder folder(name);
  folder.Add("demo", testing::SelfAttentionSpec(kE, 4), 1)
      .Add("small", testing::SelfAttentionSpec(kE, 4), 2);
  server::ServerOptions options = testing::TestServerOptions(folder.path());
  if (tweak) tweak(options);
  return testing::StartServer(options);
}

grpc::Status Infer(v1::AttentionService::Stub& stub, const std::string& model, int64_t length,
                   bool need_weights, const std::string& token = "") {
  std::mt19937 rng(1);
  v1::InferRequest request;
  request.set_model(model);
  request.set_need_weights(need_weights);
  testing::ToProto(testing::RandomTensor({1, length, kE}, rng), request.mutable_query());
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  v1::InferResponse response;
  return stub.Infer(&context, request, &response);
}

TEST(ErrorsNameTheFixTest, WorkingMemoryRefusalNamesItsFlag) {
  auto server = Start("errors_working",
                      [](server::ServerOptions& o) { o.max_batch_working_bytes = 1 << 20; });
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  const grpc::Status status = Infer(*stub, "demo", 2000, false);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("over the server's limit of 1048576 per batch"));
  EXPECT_THAT(status.error_message(), HasSubstr("--max_batch_working_bytes"));
  server->Drain();
}

TEST(ErrorsNameTheFixTest, WorkingMemoryPastTheFlagsMostNamesNoValueTheServerRefuses) {
  // --max_batch_working_bytes takes at most 512 MiB (a larger value is
  // refused at start): a request needing more must not be told to start
  // the server with such a value.
  auto server = Start("errors_working_max", [](server::ServerOptions& o) {
    o.max_batch_working_bytes = 536870912;
    o.repository.batching.max_batch_weights_bytes = 536870912;
    o.max_message_bytes = 256 << 20;  // Room for the averaged weights.
  });
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  std::mt19937 rng(1);
  v1::InferRequest request;
  request.set_model("demo");
  request.set_need_weights(true);
  // 4 heads x 5792^2 x 4 bytes of weights: just under 512 MiB; with the
  // projections the batch's working memory is over it.
  testing::ToProto(testing::RandomTensor({1, 5792, kE}, rng), request.mutable_query());
  grpc::ClientContext context;
  v1::InferResponse response;
  const grpc::Status status = stub->Infer(&context, request, &response);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("bytes of working memory"));
  EXPECT_THAT(status.error_message(), Not(HasSubstr("start the server with")));
  EXPECT_THAT(status.error_message(), HasSubstr("at most 536870912"));
  server->Drain();
}

TEST(ErrorsNameTheFixTest, AttentionWeightsRefusalNamesItsFlag) {
  auto server = Start("errors_weights", [](server::ServerOptions& o) {
    o.repository.batching.max_batch_weights_bytes = 1 << 20;  // What the memory plan sets.
  });
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  // 4 heads x 300 x 300 x 4 bytes: 1.44 MB of per-head weights.
  const grpc::Status status = Infer(*stub, "demo", 300, true);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("computing the attention weights"));
  EXPECT_THAT(status.error_message(), HasSubstr("--max_batch_working_bytes"));
  server->Drain();
}

TEST(ErrorsNameTheFixTest, AnUnknownModelListsTheModelsAndTheClosest) {
  auto server = Start("errors_models");
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  const grpc::Status typo = Infer(*stub, "dmeo", 4, false);
  EXPECT_EQ(typo.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(typo.error_message(),
            "model: 'dmeo' is not served; models: demo, small (did you mean 'demo'?)");
  const grpc::Status far = Infer(*stub, "bert", 4, false);
  EXPECT_EQ(far.error_message(), "model: 'bert' is not served; models: demo, small");
  server->Drain();
}

TEST(ErrorsNameTheFixTest, TokenRefusalsSayHowClientsSendATokenAndListOnlyTheCallersModels) {
  const std::string tokens =
      ::testing::TempDir() + "/errors_token_file_" + std::to_string(getpid());
  std::ofstream(tokens) << testing::HashHex("small-secret") << " alice small\n";
  auto server =
      Start("errors_tokens", [&](server::ServerOptions& o) { o.auth_tokens_file = tokens; });
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->InProcessChannel());
  const grpc::Status missing = Infer(*stub, "small", 4, false);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("--token_file"));
  EXPECT_THAT(missing.error_message(), HasSubstr("token="));
  EXPECT_THAT(missing.error_message(), HasSubstr("ATTENTION_TOKEN"));
  const grpc::Status unknown = Infer(*stub, "small", 4, false, "wrong-secret");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(unknown.error_message(), HasSubstr("--auth_tokens_file"));
  // A typo of a token limited to "small": its own models only, never "demo".
  const grpc::Status typo = Infer(*stub, "smal", 4, false, "small-secret");
  EXPECT_EQ(typo.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(typo.error_message(), HasSubstr("models: small (did you mean 'small'?)"));
  EXPECT_THAT(typo.error_message(), Not(HasSubstr("demo")));
  server->Drain();
  std::remove(tokens.c_str());
}

}  // namespace
}  // namespace attention
