// File: server/metrics/process_metrics.h
//
// The standard process metrics Prometheus users expect from any exporter
// (prometheus-cpp has none): process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_start_time_seconds and
// process_threads, read from /proc/self at each scrape. With
// attention_requests_total they make CPU seconds per request observable in
// production.
//
// Thread-safe: Collect() only reads /proc. Linux only; a value that cannot be
// read is left out of the scrape.
#ifndef ATTENTION_SERVER_METRICS_PROCESS_METRICS_H_
#define ATTENTION_SERVER_METRICS_PROCESS_METRICS_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace attention::server {

class ProcessMetrics : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_METRICS_PROCESS_METRICS_H_
