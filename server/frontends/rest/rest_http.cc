// File: server/frontends/rest/rest_http.cc
#include "server/frontends/rest/rest_http.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "server/frontends/rest/rest_json.h"

namespace attention::server {

void ReplyJson(httplib::Response& res, std::string body) {
  res.status = 200;
  res.body = std::move(body);
  res.set_header("Content-Type", "application/json");
}

void ReplyError(httplib::Response& res, const absl::Status& status) {
  res.status = HttpStatusOf(status.code());
  res.body = ErrorBody(status);
  res.set_header("Content-Type", "application/json");
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    res.set_header("WWW-Authenticate", "Bearer");
  }
}

// The answer to a probe: 200 when `up`, else 400 (as Triton answers).
void ReplyProbe(httplib::Response& res, const absl::Status& allowed, bool up) {
  if (!allowed.ok()) return ReplyError(res, allowed);
  if (up) {
    res.status = 200;
  } else {
    ReplyError(res, absl::UnavailableError("not ready"));
    res.status = 400;
  }
}

std::string Group(const httplib::Request& req, size_t i) {
  return i < req.matches.size() ? req.matches[i].str() : std::string();
}

// Whether the request has a body: a Content-Length other than 0 or a
// Transfer-Encoding (RFC 9112 6.3: with neither, it has none; httplib would
// read one until the client closes).
bool HasBody(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

// Makes httplib close the connection once `res` is written, for a request
// whose body was not read whole: what is left of it must not be read as the
// next request (request smuggling). httplib 0.11 closes a connection whose
// content provider fails, so the reply is written by one that then fails.
// The provider has no length of its own: httplib hands a provider with one
// the offsets of the request's Range (unchecked against its length: the
// string was read past its end), and asserts that length is not 0. The
// Content-Length is set here; after routing, httplib has set the body's
// (once it applied a Range to it). (A reply to HEAD has no body: that
// connection stays open.)
void CloseAfterReply(httplib::Response& res) {
  auto body = std::make_shared<std::string>(std::move(res.body));
  res.body.clear();
  const std::string type = res.get_header_value("Content-Type");
  res.headers.erase("Content-Type");
  res.set_header("Connection", "close");
  if (!res.has_header("Content-Length"))
    res.set_header("Content-Length", std::to_string(body->size()));
  res.set_content_provider(type, [body](size_t offset, httplib::DataSink& sink) {
    if (offset < body->size()) sink.write(body->data() + offset, body->size() - offset);
    return false;
  });
  if (type.empty()) res.headers.erase("Content-Type");
}

void CloseAfterReplyTo(const httplib::Request& req, httplib::Response& res) {
  if (req.method != "HEAD") return CloseAfterReply(res);
  if (!res.has_header("Content-Length")) {
    res.set_header("Content-Length", std::to_string(res.body.size()));
  }
  res.body.clear();
  CloseAfterReply(res);
  // httplib's Request in process_request is not const: HEAD's reply would
  // skip the provider (httplib 0.11 checks the method after the handlers).
  const_cast<httplib::Request&>(req).method = "GET";
}

// Reads and drops a body (up to `max_body` bytes) that no handler wants, so
// that the connection stays in step; false when it was not read whole.
bool DropBody(const httplib::Request& req, const httplib::ContentReader& reader, int64_t max_body,
              const std::atomic<bool>* stopping) {
  if (!HasBody(req)) return true;
  if (req.is_multipart_form_data()) return false;  // httplib's form reader: not for us.
  uint64_t seen = 0;
  return reader([&](const char*, size_t n) {
    seen += n;
    return seen <= static_cast<uint64_t>(max_body) &&
           (stopping == nullptr || !stopping->load(std::memory_order_relaxed));
  });
}

}  // namespace attention::server
