// File: server/frontends/rest/http_server.h
//
// HttpServer: an HTTP/1.1 server on Boost.Beast over Asio, made for hostile
// input: a small fixed pool of I/O threads (HttpServerOptions::io_threads)
// runs every connection's reads and writes asynchronously, each bounded in
// bytes and time (see HttpConnection), so one slow or hostile client costs
// a socket and a bounded buffer, never a thread. Open connections are
// limited (one more is answered 503 and closed). Requests go to an
// HttpHandler, which answers now or later from any thread.
//
// Why Beast: its parser bounds the head (header_limit) and the body
// (body_limit, whatever the framing, chunk lines inside the same bounded
// buffer) before it buffers them, its tcp_stream puts a deadline on every
// operation, it lets the head be judged before the body is read, and TLS is
// Asio's ssl::stream over the same code (libmicrohttpd, the alternative,
// has memory limits and timeouts but no hook between head and body).
//
// Thread-safe. Owns its I/O threads and connections; `handler` must outlive
// it. Stop (or the destructor) returns once every connection is closed,
// every exchange answered and the I/O threads joined.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_SERVER_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_SERVER_H_

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/frontends/rest/http_connections.h"
#include "server/frontends/rest/http_handler.h"
#include "server/frontends/rest/http_server_options.h"

namespace attention::server {

class HttpServer {
 public:
  // Binds and starts serving. UNAVAILABLE when the address cannot be bound.
  // With `tls`, every connection is TLS on that context (which must
  // outlive the server).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options, HttpHandler* handler,
      boost::asio::ssl::context* tls = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Stops accepting; connections close after their current answer (idle
  // ones now), and after `grace` every one is closed whatever it is doing
  // (its request cancelled). Returns once the handler has answered every
  // exchange and the I/O threads are joined.
  void Stop(absl::Duration grace = absl::ZeroDuration());
  int port() const { return port_; }
  int open_connections() const { return connections_->open(); }

 private:
  HttpServer(const HttpServerOptions& options, HttpHandler* handler,
             boost::asio::ssl::context* tls);
  void Accept();
  void OnAccept(boost::asio::ip::tcp::socket socket);

  const HttpServerOptions options_;
  HttpHandler* const handler_;
  boost::asio::ssl::context* const tls_;
  const std::shared_ptr<HttpConnections> connections_;
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_SERVER_H_
