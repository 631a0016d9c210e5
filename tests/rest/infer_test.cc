// The KServe v2 REST front-end end to end over loopback (the tests'
// HttpTestClient): JSON and binary-extension inference equal to the engine's solo
// result and to the same request over gRPC, on every model variant of the
// shared fixture (kdim/vdim != E, bias_kv, zero_attn); sequences in request
// parameters (server_rest_protocol_test: metadata, configuration, statistics,
// the repository index, sequences and counters); bad requests answered with
// the right HTTP status and a message naming the field; bodies past the
// limit refused.
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/rest_test_fixture.h"

namespace attention {
namespace {

using ::testing::HasSubstr;

// The shared server of the server tests, over REST (and gRPC to compare).
class RestInferTest : public RestServerTest {};

TEST_F(RestInferTest, JsonInferEqualsGrpcAndTheEngineOnACrossModel) {
  // "cross": E=16, kdim 12, vdim 10, bias_kv, zero_attn.
  std::mt19937 rng(7);
  const Tensor query = RandomTensor({2, 5, 16}, rng);
  const Tensor key = RandomTensor({2, 7, 12}, rng);
  const Tensor value = RandomTensor({2, 7, 10}, rng);
  const Tensor kpm = RandomMask({2, 7}, rng, 0.3);
  const Tensor mask = RandomTensor({5, 7}, rng, 1.0f);
  const json body = {{"id", "req-1"},
                     {"parameters", {{"need_weights", true}}},
                     {"inputs",
                      {Input("query", "FP32", query.shape(), FloatsJson(query)),
                       Input("key", "FP32", key.shape(), FloatsJson(key)),
                       Input("value", "FP32", value.shape(), FloatsJson(value)),
                       Input("key_padding_mask", "BOOL", kpm.shape(), BoolsJson(kpm)),
                       Input("attn_mask", "FP32", mask.shape(), FloatsJson(mask))}}};
  const auto res = PostJson("/v2/models/cross/infer", body);
  ASSERT_TRUE(res) << res.error();
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->Header("Content-Type"), "application/json");
  const json response = json::parse(res->body);
  EXPECT_EQ(response["model_name"], "cross");
  EXPECT_EQ(response["model_version"], "1");
  EXPECT_EQ(response["id"], "req-1");
  EXPECT_TRUE(response["parameters"]["queue_us"].is_number());
  ASSERT_EQ(response["outputs"].size(), 2u);
  EXPECT_EQ(response["outputs"][0]["shape"], json({2, 5, 16}));
  EXPECT_EQ(response["outputs"][1]["shape"], json({2, 5, 9}));  // 7 keys + bias_kv + zero_attn.

  MhaInputs in;
  in.query = query.view();
  in.key = key.view();
  in.value = value.view();
  in.key_padding_mask = kpm.view();
  in.attn_mask = mask.view();
  in.need_weights = true;
  const MhaOutputs solo = *Engine("cross").Forward(in);
  const std::vector<float> output = OutputData(response, "output");
  const std::vector<float> weights = OutputData(response, "attn_weights");
  ASSERT_EQ(output.size(), static_cast<size_t>(solo.output.num_elements()));
  for (size_t i = 0; i < output.size(); ++i) {
    ASSERT_NEAR(output[i], solo.output.as<float>()[i], 1e-5) << i;
  }
  ASSERT_EQ(weights.size(), static_cast<size_t>(solo.attn_weights->num_elements()));
  // And over gRPC, the same numbers (JSON's shortest form round-trips a float).
  auto grpc = GrpcInfer("cross",
                        {{"query", &query},
                         {"key", &key},
                         {"value", &value},
                         {"key_padding_mask", &kpm},
                         {"attn_mask", &mask}},
                        true);
  ASSERT_EQ(grpc["output"].size(), output.size());
  for (size_t i = 0; i < output.size(); ++i) ASSERT_NEAR(grpc["output"][i], output[i], 1e-6) << i;
  for (size_t i = 0; i < weights.size(); ++i) {
    ASSERT_NEAR(grpc["attn_weights"][i], weights[i], 1e-6) << i;
  }
}

TEST_F(RestInferTest, BinaryExtensionInAndOutEqualsJson) {
  std::mt19937 rng(8);
  const Tensor query = RandomTensor({1, 6, 32}, rng);
  // Nested JSON data, as a JSON client may send it.
  json nested = json::array();
  for (int l = 0; l < 6; ++l) {
    json row = json::array();
    for (int e = 0; e < 32; ++e) row.push_back(query.as<float>()[l * 32 + e]);
    nested.push_back(row);
  }
  const auto json_res =
      PostJson("/v2/models/small/infer",
               {{"inputs", {Input("query", "FP32", {1, 6, 32}, json::array({nested}))}},
                {"parameters", {{"is_causal", true}}}});
  ASSERT_TRUE(json_res);
  ASSERT_EQ(json_res->status, 200) << json_res->body;
  const std::vector<float> from_json = OutputData(json::parse(json_res->body), "output");

  const json header = {
      {"parameters", {{"is_causal", true}}},
      {"inputs",
       {{{"name", "query"},
         {"datatype", "FP32"},
         {"shape", {1, 6, 32}},
         {"parameters", {{"binary_data_size", query.num_bytes()}}}}}},
      {"outputs", {{{"name", "output"}, {"parameters", {{"binary_data", true}}}}}}};
  const std::string head = header.dump();
  const std::string body =
      head + std::string(static_cast<const char*>(query.data()), query.num_bytes());
  testing::HttpTestHeaders headers = {
      {"Inference-Header-Content-Length", std::to_string(head.size())}};
  const auto res =
      Client().Post("/v2/models/small/infer", headers, body, "application/octet-stream");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  ASSERT_TRUE(res->HasHeader("Inference-Header-Content-Length"));
  const size_t json_length = std::stoul(res->Header("Inference-Header-Content-Length"));
  const json response = json::parse(res->body.substr(0, json_length));
  ASSERT_EQ(response["outputs"][0]["parameters"]["binary_data_size"], 6 * 32 * 4);
  EXPECT_FALSE(response["outputs"][0].contains("data"));
  ASSERT_EQ(res->body.size(), json_length + 6 * 32 * 4);
  std::vector<float> from_binary(6 * 32);
  std::memcpy(from_binary.data(), res->body.data() + json_length, 6 * 32 * 4);
  ASSERT_EQ(from_binary.size(), from_json.size());
  for (size_t i = 0; i < from_json.size(); ++i) EXPECT_EQ(from_binary[i], from_json[i]) << i;

  // BF16 travels binary only; its result is within bfloat16's rounding.
  std::string bf16(6 * 32 * 2, '\0');
  for (int i = 0; i < 6 * 32; ++i) {
    const uint16_t b = FloatToBFloat16(query.as<float>()[i]);
    std::memcpy(&bf16[2 * i], &b, 2);
  }
  json bf_header = header;
  bf_header["inputs"][0]["datatype"] = "BF16";
  bf_header["inputs"][0]["parameters"]["binary_data_size"] = bf16.size();
  bf_header["parameters"]["binary_data_output"] = true;
  bf_header.erase("outputs");
  const std::string bf_head = bf_header.dump();
  headers = {{"Inference-Header-Content-Length", std::to_string(bf_head.size())}};
  const auto bf_res =
      Client().Post("/v2/models/small/infer", headers, bf_head + bf16, "application/octet-stream");
  ASSERT_TRUE(bf_res);
  ASSERT_EQ(bf_res->status, 200) << bf_res->body;
  const size_t bf_json = std::stoul(bf_res->Header("Inference-Header-Content-Length"));
  const json bf_response = json::parse(bf_res->body.substr(0, bf_json));
  const std::string dtype = bf_response["outputs"][0]["datatype"];
  const size_t size = dtype == "FP32" ? 4 : 2;
  ASSERT_EQ(bf_res->body.size() - bf_json, 6 * 32 * size) << dtype;
  for (int i = 0; i < 6 * 32; ++i) {
    float v = 0;
    if (size == 4) {
      std::memcpy(&v, bf_res->body.data() + bf_json + 4 * i, 4);
    } else {
      uint16_t b = 0;
      std::memcpy(&b, bf_res->body.data() + bf_json + 2 * i, 2);
      v = BFloat16ToFloat(b);
    }
    EXPECT_NEAR(v, from_json[i], 2e-2 * (1 + std::abs(from_json[i]))) << i;
  }
}

TEST_F(RestInferTest, BadRequestsGetTheRightStatusAndNameTheField) {
  struct Case {
    std::string path, body;
    int status;
    std::string message;
  };
  const std::string q = R"("inputs":[{"name":"query","datatype":"FP32","shape":[1,1,32],"data":)";
  std::string data32 = "[";
  for (int i = 0; i < 32; ++i) absl::StrAppend(&data32, i ? "," : "", "0.5");
  data32 += "]";
  const std::vector<Case> cases = {
      {"/v2/models/small/infer", "{not json", 400, "not valid JSON"},
      {"/v2/models/small/infer", "[1,2]", 400, "request body: expected a JSON object"},
      {"/v2/models/small/infer", "{" + q + "[1,2,3]}]}", 400,
       "inputs[0] ('query').data: shape [1,1,32] holds 32 elements, got 3"},
      {"/v2/models/nope/infer", "{" + q + data32 + "}]}", 404, "nope"},
      {"/v2/models/small/versions/7/infer", "{" + q + data32 + "}]}", 404, "model_version"},
      {"/v2/models/small/infer",
       R"({"inputs":[{"name":"quer","datatype":"FP32","shape":[1,1,32],"data":)" + data32 + "}]}",
       400, "inputs[0] ('quer').name: expected one of"},
      {"/v2/models/small/infer", "{" + q + "[\"a\"]}]}", 400, "inputs[0] ('query').data"},
      {"/v2/models/small/infer",
       R"({"inputs":[{"name":"query","datatype":"FP16","shape":[1,1,32],"data":)" + data32 + "}]}",
       400, "FP16 has no JSON form here"},
      {"/v2/models/small/infer",
       R"({"inputs":[{"name":"query","datatype":"INT8","shape":[1],"data":[1]}]})", 400,
       "inputs[0] ('query').datatype: expected FP32, FP16, BF16 or BOOL, got 'INT8'"},
      // A huge claimed shape with little data: refused by counting, before
      // anything is allocated for it.
      {"/v2/models/small/infer",
       R"({"inputs":[{"name":"query","datatype":"FP32","shape":[100000,100000,100000],"data":[1,2]}]})",
       400, "holds too many elements, got 2"},
      {"/v2/models/small/infer",
       R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,1,32],"parameters":{"binary_data_size":128}}]})",
       400, "only 0 bytes of binary data are left"},
      {"/v2/models/small/infer",
       R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,2,32],"parameters":{"binary_data_size":128}}]})",
       400, "shape [1,2,32] of FP32 needs 256 bytes, got 128"},
      {"/v2/models/small/infer", "{" + q + data32 + R"(}],"parameters":{"need_weights":3}})", 400,
       "parameters['need_weights']: expected bool_param"},
      {"/v2/models/small/infer", "{" + q + data32 + R"(}],"outputs":[{"name":"logits"}]})", 400,
       "logits"},
      {"/v2/nothing", "{}", 404, "no endpoint POST /v2/nothing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body.substr(0, 120));
    const auto res = Client().Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, c.status) << res->body;
    const json error = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(error.is_object()) << res->body;
    EXPECT_THAT(error.value("error", ""), HasSubstr(c.message));
  }
  // Wrong dimension: the engine's validation message, as over gRPC.
  const auto res =
      PostJson("/v2/models/small/infer",
               {{"inputs", {Input("query", "FP32", {1, 2, 16}, std::vector<float>(32, 1.f))}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_THAT(res->body, HasSubstr("query"));
  EXPECT_THAT(res->body, HasSubstr("32"));
  // The server still serves.
  const auto ok =
      Client().Post("/v2/models/small/infer", "{" + q + data32 + "}]}", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST_F(RestInferTest, OversizedBodiesAre413ChunkedOrNot) {
  // The fixture's limit is 1 MiB.
  const std::string big(size_t{1} << 21, ' ');
  auto res = Client().Post("/v2/models/small/infer", big, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_THAT(res->body, HasSubstr("--max_message_bytes"));
  // Chunked: no Content-Length to refuse by, cut off while read.
  testing::HttpTestClient client = Client();
  size_t sent = 0;
  res = client.PostChunked(
      "/v2/models/small/infer",
      [&](std::string* chunk) {
        if (sent >= (size_t{4} << 20)) return false;
        *chunk = std::string(1 << 16, ' ');
        sent += chunk->size();
        return true;
      },
      "application/json");
  if (res) {
    EXPECT_EQ(res->status, 413);
  }  // Else the server closed the connection while the client still sent.
  EXPECT_LE(sent, size_t{4} << 20);
  // Still serving.
  EXPECT_EQ(Client().Get("/v2/health/ready")->status, 200);
}

}  // namespace
}  // namespace attention
