#include "client/cli/call_advice.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attention::client {
namespace {

using ::testing::HasSubstr;

// A loopback listener that accepts one connection, reads the preface, and
// answers `reply` (empty: hangs up without a byte).
class OneShotListener {
 public:
  explicit OneShotListener(std::string reply) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    bind(fd_, reinterpret_cast<sockaddr*>(&address), length);
    listen(fd_, 1);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this, reply] {
      const int client = accept(fd_, nullptr, nullptr);
      char preface[33];
      size_t got = 0;
      while (got < sizeof(preface)) {
        const ssize_t n = read(client, preface + got, sizeof(preface) - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      if (!reply.empty()) (void)!write(client, reply.data(), reply.size());
      close(client);
    });
  }
  ~OneShotListener() {
    thread_.join();
    close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(CallAdviceTest, ProbeTellsPlaintextHttp2FromTls) {
  {
    OneShotListener http2(std::string("\0\0\0\4\0\0\0\0\0", 9));  // A SETTINGS frame.
    EXPECT_EQ(CallAdvice::Probe("127.0.0.1", http2.port()), CallAdvice::Listener::kHttp2);
  }
  {
    OneShotListener alert(std::string("\x15\x03\x01\0\x02\x02\x46", 7));  // A TLS alert.
    EXPECT_EQ(CallAdvice::Probe("127.0.0.1", alert.port()), CallAdvice::Listener::kTls);
  }
  {
    OneShotListener hang_up("");
    EXPECT_EQ(CallAdvice::Probe("127.0.0.1", hang_up.port()), CallAdvice::Listener::kTls);
  }
}

TEST(CallAdviceTest, MessagesOverALimitNameMaxMessageBytes) {
  CallAdvice::Call call;
  call.target = "127.0.0.1:1";
  call.max_message_bytes = 268435456;
  const int kResourceExhausted = 8;
  // The server's limit (the CLI's default is larger).
  std::string hint = CallAdvice::For(
      kResourceExhausted, "Received message larger than max (102400025 vs. 67108864)", call);
  EXPECT_EQ(hint,
            "the request is 102400025 bytes, over the server's limit of 67108864: send less per "
            "request, or start the server with --max_message_bytes=102400025 or more");
  // The client's own limit, sending and receiving.
  call.max_message_bytes = 1048576;
  hint = CallAdvice::For(kResourceExhausted, "Sent message larger than max (2097152 vs. 1048576)",
                         call);
  EXPECT_THAT(hint, HasSubstr("the request is 2097152 bytes, over this client's limit of "
                              "1048576: raise --max_message_bytes"));
  hint = CallAdvice::For(kResourceExhausted,
                         "Received message larger than max (2097152 vs. 1048576)", call);
  EXPECT_THAT(hint, HasSubstr("the response is 2097152 bytes, over this client's limit"));
  // Other failures get no hint.
  EXPECT_EQ(CallAdvice::For(3, "query: expected shape [*, *, 256], got [1, 4, 100]", call), "");
  EXPECT_EQ(CallAdvice::For(14, "the server is draining", call), "");
}

TEST(CallAdviceTest, TlsMismatchesFromTheProbe) {
  CallAdvice::Call call;
  {
    OneShotListener tls_server("");  // Hangs up on plaintext, as a TLS server does.
    call.target = "127.0.0.1:" + std::to_string(tls_server.port());
    EXPECT_THAT(CallAdvice::For(14, "failed to connect to all addresses; Socket closed", call),
                HasSubstr("the server speaks TLS: pass --tls"));
  }
  {
    OneShotListener plaintext(std::string("\0\0\0\4\0\0\0\0\0", 9));
    call.target = "127.0.0.1:" + std::to_string(plaintext.port());
    call.tls = true;
    EXPECT_THAT(CallAdvice::For(14, "Ssl handshake failed: WRONG_VERSION_NUMBER", call),
                HasSubstr("the server speaks plaintext, not TLS"));
  }
  call.target = "127.0.0.1:1";
  EXPECT_THAT(CallAdvice::For(14, "Ssl handshake failed: CERTIFICATE_VERIFY_FAILED", call),
              HasSubstr("does not trust the server's certificate"));
}

// Nothing listening, no token or a refused one, a deadline passed: each hint
// names the flag that fixes it (issue 38).
TEST(CallAdviceTest, HintsNameServerTokenFileAndDeadlineMs) {
  CallAdvice::Call call;
  {
    // A port that was free: a refused connection.
    OneShotListener* const taken = new OneShotListener(std::string("\0\0\0\4\0\0\0\0\0", 9));
    const int port = taken->port();
    EXPECT_EQ(CallAdvice::Probe("127.0.0.1", port), CallAdvice::Listener::kHttp2);
    delete taken;
    EXPECT_EQ(CallAdvice::Probe("127.0.0.1", port), CallAdvice::Listener::kNothing);
    call.target = "127.0.0.1:" + std::to_string(port);
    EXPECT_EQ(CallAdvice::Describe("GetModel", 14,
                                   "connections to all backends failing; last error: UNKNOWN: "
                                   "ipv4:127.0.0.1:1: Failed to connect to remote host: "
                                   "Connection refused",
                                   call),
              "GetModel failed: UNAVAILABLE: cannot connect to " + call.target +
                  " (connection refused)\n  hint: nothing is listening at " + call.target +
                  "? start attention-server there (its --port), or pass --server HOST:PORT of a "
                  "running one");
  }
  EXPECT_THAT(CallAdvice::For(16, "send the metadata 'authorization: Bearer <token>'", call),
              HasSubstr("pass --token_file=FILE (a file holding the token) or set the "
                        "ATTENTION_TOKEN environment variable"));
  call.token = true;
  EXPECT_THAT(CallAdvice::For(16, "unknown token", call),
              HasSubstr("refused this client's bearer token (read from --token_file, else the "
                        "ATTENTION_TOKEN environment variable)"));
  call.deadline_ms = 1500;
  EXPECT_THAT(CallAdvice::For(4, "Deadline Exceeded", call),
              HasSubstr("the call took longer than --deadline_ms=1500: raise it"));
  EXPECT_EQ(CallAdvice::Describe("Infer", 3, "query: bad", call),
            "Infer failed: INVALID_ARGUMENT: query: bad");
}

}  // namespace
}  // namespace attention::client
