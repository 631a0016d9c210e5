// File: server/frontends/rest/http_tls_sniff.h
//
// TlsSniff: a new connection on a TLS port, before its handshake: its first
// byte, peeked (not read: the handshake sees all the client sent). A letter
// (a plain HTTP request's method: `curl http://` to an https port) is
// answered in plain text, 400 "this port serves HTTPS; use https://", as
// nginx answers "The plain HTTP request was sent to HTTPS port", and the
// connection closed after a short drain (not reset under the answer);
// anything else (a TLS record, 0x16) goes on to the TLS connection, as before.
//
// Bounded: the wait for the first byte ends at `timeout` (the head's), the
// answer's write and drain at 1 s in all; meanwhile the connection holds its
// slot in HttpConnections (one of max_connections) and is closed by its
// CloseAll like any other.
//
// Runs on the socket's executor (a strand); owned by its own pending
// operations. Close is thread-safe.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_TLS_SNIFF_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_TLS_SNIFF_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "absl/time/time.h"
#include "server/frontends/rest/http_connections.h"

namespace attention::server {

class TlsSniff : public HttpConnectionControl, public std::enable_shared_from_this<TlsSniff> {
 public:
  // Called on the socket's strand with the socket when it is TLS; it then
  // owns the slot `id` (attaches its connection to it and removes it).
  using OnTls = std::function<void(boost::asio::ip::tcp::socket)>;

  // Watches `socket` (slot `id` of `connections`) until its first byte.
  static void Start(boost::asio::ip::tcp::socket socket, absl::Duration timeout,
                    std::shared_ptr<HttpConnections> connections, uint64_t id, OnTls on_tls);

  void Close(bool now) override;

  // The plain-text answer to plain HTTP (for tests).
  static const std::string& PlainHttpAnswer();

 private:
  TlsSniff(boost::asio::ip::tcp::socket socket, std::shared_ptr<HttpConnections> connections,
           uint64_t id, OnTls on_tls);
  void OnReadable(const boost::system::error_code& ec);
  void Drain();
  void Finish();  // Closes the socket and gives the slot back, once.

  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer timer_;
  const std::shared_ptr<HttpConnections> connections_;
  const uint64_t id_;
  OnTls on_tls_;
  std::array<char, 4096> drained_{};
  bool done_ = false;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_TLS_SNIFF_H_
