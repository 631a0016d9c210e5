// TLS, mutual TLS, certificate rotation and bearer tokens, end to end over
// loopback with in-process servers. Certificates are made at test time
// (tests/test_certificates.h).
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "server/security/tls_identity_watcher.h"
#include "server/security/token_authenticator.h"
#include "tests/server_test_util.h"
#include "tests/test_certificates.h"
#include "tests/test_util.h"

namespace attention {
namespace {

using ::attention::server::AttentionServer;
using ::attention::server::ServerOptions;
using ::attention::server::TokenAuthenticator;
using ::testing::HasSubstr;

std::string TestDir() {
  return ::testing::TempDir() + "/security_test_" + std::to_string(getpid());
}

// Two small models, "small" and "other", in a repository made once.
std::string ModelRepository() {
  static const std::string dir = [] {
    const std::string d = TestDir() + "/models";
    std::filesystem::remove_all(d);
    testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 1), d + "/small");
    testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 2), d + "/other");
    return d;
  }();
  return dir;
}

std::unique_ptr<AttentionServer> StartServer(const std::function<void(ServerOptions&)>& tweak) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.max_message_bytes = 1 << 20;
  options.repository.path = ModelRepository();
  options.repository.default_model = "small";
  options.repository.compute_threads = 1;
  options.repository.warmup = false;
  tweak(options);
  auto server = AttentionServer::Listen(options);
  if (!server.ok()) {
    ADD_FAILURE() << server.status();
    return nullptr;
  }
  const absl::Status loaded = (*server)->LoadModels();
  EXPECT_TRUE(loaded.ok()) << loaded;
  return *std::move(server);
}

std::string Target(const AttentionServer& server) {
  return "127.0.0.1:" + std::to_string(server.port());
}

// TLS credentials trusting `ca_pem`, with an optional client certificate.
std::shared_ptr<grpc::Channel> TlsChannel(const std::string& target, const std::string& ca_pem,
                                          const std::string& cert_pem = "",
                                          const std::string& key_pem = "") {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca_pem;
  ssl.pem_cert_chain = cert_pem;
  ssl.pem_private_key = key_pem;
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  // Each test's channel is its own connection (no subchannel sharing), so a
  // rotated server certificate is seen by the next channel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
}

std::shared_ptr<grpc::Channel> PlainChannel(const std::string& target) {
  return grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
}

v1::InferRequest SmallRequest(const std::string& model) {
  std::mt19937 rng(7);
  v1::InferRequest request;
  request.set_model(model);
  testing::ToProto(testing::RandomTensor({1, 3, 16}, rng), request.mutable_query());
  return request;
}

// Infer on `channel` with an optional bearer `token`.
grpc::Status Infer(const std::shared_ptr<grpc::Channel>& channel, const std::string& model = "",
                   const std::string& token = "") {
  auto stub = v1::AttentionService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  v1::InferResponse response;
  grpc::Status status = stub->Infer(&context, SmallRequest(model), &response);
  if (status.ok()) {
    EXPECT_EQ(response.output().shape_size(), 3);
  }
  return status;
}

// Polls `probe` until it returns true or `timeout` passes.
bool Eventually(const std::function<bool()>& probe, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (probe()) return true;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return probe();
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new testing::TestCertificates(TestDir() + "/certs");
    ASSERT_TRUE(certs_->ok()) << certs_->error();
  }
  static void TearDownTestSuite() { delete certs_; }

  static testing::TestCertificates* certs_;
};
testing::TestCertificates* SecurityTest::certs_ = nullptr;

TEST_F(SecurityTest, TlsServesClientsTrustingItsCaOnly) {
  auto server = StartServer([](ServerOptions& o) {
    o.tls.cert_file = certs_->Path("server-ca1.pem");
    o.tls.key_file = certs_->Path("server-ca1.key");
  });
  ASSERT_NE(server, nullptr);
  const std::string target = Target(*server);
  EXPECT_TRUE(Infer(TlsChannel(target, certs_->Read("ca1.pem"))).ok());
  // A client trusting another CA, and a plaintext client, are refused.
  EXPECT_EQ(Infer(TlsChannel(target, certs_->Read("ca2.pem"))).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Infer(PlainChannel(target)).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, MutualTlsNeedsAClientCertificateFromTheClientCa) {
  auto server = StartServer([](ServerOptions& o) {
    o.tls.cert_file = certs_->Path("server-ca1.pem");
    o.tls.key_file = certs_->Path("server-ca1.key");
    o.tls.client_ca_file = certs_->Path("ca1.pem");
  });
  ASSERT_NE(server, nullptr);
  const std::string target = Target(*server);
  const std::string ca = certs_->Read("ca1.pem");
  EXPECT_TRUE(
      Infer(TlsChannel(target, ca, certs_->Read("client-ca1.pem"), certs_->Read("client-ca1.key")))
          .ok());
  EXPECT_EQ(Infer(TlsChannel(target, ca)).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "no client certificate";
  EXPECT_EQ(
      Infer(TlsChannel(target, ca, certs_->Read("client-ca2.pem"), certs_->Read("client-ca2.key")))
          .error_code(),
      grpc::StatusCode::UNAVAILABLE)
      << "a client certificate from another CA";
}

TEST_F(SecurityTest, RotatedCertificateIsServedWithoutRestart) {
  const std::string dir = TestDir() + "/rotation";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(certs_->Path("server-ca1.pem"), dir + "/tls.crt",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(certs_->Path("server-ca1.key"), dir + "/tls.key",
                             std::filesystem::copy_options::overwrite_existing);
  auto server = StartServer([&](ServerOptions& o) {
    o.tls.cert_file = dir + "/tls.crt";
    o.tls.key_file = dir + "/tls.key";
    o.tls.reload_interval_s = 1;
  });
  ASSERT_NE(server, nullptr);
  const std::string target = Target(*server);
  ASSERT_TRUE(Infer(TlsChannel(target, certs_->Read("ca1.pem"))).ok());
  // Rotate to a certificate from the other CA, each file replaced by rename.
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"server-ca2.key", "tls.key"},
                                 {"server-ca2.pem", "tls.crt"}}) {
    std::filesystem::copy_file(certs_->Path(from), dir + "/" + to + ".new",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(dir + "/" + to + ".new", dir + "/" + to);
  }
  EXPECT_TRUE(Eventually([&] { return Infer(TlsChannel(target, certs_->Read("ca2.pem"))).ok(); },
                         absl::Seconds(30)))
      << "the new certificate was not served";
  EXPECT_EQ(Infer(TlsChannel(target, certs_->Read("ca1.pem"))).error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "the old certificate is still served";
}

TEST_F(SecurityTest, StartUpErrorsNameTheFlag) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.tls.key_file = certs_->Path("server-ca1.key");
  EXPECT_THAT(AttentionServer::Listen(options).status().message(),
              HasSubstr("--tls_cert_file is not"));
  options.tls.cert_file = certs_->Path("missing.pem");
  EXPECT_EQ(AttentionServer::Listen(options).status().code(), absl::StatusCode::kNotFound);
  options.tls.cert_file = certs_->Path("server-ca1.key");  // A key where a certificate goes.
  EXPECT_THAT(AttentionServer::Listen(options).status().message(),
              HasSubstr("is not a PEM CERTIFICATE"));
  options = ServerOptions();
  options.metrics_port = 0;
  options.auth_tokens_file = certs_->Path("missing.tokens");
  EXPECT_EQ(AttentionServer::Listen(options).status().code(), absl::StatusCode::kNotFound);
}

// A key that is not the certificate's: refused at start-up naming both files
// (before, the server started and every handshake failed).
TEST_F(SecurityTest, StartUpRefusesAKeyThatIsNotTheCertificates) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.tls.cert_file = certs_->Path("server-ca1.pem");
  options.tls.key_file = certs_->Path("client-ca1.key");
  const absl::Status status = AttentionServer::Listen(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--tls_key_file: '" + certs_->Path("client-ca1.key") +
                                          "' is not the private key of the certificate in "
                                          "--tls_cert_file '" +
                                          certs_->Path("server-ca1.pem") + "'"));
}

// A key replaced by one that does not match the certificate is refused at
// reload: the pair in force stays served. (Before, gRPC's file watcher
// installed the pair and every new connection failed.) Then a matching pair
// is served.
TEST_F(SecurityTest, MismatchedKeyOnReloadKeepsThePairInForce) {
  const std::string dir = TestDir() + "/mismatch";
  std::filesystem::create_directories(dir);
  auto replace = [&](const std::string& from, const std::string& to) {
    std::filesystem::copy_file(certs_->Path(from), dir + "/" + to + ".new",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(dir + "/" + to + ".new", dir + "/" + to);
  };
  replace("server-ca1.pem", "tls.crt");
  replace("server-ca1.key", "tls.key");
  auto server = StartServer([&](ServerOptions& o) {
    o.tls.cert_file = dir + "/tls.crt";
    o.tls.key_file = dir + "/tls.key";
    o.tls.reload_interval_s = 1;
  });
  ASSERT_NE(server, nullptr);
  const std::string target = Target(*server);
  ASSERT_TRUE(Infer(TlsChannel(target, certs_->Read("ca1.pem"))).ok());
  replace("server-ca2.key", "tls.key");  // The certificate stays ca1's.
  // Three reload intervals: a reload that took the pair would have by now.
  absl::SleepFor(absl::Seconds(3));
  const grpc::Status kept = Infer(TlsChannel(target, certs_->Read("ca1.pem")));
  EXPECT_TRUE(kept.ok()) << "the mismatched pair was installed: " << kept.error_message();
  replace("server-ca2.pem", "tls.crt");  // Now a matching pair.
  EXPECT_TRUE(Eventually([&] { return Infer(TlsChannel(target, certs_->Read("ca2.pem"))).ok(); },
                         absl::Seconds(30)))
      << "the matching pair was not served";
}

// The watcher itself: what gRPC reads (path()) changes only to matching pairs.
TEST_F(SecurityTest, IdentityWatcherInstallsOnlyMatchingPairs) {
  using ::attention::server::TlsIdentityWatcher;
  const std::string dir = TestDir() + "/watcher";
  std::filesystem::create_directories(dir);
  auto replace = [&](const std::string& from, const std::string& to) {
    std::filesystem::copy_file(certs_->Path(from), dir + "/" + to + ".new",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(dir + "/" + to + ".new", dir + "/" + to);
  };
  auto served = [](const TlsIdentityWatcher& w) {
    std::ifstream in(w.path(), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  replace("server-ca1.pem", "tls.crt");
  replace("server-ca1.key", "tls.key");
  auto watcher =
      TlsIdentityWatcher::Start(dir + "/tls.crt", dir + "/tls.key", absl::Milliseconds(20));
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  const std::string first = served(**watcher);
  EXPECT_THAT(first, HasSubstr(certs_->Read("server-ca1.pem")));
  EXPECT_THAT(first, HasSubstr(certs_->Read("server-ca1.key")));
  replace("server-ca2.key", "tls.key");
  ASSERT_TRUE(Eventually([&] { return (*watcher)->refused() > 0; }, absl::Seconds(20)));
  EXPECT_EQ(served(**watcher), first) << "a mismatched pair replaced the one in force";
  replace("server-ca2.pem", "tls.crt");
  ASSERT_TRUE(Eventually([&] { return (*watcher)->installed() > 0; }, absl::Seconds(20)));
  EXPECT_THAT(served(**watcher), HasSubstr(certs_->Read("server-ca2.pem")));
  EXPECT_THAT(served(**watcher), HasSubstr(certs_->Read("server-ca2.key")));
  EXPECT_EQ(TlsIdentityWatcher::CheckPair(certs_->Read("server-ca1.pem"),
                                          certs_->Read("server-ca2.key"), "c.pem", "k.pem")
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Bearer tokens.

std::string HashHex(const std::string& token) {
  const TokenAuthenticator::Sha256 h = TokenAuthenticator::Hash(token);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(h.data()), 32));
}

void WriteTokens(const std::string& path, const std::string& text) {
  // Replaced by rename, as a Kubernetes Secret update does.
  {
    std::ofstream out(path + ".new");
    out << text;
  }
  std::filesystem::rename(path + ".new", path);
}

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

TEST_F(SecurityTest, ProbesCanNeedATokenToo) {
  const std::string tokens = TestDir() + "/probe_tokens";
  WriteTokens(tokens, HashHex("probe-secret") + " probe *\n");
  auto server = StartServer([&](ServerOptions& o) {
    o.auth_tokens_file = tokens;
    o.auth_probes = true;
  });
  ASSERT_NE(server, nullptr);
  auto health = grpc::health::v1::Health::NewStub(PlainChannel(Target(*server)));
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext anonymous;
  EXPECT_EQ(
      health->Check(&anonymous, grpc::health::v1::HealthCheckRequest(), &response).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext with_token;
  with_token.AddMetadata("authorization", "Bearer probe-secret");
  ASSERT_TRUE(health->Check(&with_token, grpc::health::v1::HealthCheckRequest(), &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
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
TEST_F(SecurityTest, ClientCliAndHealthScriptSpeakMutualTlsWithTokens) {
  const std::string tokens = TestDir() + "/cli_tokens";
  WriteTokens(tokens, HashHex("cli-secret") + " cli small\n");
  const std::string token_file = TestDir() + "/cli_token";
  {
    std::ofstream out(token_file);
    out << "cli-secret\n";
  }
  auto server = StartServer([&](ServerOptions& o) {
    o.tls.cert_file = certs_->Path("server-ca1.pem");
    o.tls.key_file = certs_->Path("server-ca1.key");
    o.tls.client_ca_file = certs_->Path("ca1.pem");
    o.auth_tokens_file = tokens;
  });
  ASSERT_NE(server, nullptr);
  const std::string tls =
      " --server=127.0.0.1:" + std::to_string(server->port()) +
      " --tls_ca_file=" + certs_->Path("ca1.pem") +
      " --tls_server_name=localhost --tls_cert_file=" + certs_->Path("client-ca1.pem") +
      " --tls_key_file=" + certs_->Path("client-ca1.key");
  const std::string client = ATTENTION_CLIENT_BINARY;
  std::string out;
  ASSERT_EQ(testing::RunCommand(client + " models" + tls + " --token_file=" + token_file, &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("small"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("other"))) << "listed a model the token may not use";
  ASSERT_EQ(testing::RunCommand(
                "ATTENTION_TOKEN=cli-secret " + client + " infer --model=small" + tls, &out),
            0)
      << out;
  EXPECT_NE(testing::RunCommand(client + " infer --model=small" + tls, &out), 0);
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
  EXPECT_NE(testing::RunCommand(
                client + " infer --model=other" + tls + " --token_file=" + token_file, &out),
            0);
  EXPECT_THAT(out, HasSubstr("PERMISSION_DENIED"));
  // The image's HEALTHCHECK script, configured by environment.
  const std::string env = "ATTENTION_CLIENT=" + client +
                          " ATTENTION_PORT=" + std::to_string(server->port()) +
                          " ATTENTION_TLS_CA_FILE=" + certs_->Path("ca1.pem") +
                          " ATTENTION_TLS_CLIENT_CERT_FILE=" + certs_->Path("client-ca1.pem") +
                          " ATTENTION_TLS_CLIENT_KEY_FILE=" + certs_->Path("client-ca1.key");
  EXPECT_EQ(testing::RunCommand(env + " " + HEALTHCHECK_SCRIPT, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("SERVING"));
  EXPECT_NE(testing::RunCommand("ATTENTION_CLIENT=" + client + " ATTENTION_PORT=" +
                                    std::to_string(server->port()) + " " + HEALTHCHECK_SCRIPT,
                                &out),
            0)
      << "a plaintext health check of a TLS port";
}

}  // namespace
}  // namespace attention
