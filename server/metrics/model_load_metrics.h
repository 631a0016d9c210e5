// File: server/metrics/model_load_metrics.h
//
// Series of model versions loading and serving:
//   attention_model_loads_total{model,version,result}  result: success, failure, refused
//   attention_model_ready{model,version}                1 while the version serves
//   attention_model_load_seconds{model}                 load and warm-up time
// Series are created when a version is first seen (loads are rare: the
// lookup by label is not on any request's path).
//
// Thread-safe (prometheus-cpp's families are). The registry must outlive it.
#ifndef ATTENTION_SERVER_METRICS_MODEL_LOAD_METRICS_H_
#define ATTENTION_SERVER_METRICS_MODEL_LOAD_METRICS_H_

#include <cstdint>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace attention::server {

class ModelLoadMetrics {
 public:
  explicit ModelLoadMetrics(prometheus::Registry& registry);

  // A load attempt of `version` of `model` ended with `result` ("success",
  // "failure": it did not load, "refused": over max_model_bytes).
  void Load(const std::string& model, int64_t version, const std::string& result, double seconds);
  // `version` of `model` serves (1) or stopped serving (0).
  void SetReady(const std::string& model, int64_t version, bool ready);

 private:
  prometheus::Family<prometheus::Counter>& loads_;
  prometheus::Family<prometheus::Gauge>& ready_;
  prometheus::Family<prometheus::Histogram>& seconds_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_METRICS_MODEL_LOAD_METRICS_H_
