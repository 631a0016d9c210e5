#include "server/metrics/model_stats.h"

namespace attention::server {
namespace {

uint64_t Nanos(absl::Duration d) {
  return d < absl::ZeroDuration() ? 0 : static_cast<uint64_t>(absl::ToInt64Nanoseconds(d));
}

}  // namespace

void ModelStats::Answered(bool ok, absl::Duration total) {
  absl::MutexLock lock(&mu_);
  Duration& d = ok ? s_.success : s_.fail;
  ++d.count;
  d.ns += Nanos(total);
}

void ModelStats::Queued(absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  ++s_.queue.count;
  s_.queue.ns += Nanos(wait);
}

void ModelStats::Executed(uint64_t requests, uint64_t items, absl::Duration compute,
                          absl::Time end) {
  absl::MutexLock lock(&mu_);
  ++s_.execution_count;
  s_.inference_count += items;
  ++s_.compute.count;
  s_.compute.ns += Nanos(compute);
  Duration& by_size = s_.batches[requests];
  ++by_size.count;
  by_size.ns += Nanos(compute);
  s_.last_inference_ms = absl::ToUnixMillis(end);
}

ModelStats::Snapshot ModelStats::Read() const {
  absl::MutexLock lock(&mu_);
  return s_;
}

}  // namespace attention::server
