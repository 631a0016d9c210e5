// REST against hostile and slow clients (issue 35), on raw sockets: every
// read bounded (an unended request line, too many header fields: 431),
// RFC 9112 framing (a repeated or list-valued Content-Length is refused, so
// no request is smuggled in a body), pipelined requests answered in order,
// the open connections limited (503), and the drain cutting off a client that
// trickles its head. Each failed on cpp-httplib (main before the Beast
// server): see each test.
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_server.h"
#include "tests/fixture/raw_http_connection.h"
#include "tests/fixture/small_server_options.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::ServerOptions;
using ::attention::testing::HttpStatuses;
using ::attention::testing::RawHttpConnection;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class RestHostileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    options_ = new ServerOptions(testing::SmallServerOptions("rest_hostile"));
    server_ = testing::StartServer(*options_).release();
    ASSERT_NE(server_, nullptr);
  }
  static void TearDownTestSuite() {
    delete server_;
    std::filesystem::remove_all(options_->repository.path);
    delete options_;
  }
  static int Port() { return server_->http_port(); }

  static ServerOptions* options_;
  static server::AttentionServer* server_;
};
ServerOptions* RestHostileTest::options_ = nullptr;
server::AttentionServer* RestHostileTest::server_ = nullptr;

// httplib framed the request by the first value and served the body's rest
// as the next request (the smuggled one was answered).
TEST_F(RestHostileTest, ARepeatedOrListValuedContentLengthIsRefusedAndNothingIsSmuggled) {
  for (const std::string& framing : {std::string("Content-Length: 2\r\nContent-Length: 70\r\n"),
                                     std::string("Content-Length: 2, 70\r\n"),
                                     std::string("Content-Length: 2\r\nContent-Length: 2\r\n")}) {
    RawHttpConnection c(Port());
    ASSERT_TRUE(c.connected());
    c.Send(absl::StrCat("POST /v2/repository/index HTTP/1.1\r\nHost: a\r\n", framing,
                        "\r\n{}GET /v2/models/stats HTTP/1.1\r\nHost: a\r\n\r\n"));
    const std::string stream = c.ReadToEnd();
    EXPECT_THAT(HttpStatuses(stream), ElementsAre(400)) << framing << stream.substr(0, 300);
    EXPECT_EQ(stream.find("model_stats"), std::string::npos) << "smuggled: " << framing;
  }
}

// httplib read a request line until its newline, without bound, and then
// closed the connection unanswered.
TEST_F(RestHostileTest, ARequestLineWithoutEndIs431) {
  RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  c.Send(absl::StrCat("GET /", std::string(size_t{1} << 20, 'a')));  // May fail: closed.
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ElementsAre(431)) << stream.substr(0, 300);
}

// httplib had no limit on the header count.
TEST_F(RestHostileTest, MoreThanAHundredHeaderFieldsAre431) {
  RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  std::string head = "GET /v2/health/live HTTP/1.1\r\nHost: a\r\n";
  for (int i = 0; i < 200; ++i) absl::StrAppend(&head, "X-", i, ": y\r\n");
  c.Send(head + "\r\n");
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ElementsAre(431)) << stream.substr(0, 300);
}

// A repository request's body (JSON read into a DOM, at tens of times its
// size for nested arrays) is bounded at 64 KiB, declared or chunked; httplib
// read and parsed up to --max_message_bytes.
TEST_F(RestHostileTest, ARepositoryRequestsBodyIsBounded) {
  const std::string nested = std::string(40000, '[') + std::string(40000, ']');
  {
    RawHttpConnection c(Port());
    c.Send(absl::StrCat("POST /v2/repository/index HTTP/1.1\r\nHost: a\r\nContent-Length: ",
                        nested.size(), "\r\n\r\n", nested));
    const std::string stream = c.ReadToEnd();
    EXPECT_THAT(HttpStatuses(stream), ElementsAre(413)) << stream.substr(0, 300);
  }
  RawHttpConnection c(Port());
  c.Send(absl::StrCat(
      "POST /v2/repository/index HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
      absl::Hex(nested.size()), "\r\n", nested, "\r\n0\r\n\r\n"));
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ElementsAre(413)) << stream.substr(0, 300);
}

TEST_F(RestHostileTest, PipelinedRequestsAreAnsweredInOrder) {
  RawHttpConnection c(Port());
  ASSERT_TRUE(c.connected());
  c.Send(absl::StrCat(
      "GET /v2/models/small/ready HTTP/1.1\r\nHost: a\r\n\r\n",
      "POST /v2/repository/index HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}",
      "GET /v2/models/nothere HTTP/1.1\r\nHost: a\r\n\r\n", testing::kLastHttpRequest));
  const std::string stream = c.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ElementsAre(200, 200, 404, 200)) << stream.substr(0, 600);
  EXPECT_THAT(stream, HasSubstr("\"READY\""));
}

// httplib queued connections past --http_threads without bound.
TEST(RestConnectionLimitTest, AConnectionPastTheLimitIsAnswered503) {
  ServerOptions o = testing::SmallServerOptions("rest_connection_limit");
  o.http_max_connections = 1;
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  RawHttpConnection first(server->http_port());
  ASSERT_TRUE(first.Send("GET /v2/health/live HTTP/1.1\r\nHost: a\r\n\r\n"));
  ASSERT_THAT(HttpStatuses(first.ReadResponse()), ElementsAre(200));  // Open and counted.
  RawHttpConnection second(server->http_port());
  const std::string stream = second.ReadToEnd();
  EXPECT_THAT(HttpStatuses(stream), ElementsAre(503)) << stream;
  EXPECT_THAT(stream, HasSubstr("too many connections"));
  EXPECT_TRUE(server->Drain());
  std::filesystem::remove_all(o.repository.path);
}

// On httplib, the drain waited for a client trickling its head (each line
// restarted the 5 s read timeout), past --drain_timeout_s.
TEST(RestDrainTest, AHeadTrickledDuringTheDrainDoesNotHoldTheShutdown) {
  ServerOptions o = testing::SmallServerOptions("rest_drain_head");
  o.drain_timeout = absl::Seconds(1);
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  RawHttpConnection c(server->http_port());
  // Served once (so the connection is open on the server), then the next
  // head is trickled.
  ASSERT_TRUE(c.Send("GET /v2/health/live HTTP/1.1\r\nHost: a\r\n\r\n"));
  ASSERT_THAT(HttpStatuses(c.ReadResponse()), ElementsAre(200));
  ASSERT_TRUE(c.Send("GET /v2/health/live HTTP/1.1\r\nHost: a\r\n"));
  std::atomic<bool> drained{false};
  std::thread drain([&] {
    server->Drain();
    drained = true;
  });
  // A header line every 50 ms (the client's pace, not a wait): 20 s in all.
  constexpr int kLines = 400;
  int sent = 0;
  while (!drained.load() && sent < kLines && c.Send(absl::StrCat("X-", sent, ": y\r\n"))) {
    ++sent;
    absl::SleepFor(absl::Milliseconds(50));
  }
  drain.join();
  EXPECT_LT(sent, kLines) << "the drain waited for the trickled head";
  EXPECT_TRUE(c.WaitClosed());
  std::filesystem::remove_all(o.repository.path);
}

// On httplib, a request whose client had gone was computed and counted OK:
// its thread waited for the answer without looking at the socket.
TEST(RestCancelTest, AClientThatGoesBeforeItsAnswerCancelsItsQueuedRequest) {
  testing::ModelFolder models("rest_cancel");
  // Queued for up to 2 s for company: the client is gone before it runs.
  models.Add("small", testing::SelfAttentionSpec(16, 2), 1,
             "\"max_batch_size\": 16, \"max_queue_delay_us\": 2000000");
  ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  const server::ModelMetrics& m = *server->repository()->Find("small")->metrics;
  const auto count = [&](absl::StatusCode code) {
    return m.requests[static_cast<int>(server::Method::kRestModelInfer)][static_cast<int>(code)]
        ->Value();
  };
  std::string data = "0";
  for (int i = 1; i < 16; ++i) data += ",0";
  const std::string body = absl::StrCat(
      R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,1,16],"data":[)", data, "]}]}");
  {
    RawHttpConnection c(server->http_port());
    ASSERT_TRUE(
        c.Send(absl::StrCat("POST /v2/models/small/infer HTTP/1.1\r\nHost: a\r\n"
                            "Content-Type: application/json\r\nContent-Length: ",
                            body.size(), "\r\n\r\n", body)));
  }  // Closed at once.
  // Answered (cancelled) once the batcher wakes for it; bounded at 20 s.
  for (int i = 0;
       i < 2000 && count(absl::StatusCode::kCancelled) + count(absl::StatusCode::kOk) == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(count(absl::StatusCode::kCancelled), 1);
  EXPECT_EQ(count(absl::StatusCode::kOk), 0) << "computed for a client that had gone";
  EXPECT_TRUE(server->Drain());
  std::filesystem::remove_all(models.path());
}

// An inference of 4096 x 512 floats on "wide": 8 MiB in, about 25 MB of
// JSON out, more than the loopback's socket buffers hold while the client
// does not read.
std::string WideInfer() {
  constexpr int kBatch = 4096, kEmbed = 512;
  const std::vector<float> query(size_t{kBatch} * kEmbed, 0.37f);
  const std::string head = absl::StrCat(
      R"({"inputs":[{"name":"query","datatype":"FP32","shape":[)", kBatch, ",1,", kEmbed,
      R"(],"parameters":{"binary_data_size":)", query.size() * sizeof(float), "}}]}");
  return absl::StrCat(
      "POST /v2/models/wide/infer HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
      "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: ",
      head.size(), "\r\nContent-Length: ", head.size() + query.size() * sizeof(float), "\r\n\r\n",
      head, std::string(reinterpret_cast<const char*>(query.data()), query.size() * sizeof(float)));
}

// On httplib, the admission was released when the handler returned, before
// its response was written: responses a slow reader held were outside
// --max_inflight_bytes (attention_inflight_bytes read 0).
TEST(RestAdmissionTest, AResponseStaysAdmittedUntilWritten) {
  testing::ModelFolder models("rest_admission");
  models.Add("wide", testing::SelfAttentionSpec(512, 4), 1, "\"max_batch_tokens\": 8192");
  ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  RawHttpConnection c(server->http_port());
  ASSERT_TRUE(c.Send(WideInfer()));
  const std::string response_head = c.ReadUntil("\r\n\r\n");  // The answer is being written.
  ASSERT_THAT(HttpStatuses(response_head), ElementsAre(200)) << response_head;
  EXPECT_GT(server->metrics().inflight_bytes().Value(), 0)
      << "a response being written is not counted in flight";
  const std::string rest = c.ReadToEnd();
  EXPECT_GT(rest.size(), size_t{16} << 20);
  // Released once written (bounded at 20 s).
  for (int i = 0; i < 2000 && server->metrics().inflight_bytes().Value() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server->metrics().inflight_bytes().Value(), 0);
  EXPECT_TRUE(server->Drain());
  std::filesystem::remove_all(models.path());
}

// On httplib, the drain waited for a client reading its response slowly
// (60 s at 256 KiB/s), past --drain_timeout_s.
TEST(RestDrainTest, ASlowReaderDoesNotHoldTheShutdown) {
  testing::ModelFolder models("rest_drain_reader");
  models.Add("wide", testing::SelfAttentionSpec(512, 4), 1, "\"max_batch_tokens\": 8192");
  ServerOptions o = testing::TestServerOptions(models.path(), /*rest=*/true);
  o.drain_timeout = absl::Seconds(1);
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  RawHttpConnection c(server->http_port());
  ASSERT_TRUE(c.Send(WideInfer()));
  const std::string head = c.ReadUntil("\r\n\r\n");
  ASSERT_THAT(HttpStatuses(head), ElementsAre(200)) << head;
  const size_t length = std::stoul(head.substr(head.find("Content-Length: ") + 16));
  std::atomic<bool> drained{false};
  std::thread drain([&] {
    server->Drain();
    drained = true;
  });
  // 64 KiB every 50 ms (the client's pace, not a wait): 20 s for 25 MB.
  size_t got = 0;
  while (!drained.load()) {
    const std::string part = c.ReadSome(64 << 10);
    if (part.empty()) break;
    got += part.size();
    absl::SleepFor(absl::Milliseconds(50));
  }
  drain.join();
  // The drain's 1 s is about 1.3 MB at this pace (and what the socket
  // buffers held); cpp-httplib's drain waited about 20 s, nearly all of it.
  EXPECT_LT(got, length / 2) << "the drain waited for the slow reader";
  EXPECT_TRUE(c.WaitClosed());
  std::filesystem::remove_all(models.path());
}

}  // namespace
}  // namespace attention
