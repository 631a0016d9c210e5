#include "server/frontends/rest/http_tls_sniff.h"

#include <chrono>
#include <string>
#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include "absl/strings/str_cat.h"

namespace attention::server {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

std::chrono::steady_clock::duration Chrono(absl::Duration d) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      absl::ToChronoNanoseconds(d));
}

}  // namespace

const std::string& TlsSniff::PlainHttpAnswer() {
  static const std::string* const answer = [] {
    const std::string body =
        "400 Bad Request: this port serves HTTPS (TLS) and the request was sent as plain "
        "HTTP; use https:// (with curl, --cacert <the server's CA>)\n";
    return new std::string(
        absl::StrCat("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Connection: close\r\nContent-Length: ",
                     body.size(), "\r\n\r\n", body));
  }();
  return *answer;
}

TlsSniff::TlsSniff(tcp::socket socket, std::shared_ptr<HttpConnections> connections, uint64_t id,
                   OnTls on_tls)
    : socket_(std::move(socket)),
      timer_(socket_.get_executor()),
      connections_(std::move(connections)),
      id_(id),
      on_tls_(std::move(on_tls)) {}

void TlsSniff::Start(tcp::socket socket, absl::Duration timeout,
                     std::shared_ptr<HttpConnections> connections, uint64_t id, OnTls on_tls) {
  auto sniff = std::shared_ptr<TlsSniff>(
      new TlsSniff(std::move(socket), std::move(connections), id, std::move(on_tls)));
  net::post(sniff->socket_.get_executor(), [sniff, timeout] {
    sniff->connections_->Attach(sniff->id_, sniff);  // May close it at once (a drain).
    if (sniff->done_) return;
    sniff->timer_.expires_after(Chrono(timeout));
    sniff->timer_.async_wait([sniff](const boost::system::error_code& ec) {
      if (!ec) sniff->Finish();  // Nothing sent in time (or a drain never ended).
    });
    sniff->socket_.async_wait(tcp::socket::wait_read, [sniff](const boost::system::error_code& ec) {
      sniff->OnReadable(ec);
    });
  });
}

void TlsSniff::Close(bool) {
  net::post(socket_.get_executor(), [self = shared_from_this()] { self->Finish(); });
}

void TlsSniff::OnReadable(const boost::system::error_code& ec) {
  if (done_) return;
  char first = 0;
  boost::system::error_code peek_ec;
  const size_t n =
      ec ? 0 : socket_.receive(net::buffer(&first, 1), tcp::socket::message_peek, peek_ec);
  if (n == 0 || peek_ec) return Finish();  // Closed, reset or gone.
  timer_.cancel();
  if (!(first >= 'A' && first <= 'Z')) {  // A TLS record (or not HTTP): the handshake judges it.
    done_ = true;
    OnTls on_tls = std::move(on_tls_);
    return on_tls(std::move(socket_));
  }
  timer_.expires_after(std::chrono::seconds(1));
  timer_.async_wait([self = shared_from_this()](const boost::system::error_code& timer_ec) {
    if (!timer_ec) self->Finish();
  });
  net::async_write(socket_, net::buffer(PlainHttpAnswer()),
                   [self = shared_from_this()](const boost::system::error_code& write_ec, size_t) {
                     if (write_ec) return self->Finish();
                     boost::system::error_code ignored;
                     self->socket_.shutdown(tcp::socket::shutdown_send, ignored);
                     self->Drain();
                   });
}

void TlsSniff::Drain() {
  // What the client sent is read and dropped until it closes (or 1 s), so
  // that closing does not reset the connection under the answer.
  socket_.async_read_some(net::buffer(drained_),
                          [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                            if (ec || self->done_) return self->Finish();
                            self->Drain();
                          });
}

void TlsSniff::Finish() {
  if (done_) return;
  done_ = true;
  boost::system::error_code ignored;
  timer_.cancel();
  socket_.close(ignored);
  connections_->Remove(id_);
}

}  // namespace attention::server
