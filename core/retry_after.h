// File: core/retry_after.h
//
// A retry hint on an absl::Status: how long a caller refused for a rate
// should wait before it tries again. Front-ends turn it into their
// protocol's form (REST's Retry-After header, gRPC's grpc-retry-pushback-ms
// trailer on unary calls; streams carry it only in the message).
//
// Header-only; Abseil only.
#ifndef ATTENTION_CORE_RETRY_AFTER_H_
#define ATTENTION_CORE_RETRY_AFTER_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attention {

inline constexpr absl::string_view kRetryAfterUrl = "type.googleapis.com/attention.RetryAfter";

// `status` with a hint of `after` (rounded up to whole milliseconds, at least 1).
inline absl::Status WithRetryAfter(absl::Status status, absl::Duration after) {
  const int64_t ms =
      std::max<int64_t>(1, absl::ToInt64Milliseconds(absl::Ceil(after, absl::Milliseconds(1))));
  status.SetPayload(kRetryAfterUrl, absl::Cord(std::to_string(ms)));
  return status;
}

// The hint `status` carries, if any.
inline std::optional<absl::Duration> RetryAfterOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kRetryAfterUrl);  // An absl::optional.
  int64_t ms = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &ms) || ms < 0) return std::nullopt;
  return absl::Milliseconds(ms);
}

}  // namespace attention

#endif  // ATTENTION_CORE_RETRY_AFTER_H_
