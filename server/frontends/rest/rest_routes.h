// File: server/frontends/rest/rest_routes.h
//
// The REST front-end's routes: which paths exist under which method, the
// repository control path's parts, a request's CallContext, and the answer
// to a path asked with the wrong method (405 with Allow, naming the method
// to use: `GET /v2/models/m/infer` is answered "use POST", not "no
// endpoint"). Free functions, stateless and thread-safe.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_ROUTES_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_ROUTES_H_

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "server/frontends/rest/http_message.h"
#include "server/requests/call_context.h"

namespace attention::server {

// The call of a REST request: its method, its Authorization header, its peer.
CallRef CallOfRequest(const HttpRequest& request, Method method);

// /v2/repository/models/{m}/load or .../unload: the model (percent-decoded)
// and whether it is a load; none for other paths.
std::optional<std::pair<std::string, bool>> ControlPath(const std::string& path);

// Whether `path` is served to GET and HEAD: the health probes, /v2,
// /v2/models (the model list), /v2/models/stats, and a model path with no
// action or ready, config or stats.
bool IsGetEndpoint(const std::string& path);
// Whether `path` is served to POST: a model's infer, /v2/repository/index,
// the repository's load and unload.
bool IsPostEndpoint(const std::string& path);

// 405 Method Not Allowed with `Allow: <allow>` and an error naming the
// method to use, for a path that exists under another method.
HttpResponse WrongMethod(const HttpRequest& request, absl::string_view allow);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_ROUTES_H_
