// File: server/frontends/rest/rest_http.cc
#include "server/frontends/rest/rest_http.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/retry_after.h"
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
  // A rate's retry hint, in whole seconds (RFC 9110 10.2.3), at least 1.
  if (const std::optional<absl::Duration> after = RetryAfterOf(status); after.has_value()) {
    res.SetHeader("Retry-After",
                  absl::StrCat(std::max<int64_t>(
                      1, absl::ToInt64Seconds(absl::Ceil(*after, absl::Seconds(1))))));
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

std::string PercentDecoded(absl::string_view segment) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(segment.size());
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] == '%' && i + 2 < segment.size() && hex(segment[i + 1]) >= 0 &&
        hex(segment[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(segment[i + 1]) * 16 + hex(segment[i + 2])));
      i += 2;
    } else {
      out.push_back(segment[i]);
    }
  }
  return out;
}

HttpResponse ErrorResponse(const absl::Status& status) {
  HttpResponse res;
  ReplyError(res, status);
  return res;
}

absl::StatusOr<std::optional<absl::Time>> RequestDeadline(const HttpRequest& request) {
  const auto header = request.Header("grpc-timeout");
  if (!header.has_value()) return std::optional<absl::Time>();
  const absl::string_view v = *header;
  const auto malformed = [&v] {
    return absl::InvalidArgumentError(absl::StrCat(
        "grpc-timeout: expected 1 to 8 digits and a unit (H, M, S, m, u or n), e.g. 500m, got '",
        v.substr(0, 32), "'"));
  };
  if (v.size() < 2 || v.size() > 9) return malformed();
  int64_t n = 0;
  for (const char c : v.substr(0, v.size() - 1)) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return malformed();
    n = n * 10 + (c - '0');
  }
  absl::Duration unit;
  switch (v.back()) {
    case 'H':
      unit = absl::Hours(1);
      break;
    case 'M':
      unit = absl::Minutes(1);
      break;
    case 'S':
      unit = absl::Seconds(1);
      break;
    case 'm':
      unit = absl::Milliseconds(1);
      break;
    case 'u':
      unit = absl::Microseconds(1);
      break;
    case 'n':
      unit = absl::Nanoseconds(1);
      break;
    default:
      return malformed();
  }
  // A request made by no connection (a test's) counts from now.
  const absl::Time from = request.received == absl::InfinitePast() ? absl::Now() : request.received;
  return std::optional<absl::Time>(from + n * unit);
}

std::optional<ModelPath> ParseModelPath(const std::string& path) {
  constexpr absl::string_view kPrefix = "/v2/models/";
  if (!absl::StartsWith(path, kPrefix)) return std::nullopt;
  const std::vector<std::string> parts =
      absl::StrSplit(absl::string_view(path).substr(kPrefix.size()), '/');
  ModelPath out;
  size_t i = 0;
  out.name = PercentDecoded(parts[i++]);
  if (out.name.empty()) return std::nullopt;
  if (i + 1 < parts.size() && parts[i] == "versions") {
    out.version = PercentDecoded(parts[i + 1]);
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
