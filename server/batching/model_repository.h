// File: server/batching/model_repository.h
//
// The models a server serves: each with its engine, its batcher and its
// metrics. Loaded once at start-up from a folder of model directories (or
// the built-in demo model), warmed up, then read-only: safe to share across
// threads.
#ifndef ATTENTION_SERVER_BATCHING_MODEL_REPOSITORY_H_
#define ATTENTION_SERVER_BATCHING_MODEL_REPOSITORY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/mha_engine.h"
#include "core/mha_model.h"
#include "server/batching/dynamic_batcher.h"
#include "server/metrics/metrics.h"

namespace attention::server {

struct RepositoryOptions {
  std::string path;           // Folder of model directories; empty: the demo model.
  std::string default_model;  // Empty: the only model, else the first by name.
  BatchingOptions batching;   // Defaults for keys a model's config.json leaves out.
  int compute_threads = 1;    // OpenMP threads per batch computation.
  bool warmup = true;         // Create primitives for common shapes at load.
};

struct ServedModel {
  std::string name;
  std::shared_ptr<const MhaModel> model;
  std::unique_ptr<MhaEngine> engine;
  const ModelMetrics* metrics = nullptr;
  std::unique_ptr<DynamicBatcher> batcher;  // Declared last: stops first.
};

class ModelRepository {
 public:
  // Loads every subfolder of options.path holding a config.json (the folder
  // name is the model's name), or the demo model "demo" when path is empty.
  // NotFound / InvalidArgument naming the model directory when one fails to
  // load, the folder has no model, or default_model is not among them.
  static absl::StatusOr<std::unique_ptr<ModelRepository>> Load(const RepositoryOptions& options,
                                                               Metrics* metrics);

  // The model called `name` (empty: the default), or nullptr.
  const ServedModel* Find(const std::string& name) const;
  std::vector<const ServedModel*> models() const;
  const std::string& default_model() const { return default_model_; }

  // Stops every batcher from accepting requests; queued ones still complete.
  void StopAccepting();
  // Requests queued across all models.
  int64_t queued() const;

  // Held while a batch computes (any model). Tests hold it to keep batches
  // waiting deterministically.
  absl::Mutex* compute_mutex() { return &compute_mutex_; }

 private:
  ModelRepository() = default;
  absl::Mutex compute_mutex_;  // One batch computes at a time, on all cores.
  std::map<std::string, std::unique_ptr<ServedModel>> models_;
  std::string default_model_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_MODEL_REPOSITORY_H_
