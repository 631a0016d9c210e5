// File: tests/raw_http_connection.h
//
// RawHttpConnection: a loopback TCP connection to a REST port that sends
// bytes exactly as given, for tests that need what an HTTP client library
// will not send (broken framing, smuggling attempts, trickled bodies).
// Reads have a 20 s socket timeout: a bound for a broken server, not a
// timing goal. Not thread-safe; owns its socket.
#ifndef ATTENTION_TESTS_RAW_HTTP_CONNECTION_H_
#define ATTENTION_TESTS_RAW_HTTP_CONNECTION_H_

#include <string>
#include <vector>

namespace attention::testing {

class RawHttpConnection {
 public:
  explicit RawHttpConnection(int port);
  ~RawHttpConnection();
  RawHttpConnection(const RawHttpConnection&) = delete;
  RawHttpConnection& operator=(const RawHttpConnection&) = delete;

  bool connected() const { return connected_; }
  // False once the server has closed (or reset) the connection.
  bool Send(const std::string& bytes);
  // One byte; false once the connection is closed.
  bool ReadByte(char* c);
  // Reads until what was read holds `marker` (the server is then past it).
  std::string ReadUntil(const std::string& marker);
  // One response: its head, then Content-Length bytes.
  std::string ReadResponse();
  // Everything the server writes until it closes the connection.
  std::string ReadToEnd();

 private:
  const int fd_;
  bool connected_ = false;
};

// The status codes of the HTTP/1.1 responses in `stream`, in order.
std::vector<int> HttpStatuses(const std::string& stream);

// The last request on a raw connection: answered 200, then the server closes.
inline constexpr char kLastHttpRequest[] =
    "GET /v2/health/live HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";

}  // namespace attention::testing

#endif  // ATTENTION_TESTS_RAW_HTTP_CONNECTION_H_
