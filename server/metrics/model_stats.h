// File: server/metrics/model_stats.h
//
// ModelStats: one model's counters in the form Triton's statistics
// extension reports them (ModelStatistics): requests answered OK and failed
// with their total time, time queued, batches executed with their compute
// time, by batch size, items inferred and the last inference's time. Updated
// where the Prometheus series are (the request path, the batcher), so the
// two agree.
//
// Thread-safe.
#ifndef ATTENTION_SERVER_METRICS_MODEL_STATS_H_
#define ATTENTION_SERVER_METRICS_MODEL_STATS_H_

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attention::server {

class ModelStats {
 public:
  struct Duration {
    uint64_t count = 0;
    uint64_t ns = 0;
  };
  struct Snapshot {
    Duration success, fail, queue, compute;
    uint64_t inference_count = 0;          // Items (a request of N items counts N).
    uint64_t execution_count = 0;          // Batches.
    int64_t last_inference_ms = 0;         // Unix epoch; 0: none yet.
    std::map<uint64_t, Duration> batches;  // By requests per batch: compute time.
  };

  // A request answered, `ok` or not, `total` after it was received.
  void Answered(bool ok, absl::Duration total);
  // A request that waited `wait` in the queue before its batch ran.
  void Queued(absl::Duration wait);
  // A batch of `requests` requests and `items` items computed in `compute`.
  void Executed(uint64_t requests, uint64_t items, absl::Duration compute, absl::Time end);

  Snapshot Read() const;

 private:
  mutable absl::Mutex mu_;
  Snapshot s_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_METRICS_MODEL_STATS_H_
