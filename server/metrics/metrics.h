// File: server/metrics/metrics.h
//
// The server's Prometheus metrics. Families are registered once at start-up
// and each model's series are created when the model is added, so the hot
// path only touches typed handles (no lookups by name or label).
//
// Thread-safe: prometheus-cpp's metrics are; AddModel() must finish before the
// model's handles are used.
#ifndef ATTENTION_SERVER_METRICS_METRICS_H_
#define ATTENTION_SERVER_METRICS_METRICS_H_

#include <array>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/codec/status_codes.h"
#include "server/metrics/model_stats.h"
#include "server/metrics/tenant_metrics.h"

namespace attention::server {

enum class Method {
  kInfer = 0,
  kInferStream = 1,
  kCreateSession = 2,
  kAppend = 3,
  kSessionStream = 4,
  kGetSession = 5,
  kCloseSession = 6,
  kModelInfer = 7,        // inference.GRPCInferenceService (the Open Inference Protocol).
  kModelStreamInfer = 8,  // Its streaming extension.
  kRestModelInfer = 9,    // The same protocol's REST infer (POST .../infer).
};
inline constexpr int kNumMethods = 10;

// Why a session ended (attention_session_ends_total{reason}): closed by its
// caller, expired after its idle TTL, or evicted (idle past the grace) for
// one of four limits: the server's session memory, the caller's own memory
// limit, the model's max_sessions, or the caller's max_sessions_per_tenant.
// The last three only ever evict the caller's own sessions.
enum class SessionEnd {
  kClosed = 0,
  kExpired = 1,
  kEvictedMemory = 2,          // "evicted_memory": --session_memory_bytes.
  kEvictedTenantMemory = 3,    // "evicted_tenant_memory": --session_memory_per_tenant_bytes.
  kEvictedModelSessions = 4,   // "evicted_model_sessions": the model's max_sessions.
  kEvictedTenantSessions = 5,  // "evicted_tenant_sessions": --max_sessions_per_tenant.
};
inline constexpr int kNumSessionEnds = 6;
// The reason label of each SessionEnd.
inline constexpr const char* kSessionEndLabels[kNumSessionEnds] = {"closed",
                                                                   "expired",
                                                                   "evicted_memory",
                                                                   "evicted_tenant_memory",
                                                                   "evicted_model_sessions",
                                                                   "evicted_tenant_sessions"};

// One model's series.
struct ModelMetrics {
  prometheus::Histogram* request_duration = nullptr;  // Receipt to response, seconds.
  prometheus::Histogram* queue_duration = nullptr;    // Enqueue to batch start, seconds.
  prometheus::Histogram* compute_duration = nullptr;  // Per executed batch, seconds.
  prometheus::Histogram* batch_size = nullptr;        // Requests per executed batch.
  prometheus::Histogram* padding_ratio = nullptr;     // Padded / real query tokens.
  prometheus::Counter* tokens = nullptr;              // Query tokens computed.
  prometheus::Counter* flops = nullptr;               // FLOPs executed.
  prometheus::Gauge* queue_depth = nullptr;           // Requests waiting.
  prometheus::Gauge* queue_capacity = nullptr;        // max_queue_size in force.
  prometheus::Gauge* sessions = nullptr;              // Live sessions.
  prometheus::Counter* session_tokens = nullptr;      // Tokens appended to sessions.
  prometheus::Histogram* append_duration = nullptr;   // Receipt to response, seconds.
  std::array<prometheus::Counter*, kNumSessionEnds> session_ends{};
  // attention_requests_total by [method][status code]; labelled with the
  // method's name and its protocol ("grpc", or "http" for kRestModelInfer,
  // whose method label is "ModelInfer").
  std::array<std::array<prometheus::Counter*, wire::kNumStatusCodes>, kNumMethods> requests{};

  // The same requests and batches in Triton's statistics form.
  std::unique_ptr<ModelStats> stats = std::make_unique<ModelStats>();
  // attention_tenant_*{model, tenant}: each caller's queue, wait and work
  // (null in tests that build a ModelMetrics by hand).
  std::unique_ptr<TenantMetrics> tenants;

  void CountRequest(Method method, absl::StatusCode code) const {
    requests[static_cast<int>(method)][static_cast<int>(code)]->Increment();
  }
};

class Metrics {
 public:
  // Registers every family in a registry of its own, and sets
  // attention_build_info{version} to 1.
  explicit Metrics(const std::string& version);

  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Creates (once) and returns the series of `model`. The pointer stays valid
  // for the Metrics' lifetime.
  const ModelMetrics* AddModel(const std::string& model);

  prometheus::Gauge& inflight_requests() { return *inflight_; }
  // Session cache memory held (mapped) and the budget, server-wide.
  prometheus::Gauge& session_memory_bytes() { return *session_memory_; }
  prometheus::Gauge& session_memory_capacity_bytes() { return *session_capacity_; }
  // Bytes of requests accepted and not yet answered (with the responses they
  // will produce), and --max_inflight_bytes.
  prometheus::Gauge& inflight_bytes() { return *inflight_bytes_; }
  prometheus::Gauge& inflight_bytes_limit() { return *inflight_bytes_limit_; }
  // Calls refused before reaching a model: UNAUTHENTICATED, PERMISSION_DENIED
  // or RESOURCE_EXHAUSTED (the in-flight byte budget), by code.
  void CountRefusal(absl::StatusCode code) {
    prometheus::Counter* c = refusals_[static_cast<int>(code)];
    if (c != nullptr) c->Increment();
  }
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Buckets of the duration histograms: 50 us to 10 s.
  static prometheus::Histogram::BucketBoundaries DurationBuckets();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& queue_duration_;
  prometheus::Family<prometheus::Histogram>& compute_duration_;
  prometheus::Family<prometheus::Histogram>& batch_size_;
  prometheus::Family<prometheus::Histogram>& padding_ratio_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Counter>& flops_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Gauge>& queue_capacity_;
  prometheus::Family<prometheus::Gauge>& sessions_;
  prometheus::Family<prometheus::Counter>& session_tokens_;
  prometheus::Family<prometheus::Histogram>& append_duration_;
  prometheus::Family<prometheus::Counter>& session_ends_;
  prometheus::Gauge* inflight_;
  prometheus::Gauge* session_memory_;
  prometheus::Gauge* session_capacity_;
  prometheus::Gauge* inflight_bytes_;
  prometheus::Gauge* inflight_bytes_limit_;
  std::array<prometheus::Counter*, wire::kNumStatusCodes> refusals_{};
  TenantFamilies tenant_families_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<ModelMetrics>> models_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_METRICS_METRICS_H_
