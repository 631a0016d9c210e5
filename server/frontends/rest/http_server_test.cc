// HttpServer on raw sockets: every read bounded in bytes and time, RFC 9112
// framing, pipelining, the connection limit, cancellation on disconnect and
// the drain. The deadlines are set short (a fraction of a second) so the
// tests are fast; no assertion is on time: each waits for what the server
// does, bounded by the raw connection's 20 s read timeout.
#include "server/frontends/rest/http_server.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/fixture/raw_http_connection.h"

namespace attention::server {
namespace {

using ::attention::testing::HttpStatuses;
using ::attention::testing::RawHttpConnection;

// Answers every request with its method, path and body size; /refuse is
// refused at its head (401); /hold is kept for the test to answer.
class TestHandler : public HttpHandler {
 public:
  HeadDecision OnHead(const HttpRequest& head) override {
    HeadDecision decision;
    if (head.path == "/refuse") {
      decision.refuse.emplace();
      decision.refuse->status = 401;
      decision.refuse->body = "refused";
    }
    return decision;
  }
  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) override {
    if (request.path == "/hold") {
      exchange->OnCancel([this] { cancelled_.Notify(); });
      absl::MutexLock lock(&mu_);
      held_ = std::move(exchange);
      got_hold_.Notify();
      return;
    }
    HttpResponse response;
    if (request.path == "/big") {
      // 32 MiB, its release (written or dropped) notified.
      response.body.assign(32 << 20, 'x');
      response.hold = std::shared_ptr<void>(nullptr, [this](void*) { big_released_.Notify(); });
    } else {
      response.body = absl::StrCat(request.method, " ", request.path, " ", request.body.size());
    }
    exchange->Reply(std::move(response));
  }
  std::shared_ptr<HttpExchange> TakeHeld() {
    absl::MutexLock lock(&mu_);
    return std::move(held_);
  }

  absl::Notification got_hold_;
  absl::Notification cancelled_;
  absl::Notification big_released_;

 private:
  absl::Mutex mu_;
  std::shared_ptr<HttpExchange> held_ ABSL_GUARDED_BY(mu_);
};

class HttpServerTest : public ::testing::Test {
 protected:
  void Serve() {
    options_.host = "127.0.0.1";
    options_.port = 0;
    auto server = HttpServer::Start(options_, &handler_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (auto held = handler_.TakeHeld()) held->Reply(HttpResponse());
    if (server_) server_->Stop();
  }

  HttpServerOptions options_;
  TestHandler handler_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, AnswersAndKeepsTheConnectionAlive) {
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(c.ReadResponse().find("GET /a 0"), std::string::npos);
  ASSERT_TRUE(c.Send("POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"));
  EXPECT_NE(c.ReadResponse().find("POST /b 3"), std::string::npos);
}

TEST_F(HttpServerTest, AHeadTrickledPastItsDeadlineIsClosedUnanswered) {
  options_.header_timeout = absl::Milliseconds(300);
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("GET /a HTTP/1.1\r\n"));
  // A header line every 20 ms, never ending the head: each keeps the socket
  // busy (an inactivity timeout would never fire), the deadline is total.
  bool closed = false;
  for (int i = 0; i < 1000 && !closed; ++i) {
    if (!c.Send(absl::StrCat("X-", i, ": y\r\n"))) break;
    closed = c.Readable(20);
  }
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_EQ(c.ReadToEnd(), "");
}

// R-U-Dead-Yet: a body sent a byte at a time keeps the socket busy; the
// body's deadline is total.
TEST_F(HttpServerTest, ABodyTrickledPastItsDeadlineIs408) {
  options_.body_timeout = absl::Milliseconds(300);
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"));
  bool answered = false;
  for (int i = 0; i < 100000 && !answered; ++i) {
    if (!c.Send("y")) break;
    answered = c.Readable(20);
  }
  EXPECT_TRUE(answered);
  const std::string stream = c.ReadToEnd();
  EXPECT_EQ(HttpStatuses(stream), std::vector<int>{408}) << stream.substr(0, 200);
  EXPECT_EQ(stream.find("POST /a"), std::string::npos);
}

// A client that never reads its answer holds it (and its admission) only
// until the write deadline: then the connection is closed and the
// response released, most of it unwritten.
TEST_F(HttpServerTest, AReaderThatDoesNotReadIsCutOffAtTheWriteDeadline) {
  options_.write_timeout = absl::Milliseconds(300);
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_TRUE(handler_.big_released_.WaitForNotificationWithTimeout(absl::Seconds(20)));
  const std::string stream = c.ReadToEnd();
  EXPECT_LT(stream.size(), size_t{32} << 20);  // The socket's buffers held the rest.
  EXPECT_EQ(HttpStatuses(stream), std::vector<int>{200});
}

TEST_F(HttpServerTest, ARequestLineLongerThanTheHeadLimitIs431) {
  options_.header_limit_bytes = 4096;
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send(absl::StrCat("GET /", std::string(1 << 20, 'a'))));  // No newline.
  const std::string answer = c.ReadToEnd();
  EXPECT_EQ(HttpStatuses(answer), std::vector<int>{431}) << answer.substr(0, 200);
}

TEST_F(HttpServerTest, AHeaderLongerThanTheHeadLimitIs431) {
  options_.header_limit_bytes = 4096;
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(
      c.Send(absl::StrCat("GET / HTTP/1.1\r\nHost: x\r\nX-Big: ", std::string(8192, 'b'), "\r\n")));
  EXPECT_EQ(HttpStatuses(c.ReadToEnd()), std::vector<int>{431});
}

// A refusal of a head that follows a HEAD request has its body: it is not
// answered as the HEAD was.
TEST_F(HttpServerTest, ARefusalAfterAHeadRequestHasItsBody) {
  options_.header_limit_bytes = 4096;
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("HEAD /a HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string head = c.ReadUntil("\r\n\r\n");
  ASSERT_EQ(HttpStatuses(head), std::vector<int>{200});
  ASSERT_TRUE(c.Send(absl::StrCat("GET /", std::string(8192, 'a'), " HTTP/1.1\r\n")));
  const std::string answer = c.ReadToEnd();
  EXPECT_EQ(HttpStatuses(answer), std::vector<int>{431});
  EXPECT_NE(answer.find("request head: larger than 4096 bytes"), std::string::npos) << answer;
}

TEST_F(HttpServerTest, MoreHeaderFieldsThanTheLimitIs431) {
  options_.max_header_fields = 100;
  Serve();
  RawHttpConnection c(server_->port());
  std::string head = "GET / HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 150; ++i) absl::StrAppend(&head, "X-", i, ": y\r\n");
  ASSERT_TRUE(c.Send(head + "\r\n"));
  const std::string answer = c.ReadToEnd();
  EXPECT_EQ(HttpStatuses(answer), std::vector<int>{431});
  EXPECT_NE(answer.find("151 header fields, more than 100"), std::string::npos) << answer;
}

TEST_F(HttpServerTest, ContentLengthRepeatedOrAListOrWithChunkedIs400) {
  Serve();
  for (const std::string& framing :
       {std::string("Content-Length: 2\r\nContent-Length: 40\r\n"),
        std::string("Content-Length: 2\r\nContent-Length: 2\r\n"),
        std::string("Content-Length: 2, 40\r\n"), std::string("Content-Length: 2, 2\r\n"),
        std::string("Transfer-Encoding: chunked\r\nContent-Length: 2\r\n"),
        std::string("Content-Length: 2\r\nTransfer-Encoding: chunked\r\n")}) {
    RawHttpConnection c(server_->port());
    // What follows the first 2 bytes would be a smuggled request.
    ASSERT_TRUE(c.Send(absl::StrCat("POST /a HTTP/1.1\r\nHost: x\r\n", framing,
                                    "\r\nabGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")));
    const std::string answer = c.ReadToEnd();
    EXPECT_EQ(HttpStatuses(answer), std::vector<int>{400}) << framing << answer;
    EXPECT_EQ(answer.find("smuggled"), std::string::npos) << framing;
  }
}

TEST_F(HttpServerTest, ATransferEncodingOtherThanChunkedIs501) {
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nab"));
  EXPECT_EQ(HttpStatuses(c.ReadToEnd()), std::vector<int>{501});
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send(
      "GET /1 HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
      "POST /3 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nz"
      "GET /4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string answers = c.ReadToEnd();
  EXPECT_EQ(HttpStatuses(answers), (std::vector<int>{200, 200, 200, 200}));
  const size_t one = answers.find("GET /1 0"), two = answers.find("POST /2 3"),
               three = answers.find("POST /3 1"), four = answers.find("GET /4 0");
  ASSERT_NE(four, std::string::npos) << answers;
  EXPECT_LT(one, two);
  EXPECT_LT(two, three);
  EXPECT_LT(three, four);
}

TEST_F(HttpServerTest, AnIdleKeepAliveConnectionIsClosed) {
  options_.idle_timeout = absl::Milliseconds(100);
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(HttpStatuses(c.ReadResponse()), std::vector<int>{200});
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpServerTest, AConnectionPastTheLimitIsAnswered503AndClosed) {
  options_.max_connections = 1;
  Serve();
  RawHttpConnection first(server_->port());
  ASSERT_TRUE(first.Send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_EQ(HttpStatuses(first.ReadResponse()), std::vector<int>{200});  // Open, counted.
  RawHttpConnection second(server_->port());
  const std::string answer = second.ReadToEnd();
  EXPECT_EQ(HttpStatuses(answer), std::vector<int>{503}) << answer;
  ASSERT_TRUE(first.Send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n"));  // The first is served still.
  EXPECT_EQ(HttpStatuses(first.ReadResponse()), std::vector<int>{200});
}

TEST_F(HttpServerTest, ABodyPastTheLimitIs413WhateverItsFraming) {
  options_.max_body_bytes = 1000;
  Serve();
  {
    RawHttpConnection c(server_->port());
    ASSERT_TRUE(c.Send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n"));
    EXPECT_EQ(HttpStatuses(c.ReadToEnd()), std::vector<int>{413});
  }
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  for (int i = 0; i < 11 && c.Send(absl::StrCat("64\r\n", std::string(100, 'x'), "\r\n"));) ++i;
  EXPECT_EQ(HttpStatuses(c.ReadToEnd()), std::vector<int>{413});
}

TEST_F(HttpServerTest, AChunkSizeLineIsBounded) {
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  // A chunk extension without end: never buffered past the head's limit.
  c.Send(absl::StrCat("1;", std::string(1 << 20, 'e')));
  const std::string answer = c.ReadToEnd();
  ASSERT_EQ(HttpStatuses(answer).size(), 1u) << answer;
  EXPECT_EQ(HttpStatuses(answer)[0] / 100, 4) << answer;
}

TEST_F(HttpServerTest, ARefusedHeadIsAnsweredWithoutReadingItsBody) {
  Serve();
  RawHttpConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"));
  const std::string answer = c.ReadResponse();
  EXPECT_EQ(HttpStatuses(answer), std::vector<int>{401});
  EXPECT_NE(answer.find("Connection: close"), std::string::npos) << answer;
  // What the client still sends is dropped, then the connection closed.
  c.Send(std::string(100000, 'x'));
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpServerTest, AClientThatGoesCancelsItsRequest) {
  Serve();
  {
    RawHttpConnection c(server_->port());
    ASSERT_TRUE(c.Send("POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nz"));
    handler_.got_hold_.WaitForNotification();
  }  // Closed before the answer.
  ASSERT_TRUE(handler_.cancelled_.WaitForNotificationWithTimeout(absl::Seconds(20)));
  auto held = handler_.TakeHeld();
  ASSERT_NE(held, nullptr);
  EXPECT_TRUE(held->cancelled());
  held->Reply(HttpResponse());  // Dropped: nobody to write it to.
}

TEST_F(HttpServerTest, TheDrainClosesConnectionsWhateverTheyDo) {
  Serve();
  RawHttpConnection computing(server_->port());
  ASSERT_TRUE(computing.Send("POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nz"));
  handler_.got_hold_.WaitForNotification();
  RawHttpConnection trickling(server_->port());
  ASSERT_TRUE(trickling.Send("GET /a HTTP/1.1\r\nHost: x\r\n"));
  // The held request is answered once cancelled, as a request path does.
  std::shared_ptr<HttpExchange> held = handler_.TakeHeld();
  absl::Notification cancelled;
  held->OnCancel([&cancelled, weak = std::weak_ptr<HttpExchange>(held)] {
    cancelled.Notify();
    if (auto exchange = weak.lock()) exchange->Reply(HttpResponse());
  });
  server_->Stop(absl::Milliseconds(100));
  EXPECT_TRUE(cancelled.HasBeenNotified());
  EXPECT_TRUE(computing.WaitClosed());
  EXPECT_TRUE(trickling.WaitClosed());
}

}  // namespace
}  // namespace attention::server
