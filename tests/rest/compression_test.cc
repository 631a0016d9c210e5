// gzip and deflate on the REST port (issue 35; cpp-httplib inflated request
// bodies, the Beast server refused them with 415): request bodies sent as
// Triton's clients send them (`Content-Encoding: gzip`, or `deflate` in
// zlib's format) answer as the same plain bodies; a zip bomb is refused at
// --max_message_bytes without being inflated past it (peak RSS); the
// decoded size is charged to the receive budget before it is inflated; a
// corrupt stream is 400 and an unknown coding 415; responses are
// compressed for a client whose Accept-Encoding asks, and only then.
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/attention_server.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/raw_http_connection.h"
#include "tests/fixture/small_server_options.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using json = nlohmann::json;
using ::attention::server::ServerOptions;
using ::attention::testing::HttpStatuses;
using ::attention::testing::HttpTestHeaders;
using ::attention::testing::RawHttpConnection;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kLimit = 4 << 20;  // --max_message_bytes.

// `data` compressed by zlib: gzip's format (windowBits 15 + 16) or zlib's.
std::string Compress(const std::string& data, bool gzip, int repeat = 1) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, gzip ? 15 + 16 : 15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, data.size() * repeat) + 64, '\0');
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  for (int i = 0; i < repeat; ++i) {
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z.avail_in = static_cast<uInt>(data.size());
    const int rc = deflate(&z, i + 1 == repeat ? Z_FINISH : Z_NO_FLUSH);
    EXPECT_EQ(rc, i + 1 == repeat ? Z_STREAM_END : Z_OK);
  }
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string Decompress(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, 15 + 32), Z_OK);
  std::string out;
  char piece[16384];
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(piece);
    z.avail_out = sizeof(piece);
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(piece, sizeof(piece) - z.avail_out);
  }
  EXPECT_EQ(rc, Z_STREAM_END);
  inflateEnd(&z);
  return out;
}

// This process's peak RSS in KiB since ResetPeakRss (the server runs in it).
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }
int64_t PeakRssKib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    int64_t kib = 0;
    if (line.rfind("VmHWM:", 0) == 0 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(6, line.size() - 6 - 3)), &kib)) {
      return kib;
    }
  }
  ADD_FAILURE() << "no VmHWM in /proc/self/status";
  return 0;
}

// An inference of "small" (E=16) on `tokens` tokens of distinct values.
json SmallInfer(int tokens) {
  json data = json::array();
  for (int i = 0; i < tokens * 16; ++i) data.push_back(0.01 * (i % 97) - 0.3);
  return {
      {"inputs",
       {{{"name", "query"}, {"datatype", "FP32"}, {"shape", {1, tokens, 16}}, {"data", data}}}}};
}

class RestCompressionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::ModelFolder models("rest_compression");
    models.Add("small", testing::SelfAttentionSpec(16, 2), 1);
    server::ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
    o.max_message_bytes = kLimit;
    server_ = testing::StartServer(o).release();
    ASSERT_NE(server_, nullptr);
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(server_->Drain());
    delete server_;
  }
  static testing::HttpTestClient Client() {
    testing::HttpTestClient client("127.0.0.1", server_->http_port());
    client.SetTimeout(absl::Seconds(30));
    return client;
  }
  static testing::HttpTestResult Post(const std::string& body, HttpTestHeaders headers,
                                      const std::string& type = "application/json") {
    return Client().Post("/v2/models/small/infer", headers, body, type);
  }

  static inline server::AttentionServer* server_ = nullptr;
};

// Runs first: it reads the process's peak RSS. 64 MiB of zeros, 64 KiB
// compressed, against the 4 MiB limit: refused with at most the limit
// inflated (the deflate stream is counted, keeping nothing; the gzip one
// whose trailer lies is kept up to the size its trailer states, here just
// under the limit).
TEST_F(RestCompressionTest, AZipBombIsRefusedWithoutBeingInflatedPastTheLimit) {
  const std::string zeros(size_t{1} << 20, '\0');
  const std::string gzip = Compress(zeros, /*gzip=*/true, 64);
  std::string lying = gzip;  // ISIZE, the trailer's size: kLimit - 1.
  for (int i = 0; i < 4; ++i)
    lying[lying.size() - 4 + i] = static_cast<char>((kLimit - 1) >> (8 * i));
  const std::string deflate = Compress(zeros, /*gzip=*/false, 64);
  ASSERT_LT(gzip.size(), size_t{1} << 20);
  struct Bomb {
    const char* name;
    const std::string& body;
    const char* coding;
    int status;
    const char* says;
  };
  for (const Bomb& bomb : {Bomb{"gzip", gzip, "gzip", 413, "--max_message_bytes"},
                           Bomb{"deflate", deflate, "deflate", 413, "--max_message_bytes"},
                           Bomb{"lying gzip", lying, "gzip", 400, "Content-Encoding: gzip"}}) {
    SCOPED_TRACE(bomb.name);
    ResetPeakRss();
    const int64_t before = PeakRssKib();
    const auto res = Post(bomb.body, {{"Content-Encoding", bomb.coding}});
    ASSERT_TRUE(res) << res.error();
    EXPECT_EQ(res->status, bomb.status) << res->body;
    EXPECT_THAT(res->body, HasSubstr(bomb.says));
    EXPECT_LT(PeakRssKib() - before, (kLimit >> 10) + (4 << 10)) << "KiB of peak RSS gained";
  }
}

TEST_F(RestCompressionTest, GzipAndDeflateBodiesAnswerAsThePlainBody) {
  const std::string plain = SmallInfer(8).dump();
  const auto expected = Post(plain, {});
  ASSERT_TRUE(expected) << expected.error();
  ASSERT_EQ(expected->status, 200) << expected->body;
  const json outputs = json::parse(expected->body)["outputs"];
  for (const bool gzip : {true, false}) {
    const auto res = Post(Compress(plain, gzip), {{"Content-Encoding", gzip ? "gzip" : "deflate"}});
    ASSERT_TRUE(res) << res.error();
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(json::parse(res->body)["outputs"], outputs) << (gzip ? "gzip" : "deflate");
  }
  // Binary tensors: Inference-Header-Content-Length counts the decoded body.
  std::vector<float> query(8 * 16);
  for (size_t i = 0; i < query.size(); ++i) query[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
  const std::string head = json{{"inputs",
                                 {{{"name", "query"},
                                   {"datatype", "FP32"},
                                   {"shape", {1, 8, 16}},
                                   {"parameters", {{"binary_data_size", query.size() * 4}}}}}}}
                               .dump();
  const std::string binary =
      head + std::string(reinterpret_cast<const char*>(query.data()), query.size() * 4);
  const HttpTestHeaders header_length = {
      {"Inference-Header-Content-Length", absl::StrCat(head.size())}};
  const auto binary_plain = Post(binary, header_length, "application/octet-stream");
  ASSERT_TRUE(binary_plain) << binary_plain.error();
  ASSERT_EQ(binary_plain->status, 200) << binary_plain->body;
  for (const bool gzip : {true, false}) {
    HttpTestHeaders headers = header_length;
    headers.emplace_back("Content-Encoding", gzip ? "gzip" : "deflate");
    const auto res = Post(Compress(binary, gzip), headers, "application/octet-stream");
    ASSERT_TRUE(res) << res.error();
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(json::parse(res->body)["outputs"], json::parse(binary_plain->body)["outputs"]);
  }
}

TEST_F(RestCompressionTest, ACorruptOrTruncatedStreamIs400NamingContentEncoding) {
  const std::string gzip = Compress(SmallInfer(4).dump(), /*gzip=*/true);
  for (const std::string& body : {gzip.substr(0, gzip.size() - 12), gzip + "trailing",
                                  std::string("\x1f\x8b not gzip at all, 18+ bytes")}) {
    const auto res = Post(body, {{"Content-Encoding", "gzip"}});
    ASSERT_TRUE(res) << res.error();
    EXPECT_EQ(res->status, 400) << res->body;
    EXPECT_THAT(res->body, HasSubstr("Content-Encoding: gzip"));
  }
}

TEST_F(RestCompressionTest, AnUnknownCodingIs415ListingTheAcceptedOnes) {
  const auto res = Post("{}", {{"Content-Encoding", "br"}});
  ASSERT_TRUE(res) << res.error();
  EXPECT_EQ(res->status, 415) << res->body;
  EXPECT_THAT(res->body, HasSubstr("expected one of gzip, deflate or identity, got 'br'"));
  EXPECT_EQ(res->Header("Accept-Encoding"), "gzip, deflate");
}

TEST_F(RestCompressionTest, AResponseIsCompressedOnlyForAClientThatAcceptsIt) {
  const std::string body = SmallInfer(32).dump();  // About 7 KB of JSON out.
  const auto plain = Post(body, {});
  ASSERT_TRUE(plain) << plain.error();
  ASSERT_EQ(plain->status, 200) << plain->body;
  EXPECT_FALSE(plain->HasHeader("Content-Encoding"));
  ASSERT_GT(plain->body.size(), 4096u);
  const json outputs = json::parse(plain->body)["outputs"];
  struct Case {
    const char* accept;
    const char* coding;  // "": none.
  };
  for (const Case& c : {Case{"gzip", "gzip"}, Case{"deflate", "deflate"},
                        Case{"gzip;q=0, deflate", "deflate"}, Case{"deflate;q=0.5, gzip", "gzip"},
                        Case{"br, *;q=0.1", "gzip"}, Case{"gzip;q=0", ""}, Case{"identity", ""}}) {
    SCOPED_TRACE(c.accept);
    const auto res = Post(body, {{"Accept-Encoding", c.accept}});
    ASSERT_TRUE(res) << res.error();
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(res->Header("Content-Encoding"), c.coding);
    EXPECT_EQ(res->Header("Vary"), "Accept-Encoding");
    if (*c.coding == '\0') continue;
    EXPECT_LT(res->body.size(), plain->body.size());
    EXPECT_EQ(json::parse(Decompress(res->body))["outputs"], outputs);
  }
  // A small answer is sent as it is.
  const auto small = Post(SmallInfer(1).dump(), {{"Accept-Encoding", "gzip"}});
  ASSERT_TRUE(small) << small.error();
  EXPECT_EQ(small->status, 200) << small->body;
  EXPECT_FALSE(small->HasHeader("Content-Encoding"));
}

// The decoded body is charged before it is inflated, at the JSON rate: 400
// KiB of JSON (1.2 MB at 3x) against a 1 MiB receive budget, sent as 1 KiB of
// gzip (which alone the budget takes).
TEST(RestCompressionBudgetTest, TheDecodedBodyIsChargedBeforeItIsInflated) {
  testing::ModelFolder models("rest_compression_budget");
  models.Add("small", testing::SelfAttentionSpec(16, 2), 1);
  server::ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
  o.max_message_bytes = kLimit;
  o.grpc_receive_quota_bytes = 1 << 20;
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  std::string body = SmallInfer(1).dump();
  body.insert(1, std::string(400 << 10, ' '));  // Still one valid request.
  testing::HttpTestClient client("127.0.0.1", server->http_port());
  client.SetTimeout(absl::Seconds(30));
  const auto refused = client.Post("/v2/models/small/infer", {{"Content-Encoding", "gzip"}},
                                   Compress(body, /*gzip=*/true), "application/json");
  ASSERT_TRUE(refused) << refused.error();
  EXPECT_EQ(refused->status, 429) << refused->body;
  EXPECT_THAT(refused->body, HasSubstr("--grpc_receive_quota_bytes"));
  // A tenth of it is taken.
  body = SmallInfer(1).dump();
  body.insert(1, std::string(40 << 10, ' '));
  const auto taken = client.Post("/v2/models/small/infer", {{"Content-Encoding", "gzip"}},
                                 Compress(body, /*gzip=*/true), "application/json");
  ASSERT_TRUE(taken) << taken.error();
  EXPECT_EQ(taken->status, 200) << taken->body;
  EXPECT_TRUE(server->Drain());
}

// A large or compressed body is inflated and decoded off the I/O threads:
// with one I/O thread, a health probe sent after 50 KiB of gzip holding
// 48 MiB of JSON (a second or so to inflate and read) is answered before
// that body's own answer. Decoded on the I/O thread, the probe, sent once
// the server has read the body, was read only once the decode was done,
// after the body's answer (a refusal, as the tensor is too large).
TEST(RestDecodeTest, AProbeIsNotHeldBehindALargeBodysDecode) {
  ServerOptions o = testing::SmallServerOptions("rest_decode");
  o.http_io_threads = 1;
  o.grpc_receive_quota_bytes = int64_t{1} << 30;
  o.max_message_bytes = 64 << 20;
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  // [1, 1572864, 16] zeros: decoded whole, then refused (too many tokens).
  const int tokens = 1572864;
  std::string values;
  values.reserve(size_t{32} * tokens);
  for (int i = 0; i < 16 * tokens; ++i) values += "0,";
  values.back() = ']';
  const std::string body =
      absl::StrCat(R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,)", tokens,
                   R"(,16],"data":[)", values, "}]}");
  const std::string gzip = Compress(body, /*gzip=*/true);
  RawHttpConnection large(server->http_port());
  RawHttpConnection probe(server->http_port());
  ASSERT_TRUE(large.Send(absl::StrCat(
      "POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
      "Content-Encoding: gzip\r\nContent-Length: ",
      gzip.size(), "\r\n\r\n", gzip)));
  ASSERT_TRUE(large.WaitReadByServer());  // Its decode begins now.
  ASSERT_TRUE(probe.Send("GET /v2/health/live HTTP/1.1\r\nHost: a\r\n\r\n"));
  EXPECT_THAT(HttpStatuses(probe.ReadResponse()), ElementsAre(200));
  EXPECT_FALSE(large.Readable(0)) << "the large body was answered before the probe";
  const std::string answer = large.ReadResponse();
  EXPECT_THAT(HttpStatuses(answer), ElementsAre(::testing::Ge(400))) << answer.substr(0, 300);
  EXPECT_TRUE(server->Drain());
  std::filesystem::remove_all(o.repository.path);
}

}  // namespace
}  // namespace attention
