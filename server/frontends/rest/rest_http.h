// File: server/frontends/rest/rest_http.h
//
// The REST front-end's helpers on cpp-httplib's requests and responses:
// JSON and error replies (status from HttpStatusOf), probes, path groups,
// and the body rules (whether a request has a body, dropping an unread one,
// closing a connection after its reply). Free functions, stateless and
// thread-safe; they act on the request and response they are given.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_HTTP_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_HTTP_H_

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace attention::server {

// 200 with a JSON body.
void ReplyJson(httplib::Response& res, std::string body);
// The status's HTTP code and {"error": ...}; 401 adds WWW-Authenticate.
void ReplyError(httplib::Response& res, const absl::Status& status);
// The answer to a probe: 200 when `up`, else 400 (as Triton answers).
void ReplyProbe(httplib::Response& res, const absl::Status& allowed, bool up);
// The path's i-th regex group, or "" when it has none.
std::string Group(const httplib::Request& req, size_t i);
// Whether the request has a body: a Content-Length other than 0 or a
// Transfer-Encoding (RFC 9112 6.3: with neither, it has none; httplib would
// read one until the client closes).
bool HasBody(const httplib::Request& req);
// Makes httplib close the connection once `res` is written: for a request
// whose body was not read whole (what is left of it must not be read as the
// next request), or to free the connection's thread for a waiting one. The
// reply is written whole (a request's Range is not applied to it), with its
// Content-Length. (A reply to HEAD has no body: that connection stays open.)
void CloseAfterReply(httplib::Response& res);
// CloseAfterReply for a reply that may be HEAD's: httplib writes no body for
// HEAD, so the provider that closes the connection would not run (and a body
// sent with the HEAD was read as the next request). HEAD's reply is written
// as GET's with no body (its headers, Content-Length included, as HEAD's):
// `req` is httplib's own request object, whose method is changed.
void CloseAfterReplyTo(const httplib::Request& req, httplib::Response& res);
// Reads and drops a body (up to `max_body` bytes) that no handler wants, so
// that the connection stays in step; false when it was not read whole (or
// `stopping`, when given, became true while it was read).
bool DropBody(const httplib::Request& req, const httplib::ContentReader& reader, int64_t max_body,
              const std::atomic<bool>* stopping = nullptr);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_HTTP_H_
