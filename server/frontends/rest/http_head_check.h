// File: server/frontends/rest/http_head_check.h
//
// CheckHttpHead: the checks of a request head that Beast's parser does not
// make (it bounds the head's bytes and refuses conflicting framing): the
// header field count, a Content-Length repeated or list-valued even with
// equal values (RFC 9112 6.3; Beast accepts those), and a Transfer-Encoding
// other than chunked. And HttpPathOf, the path a target names. Stateless
// functions; thread-safe.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_HTTP_HEAD_CHECK_H_
#define ATTENTION_SERVER_FRONTENDS_REST_HTTP_HEAD_CHECK_H_

#include <optional>
#include <string>
#include <utility>

#include <boost/beast/http/fields.hpp>

namespace attention::server {

// The status (431, 400 or 501) and message refusing `head`, or none.
std::optional<std::pair<int, std::string>> CheckHttpHead(const boost::beast::http::fields& head,
                                                         int max_header_fields);

// The path of request target `target`, without its query: origin-form
// ("/a?b": "/a") or absolute-form ("http://host/a?b": "/a"; RFC 9112 3.2.2:
// a server must accept it), "/" when the absolute form has no path.
std::string HttpPathOf(const std::string& target);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_HTTP_HEAD_CHECK_H_
