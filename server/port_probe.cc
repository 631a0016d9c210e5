#include "server/port_probe.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace attention::server {

absl::Status CheckPortFree(const std::string& host, int port, absl::string_view flag) {
  if (port == 0) return absl::OkStatus();
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", port, ": expected a TCP port, 0 to 65535"));
  }
  // gRPC writes IPv6 hosts in brackets ("[::1]"); getaddrinfo takes them bare.
  std::string bare = host;
  if (bare.size() >= 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      getaddrinfo(bare.empty() ? nullptr : bare.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host ", host, ": cannot resolve it (", gai_strerror(rc), ")"));
  }
  absl::Status status;
  for (addrinfo* a = found; a != nullptr && status.ok(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;  // This family is not available here.
    const int one = 1;
    // As gRPC binds: a port in TIME_WAIT is free.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE) {
      status = absl::UnavailableError(
          absl::StrCat("--", flag, " ", port, ": cannot listen on ", host, ":", port,
                       ": in use by another process (another attention-server?); stop it or "
                       "choose another port"));
    }
    close(fd);
  }
  freeaddrinfo(found);
  return status;
}

}  // namespace attention::server
