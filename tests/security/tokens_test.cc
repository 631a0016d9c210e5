// Bearer tokens end to end over loopback with an in-process server: missing
// or wrong tokens, models outside a token's list, sessions owned by their
// creator, refusals counted without exposing tokens, token files rotated
// without a restart, and parse errors naming the line.
#include <grpcpp/grpcpp.h>

#include <string>

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/security_test_fixture.h"

namespace attention {
namespace {

using ::attention::server::AttentionServer;
using ::attention::server::ServerOptions;
using ::attention::server::TokenAuthenticator;
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

TEST(TokenFileTest, ParseErrorsNameTheLine) {
  EXPECT_THAT(TokenAuthenticator::Parse("abc alice *\n", "f").status().message(),
              HasSubstr("f:1: expected a SHA-256 hash of 64 hex digits"));
  const std::string hash = HashHex("x");
  EXPECT_THAT(TokenAuthenticator::Parse("# c\n\n" + hash + " alice\n", "f").status().message(),
              HasSubstr("f:3: expected 3 fields"));
  EXPECT_THAT(TokenAuthenticator::Parse(hash + " a *\n" + hash + " b *\n", "f").status().message(),
              HasSubstr("f:2: the same token hash as entry 'a'"));
  auto parsed = TokenAuthenticator::Parse(hash + " a m1,m2\n", "f");
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->size(), 1u);
  EXPECT_TRUE((*parsed)[0].principal->MayUse("m2"));
  EXPECT_FALSE((*parsed)[0].principal->MayUse("m3"));
}

// attention-client and the image's health check script over mutual TLS with
// a token, against an in-process server.
}  // namespace
}  // namespace attention
