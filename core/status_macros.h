// File: core/status_macros.h
//
// Debian's Abseil (20220623) has no status macros; these two are the small
// local equivalents used across the project, and the bad_alloc boundary.
#ifndef ATTENTION_CORE_STATUS_MACROS_H_
#define ATTENTION_CORE_STATUS_MACROS_H_

#include <new>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)              \
  do {                                     \
    const ::absl::Status _status = (expr); \
    if (!_status.ok()) return _status;     \
  } while (0)

#define ATTN_STATUS_CONCAT_INNER_(a, b) a##b
#define ATTN_STATUS_CONCAT_(a, b) ATTN_STATUS_CONCAT_INNER_(a, b)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an absl::StatusOr or
// returns its status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(ATTN_STATUS_CONCAT_(_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

namespace attention {

// Runs `body` (returning absl::Status or absl::StatusOr) and turns a
// std::bad_alloc thrown inside it into RESOURCE_EXHAUSTED naming `what`. Every
// public entry of core/ that allocates runs through this, so that running out
// of memory is an error, never a crash.
template <typename F>
auto ResourceExhaustedOnBadAlloc(absl::string_view what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  }
}

}  // namespace attention

#endif  // ATTENTION_CORE_STATUS_MACROS_H_
