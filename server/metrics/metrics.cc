#include "server/metrics/metrics.h"

namespace attention::server {
namespace {

template <typename Builder>
auto& Register(Builder builder, const char* name, const char* help,
               prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

prometheus::Histogram::BucketBoundaries Metrics::DurationBuckets() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
          50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
}

Metrics::Metrics(const std::string& version)
    : registry_(std::make_shared<prometheus::Registry>()),
      request_duration_(Register(prometheus::BuildHistogram(), "attention_request_duration_seconds",
                                 "Time from receiving a request to sending its response.",
                                 *registry_)),
      queue_duration_(Register(prometheus::BuildHistogram(), "attention_queue_duration_seconds",
                               "Time a request waited in its model's queue.", *registry_)),
      compute_duration_(Register(prometheus::BuildHistogram(), "attention_compute_duration_seconds",
                                 "Compute time of each executed batch.", *registry_)),
      batch_size_(Register(prometheus::BuildHistogram(), "attention_batch_size",
                           "Requests per executed batch.", *registry_)),
      padding_ratio_(Register(prometheus::BuildHistogram(), "attention_padding_ratio",
                              "Padded query tokens over real query tokens per batch.", *registry_)),
      requests_(Register(prometheus::BuildCounter(), "attention_requests_total",
                         "Requests answered, by model, method and gRPC status code.", *registry_)),
      tokens_(Register(prometheus::BuildCounter(), "attention_tokens_total",
                       "Query tokens computed.", *registry_)),
      flops_(Register(prometheus::BuildCounter(), "attention_flops_total",
                      "Floating-point operations executed (padded shapes).", *registry_)),
      queue_depth_(Register(prometheus::BuildGauge(), "attention_queue_depth",
                            "Requests waiting in the model's queue.", *registry_)),
      queue_capacity_(Register(prometheus::BuildGauge(), "attention_queue_capacity",
                               "The model's max_queue_size: queued requests beyond it are "
                               "refused with RESOURCE_EXHAUSTED.",
                               *registry_)),
      sessions_(Register(prometheus::BuildGauge(), "attention_sessions",
                         "Live sessions (server-held keys and values).", *registry_)),
      session_tokens_(Register(prometheus::BuildCounter(), "attention_session_tokens_total",
                               "Tokens appended to sessions.", *registry_)),
      append_duration_(
          Register(prometheus::BuildHistogram(), "attention_session_append_duration_seconds",
                   "Time from receiving an append to sending its response.", *registry_)),
      session_ends_(Register(prometheus::BuildCounter(), "attention_session_ends_total",
                             "Sessions ended, by reason: closed by the client, expired "
                             "after their idle TTL, or evicted (evicted_memory, "
                             "evicted_tenant_memory, evicted_model_sessions, "
                             "evicted_tenant_sessions: the limit that needed the room).",
                             *registry_)),
      inflight_(&Register(prometheus::BuildGauge(), "attention_inflight_requests",
                          "Requests received and not yet answered.", *registry_)
                     .Add({})),
      session_memory_(&Register(prometheus::BuildGauge(), "attention_session_memory_bytes",
                                "Session key/value cache memory held (mapped slabs).", *registry_)
                           .Add({})),
      session_capacity_(&Register(prometheus::BuildGauge(),
                                  "attention_session_memory_capacity_bytes",
                                  "The session memory budget (--session_memory_bytes).", *registry_)
                             .Add({})),
      inflight_bytes_(&Register(prometheus::BuildGauge(), "attention_inflight_bytes",
                                "Bytes of requests accepted and not yet answered, with the "
                                "responses they will produce.",
                                *registry_)
                           .Add({})),
      inflight_bytes_limit_(&Register(prometheus::BuildGauge(), "attention_inflight_bytes_limit",
                                      "The in-flight byte budget (--max_inflight_bytes).",
                                      *registry_)
                                 .Add({})),
      tenant_families_(*registry_, DurationBuckets()) {
  auto& refusals = Register(prometheus::BuildCounter(), "attention_refusals_total",
                            "Calls refused before reaching a model, by code: UNAUTHENTICATED, "
                            "PERMISSION_DENIED, RESOURCE_EXHAUSTED (in-flight bytes).",
                            *registry_);
  for (absl::StatusCode code :
       {absl::StatusCode::kUnauthenticated, absl::StatusCode::kPermissionDenied,
        absl::StatusCode::kResourceExhausted}) {
    refusals_[static_cast<int>(code)] =
        &refusals.Add({{"code", std::string(wire::StatusCodeName(code))}});
  }
  Register(prometheus::BuildGauge(), "attention_build_info", "Build information; always 1.",
           *registry_)
      .Add({{"version", version}})
      .Set(1);
}

const ModelMetrics* Metrics::AddModel(const std::string& model) {
  absl::MutexLock lock(&mu_);
  auto& slot = models_[model];
  if (slot != nullptr) return slot.get();
  auto m = std::make_unique<ModelMetrics>();
  const prometheus::Labels labels = {{"model", model}};
  m->request_duration = &request_duration_.Add(labels, DurationBuckets());
  m->queue_duration = &queue_duration_.Add(labels, DurationBuckets());
  m->compute_duration = &compute_duration_.Add(labels, DurationBuckets());
  m->batch_size = &batch_size_.Add(
      labels, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256});
  m->padding_ratio = &padding_ratio_.Add(
      labels, prometheus::Histogram::BucketBoundaries{1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0});
  m->tokens = &tokens_.Add(labels);
  m->flops = &flops_.Add(labels);
  m->queue_depth = &queue_depth_.Add(labels);
  m->queue_capacity = &queue_capacity_.Add(labels);
  m->sessions = &sessions_.Add(labels);
  m->session_tokens = &session_tokens_.Add(labels);
  m->append_duration = &append_duration_.Add(labels, DurationBuckets());
  for (int i = 0; i < kNumSessionEnds; ++i) {
    m->session_ends[i] = &session_ends_.Add({{"model", model}, {"reason", kSessionEndLabels[i]}});
  }
  const char* methods[kNumMethods] = {
      "Infer",      "InferStream",  "CreateSession", "Append",           "SessionStream",
      "GetSession", "CloseSession", "ModelInfer",    "ModelStreamInfer", "ModelInfer"};
  for (int method = 0; method < kNumMethods; ++method) {
    for (int code = 0; code < wire::kNumStatusCodes; ++code) {
      m->requests[method][code] = &requests_.Add(
          {{"model", model},
           {"method", methods[method]},
           {"protocol", method == static_cast<int>(Method::kRestModelInfer) ? "http" : "grpc"},
           {"code", std::string(wire::StatusCodeName(static_cast<absl::StatusCode>(code)))}});
    }
  }
  m->tenants = std::make_unique<TenantMetrics>(&tenant_families_, model);
  slot = std::move(m);
  return slot.get();
}

}  // namespace attention::server
