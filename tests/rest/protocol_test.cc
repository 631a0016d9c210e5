// The KServe v2 REST front-end as Triton's tools read it, end to end over
// loopback on the shared server fixture: metadata, configuration,
// statistics and the repository index; JSON responses within
// --max_message_bytes and -Infinity in float masks; sequences in request
// parameters decoded token by token as over gRPC, and a sequence started
// over gRPC continued over REST; requests counted with the http protocol
// label.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/oip_requests.h"
#include "tests/fixture/raw_http_connection.h"
#include "tests/fixture/rest_test_fixture.h"

namespace attention {
namespace {

using ::testing::HasSubstr;

// The shared server of the server tests, over REST (and gRPC to compare).
class RestProtocolTest : public RestServerTest {};

TEST_F(RestProtocolTest, MetadataConfigStatsAndIndexAsTritonToolsReadThem) {
  auto res = Client().Get("/v2");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const json server = json::parse(res->body);
  EXPECT_EQ(server["name"], "attention-service");
  EXPECT_THAT(server["extensions"].get<std::vector<std::string>>(),
              ::testing::IsSupersetOf({"statistics", "model_configuration", "sequence"}));
  EXPECT_EQ(Client().Get("/v2/health/live")->status, 200);
  EXPECT_EQ(Client().Get("/v2/health/ready")->status, 200);
  EXPECT_EQ(Client().Get("/v2/models/cross/ready")->status, 200);
  EXPECT_EQ(Client().Get("/v2/models/cross/versions/1/ready")->status, 200);
  EXPECT_EQ(Client().Get("/v2/models/nope/ready")->status, 404);

  res = Client().Get("/v2/models/cross");
  ASSERT_EQ(res->status, 200) << res->body;
  const json metadata = json::parse(res->body);
  EXPECT_EQ(metadata["versions"], json({"1"}));
  EXPECT_EQ(metadata["inputs"][1]["shape"], json({-1, -1, 12}));  // Numbers, not strings.

  res = Client().Get("/v2/models/cross/config");
  ASSERT_EQ(res->status, 200) << res->body;
  const json config = json::parse(res->body);
  EXPECT_EQ(config["name"], "cross");
  EXPECT_EQ(config["max_batch_size"], 0);
  EXPECT_TRUE(config.contains("dynamic_batching"));
  EXPECT_FALSE(config.contains("sequence_batching"));
  EXPECT_EQ(config["input"][0]["data_type"], "TYPE_FP32");
  EXPECT_EQ(config["input"][0]["optional"], false);
  EXPECT_EQ(config["input"][1]["optional"], true);
  EXPECT_EQ(config["input"][1]["dims"], json({-1, -1, 12}));
  res = Client().Get("/v2/models/cross_sequence/config");
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_TRUE(json::parse(res->body).contains("sequence_batching"));

  // Statistics: numbers and a string version (perf_analyzer reads them
  // with GetUint64 and GetString), equal compute counts.
  ASSERT_EQ(PostJson("/v2/models/tiny_queue/infer",
                     {{"inputs",
                       {Input("query", "FP32", {1, 1, 16},
                              json::array({json(std::vector<float>(16, 0.25f))}))}}})
                ->status,
            200);
  res = Client().Get("/v2/models/tiny_queue/stats");
  ASSERT_EQ(res->status, 200) << res->body;
  const json stats = json::parse(res->body)["model_stats"][0];
  EXPECT_EQ(stats["name"], "tiny_queue");
  EXPECT_EQ(stats["version"], "1");
  EXPECT_TRUE(stats["inference_count"].is_number_unsigned());
  EXPECT_GE(stats["inference_count"].get<uint64_t>(), 1u);
  for (const char* key : {"success", "fail", "queue", "compute_input", "compute_infer",
                          "compute_output", "cache_hit", "cache_miss"}) {
    ASSERT_TRUE(stats["inference_stats"].contains(key)) << key;
    EXPECT_TRUE(stats["inference_stats"][key]["count"].is_number()) << key;
    EXPECT_TRUE(stats["inference_stats"][key]["ns"].is_number()) << key;
  }
  EXPECT_EQ(stats["inference_stats"]["compute_input"]["count"],
            stats["inference_stats"]["compute_infer"]["count"]);
  res = Client().Get("/v2/models/stats");
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["model_stats"].size(), 3u);

  res = Client().Post("/v2/repository/index", R"({"ready": true})", "application/json");
  ASSERT_EQ(res->status, 200) << res->body;
  const json index = json::parse(res->body);
  ASSERT_TRUE(index.is_array());
  ASSERT_EQ(index.size(), 3u);
  EXPECT_EQ(index[0]["state"], "READY");
  EXPECT_EQ(Client().Post("/v2/repository/index", "", "application/json")->status, 200);
  // No Content-Length and no chunks (curl -X POST): no body, not a wait for one.
  testing::RawHttpConnection raw(server_->http_port());
  raw.Send("POST /v2/repository/index HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(raw.ReadToEnd(), ::testing::StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(Client().Post("/v2/repository/index", "[", "application/json")->status, 400);
}

TEST_F(RestProtocolTest, AJsonResponseStaysWithinMaxMessageBytes) {
  // 400 tokens with weights: 690 KB binary (admitted under the 1 MiB
  // --max_message_bytes, as over gRPC), ~2 MB as JSON numbers.
  std::mt19937 rng(3);
  const Tensor query = RandomTensor({1, 400, 32}, rng);
  json body = {{"parameters", {{"need_weights", true}}},
               {"inputs", {Input("query", "FP32", query.shape(), FloatsJson(query))}}};
  auto res = Client().Post("/v2/models/small/infer", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_LE(res->body.size(), size_t{1} << 20) << "status " << res->status;
  if (res->status != 200) {
    EXPECT_EQ(res->status, 429);
    EXPECT_THAT(res->body, HasSubstr("binary_data_output"));
  }
  // The binary form of the same answer fits, and is served.
  body["parameters"]["binary_data_output"] = true;
  res = Client().Post("/v2/models/small/infer", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body.substr(0, 300);
  EXPECT_LE(res->body.size(), size_t{1} << 20);
}

TEST_F(RestProtocolTest, AFloatMaskWithInfinityIsReadFromJson) {
  // PyTorch's additive masks hold -inf; tritonclient.http (Python's json)
  // writes it -Infinity, and Triton's parser reads NaN and Infinity, as this
  // server's responses write them. simdjson refuses them: 400 "not valid
  // JSON". (Not fixed: binary inputs carry them.)
  std::mt19937 rng(5);
  const Tensor query = RandomTensor({1, 2, 32}, rng);
  const std::string body = absl::StrCat(
      R"({"inputs":[)", Input("query", "FP32", query.shape(), FloatsJson(query)).dump(),
      R"(,{"name":"attn_mask","datatype":"FP32","shape":[2,2],"data":[0,-Infinity,0,0]}]})");
  const auto res = Client().Post("/v2/models/small/infer", body, "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  Tensor mask = RandomTensor({2, 2}, rng);
  for (int i = 0; i < 4; ++i) mask.mutable_as<float>()[i] = i == 1 ? -INFINITY : 0.f;
  MhaInputs in;
  in.query = query.view();
  in.attn_mask = mask.view();
  const MhaOutputs expected = *Engine("small").Forward(in);
  const auto got = json::parse(res->body)["outputs"][0]["data"].get<std::vector<float>>();
  ASSERT_EQ(got.size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(got[i], expected.output.as<float>()[i], 1e-5) << i;
}

TEST_F(RestProtocolTest, SequencesInParametersDecodeTokenByTokenAsOverGrpc) {
  std::mt19937 rng(9);
  const Tensor tokens = RandomTensor({1, 4, 32}, rng);
  std::vector<std::vector<float>> rest_rows;
  for (int t = 0; t < 4; ++t) {
    std::vector<float> row(tokens.as<float>() + t * 32, tokens.as<float>() + (t + 1) * 32);
    json parameters = {{"sequence_id", 4242}};
    if (t == 0) parameters["sequence_start"] = true;
    if (t == 3) parameters["sequence_end"] = true;
    const auto res = PostJson(
        "/v2/models/small_sequence/infer",
        {{"parameters", parameters}, {"inputs", {Input("query", "FP32", {1, 1, 32}, row)}}});
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(json::parse(res->body)["model_name"], "small_sequence");
    rest_rows.push_back(OutputData(json::parse(res->body), "output"));
  }
  // The stateless causal result over the whole prefix: row t attends to 0..t.
  MhaInputs in;
  in.query = tokens.view();
  in.is_causal = true;
  const MhaOutputs causal = *Engine("small").Forward(in);
  for (int t = 0; t < 4; ++t) {
    for (int e = 0; e < 32; ++e) {
      ASSERT_NEAR(rest_rows[t][e], causal.output.as<float>()[t * 32 + e], 1e-5) << t << "," << e;
    }
  }
  // Ended: the next step is NOT_FOUND, as over gRPC.
  const auto res =
      PostJson("/v2/models/small/infer",
               {{"parameters", {{"sequence_id", 4242}}},
                {"inputs", {Input("query", "FP32", {1, 1, 32}, std::vector<float>(32, 0.f))}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404) << res->body;
}

TEST_F(RestProtocolTest, ASequenceStartedOverGrpcContinuesOverRestWithTheSameId) {
  // The same caller (no tokens), the same model and id: one sequence, on
  // either transport; an id above INT64_MAX (uint64_param over gRPC, a JSON
  // integer over REST) names the same sequence on both.
  std::mt19937 rng(11);
  const Tensor tokens = RandomTensor({1, 3, 32}, rng);
  const uint64_t id = (uint64_t{1} << 63) + 5;
  inference::ModelInferRequest start =
      testing::Fp32InferRequest("small_sequence", "query", {1, 1, 32}, tokens.as<float>());
  (*start.mutable_parameters())["sequence_id"].set_uint64_param(id);
  (*start.mutable_parameters())["sequence_start"].set_bool_param(true);
  grpc::ClientContext context;
  inference::ModelInferResponse first;
  const grpc::Status status =
      inference::GRPCInferenceService::NewStub(*channel_)->ModelInfer(&context, start, &first);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<float> last;
  for (int t = 1; t < 3; ++t) {
    const std::string body = absl::StrCat(
        R"({"parameters":{"sequence_id":)", id, t == 2 ? R"(,"sequence_end":true)" : "",
        R"(},"inputs":[)",
        Input("query", "FP32", {1, 1, 32},
              std::vector<float>(tokens.as<float>() + 32 * t, tokens.as<float>() + 32 * (t + 1)))
            .dump(),
        "]}");
    const auto res = Client().Post("/v2/models/small_sequence/infer", body, "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    last = json::parse(res->body)["outputs"][0]["data"].get<std::vector<float>>();
  }
  MhaInputs causal;
  causal.query = tokens.view();
  causal.is_causal = true;
  const MhaOutputs expected = *Engine("small").Forward(causal);
  ASSERT_EQ(last.size(), 32u);
  for (int e = 0; e < 32; ++e) EXPECT_NEAR(last[e], expected.output.as<float>()[64 + e], 1e-5);
}

TEST_F(RestProtocolTest, RequestsAreCountedWithTheHttpProtocolLabel) {
  const server::ModelMetrics& m = ModelMetricsOf("small");
  const auto count = [&] {
    return m.requests[static_cast<int>(server::Method::kRestModelInfer)][0]->Value();
  };
  const double before = count();
  const auto res =
      PostJson("/v2/models/small/infer",
               {{"inputs", {Input("query", "FP32", {1, 1, 32}, std::vector<float>(32, 1.f))}}});
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(count(), before + 1);
  testing::HttpTestClient metrics("127.0.0.1", metrics_port_);
  const auto text = metrics.Get("/metrics");
  ASSERT_TRUE(text);
  EXPECT_THAT(text->body, HasSubstr("protocol=\"http\""));
  EXPECT_THAT(text->body, HasSubstr("protocol=\"grpc\""));
}

}  // namespace
}  // namespace attention
