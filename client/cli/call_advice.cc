#include "client/cli/call_advice.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/target_check.h"
#include "proto/codec/status_codes.h"

namespace attention::client {
namespace {

constexpr int kUnavailable = 14;  // grpc::StatusCode values.
constexpr int kUnknown = 2;
constexpr int kDeadlineExceeded = 4;
constexpr int kUnauthenticated = 16;

// Waits up to `timeout_ms` for `events` on `fd`.
bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  return poll(&p, 1, timeout_ms) == 1 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
}

// Whether `text` holds one of `words`, ignoring case and reading '_' as ' '
// (OpenSSL names reasons "CERTIFICATE_VERIFY_FAILED" or "certificate verify
// failed" by version).
bool ContainsAny(const std::string& text, std::initializer_list<const char*> words) {
  std::string folded = absl::AsciiStrToLower(text);
  std::replace(folded.begin(), folded.end(), '_', ' ');
  for (const char* word : words) {
    if (absl::StrContains(folded, absl::AsciiStrToLower(word))) return true;
  }
  return false;
}

}  // namespace

CallAdvice::Listener CallAdvice::Probe(const std::string& host, int port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addresses) != 0) {
    return Listener::kUnknown;
  }
  Listener answer = Listener::kUnknown;
  const int fd = socket(addresses->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd >= 0) {
    int error = 0;
    socklen_t length = sizeof(error);
    const int started = connect(fd, addresses->ai_addr, addresses->ai_addrlen);
    if (started != 0 && errno == ECONNREFUSED) error = ECONNREFUSED;
    const bool connected = (started == 0 || errno == EINPROGRESS) &&
                           WaitFor(fd, POLLOUT, timeout_ms) &&
                           getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
    if (error == ECONNREFUSED) answer = Listener::kNothing;
    // The HTTP/2 client preface and an empty SETTINGS frame.
    static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
    if (connected && send(fd, kPreface, sizeof(kPreface) - 1, MSG_NOSIGNAL) ==
                         static_cast<ssize_t>(sizeof(kPreface) - 1)) {
      unsigned char reply[9];
      size_t got = 0;
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
      bool closed = false;
      while (got < sizeof(reply)) {
        const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              deadline - std::chrono::steady_clock::now())
                                              .count());
        if (left <= 0 || !WaitFor(fd, POLLIN, left)) break;
        const ssize_t n = recv(fd, reply + got, sizeof(reply) - got, 0);
        if (n <= 0) {
          closed = n == 0 || errno == ECONNRESET;
          break;
        }
        got += static_cast<size_t>(n);
      }
      if (got >= 4 && reply[3] == 0x04) {
        answer = Listener::kHttp2;
      } else if ((got == 0 && closed) || (got > 0 && (reply[0] == 0x15 || reply[0] == 0x16))) {
        answer = Listener::kTls;
      }
    }
    close(fd);
  }
  freeaddrinfo(addresses);
  return answer;
}

namespace {

// The hint for a failed call, and whether nothing listens at the target.
struct Advice {
  Advice() = default;
  Advice(std::string h, std::string refused = "")  // NOLINT: braced returns.
      : hint(std::move(h)), refused_address(std::move(refused)) {}
  std::string hint;
  std::string refused_address;  // "host:port" when the connection was refused.
};

Advice Advise(int code, const std::string& details, const CallAdvice::Call& call) {
  using Listener = CallAdvice::Listener;
  static const std::regex kTooLarge(
      R"((Sent|Received) message larger than max \((\d+) vs\. (\d+)\))");
  std::smatch m;
  if (std::regex_search(details, m, kTooLarge)) {
    const std::string size = m[2], limit = m[3];
    if (limit == std::to_string(call.max_message_bytes)) {
      return {absl::StrCat(m[1] == "Sent" ? "the request" : "the response", " is ", size,
                           " bytes, over this client's limit of ", limit,
                           ": raise --max_message_bytes (the server's limit is its "
                           "--max_message_bytes)")};
    }
    return {absl::StrCat(m[1] == "Received" ? "the request" : "the response", " is ", size,
                         " bytes, over the server's limit of ", limit,
                         ": send less per request, or start the server with --max_message_bytes=",
                         size, " or more")};
  }
  if (code == kUnauthenticated) {
    return {call.token ? "the server refused this client's bearer token (read from --token_file, "
                         "else the ATTENTION_TOKEN environment variable): use one the server's "
                         "--auth_tokens_file lists"
                       : "the server wants a bearer token: pass --token_file=FILE (a file "
                         "holding the token) or set the ATTENTION_TOKEN environment variable"};
  }
  if (code == kDeadlineExceeded && call.deadline_ms > 0) {
    return {absl::StrCat("the call took longer than --deadline_ms=", call.deadline_ms,
                         ": raise it (e.g. --deadline_ms=", call.deadline_ms * 4,
                         ") if the server is busy or the request is large")};
  }
  const auto address = TargetCheck::FirstAddress(call.target);
  if (code == kUnavailable && address && ContainsAny(details, {"DNS resolution failed"})) {
    return {absl::StrCat("the host '", address->host,
                         "' of --server does not resolve: check the name, or pass --server "
                         "HOST:PORT of a running attention-server")};
  }
  if ((code != kUnavailable && code != kUnknown) ||
      !ContainsAny(details,
                   {"failed to connect", "Socket closed", "reset by peer", "andshake",
                    "backends failing", "Broken pipe", "End of TCP stream", "SSL", "TLS"})) {
    return {};
  }
  if (call.tls && ContainsAny(details, {"certificate verify failed"})) {
    return {
        "the client does not trust the server's certificate: pass --tls_ca_file (the CA "
        "that signed it), or --tls_server_name (a name it carries)"};
  }
  const Listener listener =
      address ? CallAdvice::Probe(address->host, address->port) : Listener::kUnknown;
  if (listener == Listener::kNothing) {
    const std::string at =
        absl::StrCat(absl::StrContains(address->host, ':') ? absl::StrCat("[", address->host, "]")
                                                           : address->host,
                     ":", address->port);
    return {absl::StrCat("nothing is listening at ", at,
                         "? start attention-server there (its --port), or pass --server "
                         "HOST:PORT of a running one"),
            at};
  }
  if (!call.tls && listener == Listener::kTls) {
    return {
        "the server speaks TLS: pass --tls (and --tls_ca_file with its CA unless the system "
        "trusts it)"};
  }
  if (call.tls && listener == Listener::kHttp2) {
    return {"the server speaks plaintext, not TLS: leave out --tls and the --tls_* flags"};
  }
  if (call.tls && ContainsAny(details, {"certificate required"})) {
    return {
        "the server requires a client certificate (mutual TLS): pass --tls_cert_file and "
        "--tls_key_file"};
  }
  if (call.tls && ContainsAny(details, {"unknown ca", "bad certificate", "certificate unknown",
                                        "decrypt error"})) {
    return {
        "the server did not accept the client certificate: use one signed by a CA the "
        "server trusts (its --tls_client_ca_file)"};
  }
  if (call.tls && listener == Listener::kTls) {
    return {call.client_certificate
                ? "the TLS handshake failed: the server did not accept the client certificate; "
                  "use one signed by a CA the server trusts (its --tls_client_ca_file)"
                : "the TLS handshake failed: if the server requires a client certificate "
                  "(mutual TLS), pass --tls_cert_file and --tls_key_file"};
  }
  return {};
}

}  // namespace

std::string CallAdvice::For(int code, const std::string& details, const Call& call) {
  return Advise(code, details, call).hint;
}

std::string CallAdvice::Describe(const std::string& method, int code, const std::string& details,
                                 const Call& call) {
  return DescribeAs(absl::StrCat(method, " failed"), code, details, call);
}

std::string CallAdvice::DescribeAs(const std::string& lead, int code, const std::string& details,
                                   const Call& call) {
  const Advice advice = Advise(code, details, call);
  const std::string what =
      advice.refused_address.empty()
          ? details
          : absl::StrCat("cannot connect to ", advice.refused_address, " (connection refused)");
  return absl::StrCat(lead, ": ", wire::StatusCodeName(static_cast<absl::StatusCode>(code)), ": ",
                      what, advice.hint.empty() ? "" : absl::StrCat("\n  hint: ", advice.hint));
}

}  // namespace attention::client
