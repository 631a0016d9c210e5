// File: server/frontends/rest/http_server.cc
#include "server/frontends/rest/http_server.h"

#include <algorithm>
#include <string>
#include <utility>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>

#include "absl/strings/str_cat.h"
#include "server/frontends/rest/http_connection.h"
#include "server/frontends/rest/http_tls_sniff.h"

namespace attention::server {
namespace {

namespace beast = boost::beast;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// The answer past the connection limit.
const std::string& TooManyConnections() {
  static const std::string* const answer = [] {
    const std::string body =
        R"({"error":"the server has too many connections (--http_max_connections); retry later"})";
    return new std::string(
        absl::StrCat("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Connection: close\r\nContent-Length: ",
                     body.size(), "\r\n\r\n", body));
  }();
  return *answer;
}

}  // namespace

HttpServer::HttpServer(const HttpServerOptions& options, HttpHandler* handler,
                       net::ssl::context* tls)
    : options_(options),
      handler_(handler),
      tls_(tls),
      connections_(std::make_shared<HttpConnections>(options.max_connections)),
      work_(net::make_work_guard(io_)),
      acceptor_(net::make_strand(io_)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler* handler,
                                                              net::ssl::context* tls) {
  auto server = std::unique_ptr<HttpServer>(new HttpServer(options, handler, tls));
  beast::error_code ec;
  const auto address = net::ip::make_address(options.host, ec);
  if (!ec) {
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(options.port));
    server->acceptor_.open(endpoint.protocol(), ec);
    // SO_REUSEADDR only: two servers must not share a port.
    if (!ec) server->acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) server->acceptor_.bind(endpoint, ec);
    if (!ec) server->acceptor_.listen(net::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    return absl::UnavailableError(absl::StrCat("--http_port: cannot listen on ", options.host, ":",
                                               options.port, ": ", ec.message()));
  }
  server->port_ = server->acceptor_.local_endpoint().port();
  server->Accept();
  for (int i = 0; i < std::max(1, options.io_threads); ++i) {
    server->threads_.emplace_back([s = server.get()] { s->io_.run(); });
  }
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Accept() {
  acceptor_.async_accept(net::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) OnAccept(std::move(socket));
    Accept();  // Also after an error (EMFILE among them): the next one may work.
  });
}

void HttpServer::OnAccept(tcp::socket socket) {
  beast::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);  // Small answers must not wait for an ACK.
  const uint64_t id = connections_->TryAdd();
  if (id == 0) {
    // Past the limit: answered and closed, not queued.
    auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
    stream->expires_after(std::chrono::seconds(1));
    net::async_write(*stream, net::buffer(TooManyConnections()),
                     [stream](beast::error_code, size_t) {
                       beast::error_code ignored;
                       stream->socket().shutdown(tcp::socket::shutdown_send, ignored);
                       stream->close();
                     });
    return;
  }
  const auto remote = socket.remote_endpoint(ec);
  std::string peer =
      ec ? std::string("unknown") : absl::StrCat(remote.address().to_string(), ":", remote.port());
  if (tls_ != nullptr) {
    // Plain HTTP sent to this TLS port is answered in plain text (TlsSniff).
    TlsSniff::Start(std::move(socket), options_.header_timeout, connections_, id,
                    [this, id, peer = std::move(peer)](tcp::socket tls_socket) mutable {
                      using TlsStream = beast::ssl_stream<beast::tcp_stream>;
                      auto connection = std::make_shared<HttpConnection<TlsStream>>(
                          TlsStream(std::move(tls_socket), *tls_), options_, handler_, connections_,
                          id, std::move(peer));
                      connections_->Attach(id, connection);
                      connection->Start();
                    });
    return;
  }
  auto connection = std::make_shared<HttpConnection<beast::tcp_stream>>(
      beast::tcp_stream(std::move(socket)), options_, handler_, connections_, id, std::move(peer));
  connections_->Attach(id, connection);
  connection->Start();
}

void HttpServer::Stop(absl::Duration grace) {
  if (stopped_) return;
  stopped_ = true;
  net::post(acceptor_.get_executor(), [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
  });
  connections_->CloseAll(/*now=*/false);
  // The drain's clock: polled, as it runs once at shutdown.
  const absl::Time cut = absl::Now() + grace;
  while (connections_->open() > 0 && absl::Now() < cut) absl::SleepFor(absl::Milliseconds(5));
  connections_->CloseAll(/*now=*/true);
  // The handler answers what it was given (cancelled ones included);
  // closed connections go once their operations complete.
  while (connections_->outstanding()->load() > 0 || connections_->open() > 0) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  work_.reset();
  io_.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  // The posted close may not have run before the stop: connections still in
  // the listen queue are reset now, not left waiting on an open port.
  beast::error_code ignored;
  acceptor_.close(ignored);
}

}  // namespace attention::server
