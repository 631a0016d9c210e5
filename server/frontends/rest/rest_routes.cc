#include "server/frontends/rest/rest_routes.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/frontends/rest/rest_http.h"

namespace attention::server {

CallRef CallOfRequest(const HttpRequest& req, Method method) {
  auto call = std::make_shared<CallContext>();
  call->method = method;
  if (auto authorization = req.Header("Authorization")) {
    call->authorization = std::string(*authorization);
  }
  call->peer = absl::StrCat("http:", req.peer);
  return call;
}

std::optional<std::pair<std::string, bool>> ControlPath(const std::string& path) {
  constexpr absl::string_view kPrefix = "/v2/repository/models/";
  if (!absl::StartsWith(path, kPrefix)) return std::nullopt;
  const absl::string_view rest = absl::string_view(path).substr(kPrefix.size());
  const size_t slash = rest.find('/');
  if (slash == 0 || slash == absl::string_view::npos) return std::nullopt;
  const absl::string_view action = rest.substr(slash + 1);
  if (action != "load" && action != "unload") return std::nullopt;
  return std::make_pair(PercentDecoded(rest.substr(0, slash)), action == "load");
}

bool IsGetEndpoint(const std::string& path) {
  if (path == "/v2/health/live" || path == "/v2/health/ready" || path == "/v2" ||
      path == "/v2/models" || path == "/v2/models/stats") {
    return true;
  }
  const std::optional<ModelPath> model = ParseModelPath(path);
  return model.has_value() && model->action != "infer";
}

bool IsPostEndpoint(const std::string& path) {
  const std::optional<ModelPath> model = ParseModelPath(path);
  return (model.has_value() && model->action == "infer") || path == "/v2/repository/index" ||
         ControlPath(path).has_value();
}

HttpResponse WrongMethod(const HttpRequest& req, absl::string_view allow) {
  const std::string use = absl::StartsWith(allow, "POST") ? "POST" : "GET";
  HttpResponse res = ErrorResponse(absl::InvalidArgumentError(
      absl::StrCat(req.method.substr(0, 16), " ", req.path.substr(0, 200), ": this endpoint takes ",
                   use, use == "POST" ? " (with a JSON or binary body)" : "", "; use ", use)));
  res.status = 405;
  res.SetHeader("Allow", std::string(allow));
  return res;
}

}  // namespace attention::server
