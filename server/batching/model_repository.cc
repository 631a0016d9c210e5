#include "server/batching/model_repository.h"

#include <omp.h>

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace attention::server {
namespace {

// Runs one forward pass per common length so their primitives exist before
// the first request.
absl::Status Warmup(const MhaEngine& engine) {
  const MhaSpec& s = engine.model().spec();
  // One item of each common length, and a batch of two (its strided paths
  // JIT-compile oneDNN kernels on first use, ~0.1 s).
  for (auto [items, len] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 8}, {1, 16}, {1, 32}, {1, 64}, {1, 128}, {2, 8}, {2, 32}}) {
    Tensor q(DType::kFloat32, {items, len, s.embed_dim});
    Tensor k(DType::kFloat32, {items, len, s.kdim});
    Tensor v(DType::kFloat32, {items, len, s.vdim});
    Tensor mask(DType::kBool, {items, len});
    MhaInputs in;
    in.query = q.view();
    if (!s.packed_in_proj()) {
      in.key = k.view();
      in.value = v.view();
    }
    if (items > 1) in.key_padding_mask = mask.view();  // The masked kernels too.
    RETURN_IF_ERROR(engine.Forward(in).status());
  }
  return absl::OkStatus();
}

BatchingOptions Resolve(BatchingOptions b, const ServingConfig& c) {
  if (c.max_batch_size) b.max_batch_size = *c.max_batch_size;
  if (c.max_batch_tokens) b.max_batch_tokens = *c.max_batch_tokens;
  if (c.max_queue_delay_us) b.max_queue_delay_us = *c.max_queue_delay_us;
  if (c.max_queue_size) b.max_queue_size = *c.max_queue_size;
  return b;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Load(
    const RepositoryOptions& options, Metrics* metrics) {
  std::map<std::string, std::shared_ptr<const MhaModel>> loaded;
  if (options.path.empty()) {
    loaded["demo"] = MhaModel::Demo();
  } else {
    std::error_code ec;
    if (!std::filesystem::is_directory(options.path, ec)) {
      return absl::NotFoundError(
          absl::StrCat("model repository '", options.path, "' is not a directory"));
    }
    for (const auto& entry : std::filesystem::directory_iterator(options.path, ec)) {
      if (!entry.is_directory() || !std::filesystem::exists(entry.path() / "config.json")) continue;
      ASSIGN_OR_RETURN(auto model, MhaModel::LoadFromDirectory(entry.path().string()));
      loaded[entry.path().filename().string()] = std::move(model);
    }
    if (loaded.empty()) {
      return absl::NotFoundError(absl::StrCat("model repository '", options.path,
                                              "' has no model directory (a folder with "
                                              "config.json and model.safetensors)"));
    }
  }
  auto repo = std::unique_ptr<ModelRepository>(new ModelRepository());
  repo->default_model_ =
      options.default_model.empty() ? loaded.begin()->first : options.default_model;
  if (loaded.count(repo->default_model_) == 0) {
    std::vector<std::string> names;
    for (const auto& [name, unused] : loaded) names.push_back(name);
    return absl::NotFoundError(
        absl::StrCat("default model '", repo->default_model_,
                     "' is not among the loaded models: ", absl::StrJoin(names, ", ")));
  }
  for (auto& [name, model] : loaded) {
    auto served = std::make_unique<ServedModel>();
    served->name = name;
    served->model = model;
    ASSIGN_OR_RETURN(served->engine, MhaEngine::Create(model));
    if (options.warmup) {
      // Batches run with one thread or all of them (see DynamicBatcher):
      // primitives are made per thread count.
      for (int threads : {1, options.compute_threads}) {
        omp_set_num_threads(threads);
        const absl::Status warm = Warmup(*served->engine);
        if (!warm.ok()) {
          return absl::InternalError(absl::StrCat(name, ": warm-up: ", warm.message()));
        }
      }
    }
    served->metrics = metrics->AddModel(name);
    ASSIGN_OR_RETURN(
        served->batcher,
        DynamicBatcher::Create(served->engine.get(), Resolve(options.batching, model->serving()),
                               served->metrics, &repo->compute_mutex_, options.compute_threads));
    const MhaSpec& s = model->spec();
    const BatchingOptions& b = served->batcher->options();
    std::cerr << "model '" << name << "': embed_dim " << s.embed_dim << ", num_heads "
              << s.num_heads << ", kdim " << s.kdim << ", vdim " << s.vdim << ", compute "
              << DTypeName(s.compute_dtype) << "; batching max_batch_size " << b.max_batch_size
              << ", max_batch_tokens " << b.max_batch_tokens << ", max_queue_delay_us "
              << b.max_queue_delay_us << ", max_queue_size " << b.max_queue_size
              << (options.warmup ? "; warmed up" : "") << "\n";
    repo->models_[name] = std::move(served);
  }
  return repo;
}

const ServedModel* ModelRepository::Find(const std::string& name) const {
  auto it = models_.find(name.empty() ? default_model_ : name);
  return it == models_.end() ? nullptr : it->second.get();
}

std::vector<const ServedModel*> ModelRepository::models() const {
  std::vector<const ServedModel*> out;
  for (const auto& [name, m] : models_) out.push_back(m.get());
  return out;
}

void ModelRepository::StopAccepting() {
  for (auto& [name, m] : models_) m->batcher->Stop();
}

int64_t ModelRepository::queued() const {
  int64_t n = 0;
  for (const auto& [name, m] : models_) n += m->batcher->queue_depth();
  return n;
}

}  // namespace attention::server
