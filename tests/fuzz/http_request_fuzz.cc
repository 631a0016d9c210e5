// The REST port's HTTP server (server/frontends/rest/http_server.h): arbitrary
// bytes as what a client sends on one connection, through a real HttpServer
// on loopback (started once, small limits and short deadlines) whose
// handler echoes each request's method, path and body size and refuses
// /refuse at its head. The client half-closes after sending, then reads
// everything until the server closes.
//
// Checked: no crash, no sanitizer report; what the server wrote is a
// sequence of whole HTTP/1.1 responses (Beast's own response parser reads
// each), statuses 100-599, and nothing after one that says Connection:
// close; the server closes the connection within the read timeout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/frontends/rest/http_server.h"
#include "tests/fuzz/fuzz_entries.h"

namespace attention::fuzz {
namespace {

namespace http = boost::beast::http;

absl::Status Bug(const std::string& what) {
  return absl::InternalError(absl::StrCat("fuzz invariant: ", what));
}

class EchoHandler : public server::HttpHandler {
 public:
  server::HeadDecision OnHead(const server::HttpRequest& head) override {
    server::HeadDecision decision;
    if (head.path == "/refuse") {
      decision.refuse.emplace();
      decision.refuse->status = 401;
    }
    return decision;
  }
  void Handle(server::HttpRequest request,
              std::shared_ptr<server::HttpExchange> exchange) override {
    server::HttpResponse response;
    // HEAD's answer has no body: the checker cannot tell which answer is HEAD's.
    if (request.method != "HEAD") {
      response.body = absl::StrCat(request.method, " ", request.path, " ", request.body.size());
    }
    exchange->Reply(std::move(response));
  }
};

int Port() {
  static const int port = [] {
    static EchoHandler handler;
    server::HttpServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.io_threads = 1;
    options.header_limit_bytes = 1024;
    options.max_header_fields = 16;
    options.max_body_bytes = 4096;
    options.header_timeout = absl::Milliseconds(500);
    options.body_timeout = absl::Milliseconds(500);
    options.idle_timeout = absl::Milliseconds(500);
    options.linger_timeout = absl::Milliseconds(200);
    // Never stopped: it serves every input of the process.
    return server::HttpServer::Start(options, &handler)->release()->port();
  }();
  return port;
}

}  // namespace

// A connection to the fuzzed server. Thousands of inputs a second open as
// many connections: a connect that fails for want of a local resource (ports
// or descriptors still held by connections closing) is tried again, for up
// to 5 s, before it counts as the server's fault.
absl::StatusOr<int> Connect() {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(Port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int error = 0;
  for (int attempt = 0; attempt < 500; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0) {
      const timeval timeout{10, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
      error = errno;
      close(fd);
    } else {
      error = errno;
    }
    usleep(10000);
  }
  return absl::UnavailableError(
      absl::StrCat("cannot connect to the fuzzed server: ", std::strerror(error)));
}

absl::Status FuzzOneHttpRequest(const uint8_t* data, size_t size) {
  ASSIGN_OR_RETURN(const int fd, Connect());
  for (size_t sent = 0; sent < size;) {  // Stops once the server closes.
    const ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string stream;
  char buf[16384];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) stream.append(buf, static_cast<size_t>(n));
  const bool timed_out = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  close(fd);
  if (timed_out) return Bug("the server did not close the connection");
  boost::beast::flat_buffer buffer;
  if (!stream.empty()) {  // Nothing answered: an empty buffer has no data (memcpy of null).
    auto in = buffer.prepare(stream.size());
    std::memcpy(in.data(), stream.data(), stream.size());
    buffer.commit(stream.size());
  }
  while (buffer.size() > 0) {
    http::response_parser<http::string_body> parser;
    parser.eager(true);
    boost::beast::error_code ec;
    size_t used = parser.put(buffer.data(), ec);
    if (ec || !parser.is_done()) {
      // The last answer may be a refusal of a HEAD request: its head only.
      http::response_parser<http::string_body> head_only;
      head_only.skip(true);
      boost::beast::error_code head_ec;
      used = head_only.put(buffer.data(), head_ec);
      if (head_ec || !head_only.is_done() || used != buffer.size() ||
          head_only.get().keep_alive()) {
        return Bug(absl::StrCat("the server wrote what is not a whole HTTP response: ",
                                ec ? ec.message() : "cut short"));
      }
      break;
    }
    buffer.consume(used);
    const unsigned status = parser.get().result_int();
    if (status < 100 || status > 599) return Bug(absl::StrCat("status ", status));
    if (!parser.get().keep_alive() && buffer.size() > 0) {
      return Bug("bytes after a response that closes the connection");
    }
  }
  return absl::OkStatus();
}

}  // namespace attention::fuzz
