// File: server/frontends/rest/http_head_check.cc
#include "server/frontends/rest/http_head_check.h"

#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace attention::server {

namespace http = boost::beast::http;

std::optional<std::pair<int, std::string>> CheckHttpHead(const http::fields& head,
                                                         int max_header_fields) {
  const size_t fields = std::distance(head.begin(), head.end());
  if (fields > static_cast<size_t>(max_header_fields)) {
    return std::make_pair(431, absl::StrCat("request head: ", fields, " header fields, more than ",
                                            max_header_fields));
  }
  // RFC 9112 6.3: one Content-Length, one number; Beast takes equal repeats.
  const auto lengths = head.equal_range(http::field::content_length);
  if (lengths.first != lengths.second) {
    if (std::next(lengths.first) != lengths.second ||
        lengths.first->value().find(',') != boost::beast::string_view::npos) {
      return std::make_pair(400, "Content-Length: expected one, got several");
    }
  }
  const auto te = head.find(http::field::transfer_encoding);
  if (te != head.end()) {
    const std::string value(te->value());
    if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(value), "chunked")) {
      return std::make_pair(501, absl::StrCat("Transfer-Encoding: expected chunked, got '",
                                              value.substr(0, 64), "'"));
    }
  }
  return std::nullopt;
}

std::string HttpPathOf(const std::string& target) {
  absl::string_view path = absl::string_view(target).substr(0, target.find('?'));
  if (absl::StartsWithIgnoreCase(path, "http://") || absl::StartsWithIgnoreCase(path, "https://")) {
    const size_t slash = path.find('/', path.find("://") + 3);
    path = slash == absl::string_view::npos ? absl::string_view("/") : path.substr(slash);
  }
  return std::string(path);
}

}  // namespace attention::server
