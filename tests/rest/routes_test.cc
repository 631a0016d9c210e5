// REST routes a new user meets first (issue 38, wall 3): a path asked with
// the wrong method is 405 with Allow and says which method to use
// (`GET .../infer`: use POST); GET /v2/models lists the models with their
// versions and state (a model that failed to load, with its reason); the
// metrics port's `/` points to /metrics; plain http:// sent to a TLS REST
// port gets a plain-text 400 saying to use https://, not an empty reply; the
// REST port's `/` points to the API's paths and its `/metrics` to the
// metrics port.
#include <unistd.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/raw_http_connection.h"
#include "tests/fixture/server_test_util.h"
#include "tests/fixture/test_certificates.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::testing::HasSubstr;

// "demo" serves; "bad" has a config.json typo and does not load.
std::unique_ptr<server::AttentionServer> Start(
    const std::string& name, const std::function<void(server::ServerOptions&)>& tweak = {}) {
  testing::ModelFolder folder(name);
  folder.Add("demo", testing::SelfAttentionSpec(16, 2), 1)
      .Add("bad", testing::SelfAttentionSpec(16, 2), 2, "\"embeddim\": 16");
  server::ServerOptions options = testing::TestServerOptions(folder.path(), /*rest=*/true);
  if (tweak) tweak(options);
  return testing::StartServer(options);
}

TEST(RestRoutesTest, TheWrongMethodIs405NamingTheRightOne) {
  auto server = Start("routes_methods");
  ASSERT_NE(server, nullptr);
  testing::HttpTestClient http("127.0.0.1", server->http_port());
  const auto get_infer = http.Get("/v2/models/demo/infer");
  EXPECT_EQ(get_infer->status, 405) << get_infer->body;
  EXPECT_EQ(get_infer->Header("Allow"), "POST");
  EXPECT_THAT(get_infer->body, HasSubstr("use POST"));
  const auto get_index = http.Get("/v2/repository/index");
  EXPECT_EQ(get_index->status, 405) << get_index->body;
  EXPECT_EQ(get_index->Header("Allow"), "POST");
  const auto post_ready = http.Post("/v2/health/ready", "{}", "application/json");
  EXPECT_EQ(post_ready->status, 405) << post_ready->body;
  EXPECT_EQ(post_ready->Header("Allow"), "GET, HEAD");
  EXPECT_THAT(post_ready->body, HasSubstr("use GET"));
  EXPECT_EQ(http.Get("/v2/nothing")->status, 404);  // Unknown paths stay 404.
  server->Drain();
}

TEST(RestRoutesTest, GetModelsListsModelsVersionsAndState) {
  auto server = Start("routes_models");
  ASSERT_NE(server, nullptr);
  testing::HttpTestClient http("127.0.0.1", server->http_port());
  const auto listed = http.Get("/v2/models");
  ASSERT_EQ(listed->status, 200) << listed->body;
  const nlohmann::json models = nlohmann::json::parse(listed->body).at("models");
  ASSERT_EQ(models.size(), 2u) << listed->body;
  EXPECT_EQ(models[0].at("name"), "bad");
  EXPECT_EQ(models[0].at("state"), "UNAVAILABLE");
  EXPECT_THAT(models[0].at("reason").get<std::string>(), HasSubstr("embeddim"));
  EXPECT_EQ(models[1].at("name"), "demo");
  EXPECT_EQ(models[1].at("state"), "READY");
  EXPECT_EQ(models[1].at("versions"),
            nlohmann::json::parse(R"([{"version": "1", "state": "READY"}])"));
  server->Drain();
}

TEST(RestRoutesTest, TheMetricsPortsRootPointsToMetrics) {
  const int metrics_port = testing::FreePort();
  auto server =
      Start("routes_metrics", [&](server::ServerOptions& o) { o.metrics_port = metrics_port; });
  ASSERT_NE(server, nullptr);
  testing::HttpTestClient http("127.0.0.1", metrics_port);
  const auto root = http.Get("/");
  EXPECT_EQ(root->status, 200) << root->body;
  EXPECT_THAT(root->body, HasSubstr("/metrics"));
  const auto other = http.Get("/metric");
  EXPECT_EQ(other->status, 404);
  EXPECT_THAT(other->body, HasSubstr("/metrics"));
  const auto metrics = http.Get("/metrics");
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("attention_"));
  server->Drain();
}

// GET / on the REST port points to the API's paths; GET /metrics there is a
// 404 naming the metrics port and its flag.
TEST(RestRoutesTest, TheRootPointsToTheApiAndMetricsToTheMetricsPort) {
  const int metrics_port = testing::FreePort();
  auto server =
      Start("routes_root", [&](server::ServerOptions& o) { o.metrics_port = metrics_port; });
  ASSERT_NE(server, nullptr);
  testing::HttpTestClient http("127.0.0.1", server->http_port());
  const auto root = http.Get("/");
  EXPECT_EQ(root->status, 200) << root->body;
  const nlohmann::json j = nlohmann::json::parse(root->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << root->body;
  const std::string endpoints = j["endpoints"].dump();
  for (const char* path : {"GET /v2\"", "GET /v2/models\"", "GET /v2/health/ready\"",
                           "POST /v2/models/{model}/infer\""}) {
    EXPECT_THAT(endpoints, HasSubstr(path));
  }
  EXPECT_THAT(root->body, HasSubstr("--metrics_port"));
  const auto metrics = http.Get("/metrics");
  EXPECT_EQ(metrics->status, 404) << metrics->body;
  EXPECT_THAT(metrics->body,
              HasSubstr("metrics port, " + std::to_string(metrics_port) + " (--metrics_port)"));
  EXPECT_THAT(metrics->body, HasSubstr(":" + std::to_string(metrics_port) + "/metrics"));
  server->Drain();
}

TEST(RestRoutesTest, PlainHttpToATlsPortIsAnsweredInPlainText) {
  const std::string dir = ::testing::TempDir() + "/routes_certs_" + std::to_string(getpid());
  testing::TestCertificates certs(dir);
  ASSERT_TRUE(certs.ok()) << certs.error();
  auto server = Start("routes_tls", [&](server::ServerOptions& o) {
    o.tls.cert_file = certs.Path("server-ca1.pem");
    o.tls.key_file = certs.Path("server-ca1.key");
  });
  ASSERT_NE(server, nullptr);
  testing::RawHttpConnection plain(server->http_port());
  ASSERT_TRUE(plain.connected());
  ASSERT_TRUE(plain.Send("GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  const std::string answer = plain.ReadToEnd();
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 400 Bad Request"));
  EXPECT_THAT(answer, HasSubstr("use https://"));
  // TLS clients are served as before.
  testing::HttpTestClient https("127.0.0.1", server->http_port(),
                                testing::HttpTestTls(certs.Path("ca1.pem")));
  EXPECT_EQ(https.Get("/v2/health/ready")->status, 200);
  server->Drain();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace attention
