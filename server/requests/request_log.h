// File: server/requests/request_log.h
//
// RequestLog: the server's line per refused or failed request, written by
// the request path for every protocol:
//
//   2026-11-24T07:31:02.123Z request failed: RESOURCE_EXHAUSTED
//     attention.v1.AttentionService/Infer model=small caller=alice
//     peer=ipv4:10.0.0.7:51234: response: would be about ... bytes
//
// (one line). The caller is the token entry's name, never the token. At
// most `lines_per_second` lines a second; what is held back is counted and
// said in the next line written ("... 37 more not logged").
//
// Thread-safe. Writes to the stream given (std::cerr in the server).
#ifndef ATTENTION_SERVER_REQUESTS_REQUEST_LOG_H_
#define ATTENTION_SERVER_REQUESTS_REQUEST_LOG_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/metrics/metrics.h"

namespace attention::server {

class RequestLog {
 public:
  // `clock` tells the time (tests pass their own).
  explicit RequestLog(std::ostream* out, int lines_per_second = 10,
                      std::function<absl::Time()> clock = absl::Now)
      : out_(out), lines_per_second_(lines_per_second), clock_(std::move(clock)) {}

  RequestLog(const RequestLog&) = delete;
  RequestLog& operator=(const RequestLog&) = delete;

  // Logs `status` (not OK) of a `method` call for `model` (the served
  // model's name, or the one the caller asked for, made one printable field;
  // empty: none) by `caller` from `peer`, unless this second's lines are spent.
  void Failed(Method method, absl::string_view model, absl::string_view caller,
              absl::string_view peer, const absl::Status& status);
  // The same, naming the caller only if the line is written (finding the
  // name may cost a token's hash).
  void Failed(Method method, absl::string_view model, absl::FunctionRef<std::string()> caller,
              absl::string_view peer, const absl::Status& status);

  // "attention.v1.AttentionService/Infer" and the like.
  static absl::string_view MethodPath(Method method);

  // Lines held back so far (for tests).
  int64_t suppressed_total() const;

 private:
  std::ostream* const out_;
  const int lines_per_second_;
  const std::function<absl::Time()> clock_;
  mutable absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int lines_in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;  // Since the last line written.
  int64_t suppressed_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_REQUEST_LOG_H_
