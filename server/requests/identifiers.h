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

// The first `n` bytes of `value` at most, cut before a UTF-8 character that
// would not fit whole (a cut string goes into proto3 string fields, which
// clients refuse to parse when they hold invalid UTF-8).
inline absl::string_view Utf8Prefix(absl::string_view value, size_t n) {
  if (value.size() <= n) return value;
  size_t end = n;
  // Back over continuation bytes (10xxxxxx) to the start of the character.
  while (end > 0 && (static_cast<unsigned char>(value[end]) & 0xC0) == 0x80) --end;
  return value.substr(0, end);
}

// `value` itself when short; else its first kShownBytes bytes and its size.
inline std::string Shown(absl::string_view value) {
  if (value.size() <= kShownBytes) return std::string(value);
  return absl::StrCat(Utf8Prefix(value, kShownBytes), "... (", value.size(), " bytes)");
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
  return std::string(Utf8Prefix(value, kMaxIdentifierBytes));
}

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_IDENTIFIERS_H_
