#include "server/batching/model_bytes.h"

#include <filesystem>
#include <system_error>

namespace attention::server {

EngineOptions ServingEngineOptions() {
  EngineOptions options;
  options.keep_model_weights = false;  // The packed weights are the only copy.
  return options;
}

int64_t ModelFileBytes(const std::string& dir) {
  std::error_code ec;
  const auto size =
      std::filesystem::file_size(std::filesystem::path(dir) / "model.safetensors", ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

int64_t EstimateModelBytes(const std::string& dir) {
  absl::StatusOr<MhaSpec> spec = dir.empty() ? MhaModel::Demo()->spec() : MhaModel::ReadSpec(dir);
  if (!spec.ok()) return ModelFileBytes(dir);
  absl::StatusOr<int64_t> bytes = MhaEngine::EstimateResidentBytes(*spec, ServingEngineOptions());
  return bytes.ok() ? *bytes : ModelFileBytes(dir);
}

}  // namespace attention::server
