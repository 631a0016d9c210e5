// Bearer tokens end to end over loopback with an in-process server: missing
// or wrong tokens, models outside a token's list, sessions owned by their
// creator, refusals counted without exposing tokens, token files rotated
// without a restart, and an empty model name resolved among a token's models.
// The token file itself: token_file_test.cc.
#include <grpcpp/grpcpp.h>

#include <random>
#include <string>

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/security_test_fixture.h"

namespace attention {
namespace {

using ::testing::HasSubstr;
using namespace ::attention::security_test;  // NOLINT: the fixture's helpers.

class TokenTest : public SecurityTest {
 protected:
  static void SetUpTestSuite() {
    SecurityTest::SetUpTestSuite();
    tokens_file_ = new std::string(TestDir() + "/tokens");
    WriteTokens(*tokens_file_, "# sha256  name  models\n" + HashHex("alice-secret") +
                                   " alice small\n" + HashHex("ops-secret") + "  ops  *\n");
    metrics_port_ = testing::FreePort();
    server_ = StartServer([](ServerOptions& o) {
                o.metrics_port = metrics_port_;
                o.auth_tokens_file = *tokens_file_;
                o.auth_reload_interval = absl::Milliseconds(100);
              }).release();
    ASSERT_NE(server_, nullptr);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete tokens_file_;
    SecurityTest::TearDownTestSuite();
  }
  std::shared_ptr<grpc::Channel> Channel() { return PlainChannel(Target(*server_)); }

  static AttentionServer* server_;
  static std::string* tokens_file_;
  static int metrics_port_;
};
AttentionServer* TokenTest::server_ = nullptr;
std::string* TokenTest::tokens_file_ = nullptr;
int TokenTest::metrics_port_ = 0;

TEST_F(TokenTest, MissingOrWrongTokensAreUnauthenticated) {
  EXPECT_EQ(Infer(Channel(), "small").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Infer(Channel(), "small", "guess").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Infer(Channel(), "nope", "guess").error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << "an unknown caller learns nothing about models";
  EXPECT_TRUE(Infer(Channel(), "small", "alice-secret").ok());
  EXPECT_TRUE(Infer(Channel(), "", "alice-secret").ok()) << "the default model is 'small'";
  EXPECT_TRUE(Infer(Channel(), "other", "ops-secret").ok());
}

TEST_F(TokenTest, ModelsOutsideTheTokensListAreDenied) {
  const grpc::Status denied = Infer(Channel(), "other", "alice-secret");
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(denied.error_message(), HasSubstr("'alice' may not use model 'other'"));
  EXPECT_EQ(Infer(Channel(), "nope", "alice-secret").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Infer(Channel(), "nope", "ops-secret").error_code(), grpc::StatusCode::NOT_FOUND);

  auto stub = v1::AttentionService::NewStub(Channel());
  grpc::ClientContext list_context;
  list_context.AddMetadata("authorization", "Bearer alice-secret");
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub->ListModels(&list_context, v1::ListModelsRequest(), &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).name(), "small");
  grpc::ClientContext get_context;
  get_context.AddMetadata("authorization", "Bearer alice-secret");
  v1::GetModelRequest get;
  get.set_name("other");
  v1::ModelInfo info;
  EXPECT_EQ(stub->GetModel(&get_context, get, &info).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // Health stays open for probes.
  auto health = grpc::health::v1::Health::NewStub(Channel());
  grpc::ClientContext health_context;
  grpc::health::v1::HealthCheckResponse serving;
  ASSERT_TRUE(
      health->Check(&health_context, grpc::health::v1::HealthCheckRequest(), &serving).ok());
  EXPECT_EQ(serving.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(TokenTest, SessionsBelongToTheirCreator) {
  auto stub = v1::SessionService::NewStub(Channel());
  grpc::ClientContext create_context;
  create_context.AddMetadata("authorization", "Bearer alice-secret");
  v1::CreateSessionRequest create;
  create.set_model("small");
  create.set_kind(v1::SESSION_KIND_SELF);
  v1::SessionInfo session;
  const grpc::Status created = stub->CreateSession(&create_context, create, &session);
  ASSERT_TRUE(created.ok()) << created.error_message();
  std::mt19937 rng(3);
  v1::AppendRequest append;
  append.set_session_id(session.session_id());
  testing::ToProto(testing::RandomTensor({2, 16}, rng), append.mutable_tokens());
  for (const auto& [token, code] :
       {std::pair<std::string, grpc::StatusCode>{"ops-secret", grpc::StatusCode::PERMISSION_DENIED},
        {"", grpc::StatusCode::UNAUTHENTICATED},
        {"alice-secret", grpc::StatusCode::OK}}) {
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    v1::AppendResponse response;
    EXPECT_EQ(stub->Append(&context, append, &response).error_code(), code) << token;
  }
  grpc::ClientContext close_context;
  close_context.AddMetadata("authorization", "Bearer alice-secret");
  v1::CloseSessionRequest close;
  close.set_session_id(session.session_id());
  v1::CloseSessionResponse closed;
  EXPECT_TRUE(stub->CloseSession(&close_context, close, &closed).ok());
}

TEST_F(TokenTest, RefusalsAreCountedAndTokensNeverExposed) {
  ASSERT_EQ(Infer(Channel(), "small", "not-a-token").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_EQ(Infer(Channel(), "other", "alice-secret").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  const std::string text = testing::HttpGet(metrics_port_, "/metrics");
  EXPECT_GE(testing::MetricValue(text, "attention_refusals_total", {"code=\"UNAUTHENTICATED\""}),
            1);
  EXPECT_GE(testing::MetricValue(text, "attention_refusals_total", {"code=\"PERMISSION_DENIED\""}),
            1);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("secret")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("not-a-token")));
}

// Runs last in the suite: it changes the tokens.
TEST_F(TokenTest, ZRotatedTokensTakeEffectWithoutRestart) {
  ASSERT_TRUE(Infer(Channel(), "small", "alice-secret").ok());
  WriteTokens(*tokens_file_, HashHex("alice-rotated") + " alice small,other\n" +
                                 HashHex("ops-secret") + " ops *\n");
  EXPECT_TRUE(Eventually([&] { return Infer(Channel(), "other", "alice-rotated").ok(); },
                         absl::Seconds(20)));
  EXPECT_EQ(Infer(Channel(), "small", "alice-secret").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // A broken file keeps the tokens in force.
  WriteTokens(*tokens_file_, "not a token line\n");
  absl::SleepFor(absl::Milliseconds(500));  // Several reload intervals: nothing may change.
  EXPECT_TRUE(Infer(Channel(), "small", "alice-rotated").ok());
}

// An empty model name resolves among the caller's own models; a limited
// token never learns the server's default's name (issue 21, item 6). Models
// "small" (the default) and "wide" (E=48, kdim 20, vdim 28: Infer needs a key).
TEST(TokenModelTest, EmptyModelNameResolvesAmongTheCallersModels) {
  MhaSpec wide = testing::SelfAttentionSpec(48, 4);
  wide.kdim = 20;
  wide.vdim = 28;
  testing::ModelFolder models("token_models");
  models.Add("small", testing::SelfAttentionSpec(32, 4), 1, "\"max_session_tokens\": 8192");
  models.Add("wide", wide, 2);
  const std::string tokens = models.path() + "_tokens";
  WriteTokens(tokens, HashHex("bob-secret") + " bob wide\n");
  ServerOptions options = testing::TestServerOptions(models.path(), false, 2);
  options.drain_grace = absl::Milliseconds(500);
  options.repository.default_model = "small";
  options.sessions.memory_bytes = int64_t{256} << 20;
  options.max_message_bytes = 8 << 20;
  options.auth_tokens_file = tokens;
  auto server = testing::StartServer(options);
  ASSERT_NE(server, nullptr);
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
  testing::ToProto(testing::RandomTensor({1, 4, 48}, rng), request.mutable_query());
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
