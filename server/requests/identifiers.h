// File: server/requests/identifiers.h
//
// Limits on the identifiers a caller sends and the server keeps or echoes:
// request ids, session and sequence ids, model, service and reflection
// names. Each is at most kMaxIdentifierBytes (INVALID_ARGUMENT above it), and
// an identifier quoted in an error message is cut to kShownBytes, so neither
// a kept id nor an error's text can grow with what a caller sends.
//
// Stateless functions; thread-safe.
#ifndef ATTENTION_SERVER_REQUESTS_IDENTIFIERS_H_
#define ATTENTION_SERVER_REQUESTS_IDENTIFIERS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace attention::server {

inline constexpr size_t kMaxIdentifierBytes = 1024;
inline constexpr size_t kShownBytes = 128;

// `value` itself when short; else its first kShownBytes bytes and its size.
inline std::string Shown(absl::string_view value) {
  if (value.size() <= kShownBytes) return std::string(value);
  return absl::StrCat(value.substr(0, kShownBytes), "... (", value.size(), " bytes)");
}

// OK, or INVALID_ARGUMENT naming `field` when `value` is longer than the limit.
inline absl::Status CheckIdentifier(absl::string_view value, absl::string_view field) {
  if (value.size() <= kMaxIdentifierBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.size(),
                                                 " bytes, longer than the limit of ",
                                                 kMaxIdentifierBytes, " bytes"));
}

// `value` cut to kMaxIdentifierBytes, for echoing a refused request's id.
inline std::string Echoed(absl::string_view value) {
  return std::string(value.substr(0, kMaxIdentifierBytes));
}

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_IDENTIFIERS_H_
