// REST connections and bodies. Busy keep-alive connections on every I/O thread: a client that
// connects meanwhile is served while those keep sending (on cpp-httplib's thread per connection
// it waited until one of them stopped). Bodies beyond the receive budget are refused and dropped.
// The drain stops the REST port without waiting for a body a client trickles.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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
#include "tests/fixture/http_test_client.h"
#include "tests/fixture/raw_http_connection.h"
#include "tests/fixture/small_server_options.h"
#include "tests/fixture/test_server.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::server::ServerOptions;

TEST(RestConnectionsTest, AConnectionBeyondTheThreadsIsServedWhileOthersKeepSending) {
  ServerOptions o = testing::SmallServerOptions("rest_connections");
  o.http_io_threads = 2;
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();

  // Two keep-alive clients hold both threads, sending without a pause until
  // the third is answered (or, on a server that starves it, a bound).
  std::atomic<bool> third_answered{false};
  std::atomic<int> busy_ready{0};
  std::atomic<int> busy_ok[2] = {0, 0}, busy_failed[2] = {0, 0};  // Read while written.
  const absl::Time bound = absl::Now() + absl::Seconds(20);
  std::atomic<bool> bound_reached{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < 2; ++i) {
    busy.emplace_back([&, i] {
      testing::HttpTestClient client("127.0.0.1", port);
      client.SetKeepAlive(true);
      client.SetTimeout(absl::Seconds(30));
      bool counted = false;
      while (!third_answered.load()) {
        if (absl::Now() > bound) {
          bound_reached = true;
          break;
        }
        auto res = client.Get("/v2/models/small/ready");
        if (res && res->status == 200) {
          ++busy_ok[i];
        } else {
          ++busy_failed[i];
        }
        if (!counted) {
          counted = true;
          ++busy_ready;
        }
      }
    });
  }
  while (busy_ready.load() < 2 && absl::Now() < bound) absl::SleepFor(absl::Milliseconds(1));

  const int before = busy_ok[0] + busy_ok[1];
  testing::HttpTestClient third("127.0.0.1", port);
  third.SetTimeout(absl::Seconds(30));
  auto res = third.Get("/v2/health/ready");
  third_answered = true;
  for (std::thread& t : busy) t.join();

  const int meanwhile = busy_ok[0] + busy_ok[1] - before;
  ASSERT_TRUE(res) << res.error();
  EXPECT_EQ(res->status, 200);
  EXPECT_FALSE(bound_reached.load())
      << "the third connection was served only once the busy clients stopped";
  // Served in turn: each busy connection is closed after the reply it was
  // writing when the third arrived, so a few of theirs are answered first
  // (about 6 here), not the keep-alive limit's 100000 per connection.
  EXPECT_LT(meanwhile, 1000) << "busy requests answered while the third waited";
  for (int i = 0; i < 2; ++i) {
    EXPECT_GT(busy_ok[i].load(), 0) << "busy client " << i;
    EXPECT_EQ(busy_failed[i].load(), 0)
        << "busy client " << i << ": a closed keep-alive connection "
        << "must be reopened by the client, not fail a request";
  }
  EXPECT_TRUE(server->Drain());
}

// Bodies being read and parsed are charged to a receive budget before the
// in-flight budget admits what was parsed: a body the budget cannot take is
// refused (429, naming the quota) and dropped as it is read, framed by
// Content-Length or chunked, and a body's charge is given back once it is
// answered.
TEST(RestConnectionsTest, BodiesBeyondTheReceiveBudgetAreRefusedAndDropped) {
  ServerOptions o = testing::SmallServerOptions("rest_receive");
  o.max_message_bytes = 4 << 20;
  o.grpc_receive_quota_bytes = 1 << 20;  // REST's budget too: 256 KiB of JSON at 4x.
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  testing::HttpTestClient client("127.0.0.1", server->http_port());
  client.SetTimeout(absl::Seconds(30));

  auto body_of = [](int length) {
    std::string data;
    for (int i = 0; i < length * 16; ++i) absl::StrAppend(&data, i ? "," : "", 0.001 * (i % 997));
    return absl::StrCat(R"({"inputs":[{"name":"query","datatype":"FP32","shape":[1,)", length,
                        R"(,16],"data":[)", data, "]}]}");
  };
  const std::string small = body_of(64);
  const std::string large = body_of(8192);
  ASSERT_LT(small.size() * 4, size_t{1} << 20);
  ASSERT_GT(large.size() * 4, size_t{1} << 20);
  ASSERT_LT(large.size(), size_t{4} << 20);  // Within --max_message_bytes: not a 413.

  for (int i = 0; i < 3; ++i) {  // Charges are given back: the budget does not leak.
    auto res = client.Post("/v2/models/small/infer", small, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
  }
  // Refused by its Content-Length; the body is read and dropped (nothing
  // kept), so the client, still sending it, reads the 429 and not a reset.
  for (int i = 0; i < 3; ++i) {
    auto refused = client.Post("/v2/models/small/infer", large, "application/json");
    ASSERT_TRUE(refused) << refused.error();
    EXPECT_EQ(refused->status, 429) << refused->body;
    EXPECT_THAT(refused->body, ::testing::HasSubstr("--grpc_receive_quota_bytes"));
  }

  // Chunked: no length to charge up front, so the charge grows as it is read.
  size_t sent = 0;
  auto chunked = client.PostChunked(
      "/v2/models/small/infer",
      [&](std::string* chunk) {
        const size_t n = std::min<size_t>(64 << 10, large.size() - sent);
        if (n == 0) return false;
        *chunk = large.substr(sent, n);
        sent += n;
        return true;
      },
      "application/json");
  // The rest of a refused body is read and dropped, so the client reads the
  // 429 (it was a reset when the server closed with the body unread).
  ASSERT_TRUE(chunked) << chunked.error();
  EXPECT_EQ(chunked->status, 429) << chunked->body;
  EXPECT_EQ(sent, large.size());

  auto after = client.Post("/v2/models/small/infer", small, "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;
  EXPECT_TRUE(server->Drain());
}

// The drain stops the REST port once its accepted requests are answered, and
// the port's threads are joined: a handler still reading a body that a
// client trickles (a byte at a time, each within the read timeout) held the
// shutdown until the whole body had come, past --drain_timeout.
TEST(RestDrainTest, ABodyTrickledDuringTheDrainDoesNotHoldTheShutdown) {
  ServerOptions o = testing::SmallServerOptions("rest_drain");
  o.drain_timeout = absl::Seconds(2);
  auto server = testing::StartServer(o);
  ASSERT_NE(server, nullptr);
  testing::RawHttpConnection c(server->http_port());
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
  ASSERT_THAT(head, ::testing::HasSubstr("100 Continue"));
  int sent = 0;
  ASSERT_TRUE(c.Send("{"));
  ++sent;
  std::atomic<bool> drained{false};
  std::thread drain([&] {
    server->Drain();
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

}  // namespace
}  // namespace attention
