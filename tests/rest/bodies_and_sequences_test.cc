// An adversarial review of the KServe v2 REST front-end where it meets HTTP
// framing, the server's limits and the gRPC side: bodies a handler leaves
// unread must not be served as the next request on the connection (request
// smuggling / keep-alive desync); bodies of methods the server has no
// handler for are not buffered without bound; a POST without a length has
// an empty body (RFC 9112 6.3), not "until the client closes"; a JSON
// response stays within --max_message_bytes; a sequence started over gRPC
// continues over REST. Raw sockets send what cpp-httplib's client will not.
#include <httplib.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/security/token_authenticator.h"
#include "tests/fixture/raw_http_connection.h"
#include "tests/fixture/server_fixture.h"

namespace attention {
namespace {

using ::attention::testing::HttpStatuses;
using ::attention::testing::kLastHttpRequest;
using ::attention::testing::RawHttpConnection;
using ::testing::HasSubstr;
using json = nlohmann::json;

json Input(const std::string& name, const Shape& shape, const float* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return json{{"name", name},
              {"datatype", "FP32"},
              {"shape", shape},
              {"data", std::vector<float>(data, data + n)}};
}

class RestReviewTest : public ServerTest {
 protected:
  static int Port() { return server_->http_port(); }
  static httplib::Client Client() {
    httplib::Client client("127.0.0.1", Port());
    client.set_read_timeout(30, 0);
    return client;
  }
};

// Runs first: it reads the process's peak RSS, which later tests raise.
TEST_F(RestReviewTest, BodiesOfMethodsWithoutAHandlerAreNotBufferedWithoutBound) {
  // httplib reads a PUT/PATCH/DELETE body whole into memory before finding no
  // handler, after undoing its Content-Encoding: a 128 KiB gzip of 128 MiB of
  // zeros (under the 1 MiB --max_message_bytes) cost 128 MiB and more.
  std::string gz(size_t{1} << 20, '\0');
  z_stream z{};
  ASSERT_EQ(deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);
  const std::string zeros(size_t{1} << 20, '\0');
  z.next_out = reinterpret_cast<Bytef*>(gz.data());
  z.avail_out = static_cast<uInt>(gz.size());
  for (int i = 0; i < 128; ++i) {
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(zeros.data()));
    z.avail_in = static_cast<uInt>(zeros.size());
    ASSERT_EQ(deflate(&z, i == 127 ? Z_FINISH : Z_NO_FLUSH), i == 127 ? Z_STREAM_END : Z_OK);
  }
  gz.resize(z.total_out);
  deflateEnd(&z);
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  for (const char* method : {"PUT", "PATCH"}) {
    RawHttpConnection c(Port());
    ASSERT_TRUE(c.connected());
    c.Send(absl::StrCat(method,
                        " /v2/models/small/infer HTTP/1.1\r\nHost: a\r\nContent-Encoding: gzip\r\n"
                        "Content-Length: ",
                        gz.size(), "\r\nConnection: close\r\n\r\n", gz));
    const std::vector<int> statuses = HttpStatuses(c.ReadToEnd());
    ASSERT_EQ(statuses.size(), 1u) << method;
    EXPECT_GE(statuses[0], 400) << method;
  }
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 32 << 10) << "KiB of peak RSS gained";
}

// A body sent after the server has read the headers (Expect: 100-continue,
// as curl sends for large bodies; or any body past the first segments) and
// that no handler reads was parsed as the next request on the connection.
TEST_F(RestReviewTest, AnUnreadBodyIsNotServedAsTheNextRequest) {
  // A body that is itself a request: a proxy in front would send its answer
  // to whoever asks next on that connection.
  const std::string inner = "GET /v2/models/stats HTTP/1.1\r\nHost: a\r\n\r\n";
  for (const char* target :
       {"POST /v2/repository/models/small/load", "POST /v2/nothing", "GET /v2/health/ready"}) {
    SCOPED_TRACE(target);
    RawHttpConnection c(Port());
    ASSERT_TRUE(c.connected());
    c.Send(absl::StrCat(target, " HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n",
                        "Content-Length: ", inner.size(), "\r\n\r\n"));
    std::string stream = c.ReadUntil("100 Continue\r\n\r\n");
    c.Send(inner);
    stream += c.ReadResponse();
    c.Send(kLastHttpRequest);  // Fails when the server has closed.
    stream += c.ReadToEnd();
    const std::vector<int> statuses = HttpStatuses(stream);
    EXPECT_EQ(stream.find("model_stats"), std::string::npos)
        << "the body was served: " << ::testing::PrintToString(statuses);
    EXPECT_LE(statuses.size(), 3u);  // 100, the answer, the last request's.
  }
}

TEST_F(RestReviewTest, ABodyCutOffAtTheLimitClosesTheConnection) {
  // Chunked, 1 MiB + 128 KiB: cut at the limit (413), its remaining chunks
  // were then parsed as requests (414, 400, ... and the smuggled one).
  std::string request =
      "POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 18; ++i)
    absl::StrAppend(&request, "10000\r\n", std::string(65536, ' '), "\r\n");
  absl::StrAppend(&request, "0\r\n\r\n", kLastHttpRequest);
  RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  c.Send(request);  // May fail part way: the server closes.
  const std::vector<int> statuses = HttpStatuses(c.ReadToEnd());
  EXPECT_LE(statuses.size(), 1u) << ::testing::PrintToString(statuses);
  if (!statuses.empty()) {
    EXPECT_EQ(statuses[0], 413);
  }
  // A multipart body is not half-read by httplib's form parser (which threw
  // bad_function_call: 500) but refused.
  const auto res =
      Client().Post("/v2/models/small/infer",
                    "--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n{}\r\n--xyz--\r\n",
                    "multipart/form-data; boundary=xyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 415) << res->body;
  EXPECT_FALSE(res->has_header("EXCEPTION_WHAT")) << res->get_header_value("EXCEPTION_WHAT");
}

TEST_F(RestReviewTest, APostWithoutContentLengthHasAnEmptyBody) {
  // RFC 9112 6.3: no Content-Length and no Transfer-Encoding is a body of 0
  // bytes. httplib read "until the client closes": the next request was read
  // as this one's body, and after its read timeout (5 s) the answer was 400.
  RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  c.Send("POST /v2/repository/index HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ::testing::ElementsAre(200));
  EXPECT_THAT(stream, HasSubstr("\"READY\""));
}

TEST_F(RestReviewTest, AJsonResponseStaysWithinMaxMessageBytes) {
  // 400 tokens with weights: 690 KB binary (admitted under the 1 MiB
  // --max_message_bytes, as over gRPC), ~2 MB as JSON numbers.
  std::mt19937 rng(3);
  const Tensor query = RandomTensor({1, 400, 32}, rng);
  json body = {{"parameters", {{"need_weights", true}}},
               {"inputs", {Input("query", {1, 400, 32}, query.as<float>())}}};
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

TEST_F(RestReviewTest, AFloatMaskWithInfinityIsReadFromJson) {
  // PyTorch's additive masks hold -inf; tritonclient.http (Python's json)
  // writes it -Infinity, and Triton's parser reads NaN and Infinity, as this
  // server's responses write them. simdjson refuses them: 400 "not valid
  // JSON". (Not fixed: binary inputs carry them.)
  std::mt19937 rng(5);
  const Tensor query = RandomTensor({1, 2, 32}, rng);
  const std::string body = absl::StrCat(
      R"({"inputs":[)", Input("query", {1, 2, 32}, query.as<float>()).dump(),
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

TEST_F(RestReviewTest, ASequenceStartedOverGrpcContinuesOverRestWithTheSameId) {
  // The same caller (no tokens), the same model and id: one sequence, on
  // either transport; an id above INT64_MAX (uint64_param over gRPC, a JSON
  // integer over REST) names the same sequence on both.
  std::mt19937 rng(11);
  const Tensor tokens = RandomTensor({1, 3, 32}, rng);
  const uint64_t id = (uint64_t{1} << 63) + 5;
  inference::ModelInferRequest start;
  start.set_model_name("small_sequence");
  auto* in = start.add_inputs();
  in->set_name("query");
  in->set_datatype("FP32");
  for (int64_t d : {1, 1, 32}) in->add_shape(d);
  start.add_raw_input_contents(std::string(static_cast<const char*>(tokens.data()), 32 * 4));
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
        R"(},"inputs":[)", Input("query", {1, 1, 32}, tokens.as<float>() + 32 * t).dump(), "]}");
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

// With tokens (a server of its own): the token is checked before a body is
// parsed (which costs ~15 times its size: a 60 MiB JSON body peaked at 1 GB
// resident), and a sequence is its caller's on either transport.
TEST(RestReviewTokenTest, TheTokenComesBeforeTheBodyAndSequencesStayTheCallers) {
  const std::string dir = ::testing::TempDir() + "/rest_review_tokens_" + std::to_string(getpid());
  testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 1),
                         dir + "/models/small");
  {
    std::ofstream out(dir + "/tokens");
    for (const char* name : {"alice", "bob"}) {
      const auto h = server::TokenAuthenticator::Hash(absl::StrCat(name, "-secret"));
      out << absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(h.data()), 32))
          << " " << name << " small\n";
    }
  }
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.metrics_port = 0;
  o.http_port = 0;
  o.drain_grace = absl::ZeroDuration();
  o.repository.path = dir + "/models";
  o.repository.compute_threads = 1;
  o.repository.warmup = false;
  o.auth_tokens_file = dir + "/tokens";
  auto server = AttentionServer::Listen(o);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->LoadModels().ok());
  httplib::Client client("127.0.0.1", (*server)->http_port());
  auto res = client.Post("/v2/models/small/infer", "{not json", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401) << res->body;
  res = client.Post("/v2/repository/index", "[", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401) << res->body;

  // alice starts sequence 7 over gRPC; bob's step with that id over REST
  // finds no sequence, alice's continues hers.
  std::vector<float> token(16, 0.5f);
  inference::ModelInferRequest start;
  start.set_model_name("small");
  auto* in = start.add_inputs();
  in->set_name("query");
  in->set_datatype("FP32");
  for (int64_t d : {1, 1, 16}) in->add_shape(d);
  start.add_raw_input_contents(std::string(reinterpret_cast<const char*>(token.data()), 64));
  (*start.mutable_parameters())["sequence_id"].set_int64_param(7);
  (*start.mutable_parameters())["sequence_start"].set_bool_param(true);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer alice-secret");
  inference::ModelInferResponse first;
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                     grpc::InsecureChannelCredentials());
  const grpc::Status status =
      inference::GRPCInferenceService::NewStub(channel)->ModelInfer(&context, start, &first);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string step = absl::StrCat(R"({"parameters":{"sequence_id":7},"inputs":[)",
                                        Input("query", {1, 1, 16}, token.data()).dump(), "]}");
  res = client.Post("/v2/models/small/infer", {{"Authorization", "Bearer bob-secret"}}, step,
                    "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404) << res->body;
  res = client.Post("/v2/models/small/infer", {{"Authorization", "Bearer alice-secret"}}, step,
                    "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_TRUE((*server)->Drain());
}

}  // namespace
}  // namespace attention
