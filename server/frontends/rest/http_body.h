// File: server/frontends/rest/http_body.h
//
// HttpBody: a Beast Body for request bodies, a string that asks before it
// grows. The parser hands it the body's bytes as they arrive (decoded from
// their framing, Content-Length or chunked); before keeping them it calls
// `grow` with the size the body would reach, and a false stops the read
// with net::error::no_buffer_space (the connection then answers the refusal
// the handler gave). So a body, whatever its framing, is charged to a
// budget as it is read, never past it.
//
// Used by one parser on one strand: not thread-safe. The value owns its
// bytes.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_BODY_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_BODY_H_

#include <cstdint>
#include <functional>
#include <string>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/optional.hpp>

namespace attention::server {

struct HttpBody {
  struct value_type {
    std::string data;
    std::function<bool(uint64_t)> grow;  // May be empty: grows freely.
  };

  static std::uint64_t size(const value_type& body) { return body.data.size(); }

  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(boost::beast::http::header<isRequest, Fields>&, value_type& body) : body_(body) {}

    void init(const boost::optional<std::uint64_t>& length, boost::beast::error_code& ec) {
      ec = {};
      // The parser's body_limit has bounded a declared length already.
      if (!length) return;
      // Reserved, not charged: pages are touched (and charged, in put) as
      // the bytes arrive.
      body_.data.reserve(*length);
    }

    template <class ConstBufferSequence>
    std::size_t put(const ConstBufferSequence& buffers, boost::beast::error_code& ec) {
      const std::size_t n = boost::asio::buffer_size(buffers);
      if (body_.grow && !body_.grow(body_.data.size() + n)) {
        ec = boost::asio::error::no_buffer_space;
        return 0;
      }
      ec = {};
      const std::size_t at = body_.data.size();
      body_.data.resize(at + n);
      return boost::asio::buffer_copy(boost::asio::buffer(&body_.data[at], n), buffers);
    }

    void finish(boost::beast::error_code& ec) { ec = {}; }

   private:
    value_type& body_;
  };
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_BODY_H_
