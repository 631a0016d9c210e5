// File: server/frontends/rest/http_server_options.h
//
// HttpServerOptions: the REST port's HTTP limits, each with the answer a
// client past it gets (see HttpConnection). Every read is bounded in bytes
// and in time: one slow or hostile client costs a socket and a buffer of at
// most `header_limit_bytes` plus `max_body_bytes` (the body only once its
// head was admitted), never a thread. A plain value.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_SERVER_OPTIONS_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace attention::server {

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;     // 0: a free port (HttpServer::port()).
  int io_threads = 2;  // Threads running every connection's I/O.
  // Open connections; one more is answered 503 and closed.
  int max_connections = 1024;
  // Request line and headers together: past it, 431 and close.
  int64_t header_limit_bytes = 16 << 10;
  // Header fields: past it, 431 and close.
  int max_header_fields = 100;
  // A body, whatever its framing (chunk-size lines included): past it, 413
  // and close.
  int64_t max_body_bytes = 64 << 20;
  // The head must arrive within this of its first byte (of the accept for a
  // connection's first request): else the connection is closed unanswered
  // (slowloris).
  absl::Duration header_timeout = absl::Seconds(10);
  // The body must arrive within this of the end of its head: else 408 and
  // close (R-U-Dead-Yet). Generous: 64 MiB at 1.1 MiB/s.
  absl::Duration body_timeout = absl::Seconds(60);
  // A keep-alive connection with no request begun is closed after this.
  absl::Duration idle_timeout = absl::Seconds(5);
  // A response must be written within this (a client reading slowly holds
  // its admitted response no longer).
  absl::Duration write_timeout = absl::Seconds(60);
  // After a refusal whose body was not read, what the client still sends is
  // read and dropped for up to this (so it reads the answer, not a reset).
  absl::Duration linger_timeout = absl::Seconds(5);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_SERVER_OPTIONS_H_
