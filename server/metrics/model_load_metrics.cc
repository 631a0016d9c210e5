#include "server/metrics/model_load_metrics.h"

namespace attention::server {

ModelLoadMetrics::ModelLoadMetrics(prometheus::Registry& registry)
    : loads_(prometheus::BuildCounter()
                 .Name("attention_model_loads_total")
                 .Help("Model version loads by result (success, failure, refused)")
                 .Register(registry)),
      ready_(prometheus::BuildGauge()
                 .Name("attention_model_ready")
                 .Help("1 while a model version serves")
                 .Register(registry)),
      seconds_(prometheus::BuildHistogram()
                   .Name("attention_model_load_seconds")
                   .Help("Time to load and warm up a model version")
                   .Register(registry)) {}

void ModelLoadMetrics::Load(const std::string& model, int64_t version, const std::string& result,
                            double seconds) {
  const std::string v = std::to_string(version);
  loads_.Add({{"model", model}, {"version", v}, {"result", result}}).Increment();
  if (result == "success") {
    seconds_
        .Add({{"model", model}},
             prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30})
        .Observe(seconds);
  }
}

void ModelLoadMetrics::SetReady(const std::string& model, int64_t version, bool ready) {
  ready_.Add({{"model", model}, {"version", std::to_string(version)}}).Set(ready ? 1 : 0);
}

}  // namespace attention::server
