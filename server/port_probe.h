// File: server/port_probe.h
//
// CheckPortFree(): whether the server could bind a TCP port, asked before
// anything starts, so that a busy port is one line naming the flag (not
// gRPC's error report, nor after the metrics URL was announced). The real
// bind still decides: a port taken between the probe and it is refused there.
// Stateless; thread-safe.
#ifndef ATTENTION_SERVER_PORT_PROBE_H_
#define ATTENTION_SERVER_PORT_PROBE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attention::server {

// OK when `host`:`port` can be bound now (or `port` is 0: any free port).
// `host` as gRPC takes it: a name, an IPv4 address or a bracketed IPv6 one.
// UNAVAILABLE "--<flag> <port>: cannot listen on <host>:<port>: in use ..." when
// another process holds it; INVALID_ARGUMENT when `host` does not resolve
// or `port` is not 0 to 65535.
absl::Status CheckPortFree(const std::string& host, int port, absl::string_view flag);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_PORT_PROBE_H_
