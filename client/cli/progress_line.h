// File: client/cli/progress_line.h
//
// ProgressLine: progress of a long command as lines on stderr ("prefilled
// 16/64 sessions"), at most one per interval so a fast loop does not flood
// the terminal, but always the first and the last (done == total). Lines, not
// carriage returns: they read the same in a log as on a terminal.
// Thread-safe: workers report as they finish. Does not own `out`.
#ifndef ATTENTION_CLIENT_CLI_PROGRESS_LINE_H_
#define ATTENTION_CLIENT_CLI_PROGRESS_LINE_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attention::client {

class ProgressLine {
 public:
  // Prints "<prefix><done>/<total><suffix>" lines to `out`.
  ProgressLine(FILE* out, std::string prefix, int64_t total, std::string suffix,
               absl::Duration interval = absl::Seconds(1));

  // Counts one more item done; prints when it is the first, the last, or
  // `interval` has passed since the last line.
  void Done();

  int64_t done() const;

 private:
  FILE* const out_;
  const std::string prefix_, suffix_;
  const int64_t total_;
  const absl::Duration interval_;
  mutable absl::Mutex mu_;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_PROGRESS_LINE_H_
