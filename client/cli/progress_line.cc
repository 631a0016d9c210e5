#include "client/cli/progress_line.h"

#include <utility>

#include "absl/time/clock.h"

namespace attention::client {

ProgressLine::ProgressLine(FILE* out, std::string prefix, int64_t total, std::string suffix,
                           absl::Duration interval)
    : out_(out),
      prefix_(std::move(prefix)),
      suffix_(std::move(suffix)),
      total_(total),
      interval_(interval) {}

void ProgressLine::Done() {
  absl::MutexLock lock(&mu_);
  ++done_;
  const absl::Time now = absl::Now();
  if (done_ != 1 && done_ != total_ && now - last_ < interval_) return;
  last_ = now;
  std::fprintf(out_, "%s%lld/%lld%s\n", prefix_.c_str(), static_cast<long long>(done_),
               static_cast<long long>(total_), suffix_.c_str());
  std::fflush(out_);
}

int64_t ProgressLine::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

}  // namespace attention::client
