// File: server/security/grpc_log.h
//
// gRPC's own log, routed: gRPC 1.51 writes a raw line for every failed TLS
// handshake ("E1128 ... ssl_transport_security.cc:1501] Handshake failed
// with fatal error SSL_ERROR_SSL: ...wrong version number"), one per
// connection attempt of a plaintext client (three or more per call). Those
// become one line of the server's own, at most every 10 s, saying what it
// likely means and how many there were:
//
//   TLS: a client's handshake failed (wrong version number: a client
//   speaking plaintext to this TLS port?); 5 more since the last such line
//
// Every other gRPC log line is written as gRPC writes it (same format, same
// GRPC_VERBOSITY filter, which gRPC applies before calling the function).
//
// Thread-safe (gRPC calls the function from any thread).
#ifndef ATTENTION_SERVER_SECURITY_GRPC_LOG_H_
#define ATTENTION_SERVER_SECURITY_GRPC_LOG_H_

#include <string>

#include "absl/strings/string_view.h"

namespace attention::server {

// Installs the routing (gpr_set_log_function). Call once, early in main().
void RouteGrpcLog();

// The server's line for a gRPC handshake failure `message` (for tests), ""
// when `message` is not one.
std::string HandshakeFailureLine(absl::string_view message);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SECURITY_GRPC_LOG_H_
