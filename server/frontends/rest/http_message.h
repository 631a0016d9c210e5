// File: server/frontends/rest/http_message.h
//
// HttpRequest and HttpResponse: one HTTP/1.1 exchange as the REST handlers
// see it, free of the connection that carries it (HttpConnection reads the
// one and writes the other). A request's head is complete when OnHead sees
// it; its body is filled only for Handle. A response's `hold` is kept until
// its last byte has been written to the socket (or the connection is gone):
// the in-flight admission of the request it answers.
//
// Plain values: not thread-safe; each is owned by whoever holds it.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_MESSAGE_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_MESSAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include <boost/beast/http/fields.hpp>

namespace attention::server {

struct HttpRequest {
  std::string method;  // As sent: "GET", "POST", ...
  std::string target;  // The request target, path and query.
  std::string path;    // The target's path, without its query (HttpPathOf).
  boost::beast::http::fields headers;
  std::string body;  // Decoded from its framing (Content-Length or chunked).
  std::string peer;  // "address:port".
  absl::Time received = absl::InfinitePast();  // When its head was read.
  // OnHead's charge for the body (HeadDecision::charge): the handler drops
  // it once what it parsed from the body is admitted elsewhere.
  std::shared_ptr<void> charge;

  // The first value of header `name`, or none.
  std::optional<absl::string_view> Header(absl::string_view name) const {
    auto it = headers.find(boost::beast::string_view(name.data(), name.size()));
    if (it == headers.end()) return std::nullopt;
    return absl::string_view(it->value().data(), it->value().size());
  }
  // Whether the head announces a body (Content-Length other than 0, or
  // Transfer-Encoding; RFC 9112 6.3: with neither, there is none).
  bool HasBody() const {
    if (Header("Transfer-Encoding").has_value()) return true;
    const auto length = Header("Content-Length");
    return length.has_value() && *length != "0";
  }
};

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // Content-Length is set on write.
  std::string body;
  bool close = false;          // Close the connection once it is written.
  std::shared_ptr<void> hold;  // Released once written (or the connection is gone).

  void SetHeader(std::string name, std::string value) {
    for (auto& [n, v] : headers) {
      if (n == name) {
        v = std::move(value);
        return;
      }
    }
    headers.emplace_back(std::move(name), std::move(value));
  }
  std::string_view Header(std::string_view name) const {
    for (const auto& [n, v] : headers) {
      if (n == name) return v;
    }
    return {};
  }
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_MESSAGE_H_
