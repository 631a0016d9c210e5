// HTTP/1.1 framing on the REST port: where a body ends and the next request
// begins. A body a handler leaves unread (100-continue, a HEAD's, one cut
// off at the limit) is never served as the next request on the connection
// (request smuggling / keep-alive desync); bodies of methods without a
// handler are not buffered without bound; a POST without a length has an
// empty body (RFC 9112 6.3); Transfer-Encoding with Content-Length is
// refused and its connection closed (RFC 9112 6.1); a Range on a reply that
// closes its connection reads nothing past the reply; the receive budget
// charges a binary body's JSON header as JSON, and load/unload check the
// token before reading a body. Raw sockets send what an HTTP client
// will not.
#include <sys/resource.h>
#include <zlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/raw_http_connection.h"
#include "tests/fixture/security_test_fixture.h"
#include "tests/fixture/server_fixture.h"
#include "tests/fixture/test_server.h"

namespace attention {
namespace {

using ::attention::testing::HttpStatuses;
using ::testing::HasSubstr;

// The shared server of the server tests (1 MiB --max_message_bytes, no
// tokens).
class RestBodyFramingTest : public ServerTest {
 protected:
  static int Port() { return server_->http_port(); }
  static testing::HttpTestClient Client() {
    testing::HttpTestClient client("127.0.0.1", Port());
    client.SetTimeout(absl::Seconds(30));
    return client;
  }
};

// Runs first: it reads the process's peak RSS, which later tests raise.
TEST_F(RestBodyFramingTest, BodiesOfMethodsWithoutAHandlerAreNotBufferedWithoutBound) {
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
    testing::RawHttpConnection c(Port());
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
TEST_F(RestBodyFramingTest, AnUnreadBodyIsNotServedAsTheNextRequest) {
  // A body that is itself a request: a proxy in front would send its answer
  // to whoever asks next on that connection.
  const std::string inner = "GET /v2/models/stats HTTP/1.1\r\nHost: a\r\n\r\n";
  for (const char* target :
       {"POST /v2/repository/models/small/load", "POST /v2/nothing", "GET /v2/health/ready"}) {
    SCOPED_TRACE(target);
    testing::RawHttpConnection c(Port());
    ASSERT_TRUE(c.connected());
    c.Send(absl::StrCat(target, " HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n",
                        "Content-Length: ", inner.size(), "\r\n\r\n"));
    std::string stream = c.ReadUntil("100 Continue\r\n\r\n");
    c.Send(inner);
    stream += c.ReadResponse();
    c.Send(testing::kLastHttpRequest);  // Fails when the server has closed.
    stream += c.ReadToEnd();
    const std::vector<int> statuses = HttpStatuses(stream);
    EXPECT_EQ(stream.find("model_stats"), std::string::npos)
        << "the body was served: " << ::testing::PrintToString(statuses);
    EXPECT_LE(statuses.size(), 3u);  // 100, the answer, the last request's.
  }
}

TEST_F(RestBodyFramingTest, ABodyCutOffAtTheLimitClosesTheConnection) {
  // Chunked, 1 MiB + 128 KiB: cut at the limit (413), its remaining chunks
  // were then parsed as requests (414, 400, ... and the smuggled one).
  std::string request =
      "POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 18; ++i)
    absl::StrAppend(&request, "10000\r\n", std::string(65536, ' '), "\r\n");
  absl::StrAppend(&request, "0\r\n\r\n", testing::kLastHttpRequest);
  testing::RawHttpConnection c(Port());
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
  EXPECT_FALSE(res->HasHeader("EXCEPTION_WHAT")) << res->Header("EXCEPTION_WHAT");
}

TEST_F(RestBodyFramingTest, APostWithoutContentLengthHasAnEmptyBody) {
  // RFC 9112 6.3: no Content-Length and no Transfer-Encoding is a body of 0
  // bytes. httplib read "until the client closes": the next request was read
  // as this one's body, and after its read timeout (5 s) the answer was 400.
  testing::RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  c.Send("POST /v2/repository/index HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ::testing::ElementsAre(200));
  EXPECT_THAT(stream, HasSubstr("\"READY\""));
}

// One server with tokens, a 4 MiB message limit and a 1 MiB receive budget
// (REST's: 256 KiB of JSON at 4x).
class RestFramingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::ModelFolder models("rest_framing");
    models.Add("small", testing::SelfAttentionSpec(16, 2), 1);
    security_test::WriteTokens(models.path() + ".tokens",
                               security_test::HashHex("alice-secret") + " alice small\n");
    ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
    o.max_message_bytes = 4 << 20;
    o.grpc_receive_quota_bytes = 1 << 20;
    o.auth_tokens_file = models.path() + ".tokens";
    server_ = testing::StartServer(o).release();
    ASSERT_NE(server_, nullptr);
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(server_->Drain());
    delete server_;
  }
  static int Port() { return server_->http_port(); }

  static inline AttentionServer* server_ = nullptr;
};

// A reply that closes its connection (a refusal whose body was not read) is
// written by a content provider; httplib hands it the offsets of the
// request's Range, which it read the reply's string at without a bound: the
// bytes after the ~40-byte error body (the server's heap) went to the client.
TEST_F(RestFramingTest, ARangeOnAClosingReplyIsNotReadPastTheReply) {
  testing::RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  c.Send(
      "GET /v2 HTTP/1.1\r\nHost: a\r\nRange: bytes=300-1323\r\nContent-Length: 1\r\n"
      "\r\nx");
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ::testing::ElementsAre(400)) << stream.substr(0, 300);
  const size_t head = stream.find("\r\n\r\n");
  ASSERT_NE(head, std::string::npos);
  const std::string body = stream.substr(head + 4);
  // The whole error body (the Range ignored), and nothing past it.
  EXPECT_LE(body.size(), 100u) << "bytes past the reply were sent";
  EXPECT_THAT(body, HasSubstr("GET: a body is not read"));
}

// Transfer-Encoding and Content-Length together: httplib reads the body
// chunked, but the body reader judged it by its Content-Length: a huge one
// marked it too big before reading, so the budget was never charged and the
// chunked body was read (up to --max_message_bytes) uncharged, then 413.
// RFC 9112 6.1: such a request may be refused, and its connection MUST be
// closed (a proxy that framed it by Content-Length desyncs from the server).
TEST_F(RestFramingTest, TransferEncodingWithContentLengthIsRefusedUnreadAndClosed) {
  testing::RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  // Headers only: a server that reads the body waits for it (httplib's 5 s
  // read timeout), then answers 413.
  c.Send(
      "POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer alice-secret\r\n"
      "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
      "Content-Length: 1000000000000\r\n\r\n");
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ::testing::ElementsAre(400)) << stream.substr(0, 400);
  EXPECT_THAT(stream, HasSubstr("Content-Length"));

  // A small Content-Length with a whole chunked body: was answered, and the
  // connection kept (the next request answered too).
  testing::RawHttpConnection d(Port());
  ASSERT_TRUE(d.connected());
  d.Send(absl::StrCat(
      "POST /v2/repository/index HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer alice-secret\r\n"
      "Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
      testing::kLastHttpRequest));
  const std::vector<int> statuses = HttpStatuses(d.ReadToEnd());
  // The server may reset (unread bytes) before the client reads the 400.
  EXPECT_LE(statuses.size(), 1u) << ::testing::PrintToString(statuses);
  if (!statuses.empty()) {
    EXPECT_EQ(statuses[0], 400);
  }
}

// Model load/unload read and charged a body before the token was checked
// (infer and the index check it first): an unauthenticated caller's bodies
// were charged to the receive budget (refused 429 past it) instead of 401.
TEST_F(RestFramingTest, LoadAndUnloadCheckTheTokenBeforeReadingTheBody) {
  testing::HttpTestClient client("127.0.0.1", Port());
  client.SetTimeout(absl::Seconds(30));
  // 320 KiB of JSON: 1.25 MiB at 4x, beyond the 1 MiB budget.
  const std::string body =
      absl::StrCat(R"({"parameters":{"pad":")", std::string(320 << 10, 'a'), R"("}})");
  for (const char* action : {"load", "unload"}) {
    SCOPED_TRACE(action);
    auto res =
        client.Post(absl::StrCat("/v2/repository/models/small/", action), body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << res->body;
    EXPECT_EQ(res->Header("WWW-Authenticate"), "Bearer");
  }
  // Authenticated, the model stays served (the small body: an empty one).
  auto ready = client.Get("/v2/models/small/ready", {{"Authorization", "Bearer alice-secret"}});
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << ready->body;
}

// A load's or unload's body was read whole and parsed (nlohmann's DOM, tens of
// times its size for nested arrays) before the admin right was checked: a
// caller with a valid token but no admin right is now refused by the head,
// without a byte of the body read (on httplib it waited for the body).
TEST_F(RestFramingTest, LoadAndUnloadCheckTheAdminRightBeforeReadingTheBody) {
  for (const char* action : {"load", "unload"}) {
    SCOPED_TRACE(action);
    testing::RawHttpConnection c(Port());
    ASSERT_TRUE(c.connected());
    // 1 MiB announced, none sent.
    c.Send(absl::StrCat("POST /v2/repository/models/small/", action,
                        " HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer alice-secret\r\n"
                        "Content-Type: application/json\r\nContent-Length: ",
                        1 << 20, "\r\n\r\n"));
    const std::string answer = c.ReadResponse();
    EXPECT_THAT(HttpStatuses(answer), ::testing::ElementsAre(403)) << answer;
  }
}

// A body with Inference-Header-Content-Length was charged at the binary
// rate (2x) whole, though its JSON header (all of it, when the header
// length is the body's) is read as JSON (3x): 400 KiB of JSON, beyond the
// 1 MiB budget at 3x, was taken at 2x. Headers alone: refused unread.
TEST_F(RestFramingTest, ABinaryBodysJsonHeaderIsChargedAsJson) {
  testing::RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  const int json = 400 << 10;
  c.Send(absl::StrCat(
      "POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer alice-secret\r\n"
      "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: ",
      json, "\r\nContent-Length: ", json + 64, "\r\n\r\n"));
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ::testing::ElementsAre(429)) << stream.substr(0, 400);
  EXPECT_THAT(stream, HasSubstr("--grpc_receive_quota_bytes"));
}

// A HEAD with a body is refused and its connection to be closed; httplib
// writes no body for HEAD, so the provider that closes the connection did
// not run: the reply said "Connection: close", the connection stayed open,
// and the body (sent after the headers were read) was served as a request.
TEST_F(RestFramingTest, AHeadsBodyIsNotServedAsTheNextRequest) {
  const std::string inner =
      "GET /v2/models/stats HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer alice-secret\r\n\r\n";
  testing::RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  c.Send(absl::StrCat("HEAD /v2/health/live HTTP/1.1\r\nHost: a\r\nContent-Length: ", inner.size(),
                      "\r\n\r\n"));
  std::string stream;
  char ch;
  while (stream.find("\r\n\r\n") == std::string::npos && c.ReadByte(&ch)) stream.push_back(ch);
  c.Send(inner);  // Fails once the server has closed.
  c.Send(testing::kLastHttpRequest);
  stream += c.ReadToEnd();
  EXPECT_EQ(stream.find("model_stats"), std::string::npos) << "the body was served: " << stream;
  EXPECT_THAT(HttpStatuses(stream), ::testing::ElementsAre(400)) << stream;
}

}  // namespace
}  // namespace attention
