// Tokens, TLS and mutual TLS on the REST port, with servers of their own:
// the same bearer tokens as gRPC (401 with WWW-Authenticate, 403 for another
// caller's model, probes open without --auth_probes) and the gRPC port's
// certificate files.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/attention_server.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/security_test_fixture.h"
#include "tests/fixture/test_certificates.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::security_test::RotatingPair;
using ::attention::security_test::ServeServerPair;
using ::attention::server::ServerOptions;
using json = nlohmann::json;

json Input(const std::string& name, const std::string& datatype, const Shape& shape, json data) {
  return json{{"name", name}, {"datatype", datatype}, {"shape", shape}, {"data", std::move(data)}};
}

// Tokens and TLS on the REST port: servers of their own.
class RestSecurityTest : public ::testing::Test {
 protected:
  static std::string Dir() {
    return ::testing::TempDir() + "/rest_security_test_" + std::to_string(getpid());
  }
  static std::unique_ptr<server::AttentionServer> Start(
      const std::function<void(ServerOptions&)>& tweak) {
    const std::string models = Dir() + "/models";
    if (!std::filesystem::exists(models)) {
      testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 1),
                             models + "/small");
      testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 2),
                             models + "/other");
    }
    ServerOptions o = testing::TestServerOptions(models, /*rest=*/true);
    o.drain_grace = absl::Milliseconds(500);
    tweak(o);
    return testing::StartServer(o);
  }
  static std::string Body() {
    return json{{"inputs", {Input("query", "FP32", {1, 1, 16}, std::vector<float>(16, 1.f))}}}
        .dump();
  }
};

TEST_F(RestSecurityTest, BearerTokensAsOverGrpc) {
  std::filesystem::create_directories(Dir());
  const std::string tokens = Dir() + "/tokens";
  {
    std::ofstream out(tokens);
    out << testing::HashHex("alice-secret") << " alice small\n";
  }
  auto server = Start([&](ServerOptions& o) { o.auth_tokens_file = tokens; });
  ASSERT_NE(server, nullptr);
  testing::HttpTestClient client("127.0.0.1", server->http_port());
  auto res = client.Post("/v2/models/small/infer", Body(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(res->Header("WWW-Authenticate"), "Bearer");
  EXPECT_THAT(res->body, ::testing::HasSubstr("error"));
  testing::HttpTestHeaders bad = {{"Authorization", "Bearer wrong"}};
  EXPECT_EQ(client.Post("/v2/models/small/infer", bad, Body(), "application/json")->status, 401);
  testing::HttpTestHeaders alice = {{"Authorization", "Bearer alice-secret"}};
  res = client.Post("/v2/models/small/infer", alice, Body(), "application/json");
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(client.Post("/v2/models/other/infer", alice, Body(), "application/json")->status, 403);
  EXPECT_EQ(client.Get("/v2/models/other/config", alice)->status, 403);
  EXPECT_EQ(client.Get("/v2/models/small/config")->status, 401);
  // Probes stay open without --auth_probes, as over gRPC.
  EXPECT_EQ(client.Get("/v2/health/ready")->status, 200);
  res = client.Get("/v2/models/stats", alice);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["model_stats"].size(), 1u);  // Only alice's model.
}

TEST_F(RestSecurityTest, TlsOnTheRestPortWithTheGrpcPortsCertificate) {
  testing::TestCertificates certs(Dir() + "/certs");
  ASSERT_TRUE(certs.ok()) << certs.error();
  auto server = Start([&](ServerOptions& o) { ServeServerPair(certs, "ca1", o); });
  ASSERT_NE(server, nullptr);
  testing::HttpTestClient trusting("localhost", server->http_port(),
                                   testing::HttpTestTls{certs.Path("ca1.pem")});
  auto res = trusting.Post("/v2/models/small/infer", Body(), "application/json");
  ASSERT_TRUE(res) << res.error();
  EXPECT_EQ(res->status, 200) << res->body;
  testing::HttpTestClient other_ca("localhost", server->http_port(),
                                   testing::HttpTestTls{certs.Path("ca2.pem")});
  EXPECT_FALSE(other_ca.Get("/v2/health/live"));
  testing::HttpTestClient plain("127.0.0.1", server->http_port());
  const auto plain_res = plain.Get("/v2/health/live");
  EXPECT_TRUE(!plain_res || plain_res->status != 200);
}

TEST_F(RestSecurityTest, MutualTlsNeedsAClientCertificate) {
  testing::TestCertificates certs(Dir() + "/mcerts");
  ASSERT_TRUE(certs.ok()) << certs.error();
  auto server = Start([&](ServerOptions& o) {
    ServeServerPair(certs, "ca1", o);
    o.tls.client_ca_file = certs.Path("ca1.pem");
  });
  ASSERT_NE(server, nullptr);
  testing::HttpTestClient with_cert(
      "localhost", server->http_port(),
      testing::HttpTestTls{certs.Path("ca1.pem"), certs.Path("client-ca1.pem"),
                           certs.Path("client-ca1.key")});
  auto res = with_cert.Post("/v2/models/small/infer", Body(), "application/json");
  ASSERT_TRUE(res) << res.error();
  EXPECT_EQ(res->status, 200);
  testing::HttpTestClient without("localhost", server->http_port(),
                                  testing::HttpTestTls{certs.Path("ca1.pem")});
  EXPECT_FALSE(without.Get("/v2/health/live"));
}

// The client CA file is re-read while serving, as gRPC's provider re-reads
// it: once it names another CA, clients that CA signed are let in and the
// old CA's are not. (cpp-httplib read it once, at start.)
TEST_F(RestSecurityTest, AChangedClientCaIsReReadOnTheRestPort) {
  testing::TestCertificates certs(Dir() + "/cacerts");
  ASSERT_TRUE(certs.ok()) << certs.error();
  const std::string ca_file = Dir() + "/rest-client-ca.pem";
  std::ofstream(ca_file) << certs.Read("ca1.pem");
  auto server = Start([&](ServerOptions& o) {
    ServeServerPair(certs, "ca1", o);
    o.tls.client_ca_file = ca_file;
  });
  ASSERT_NE(server, nullptr);
  auto live = [&](const std::string& client) {
    testing::HttpTestClient c(
        "localhost", server->http_port(),
        testing::HttpTestTls{certs.Path("ca1.pem"), certs.Path(client + ".pem"),
                             certs.Path(client + ".key")});
    auto res = c.Get("/v2/health/live");
    return res && res->status == 200;
  };
  ASSERT_TRUE(live("client-ca1"));
  ASSERT_FALSE(live("client-ca2"));
  // Replaced in one step by ca2, with a later mtime.
  std::ofstream(ca_file + ".next") << certs.Read("ca2.pem");
  std::filesystem::rename(ca_file + ".next", ca_file);
  std::filesystem::last_write_time(
      ca_file, std::filesystem::last_write_time(ca_file) + std::chrono::seconds(2));
  // Read at a handshake once a second has passed since the last check
  // (bounded at 20 s).
  bool in = false;
  for (int i = 0; i < 100 && !(in = live("client-ca2")); ++i) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(in) << "the REST port still verifies against the old client CA";
  EXPECT_FALSE(live("client-ca1"));
}

// One mutual-TLS GET /v2/health/live with OpenSSL itself (HttpTestClient
// does not resume sessions), as curl, browsers and most HTTP libraries do on
// their next connection: offers `resume` when given. Returns the status (0:
// no answer, the handshake failed); `*session` is the connection's session
// (the caller frees it), `*reused` whether `resume` was resumed.
int ResumingGet(int port, const testing::TestCertificates& certs, const std::string& client,
                SSL_SESSION* resume, SSL_SESSION** session, bool* reused) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_load_verify_locations(ctx, certs.Path("ca1.pem").c_str(), nullptr);
  SSL_CTX_use_certificate_chain_file(ctx, certs.Path(client + ".pem").c_str());
  SSL_CTX_use_PrivateKey_file(ctx, certs.Path(client + ".key").c_str(), SSL_FILETYPE_PEM);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  int status = 0;
  SSL* ssl = SSL_new(ctx);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0) {
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, "localhost");
    if (resume != nullptr) SSL_set_session(ssl, resume);
    if (SSL_connect(ssl) == 1) {
      const std::string request = "GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n";
      SSL_write(ssl, request.data(), static_cast<int>(request.size()));
      std::string answer;
      char buffer[4096];
      int n;
      // The head only (the answer has no body); the connection is kept, and
      // closed by this client (a read to the server's close would end in an
      // error: it sends no close_notify, and OpenSSL drops the session).
      while (answer.find("\r\n\r\n") == std::string::npos &&
             (n = SSL_read(ssl, buffer, sizeof(buffer))) > 0) {
        answer.append(buffer, n);
      }
      if (answer.rfind("HTTP/1.1 ", 0) == 0) status = std::atoi(answer.c_str() + 9);
      *reused = SSL_session_reused(ssl) == 1;
      *session = SSL_get1_session(ssl);  // After the answer: TLS 1.3's ticket came first.
      SSL_shutdown(ssl);                 // Else OpenSSL marks the session not resumable.
    }
  }
  SSL_free(ssl);
  close(fd);
  SSL_CTX_free(ctx);
  return status;
}

// A client that resumes its TLS session on its next connection (TLS 1.2's
// session id or ticket, TLS 1.3's ticket) failed the handshake on the REST
// port with mutual TLS: OpenSSL refuses to resume, with an "internal error"
// alert, when peers are verified and no session id context is set
// (SSL_R_SESSION_ID_CONTEXT_UNINITIALIZED). And once the client CA file
// changes, a session made under the old CAs must not be resumed: its client
// certificate was never checked against the CAs in force.
TEST_F(RestSecurityTest, AResumedTlsSessionIsServedUnderMutualTlsUntilTheClientCaChanges) {
  testing::TestCertificates certs(Dir() + "/resume");
  ASSERT_TRUE(certs.ok()) << certs.error();
  const std::string ca_file = Dir() + "/resume-client-ca.pem";
  std::ofstream(ca_file) << certs.Read("ca1.pem");
  auto server = Start([&](ServerOptions& o) {
    ServeServerPair(certs, "ca1", o);
    o.tls.client_ca_file = ca_file;
  });
  ASSERT_NE(server, nullptr);
  SSL_SESSION* first = nullptr;
  bool reused = false;
  ASSERT_EQ(ResumingGet(server->http_port(), certs, "client-ca1", nullptr, &first, &reused), 200);
  ASSERT_NE(first, nullptr);
  ASSERT_EQ(SSL_SESSION_is_resumable(first), 1) << "the server gave no session to resume";
  SSL_SESSION* second = nullptr;
  EXPECT_EQ(ResumingGet(server->http_port(), certs, "client-ca1", first, &second, &reused), 200)
      << "a resumed session's handshake failed";
  EXPECT_TRUE(reused);
  SSL_SESSION_free(second);
  // The CA file now names ca2 only: client-ca1's session is not resumed (a
  // full handshake, whose certificate ca2 did not sign, fails).
  std::ofstream(ca_file + ".next") << certs.Read("ca2.pem");
  std::filesystem::rename(ca_file + ".next", ca_file);
  std::filesystem::last_write_time(
      ca_file, std::filesystem::last_write_time(ca_file) + std::chrono::seconds(2));
  // Read at a handshake once a second has passed since the last check
  // (bounded at 20 s): until then client-ca1 is still let in.
  int status = 200;
  for (int i = 0; i < 100 && status == 200; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    SSL_SESSION* next = nullptr;
    status = ResumingGet(server->http_port(), certs, "client-ca1", first, &next, &reused);
    if (next != nullptr) SSL_SESSION_free(next);
  }
  EXPECT_EQ(status, 0) << "a session made under the old client CA was resumed";
  SSL_SESSION_free(first);
}

// RFC 8446 6.1: each side sends close_notify before it closes. The REST port
// closed the socket under TLS without it: a client that reads its
// "Connection: close" answer to the end got an error (OpenSSL 3: "unexpected
// eof while reading"; Python's ssl: SSLEOFError) instead of the end, and
// OpenSSL dropped its session (no resumption on the next connection).
TEST_F(RestSecurityTest, TheRestPortEndsATlsConnectionWithCloseNotify) {
  testing::TestCertificates certs(Dir() + "/notify");
  ASSERT_TRUE(certs.ok()) << certs.error();
  auto server = Start([&](ServerOptions& o) { ServeServerPair(certs, "ca1", o); });
  ASSERT_NE(server, nullptr);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_load_verify_locations(ctx, certs.Path("ca1.pem").c_str(), nullptr);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server->http_port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  SSL_set_tlsext_host_name(ssl, "localhost");
  ASSERT_EQ(SSL_connect(ssl), 1);
  const std::string request =
      "GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  SSL_write(ssl, request.data(), static_cast<int>(request.size()));
  std::string answer;
  char buffer[4096];
  int n;
  while ((n = SSL_read(ssl, buffer, sizeof(buffer))) > 0) answer.append(buffer, n);
  const int error = SSL_get_error(ssl, n);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  EXPECT_EQ(error, SSL_ERROR_ZERO_RETURN) << "the connection ended without close_notify";
  SSL_free(ssl);
  close(fd);
  SSL_CTX_free(ctx);
}

// A rotated certificate is served on the REST port too, without a restart
// (the REST port re-reads the pair gRPC's watcher holds), and a key that does
// not match the new certificate is not installed on either port.
TEST_F(RestSecurityTest, ARotatedCertificateIsServedOnTheRestPortWithoutRestart) {
  testing::TestCertificates certs(Dir() + "/rcerts");
  ASSERT_TRUE(certs.ok()) << certs.error();
  const RotatingPair pair(certs, Dir() + "/rotation");
  pair.PlaceServerPair("ca1");
  auto server = Start([&](ServerOptions& o) { pair.ServeOn(o); });
  ASSERT_NE(server, nullptr);
  auto live_with_ca = [&](const std::string& ca) {
    testing::HttpTestClient client("localhost", server->http_port(),
                                   testing::HttpTestTls{certs.Path(ca)});
    auto res = client.Get("/v2/health/live");
    return res && res->status == 200;
  };
  ASSERT_TRUE(live_with_ca("ca1.pem"));
  ASSERT_FALSE(live_with_ca("ca2.pem"));

  // A certificate of the other CA with a key that is not its own: refused.
  pair.Place("server-ca2.pem", "tls.crt");
  pair.Place("client-ca1.key", "tls.key");
  // Then the matching pair.
  absl::SleepFor(absl::Seconds(2));  // Two watcher checks see the mismatched pair.
  EXPECT_TRUE(live_with_ca("ca1.pem")) << "a mismatched pair replaced the one in force";
  pair.Place("server-ca2.key", "tls.key");
  const absl::Time bound = absl::Now() + absl::Seconds(30);
  bool rotated = false;
  while (!(rotated = live_with_ca("ca2.pem")) && absl::Now() < bound) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(rotated) << "the new certificate was not served on the REST port";
  EXPECT_FALSE(live_with_ca("ca1.pem")) << "the old certificate is still served";
}

// Handshakes from several clients at once while the pair rotates (back and
// forth between two CAs' certificates), with mutual TLS: OpenSSL's
// certificate callback runs on every connection's thread and hands each the
// pair in force while the file is re-read; every handshake of a client that
// trusts both CAs succeeds, and its client certificate is still checked.
TEST_F(RestSecurityTest, ConcurrentMutualTlsHandshakesWhileThePairRotates) {
  testing::TestCertificates certs(Dir() + "/ccerts");
  ASSERT_TRUE(certs.ok()) << certs.error();
  const RotatingPair pair(certs, Dir() + "/crotation");
  {
    std::ofstream both(pair.dir() + "/both-cas.pem");
    for (const char* ca : {"ca1.pem", "ca2.pem"}) both << std::ifstream(certs.Path(ca)).rdbuf();
  }
  pair.PlaceServerPair("ca1");
  auto server = Start([&](ServerOptions& o) {
    pair.ServeOn(o);
    o.tls.client_ca_file = certs.Path("ca1.pem");
    o.http_io_threads = 2;
  });
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  auto live = [&](const std::string& ca, bool with_cert) {
    testing::HttpTestTls tls{ca};
    if (with_cert) {
      tls.cert_file = certs.Path("client-ca1.pem");
      tls.key_file = certs.Path("client-ca1.key");
    }
    auto client = std::make_unique<testing::HttpTestClient>("localhost", port, tls);
    client->SetKeepAlive(false);  // A handshake for every request.
    auto res = client->Get("/v2/health/live");
    return res && res->status == 200;
  };
  std::atomic<bool> done{false};
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&] {
      while (!done.load()) (live(pair.dir() + "/both-cas.pem", true) ? ok : failed)++;
    });
  }
  // ca1 -> ca2 -> ca1 -> ca2, each seen by a client that trusts only it.
  int seen = 0;
  for (const char* ca : {"ca2", "ca1", "ca2"}) {
    pair.PlaceServerPair(ca);
    const absl::Time bound = absl::Now() + absl::Seconds(30);
    bool rotated = false;
    while (!(rotated = live(certs.Path(absl::StrCat(ca, ".pem")), true)) && absl::Now() < bound) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_TRUE(rotated) << ca << " was not served";
    seen += rotated;
  }
  done = true;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(seen, 3);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(failed.load(), 0) << "handshakes failed during rotation (of " << ok.load() << " ok)";
  // After the rotations the client certificate is still required.
  EXPECT_FALSE(live(pair.dir() + "/both-cas.pem", false));
  EXPECT_TRUE(live(pair.dir() + "/both-cas.pem", true));
}

}  // namespace
}  // namespace attention
