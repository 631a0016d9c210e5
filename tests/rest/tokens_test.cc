// Bearer tokens on the REST port where they meet bodies and sequences
// (a server of its own): the token is checked before a body is parsed, and a
// sequence is its caller's on either transport. The REST port's tokens and
// TLS as such: tests/security/rest_test.cc.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/attention_server.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/oip_requests.h"
#include "tests/fixture/rest_test_fixture.h"
#include "tests/fixture/security_test_fixture.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::ServerOptions;

// With tokens (a server of its own): the token is checked before a body is
// parsed (which costs ~15 times its size: a 60 MiB JSON body peaked at 1 GB
// resident), and a sequence is its caller's on either transport.
TEST(RestTokensTest, TheTokenComesBeforeTheBodyAndSequencesStayTheCallers) {
  testing::ModelFolder models("rest_tokens");
  models.Add("small", testing::SelfAttentionSpec(16, 2), 1);
  security_test::WriteTokens(models.path() + ".tokens",
                             absl::StrCat(security_test::HashHex("alice-secret"), " alice small\n",
                                          security_test::HashHex("bob-secret"), " bob small\n"));
  ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
  o.auth_tokens_file = models.path() + ".tokens";
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  testing::HttpTestClient client("127.0.0.1", server->http_port());
  auto res = client.Post("/v2/models/small/infer", "{not json", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401) << res->body;
  res = client.Post("/v2/repository/index", "[", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401) << res->body;

  // alice starts sequence 7 over gRPC; bob's step with that id over REST
  // finds no sequence, alice's continues hers.
  std::vector<float> token(16, 0.5f);
  inference::ModelInferRequest start =
      testing::Fp32InferRequest("small", "query", {1, 1, 16}, token.data());
  (*start.mutable_parameters())["sequence_id"].set_int64_param(7);
  (*start.mutable_parameters())["sequence_start"].set_bool_param(true);
  grpc::ClientContext context;
  testing::PrepareContext(context, "alice-secret");
  inference::ModelInferResponse first;
  const grpc::Status status =
      inference::GRPCInferenceService::NewStub(testing::PlainChannel(*server))
          ->ModelInfer(&context, start, &first);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string step = absl::StrCat(R"({"parameters":{"sequence_id":7},"inputs":[)",
                                        Input("query", "FP32", {1, 1, 16}, token).dump(), "]}");
  res = client.Post("/v2/models/small/infer", {{"Authorization", "Bearer bob-secret"}}, step,
                    "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404) << res->body;
  res = client.Post("/v2/models/small/infer", {{"Authorization", "Bearer alice-secret"}}, step,
                    "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_TRUE(server->Drain());
}

}  // namespace
}  // namespace attention
