// File: server/frontends/rest/rest_http.cc
#include "server/frontends/rest/rest_http.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "server/frontends/rest/rest_json.h"

namespace attention::server {

void ReplyJson(HttpResponse& res, std::string body) {
  res.status = 200;
  res.body = std::move(body);
  res.SetHeader("Content-Type", "application/json");
}

void ReplyError(HttpResponse& res, const absl::Status& status) {
  res.status = HttpStatusOf(status.code());
  res.body = ErrorBody(status);
  res.SetHeader("Content-Type", "application/json");
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    res.SetHeader("WWW-Authenticate", "Bearer");
  }
}

void ReplyProbe(HttpResponse& res, const absl::Status& allowed, bool up) {
  if (!allowed.ok()) return ReplyError(res, allowed);
  if (up) {
    res.status = 200;
  } else {
    ReplyError(res, absl::UnavailableError("not ready"));
    res.status = 400;
  }
}

HttpResponse ErrorResponse(const absl::Status& status) {
  HttpResponse res;
  ReplyError(res, status);
  return res;
}

std::optional<ModelPath> ParseModelPath(const std::string& path) {
  constexpr absl::string_view kPrefix = "/v2/models/";
  if (!absl::StartsWith(path, kPrefix)) return std::nullopt;
  const std::vector<std::string> parts =
      absl::StrSplit(absl::string_view(path).substr(kPrefix.size()), '/');
  ModelPath out;
  size_t i = 0;
  out.name = parts[i++];
  if (out.name.empty()) return std::nullopt;
  if (i + 1 < parts.size() && parts[i] == "versions") {
    out.version = parts[i + 1];
    if (out.version.empty()) return std::nullopt;
    i += 2;
  }
  if (i < parts.size()) out.action = parts[i++];
  if (i != parts.size()) return std::nullopt;
  if (!out.action.empty() && out.action != "ready" && out.action != "config" &&
      out.action != "stats" && out.action != "infer") {
    return std::nullopt;
  }
  return out;
}

}  // namespace attention::server
