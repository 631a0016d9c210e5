// File: server/frontends/rest/http_connection.cc
#include "server/frontends/rest/http_connection.h"

#include <algorithm>
#include <thread>
#include <type_traits>
#include <utility>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/frontends/rest/http_head_check.h"

namespace attention::server {
namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;

// Room for a whole head plus one read past it (pipelined bytes included).
constexpr size_t kReadChunk = 16 << 10;

// Whether the parser refused the bytes (not: the client went mid-message).
bool IsMalformed(const beast::error_code& ec) {
  return ec.category() == beast::error_code(http::error::end_of_stream).category() &&
         ec != http::error::end_of_stream && ec != http::error::partial_message;
}

std::chrono::nanoseconds Chrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

// {"error": message}, for the messages this file makes (no control bytes).
std::string ErrorJson(const std::string& message) {
  std::string out = R"({"error":")";
  for (const char c : message) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) out.push_back(c);
  }
  out += "\"}";
  return out;
}

}  // namespace

template <class Stream>
HttpConnection<Stream>::HttpConnection(Stream stream, const HttpServerOptions& options,
                                       HttpHandler* handler,
                                       std::shared_ptr<HttpConnections> connections, uint64_t id,
                                       std::string peer)
    : stream_(std::move(stream)),
      options_(options),
      handler_(handler),
      connections_(std::move(connections)),
      id_(id),
      peer_(std::move(peer)),
      buffer_(static_cast<size_t>(options.header_limit_bytes) + kReadChunk),
      body_timer_(stream_.get_executor()) {}

template <class Stream>
HttpConnection<Stream>::~HttpConnection() {
  connections_->Remove(id_);
}

template <class Stream>
void HttpConnection<Stream>::Start() {
  net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
    if constexpr (std::is_same_v<Stream, beast::ssl_stream<beast::tcp_stream>>) {
      // The handshake is part of the first head's time.
      beast::get_lowest_layer(self->stream_).expires_after(Chrono(self->options_.header_timeout));
      self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
        if (ec) return self->DoClose();
        self->ReadHead();
      });
    } else {
      self->ReadHead();
    }
  });
}

template <class Stream>
void HttpConnection<Stream>::Close(bool now) {
  net::post(stream_.get_executor(), [self = this->shared_from_this(), now] {
    if (self->closed_) return;
    // Not past its head (reading it, or idle): nothing of it is answered. A
    // request whose body is arriving is answered, then the connection closed.
    const bool past_head = self->body_.has_value() || self->continue_ != nullptr;
    if (now || (self->state_ == State::kReading && !past_head)) return self->DoClose();
    self->close_after_ = true;
  });
}

template <class Stream>
void HttpConnection<Stream>::ReadHead() {
  if (closed_) return;
  if (close_after_) return DoClose();
  state_ = State::kReading;
  // Until this head is parsed, a refusal of it is answered as to GET and
  // closes the connection.
  keep_alive_ = false;
  http10_ = false;
  head_method_ = false;
  head_.emplace();
  head_->header_limit(static_cast<std::uint32_t>(options_.header_limit_bytes));
  // A Content-Length past it is refused with the head (413), unread.
  head_->body_limit(static_cast<std::uint64_t>(options_.max_body_bytes));
  if (first_ || buffer_.size() > 0) return ReadHeadNow();
  // Idle keep-alive: the next head's first byte within idle_timeout.
  beast::get_lowest_layer(stream_).expires_after(Chrono(options_.idle_timeout));
  stream_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                            self->buffer_.commit(n);
                            if (ec || self->closed_) return self->DoClose();
                            self->ReadHeadNow();
                          });
}

template <class Stream>
void HttpConnection<Stream>::ReadHeadNow() {
  beast::get_lowest_layer(stream_).expires_after(Chrono(options_.header_timeout));
  http::async_read_header(
      stream_, buffer_, *head_,
      [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHead(ec); });
}

template <class Stream>
void HttpConnection<Stream>::OnHead(beast::error_code ec) {
  if (closed_) return;
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    return Refuse(
        431, absl::StrCat("request head: larger than ", options_.header_limit_bytes, " bytes"));
  }
  if (ec == http::error::body_limit) return TooLarge();
  if (ec == http::error::multiple_content_length || ec == http::error::bad_content_length) {
    return Refuse(400, "Content-Length: expected one number, with no Transfer-Encoding");
  }
  if (ec == http::error::bad_transfer_encoding) {
    return Refuse(400, "Content-Length: expected none with Transfer-Encoding: chunked");
  }
  if (ec && IsMalformed(ec)) {
    return Refuse(400, absl::StrCat("request head: ", ec.message()));
  }
  if (ec) return DoClose();  // Closed, reset, or too slow (slowloris): unanswered.
  const auto& head = head_->get();
  keep_alive_ = head.keep_alive();
  http10_ = head.version() < 11;
  head_method_ = head.method() == http::verb::head;
  request_ = HttpRequest();
  request_.method = std::string(head.method_string());
  request_.target = std::string(head.target());
  request_.path = HttpPathOf(request_.target);
  request_.headers = static_cast<const http::fields&>(head);
  request_.peer = peer_;
  request_.received = absl::Now();
  if (auto refused = CheckHttpHead(head, options_.max_header_fields)) {
    return Refuse(refused->first, refused->second);
  }
  HeadDecision decision = handler_->OnHead(request_);
  if (decision.refuse.has_value()) {
    body_unread_ = !head_->is_done();
    if (body_unread_) decision.refuse->close = true;
    return Write(*std::move(decision.refuse));
  }
  charge_ = std::move(decision.charge);
  on_body_bytes_ = std::move(decision.on_body_bytes);
  if (head_->is_done()) return Dispatch();
  if (beast::iequals(head[http::field::expect], "100-continue")) {
    continue_ = std::make_unique<http::response<http::empty_body>>(http::status::continue_, 11);
    beast::get_lowest_layer(stream_).expires_after(Chrono(options_.write_timeout));
    return http::async_write(stream_, *continue_,
                             [self = this->shared_from_this()](beast::error_code ec, size_t) {
                               self->continue_.reset();
                               if (ec || self->closed_) return self->DoClose();
                               self->ReadBody();
                             });
  }
  ReadBody();
}

template <class Stream>
void HttpConnection<Stream>::ReadBody() {
  body_.emplace(std::move(*head_));
  head_.reset();
  body_->body_limit(static_cast<std::uint64_t>(options_.max_body_bytes));
  body_refusal_.reset();
  if (on_body_bytes_) {
    body_->get().body().grow = [this](uint64_t bytes) {
      body_refusal_ = on_body_bytes_(bytes);
      return !body_refusal_.has_value();
    };
  }
  beast::get_lowest_layer(stream_).expires_never();
  body_timed_out_ = false;
  body_timer_.expires_after(Chrono(options_.body_timeout));
  body_timer_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
    if (ec || self->closed_ || !self->body_.has_value()) return;  // Read in time.
    self->body_timed_out_ = true;
    beast::error_code ignored;
    beast::get_lowest_layer(self->stream_).socket().cancel(ignored);  // OnBody answers 408.
  });
  http::async_read(
      stream_, buffer_, *body_,
      [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
}

template <class Stream>
void HttpConnection<Stream>::OnBody(beast::error_code ec) {
  on_body_bytes_ = nullptr;
  body_timer_.cancel();
  if (closed_) return;
  if (ec) {
    charge_.reset();
    body_unread_ = true;
    if (ec == boost::asio::error::no_buffer_space && body_refusal_.has_value()) {
      HttpResponse refusal = *std::move(body_refusal_);
      refusal.close = true;
      return Write(std::move(refusal));
    }
    if (ec == http::error::body_limit) return TooLarge();
    if (body_timed_out_) {
      return Refuse(408, absl::StrCat("request body: not received within ",
                                      absl::FormatDuration(options_.body_timeout)));
    }
    if (IsMalformed(ec)) {
      return Refuse(400, absl::StrCat("request body: ", ec.message()));
    }
    return DoClose();
  }
  request_.body = std::move(body_->get().body().data);
  body_.reset();
  Dispatch();
}

template <class Stream>
void HttpConnection<Stream>::Dispatch() {
  state_ = State::kComputing;
  body_unread_ = false;
  request_.charge = std::move(charge_);
  on_body_bytes_ = nullptr;
  // Held by the handler alone (here: weakly, to cancel it): one it drops
  // unanswered answers 500 from its destructor.
  auto exchange =
      std::make_shared<HttpExchange>(this->shared_from_this(), connections_->outstanding());
  exchange_ = exchange;
  handling_.store(std::this_thread::get_id(), std::memory_order_release);
  handler_->Handle(std::move(request_), std::move(exchange));
  handling_.store(std::thread::id(), std::memory_order_release);
  if (state_ == State::kComputing && !pending_.has_value()) Watch();
}

template <class Stream>
void HttpConnection<Stream>::Watch() {
  if (closed_ || pending_.has_value() || watching_) return;
  const size_t room = buffer_.max_size() - buffer_.size();
  if (room == 0) return;  // Pipelined bytes fill the buffer: read no more until answered.
  watching_ = true;
  beast::get_lowest_layer(stream_).expires_never();
  stream_.async_read_some(
      buffer_.prepare(std::min(room, kReadChunk)),
      [self = this->shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
}

template <class Stream>
void HttpConnection<Stream>::OnWatch(beast::error_code ec, size_t n) {
  watching_ = false;
  buffer_.commit(n);
  if (closed_) return;
  if (pending_.has_value()) {
    HttpResponse response = *std::move(pending_);
    pending_.reset();
    return Write(std::move(response));
  }
  if (ec) return DoClose();  // The client went: its request is cancelled.
  Watch();
}

template <class Stream>
void HttpConnection<Stream>::Answer(std::function<HttpResponse()> make) {
  // Answered inside Handle (on the strand): written without a round trip.
  if (handling_.load(std::memory_order_acquire) == std::this_thread::get_id()) {
    return OnAnswer(make());
  }
  net::post(stream_.get_executor(), [self = this->shared_from_this(), make = std::move(make)] {
    if (self->closed_) return self->OnAnswer(HttpResponse());  // Dropped unmade.
    self->OnAnswer(make());
  });
}

template <class Stream>
void HttpConnection<Stream>::OnAnswer(HttpResponse response) {
  exchange_.reset();
  charge_.reset();
  if (closed_) return;  // Dropped with its hold.
  if (watching_) {
    pending_ = std::move(response);
    beast::get_lowest_layer(stream_).cancel();  // OnWatch writes it.
    return;
  }
  Write(std::move(response));
}

template <class Stream>
void HttpConnection<Stream>::Refuse(int status, const std::string& message) {
  HttpResponse response;
  response.status = status;
  response.body = ErrorJson(message);
  response.SetHeader("Content-Type", "application/json");
  response.close = true;
  body_unread_ = true;
  Write(std::move(response));
}

template <class Stream>
void HttpConnection<Stream>::TooLarge() {
  Refuse(413, absl::StrCat("request body: larger than the server's limit of ",
                           options_.max_body_bytes, " bytes (--max_message_bytes)"));
}

template <class Stream>
void HttpConnection<Stream>::Write(HttpResponse response) {
  state_ = State::kWriting;
  head_.reset();
  body_.reset();
  out_ = std::make_unique<http::response<http::string_body>>();
  out_->result(static_cast<unsigned>(response.status));
  out_->version(11);
  for (auto& [name, value] : response.headers) out_->set(name, value);
  const size_t size = response.body.size();
  out_->body() = std::move(response.body);
  out_->keep_alive(keep_alive_ && !response.close && !close_after_);
  // An HTTP/1.0 client keeps the connection only when told (RFC 9112 C.2.2).
  if (http10_ && out_->keep_alive()) out_->set(http::field::connection, "keep-alive");
  if (head_method_) {
    out_->body().clear();
    out_->content_length(size);
  } else {
    out_->prepare_payload();
  }
  out_hold_ = std::move(response.hold);
  linger_after_write_ = response.close && body_unread_;
  beast::get_lowest_layer(stream_).expires_after(Chrono(options_.write_timeout));
  http::async_write(
      stream_, *out_,
      [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnWritten(ec); });
}

template <class Stream>
void HttpConnection<Stream>::OnWritten(beast::error_code ec) {
  out_hold_.reset();
  const bool keep = out_ != nullptr && out_->keep_alive();
  out_.reset();
  if (closed_) return;
  if (ec) return DoClose();
  if (linger_after_write_) return Linger();
  if (!keep) return CloseAfterAnswer();
  first_ = false;
  ReadHead();
}

template <class Stream>
void HttpConnection<Stream>::CloseAfterAnswer() {
  if constexpr (std::is_same_v<Stream, beast::ssl_stream<beast::tcp_stream>>) {
    // TLS: close_notify first (RFC 8446 6.1), so that a client reading to
    // the end sees the end, not a truncation; bounded by linger_timeout.
    state_ = State::kClosing;
    beast::get_lowest_layer(stream_).expires_after(Chrono(options_.linger_timeout));
    return stream_.async_shutdown(
        [self = this->shared_from_this()](beast::error_code) { self->DoClose(); });
  }
  DoClose();
}

template <class Stream>
void HttpConnection<Stream>::Linger() {
  // What the client still sends of a body not read is dropped, so that it
  // reads the answer rather than a reset; bounded in bytes and time.
  state_ = State::kClosing;
  beast::error_code ignored;
  beast::get_lowest_layer(stream_).socket().shutdown(net::socket_base::shutdown_send, ignored);
  if (discard_.empty()) {
    discard_.resize(kReadChunk);
    buffer_.consume(buffer_.size());
    beast::get_lowest_layer(stream_).expires_after(Chrono(options_.linger_timeout));
  }
  stream_.async_read_some(
      net::buffer(discard_), [self = this->shared_from_this()](beast::error_code ec, size_t n) {
        self->discarded_ += static_cast<int64_t>(n);
        if (ec || self->closed_ || self->discarded_ > self->options_.max_body_bytes) {
          return self->DoClose();
        }
        self->Linger();
      });
}

template <class Stream>
void HttpConnection<Stream>::DoClose() {
  if (closed_) return;
  closed_ = true;
  state_ = State::kClosing;
  beast::error_code ignored;
  beast::get_lowest_layer(stream_).socket().shutdown(net::socket_base::shutdown_both, ignored);
  beast::get_lowest_layer(stream_).close();
  body_timer_.cancel();
  charge_.reset();
  if (auto exchange = exchange_.lock()) exchange->Cancel();
  exchange_.reset();
}

template class HttpConnection<boost::beast::tcp_stream>;
template class HttpConnection<boost::beast::ssl_stream<boost::beast::tcp_stream>>;

}  // namespace attention::server
