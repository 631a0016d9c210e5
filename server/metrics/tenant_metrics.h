// File: server/metrics/tenant_metrics.h
//
// One model's per-tenant series: what each caller (token) has queued, how
// long its requests waited, the work computed for it and why it was refused
// (attention_tenant_*{model, tenant}). The tenant label is the token's name
// from the tokens file, or "-" on a server without tokens, so the series are
// bounded by the file's names. A tenant's series are made on its first
// request and kept.
//
// Thread-safe. For() takes a mutex and is called when a queue first sees a
// tenant, never per request; the series it returns are prometheus-cpp's
// thread-safe handles, valid as long as the TenantMetrics.
#ifndef ATTENTION_SERVER_METRICS_TENANT_METRICS_H_
#define ATTENTION_SERVER_METRICS_TENANT_METRICS_H_

#include <array>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace attention::server {

// Why a tenant's request was refused (attention_tenant_refusals_total{reason}).
enum class TenantRefusal {
  kQueueShare = 0,  // "queue_share": the queue was full and the tenant held its share.
  kPushedOut = 1,   // "pushed_out": queued, then pushed out for a tenant under its share.
  kRate = 2,        // "rate": over the token's rate= or token_rate=.
};
inline constexpr int kNumTenantRefusals = 3;
inline constexpr const char* kTenantRefusalLabels[kNumTenantRefusals] = {"queue_share",
                                                                         "pushed_out", "rate"};

struct TenantSeries {
  prometheus::Gauge* queue_depth = nullptr;         // Requests queued.
  prometheus::Histogram* queue_duration = nullptr;  // Enqueue to batch start, seconds.
  prometheus::Counter* flops = nullptr;             // FLOPs of its requests computed.
  std::array<prometheus::Counter*, kNumTenantRefusals> refusals{};

  void Refused(TenantRefusal why) const { refusals[static_cast<int>(why)]->Increment(); }
};

// The four families, registered once per registry (Metrics' constructor,
// which gives its duration buckets: this unit stays below metrics.h).
struct TenantFamilies {
  TenantFamilies(prometheus::Registry& registry,
                 prometheus::Histogram::BucketBoundaries duration_buckets);
  const prometheus::Histogram::BucketBoundaries duration_buckets;
  prometheus::Family<prometheus::Gauge>& queue_depth;
  prometheus::Family<prometheus::Histogram>& queue_duration;
  prometheus::Family<prometheus::Counter>& flops;
  prometheus::Family<prometheus::Counter>& refusals;
};

class TenantMetrics {
 public:
  // `families` must outlive it.
  TenantMetrics(TenantFamilies* families, std::string model);
  TenantMetrics(const TenantMetrics&) = delete;
  TenantMetrics& operator=(const TenantMetrics&) = delete;

  // The series of the tenant labelled `name`, made on first use.
  const TenantSeries* For(absl::string_view name);

 private:
  TenantFamilies* const families_;
  const std::string model_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<TenantSeries>, std::less<>> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_METRICS_TENANT_METRICS_H_
