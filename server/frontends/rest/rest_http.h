// File: server/frontends/rest/rest_http.h
//
// The REST front-end's helpers on HttpResponse and request paths: JSON and
// error replies (status from HttpStatusOf), probes, and the model path
// (/v2/models/{m}[/versions/{v}][/{action}]), the client's deadline. Free functions, stateless and
// thread-safe; they act on the values they are given.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_HTTP_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_HTTP_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/frontends/rest/http_message.h"

namespace attention::server {

// 200 with a JSON body.
void ReplyJson(HttpResponse& res, std::string body);
// The status's HTTP code and {"error": ...}; 401 adds WWW-Authenticate.
void ReplyError(HttpResponse& res, const absl::Status& status);
// The answer to a probe: 200 when `up`, else 400 (as Triton answers).
void ReplyProbe(HttpResponse& res, const absl::Status& allowed, bool up);
// A response with `status`'s code and error body.
HttpResponse ErrorResponse(const absl::Status& status);

// The client's deadline for the request, as gRPC sends it: `grpc-timeout`,
// 1 to 8 digits and a unit (H, M, S, m, u or n: hours down to nanoseconds),
// counted from when the head was read. None without the header;
// INVALID_ARGUMENT naming the header and its form when malformed.
absl::StatusOr<std::optional<absl::Time>> RequestDeadline(const HttpRequest& request);

// /v2/models/{name}[/versions/{version}][/{action}], its parts; none when
// the path is not of that form (a name or version may not be empty or hold
// a '/').
struct ModelPath {
  std::string name;
  std::string version;
  std::string action;  // "", "ready", "config", "stats", "infer".
};
std::optional<ModelPath> ParseModelPath(const std::string& path);

// `segment` of a URL path with its %XX escapes decoded (RFC 3986 2.1; an
// invalid escape is kept as sent, '+' is itself): model names are folder
// names, which clients percent-encode.
std::string PercentDecoded(absl::string_view segment);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_HTTP_H_
