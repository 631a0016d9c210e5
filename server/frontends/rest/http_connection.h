// File: server/frontends/rest/http_connection.h
//
// HttpConnection: one client connection's loop, on its own strand of the
// server's I/O threads: read a head (bounded in bytes and time), check its
// framing, ask the handler (OnHead), read the body (bounded), hand the
// request to the handler, watch the socket while it is computed, write the
// answer (bounded in time), then the next request: pipelined requests are
// answered in order, one at a time. Nothing in it waits on a thread.
//
//   head: header_limit_bytes (431), max_header_fields (431), header_timeout
//         from its first byte (closed unanswered); idle_timeout before it
//   framing (RFC 9112): Content-Length repeated or a list, or with
//         Transfer-Encoding, or malformed: 400; Transfer-Encoding other
//         than chunked: 501; each closes the connection
//   body: max_body_bytes whatever the framing (413), body_timeout (408)
//   answer: write_timeout; its `hold` released once written
//   refused with a body unread: the answer, then the connection closed
//         while what the client still sends is dropped (linger_timeout)
//
// A client that closes (or resets) while its request is computed cancels
// it: HttpExchange::Cancel, then the answer is dropped. The drain closes it
// (Close) after its answer, or at once.
//
// Thread-safe entry points: Start, Answer, Close (each posts to the
// strand); the rest runs on the strand. Owned by shared_ptr: its pending
// operations and an unanswered exchange hold it. `handler` must outlive it.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_CONNECTION_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "server/frontends/rest/http_body.h"
#include "server/frontends/rest/http_connections.h"
#include "server/frontends/rest/http_exchange.h"
#include "server/frontends/rest/http_handler.h"
#include "server/frontends/rest/http_server_options.h"

namespace attention::server {

template <class Stream>
class HttpConnection final : public HttpAnswerSink,
                             public HttpConnectionControl,
                             public std::enable_shared_from_this<HttpConnection<Stream>> {
 public:
  // `id` is this connection's in `connections` (removed when it goes).
  HttpConnection(Stream stream, const HttpServerOptions& options, HttpHandler* handler,
                 std::shared_ptr<HttpConnections> connections, uint64_t id, std::string peer);
  ~HttpConnection() override;

  // Starts reading (after the TLS handshake, for a TLS stream).
  void Start();
  void Answer(std::function<HttpResponse()> make) override;
  void Close(bool now) override;

 private:
  enum class State { kReading, kComputing, kWriting, kClosing };
  void ReadHead();
  void ReadHeadNow();
  void OnHead(boost::beast::error_code ec);
  void ReadBody();
  void OnBody(boost::beast::error_code ec);
  void Dispatch();
  void Watch();
  void OnWatch(boost::beast::error_code ec, size_t n);
  void OnAnswer(HttpResponse response);
  // Answers a request the connection itself refuses, then closes.
  void Refuse(int status, const std::string& message);
  void TooLarge();  // 413.
  void Write(HttpResponse response);
  void OnWritten(boost::beast::error_code ec);
  // After an answer with Connection: close (TLS: close_notify first).
  void CloseAfterAnswer();
  void Linger();
  void DoClose();

  Stream stream_;
  const HttpServerOptions& options_;
  HttpHandler* const handler_;
  const std::shared_ptr<HttpConnections> connections_;
  const uint64_t id_;
  const std::string peer_;

  // The thread running Handle on the strand, while it does (else none).
  std::atomic<std::thread::id> handling_{};
  State state_ = State::kReading;
  bool first_ = true;
  bool close_after_ = false;  // Drain: close once the current answer is written.
  bool closed_ = false;
  bool watching_ = false;
  bool keep_alive_ = true;  // The current request's.
  bool http10_ = false;     // The current request is HTTP/1.0.
  bool head_method_ = false;
  bool body_unread_ = false;  // The current request's body was not read.
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::empty_body>> head_;
  std::optional<boost::beast::http::request_parser<HttpBody>> body_;
  std::function<std::optional<HttpResponse>(uint64_t)> on_body_bytes_;
  std::optional<HttpResponse> body_refusal_;  // What on_body_bytes_ answered.
  HttpRequest request_;
  std::shared_ptr<void> charge_;
  // The request being computed's, to cancel it; weak: the exchange holds
  // this connection, and one its handler drops must go (answering 500).
  std::weak_ptr<HttpExchange> exchange_;
  std::optional<HttpResponse> pending_;
  std::unique_ptr<boost::beast::http::response<boost::beast::http::string_body>> out_;
  std::shared_ptr<void> out_hold_;
  bool linger_after_write_ = false;
  std::unique_ptr<boost::beast::http::response<boost::beast::http::empty_body>> continue_;
  std::vector<char> discard_;
  int64_t discarded_ = 0;
  // The body's total deadline: a timer of its own, not the stream's (whose
  // expiry closes the socket), so the client is answered 408.
  boost::asio::steady_timer body_timer_;
  bool body_timed_out_ = false;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_CONNECTION_H_
