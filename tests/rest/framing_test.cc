// A second adversarial review of the REST front-end where its connection
// rules (a reply that closes its connection, the receive budget) meet HTTP
// framing and the server's other paths: a Range header on a reply that
// closes its connection read the server's heap past the reply; a request
// with both Transfer-Encoding and Content-Length was read chunked but judged
// by its Content-Length (a huge one skipped the receive budget) and kept its
// connection (RFC 9112 6.1: the server MUST close it); model load/unload read
// and charged an unauthenticated caller's body before the token was checked.
// A body trickled during the drain held the shutdown past --drain_timeout.
// A HEAD's body was served as the next request (its reply did not close).
// A binary body's JSON header was charged at the binary rate.
// Raw sockets send what cpp-httplib's client will not.
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "server/security/token_authenticator.h"
#include "tests/fixture/raw_http_connection.h"
#include "tests/fixture/small_server_options.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::AttentionServer;
using ::attention::server::ServerOptions;
using ::attention::testing::HttpStatuses;
using ::attention::testing::kLastHttpRequest;
using ::attention::testing::RawHttpConnection;
using ::testing::HasSubstr;

// One server with tokens, a 4 MiB message limit and a 1 MiB receive budget
// (REST's: 256 KiB of JSON at 4x).
class RestFramingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/rest_framing_" + std::to_string(getpid()));
    testing::WriteModelDir(**MhaModel::Random(testing::SelfAttentionSpec(16, 2), 1),
                           *dir_ + "/models/small");
    {
      std::ofstream out(*dir_ + "/tokens");
      const auto h = server::TokenAuthenticator::Hash("alice-secret");
      out << absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(h.data()), 32))
          << " alice small\n";
    }
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.metrics_port = 0;
    o.http_port = 0;
    o.drain_grace = absl::ZeroDuration();
    o.max_message_bytes = 4 << 20;
    o.grpc_receive_quota_bytes = 1 << 20;
    o.repository.path = *dir_ + "/models";
    o.repository.compute_threads = 1;
    o.repository.warmup = false;
    o.auth_tokens_file = *dir_ + "/tokens";
    auto server = AttentionServer::Listen(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    ASSERT_TRUE(server_->LoadModels().ok());
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(server_->Drain());
    delete server_;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static int Port() { return server_->http_port(); }

  static AttentionServer* server_;
  static std::string* dir_;
};

AttentionServer* RestFramingTest::server_ = nullptr;
std::string* RestFramingTest::dir_ = nullptr;

// A reply that closes its connection (a refusal whose body was not read) is
// written by a content provider; httplib hands it the offsets of the
// request's Range, which it read the reply's string at without a bound: the
// bytes after the ~40-byte error body (the server's heap) went to the client.
TEST_F(RestFramingTest, ARangeOnAClosingReplyIsNotReadPastTheReply) {
  RawHttpConnection c(Port());
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
  RawHttpConnection c(Port());
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
  RawHttpConnection d(Port());
  ASSERT_TRUE(d.connected());
  d.Send(absl::StrCat(
      "POST /v2/repository/index HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer alice-secret\r\n"
      "Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
      kLastHttpRequest));
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
  httplib::Client client("127.0.0.1", Port());
  client.set_read_timeout(30, 0);
  // 320 KiB of JSON: 1.25 MiB at 4x, beyond the 1 MiB budget.
  const std::string body =
      absl::StrCat(R"({"parameters":{"pad":")", std::string(320 << 10, 'a'), R"("}})");
  for (const char* action : {"load", "unload"}) {
    SCOPED_TRACE(action);
    auto res =
        client.Post(absl::StrCat("/v2/repository/models/small/", action), body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << res->body;
    EXPECT_EQ(res->get_header_value("WWW-Authenticate"), "Bearer");
  }
  // Authenticated, the model stays served (the small body: an empty one).
  auto ready = client.Get("/v2/models/small/ready", {{"Authorization", "Bearer alice-secret"}});
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << ready->body;
}

// A body with Inference-Header-Content-Length was charged at the binary
// rate (2x) whole, though its JSON header (all of it, when the header
// length is the body's) is parsed as JSON (4x): 320 KiB of JSON, beyond the
// 1 MiB budget at 4x, was taken at 2x. Headers alone: refused unread.
TEST_F(RestFramingTest, ABinaryBodysJsonHeaderIsChargedAsJson) {
  RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  const int json = 320 << 10;
  c.Send(absl::StrCat(
      "POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer alice-secret\r\n"
      "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: ",
      json, "\r\nContent-Length: ", json + 64, "\r\n\r\n"));
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ::testing::ElementsAre(429)) << stream.substr(0, 400);
  EXPECT_THAT(stream, HasSubstr("--grpc_receive_quota_bytes"));
}

// The drain stops the REST port once its accepted requests are answered, and
// the port's threads are joined: a handler still reading a body that a
// client trickles (a byte at a time, each within the read timeout) held the
// shutdown until the whole body had come, past --drain_timeout.
TEST(RestDrainTest, ABodyTrickledDuringTheDrainDoesNotHoldTheShutdown) {
  ServerOptions o = testing::SmallServerOptions("rest_drain");
  o.drain_timeout = absl::Seconds(2);
  auto server = AttentionServer::Listen(o);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->LoadModels().ok());
  RawHttpConnection c((*server)->http_port());
  ASSERT_TRUE(c.connected());
  constexpr int kBody = 160;
  // 100 Continue: the server has read the headers and goes on to the handler.
  c.Send(absl::StrCat(
      "POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
      "Expect: 100-continue\r\nContent-Length: ",
      kBody, "\r\n\r\n"));
  std::string head;
  char ch;
  while (head.find("\r\n\r\n") == std::string::npos && c.ReadByte(&ch)) head.push_back(ch);
  ASSERT_THAT(head, HasSubstr("100 Continue"));
  int sent = 0;
  ASSERT_TRUE(c.Send("{"));
  ++sent;
  std::atomic<bool> drained{false};
  std::thread drain([&] {
    (*server)->Drain();
    drained = true;
  });
  // A byte every 250 ms (the body's pace, not a wait): 40 s for the body.
  while (!drained.load() && sent < kBody && c.Send(" ")) {
    ++sent;
    absl::SleepFor(absl::Milliseconds(250));
  }
  drain.join();
  EXPECT_LT(sent, kBody) << "the drain waited for the whole trickled body";
  std::filesystem::remove_all(o.repository.path);
}

// A HEAD with a body is refused and its connection to be closed; httplib
// writes no body for HEAD, so the provider that closes the connection did
// not run: the reply said "Connection: close", the connection stayed open,
// and the body (sent after the headers were read) was served as a request.
TEST_F(RestFramingTest, AHeadsBodyIsNotServedAsTheNextRequest) {
  const std::string inner =
      "GET /v2/models/stats HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer alice-secret\r\n\r\n";
  RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  c.Send(absl::StrCat("HEAD /v2/health/live HTTP/1.1\r\nHost: a\r\nContent-Length: ", inner.size(),
                      "\r\n\r\n"));
  std::string stream;
  char ch;
  while (stream.find("\r\n\r\n") == std::string::npos && c.ReadByte(&ch)) stream.push_back(ch);
  c.Send(inner);  // Fails once the server has closed.
  c.Send(kLastHttpRequest);
  stream += c.ReadToEnd();
  EXPECT_EQ(stream.find("model_stats"), std::string::npos) << "the body was served: " << stream;
  EXPECT_THAT(HttpStatuses(stream), ::testing::ElementsAre(400)) << stream;
}

}  // namespace
}  // namespace attention
