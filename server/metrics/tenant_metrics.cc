#include "server/metrics/tenant_metrics.h"

#include <utility>

namespace attention::server {

TenantFamilies::TenantFamilies(prometheus::Registry& registry,
                               prometheus::Histogram::BucketBoundaries duration_buckets)
    : duration_buckets(std::move(duration_buckets)),
      queue_depth(prometheus::BuildGauge()
                      .Name("attention_tenant_queue_depth")
                      .Help("Requests a tenant (token) has waiting in the model's queue.")
                      .Register(registry)),
      queue_duration(prometheus::BuildHistogram()
                         .Name("attention_tenant_queue_duration_seconds")
                         .Help("Time a tenant's requests waited in the model's queue.")
                         .Register(registry)),
      flops(prometheus::BuildCounter()
                .Name("attention_tenant_flops_total")
                .Help("Floating-point operations of a tenant's requests computed (their own "
                      "shapes, unpadded): the share of the model's compute each tenant got.")
                .Register(registry)),
      refusals(prometheus::BuildCounter()
                   .Name("attention_tenant_refusals_total")
                   .Help("A tenant's requests refused RESOURCE_EXHAUSTED, by reason: "
                         "queue_share (the queue was full and the tenant held its share), "
                         "pushed_out (queued, then pushed out for a tenant under its share), "
                         "rate (over the token's rate).")
                   .Register(registry)) {}

TenantMetrics::TenantMetrics(TenantFamilies* families, std::string model)
    : families_(families), model_(std::move(model)) {}

const TenantSeries* TenantMetrics::For(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = series_.find(name);
  if (it != series_.end()) return it->second.get();
  auto s = std::make_unique<TenantSeries>();
  const std::map<std::string, std::string> labels = {{"model", model_},
                                                     {"tenant", std::string(name)}};
  s->queue_depth = &families_->queue_depth.Add(labels);
  s->queue_duration = &families_->queue_duration.Add(labels, families_->duration_buckets);
  s->flops = &families_->flops.Add(labels);
  for (int i = 0; i < kNumTenantRefusals; ++i) {
    std::map<std::string, std::string> with_reason = labels;
    with_reason["reason"] = kTenantRefusalLabels[i];
    s->refusals[static_cast<size_t>(i)] = &families_->refusals.Add(with_reason);
  }
  const TenantSeries* out = s.get();
  series_.emplace(std::string(name), std::move(s));
  return out;
}

}  // namespace attention::server
