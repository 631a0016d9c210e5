// TLS, mutual TLS and certificate rotation (and probes and the CLI with
// tokens), end to end over loopback with in-process servers; token files
// themselves are server_tokens_test. Certificates are made at test time
// (tests/fixture/test_certificates.h).
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
#include "tests/fixture/security_test_fixture.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_certificates.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::testing::HasSubstr;
using namespace ::attention::security_test;  // NOLINT: the fixture's helpers.

TEST_F(SecurityTest, TlsServesClientsTrustingItsCaOnly) {
  auto server = StartServer([](ServerOptions& o) { ServeServerPair(*certs_, "ca1", o); });
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
    ServeServerPair(*certs_, "ca1", o);
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
  const RotatingPair pair(*certs_, TestDir() + "/rotation");
  pair.PlaceServerPair("ca1");
  auto server = StartServer([&](ServerOptions& o) { pair.ServeOn(o); });
  ASSERT_NE(server, nullptr);
  const std::string target = Target(*server);
  ASSERT_TRUE(Infer(TlsChannel(target, certs_->Read("ca1.pem"))).ok());
  // Rotate to a certificate from the other CA, each file replaced by rename.
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"server-ca2.key", "tls.key"},
                                 {"server-ca2.pem", "tls.crt"}}) {
    pair.Place(from, to);
  }
  EXPECT_TRUE(Eventually([&] { return Infer(TlsChannel(target, certs_->Read("ca2.pem"))).ok(); },
                         absl::Seconds(30)))
      << "the new certificate was not served";
  EXPECT_EQ(Infer(TlsChannel(target, certs_->Read("ca1.pem"))).error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "the old certificate is still served";
}

TEST_F(SecurityTest, StartUpErrorsNameTheFlag) {
  ServerOptions options = testing::TestServerOptions("");
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
  ServerOptions options = testing::TestServerOptions("");
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
  const RotatingPair pair(*certs_, TestDir() + "/mismatch");
  pair.PlaceServerPair("ca1");
  auto server = StartServer([&](ServerOptions& o) { pair.ServeOn(o); });
  ASSERT_NE(server, nullptr);
  const std::string target = Target(*server);
  ASSERT_TRUE(Infer(TlsChannel(target, certs_->Read("ca1.pem"))).ok());
  pair.Place("server-ca2.key", "tls.key");  // The certificate stays ca1's.
  // Three reload intervals: a reload that took the pair would have by now.
  absl::SleepFor(absl::Seconds(3));
  const grpc::Status kept = Infer(TlsChannel(target, certs_->Read("ca1.pem")));
  EXPECT_TRUE(kept.ok()) << "the mismatched pair was installed: " << kept.error_message();
  pair.Place("server-ca2.pem", "tls.crt");  // Now a matching pair.
  EXPECT_TRUE(Eventually([&] { return Infer(TlsChannel(target, certs_->Read("ca2.pem"))).ok(); },
                         absl::Seconds(30)))
      << "the matching pair was not served";
}

// The watcher itself: what gRPC reads (path()) changes only to matching pairs.
TEST_F(SecurityTest, IdentityWatcherInstallsOnlyMatchingPairs) {
  using ::attention::server::TlsIdentityWatcher;
  const RotatingPair pair(*certs_, TestDir() + "/watcher");
  auto served = [](const TlsIdentityWatcher& w) {
    std::ifstream in(w.path(), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  pair.PlaceServerPair("ca1");
  auto watcher = TlsIdentityWatcher::Start(pair.dir() + "/tls.crt", pair.dir() + "/tls.key",
                                           absl::Milliseconds(20));
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  const std::string first = served(**watcher);
  EXPECT_THAT(first, HasSubstr(certs_->Read("server-ca1.pem")));
  EXPECT_THAT(first, HasSubstr(certs_->Read("server-ca1.key")));
  pair.Place("server-ca2.key", "tls.key");
  ASSERT_TRUE(Eventually([&] { return (*watcher)->refused() > 0; }, absl::Seconds(20)));
  EXPECT_EQ(served(**watcher), first) << "a mismatched pair replaced the one in force";
  pair.Place("server-ca2.pem", "tls.crt");
  ASSERT_TRUE(Eventually([&] { return (*watcher)->installed() > 0; }, absl::Seconds(20)));
  EXPECT_THAT(served(**watcher), HasSubstr(certs_->Read("server-ca2.pem")));
  EXPECT_THAT(served(**watcher), HasSubstr(certs_->Read("server-ca2.key")));
  EXPECT_EQ(TlsIdentityWatcher::CheckPair(certs_->Read("server-ca1.pem"),
                                          certs_->Read("server-ca2.key"), "c.pem", "k.pem")
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Bearer tokens.

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

TEST_F(SecurityTest, ClientCliAndHealthScriptSpeakMutualTlsWithTokens) {
  const std::string tokens = TestDir() + "/cli_tokens";
  WriteTokens(tokens, HashHex("cli-secret") + " cli small\n");
  const std::string token_file = TestDir() + "/cli_token";
  {
    std::ofstream out(token_file);
    out << "cli-secret\n";
  }
  auto server = StartServer([&](ServerOptions& o) {
    ServeServerPair(*certs_, "ca1", o);
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
