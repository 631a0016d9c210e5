#include "server/batching/model_repository.h"
#include "server/batching/version_reaper.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace attention::server {

ModelRepository::ModelRepository(RepositoryOptions options, Metrics* metrics)
    : options_(std::move(options)), metrics_(metrics), load_metrics_(*metrics->registry()) {
  reaper_ = std::make_shared<VersionReaper>([this](const void* key, int64_t bytes) {
    {
      absl::MutexLock lock(&mu_);
      resident_bytes_ -= bytes;
    }
    if (options_.on_freed) options_.on_freed(key);
  });
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Load(RepositoryOptions options,
                                                                       Metrics* metrics) {
  auto repo = std::unique_ptr<ModelRepository>(new ModelRepository(std::move(options), metrics));
  const RepositoryOptions& o = repo->options_;
  std::map<std::string, std::string> dirs;
  if (!o.path.empty()) {
    ASSIGN_OR_RETURN(dirs, ScanRepository(o.path));
    if (dirs.empty()) {
      return absl::NotFoundError(absl::StrCat("model repository '", o.path,
                                              "' has no model directory (a folder with "
                                              "config.json and model.safetensors)"));
    }
    for (const auto& [name, dir] : dirs) {
      RETURN_IF_ERROR(repo->Sync(name, dir, /*stable_only=*/false));
    }
  } else {
    ASSIGN_OR_RETURN(auto demo, repo->LoadVersion("demo", 1, ""));
    absl::MutexLock lock(&repo->mu_);
    repo->models_["demo"].serving[1] = std::move(demo);
    repo->load_metrics_.SetReady("demo", 1, true);
    dirs["demo"] = "";
  }
  {
    absl::MutexLock lock(&repo->mu_);
    for (auto& [name, entry] : repo->models_) entry.configured = true;
  }
  repo->default_model_ = o.default_model.empty() ? dirs.begin()->first : o.default_model;
  if (dirs.count(repo->default_model_) == 0) {
    std::vector<std::string> names;
    for (const auto& [name, unused] : dirs) names.push_back(name);
    return absl::NotFoundError(
        absl::StrCat("default model '", repo->default_model_,
                     "' is not among the loaded models: ", absl::StrJoin(names, ", ")));
  }
  repo->worker_ = std::thread([r = repo.get()] { r->WorkLoop(); });
  return repo;
}

void ModelRepository::StopControl() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (worker_.joinable()) worker_.join();
}

ModelRepository::~ModelRepository() {
  StopControl();
  std::map<std::string, Entry> models;
  {
    absl::MutexLock lock(&mu_);
    models.swap(models_);
  }
  models.clear();  // Each version goes to the reaper once its last lease does.
  if (!reaper_->WaitAllFreed(absl::Seconds(30))) {
    std::cerr << "model repository: versions still held 30 s after shutdown\n";
  }
  reaper_->Stop();
}

absl::Status ModelRepository::Sync(const std::string& name, const std::string& dir,
                                   bool stable_only) {
  absl::StatusOr<ModelLayout> layout = ScanModel(dir);
  if (!layout.ok()) {
    std::cerr << "model '" << name << "': " << layout.status().message() << "\n";
    return layout.status();
  }
  std::vector<int64_t> loadable;  // Ascending.
  std::map<int64_t, std::string> prints;
  for (const auto& [v, vdir] : layout->versions) {
    const std::string print = Fingerprint(vdir);
    prints[v] = print;
    bool changed = false;
    {
      absl::MutexLock lock(&mu_);
      Entry& e = models_[name];
      e.dir = dir;
      if (e.serving.count(v)) {
        loadable.push_back(v);
        std::string& loaded = e.loaded_print[v];
        if (stable_only && !loaded.empty() && loaded != print) {
          std::cerr << "model '" << name << "' version " << v
                    << ": its files changed after it was loaded; it keeps serving what was loaded "
                       "(versions are immutable: write new weights as a new version)\n";
          loaded = print;  // Said once per change.
        }
        continue;
      }
      auto refused = e.refused.find(v);
      if (refused != e.refused.end() && refused->second.first == print) continue;
      changed = e.seen[v] != print;
      e.seen[v] = print;
    }
    if (stable_only && changed) continue;  // Seen once: wait for one more poll.
    const absl::Status complete = CheckComplete(vdir);
    if (!complete.ok()) {
      // Unchanged since the last poll (or loaded on request): not a copy in
      // progress but a broken version. Refused until its folder changes.
      load_metrics_.Load(name, v, "failure", 0);
      std::cerr << "model '" << name << "' version " << v << ": not loaded: " << complete.message()
                << "\n";
      absl::MutexLock lock(&mu_);
      models_[name].refused[v] = {print, std::string(complete.message())};
      continue;
    }
    loadable.push_back(v);
  }
  absl::Status last_error = absl::OkStatus();
  for (;;) {
    const std::set<int64_t> want = SelectVersions(layout->policy, loadable);
    int64_t next = 0;
    {
      absl::MutexLock lock(&mu_);
      const Entry& e = models_[name];
      for (int64_t v : want) {
        if (!e.serving.count(v)) next = v;
      }
    }
    if (next == 0) {
      // Everything wanted serves: retire the rest (never before the new serve).
      std::vector<int64_t> drop;
      {
        absl::MutexLock lock(&mu_);
        for (const auto& [v, m] : models_[name].serving) {
          if (!want.count(v)) drop.push_back(v);
        }
      }
      for (int64_t v : drop) Unpublish(name, v);
      break;
    }
    absl::StatusOr<std::shared_ptr<ServedModel>> loaded =
        LoadVersion(name, next, layout->versions[next]);
    absl::MutexLock lock(&mu_);
    Entry& e = models_[name];
    if (loaded.ok()) {
      e.serving[next] = *std::move(loaded);
      e.loaded_print[next] = prints[next];
      e.refused.erase(next);
      e.configured = true;  // Readiness now waits for it.
      load_metrics_.SetReady(name, next, true);
    } else {
      last_error = loaded.status();
      e.refused[next] = {prints[next], std::string(loaded.status().message())};
      loadable.erase(std::find(loadable.begin(), loadable.end(), next));
    }
  }
  absl::MutexLock lock(&mu_);
  if (models_[name].serving.empty()) {
    if (!last_error.ok()) return last_error;
    return absl::NotFoundError(absl::StrCat("model '", name, "': no loadable version in '", dir,
                                            "' (policy ", layout->policy.ToString(), ")"));
  }
  return absl::OkStatus();
}

void ModelRepository::Unpublish(const std::string& name, int64_t version) {
  std::shared_ptr<ServedModel> gone;
  {
    absl::MutexLock lock(&mu_);
    auto it = models_.find(name);
    if (it == models_.end()) return;
    auto v = it->second.serving.find(version);
    if (v == it->second.serving.end()) return;
    gone = std::move(v->second);
    it->second.serving.erase(v);
  }
  load_metrics_.SetReady(name, version, false);
  std::cerr << "model '" << name << "' version " << version
            << ": unloaded (freed when its last request ends)\n";
  if (options_.on_unload) options_.on_unload(*gone);
  // The requests admitted to it hold it; the last one hands it to the reaper.
}

ModelRef ModelRepository::Find(const std::string& name, int64_t version) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = models_.find(name.empty() ? default_model_ : name);
  if (it == models_.end() || it->second.serving.empty()) return nullptr;
  const auto& serving = it->second.serving;
  if (version == 0) return serving.rbegin()->second;
  auto v = serving.find(version);
  return v == serving.end() ? nullptr : v->second;
}

std::vector<ModelRef> ModelRepository::Snapshot() const {
  std::vector<ModelRef> out;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, e] : models_) {
    if (!e.serving.empty()) out.push_back(e.serving.rbegin()->second);
  }
  return out;
}

std::vector<const ServedModel*> ModelRepository::models() const {
  std::vector<const ServedModel*> out;
  for (const ModelRef& m : Snapshot()) out.push_back(m.get());
  return out;
}

std::vector<VersionState> ModelRepository::Index(const std::string& name) const {
  std::vector<VersionState> out;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [model, e] : models_) {
    if (!name.empty() && model != name) continue;
    std::map<int64_t, VersionState> versions;
    for (const auto& [v, r] : e.refused) versions[v] = {model, v, "UNAVAILABLE", r.second};
    for (const auto& [v, m] : e.serving) versions[v] = {model, v, "READY", ""};
    if (versions.empty()) versions[0] = {model, 0, "UNAVAILABLE", "unloaded"};
    for (auto& [v, s] : versions) out.push_back(std::move(s));
  }
  return out;
}

bool ModelRepository::Known(const std::string& name) const {
  absl::ReaderMutexLock lock(&mu_);
  return models_.count(name) > 0;
}

bool ModelRepository::AllServing() const {
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, e] : models_) {
    if (e.configured && e.serving.empty()) return false;
  }
  return true;
}

absl::Status ModelRepository::LoadModel(const std::string& name) {
  absl::MutexLock serial(&load_mu_);
  if (options_.path.empty()) {
    return absl::FailedPreconditionError("model: this server serves the built-in demo model only");
  }
  ASSIGN_OR_RETURN(auto dirs, ScanRepository(options_.path));
  auto it = dirs.find(name);
  if (it == dirs.end()) {
    return absl::NotFoundError(
        absl::StrCat("model: '", name, "' has no folder in the repository '", options_.path, "'"));
  }
  {
    absl::MutexLock lock(&mu_);
    models_[name].refused.clear();  // An explicit load retries refused versions.
  }
  const absl::Status status = Sync(name, it->second, /*stable_only=*/false);
  if (options_.on_change) options_.on_change();
  return status;
}

absl::Status ModelRepository::UnloadModel(const std::string& name) {
  absl::MutexLock serial(&load_mu_);
  std::vector<int64_t> versions;
  {
    absl::MutexLock lock(&mu_);
    auto it = models_.find(name);
    if (it != models_.end()) {
      for (const auto& [v, m] : it->second.serving) versions.push_back(v);
    }
  }
  if (versions.empty()) {
    return absl::NotFoundError(absl::StrCat("model: '", name, "' has no version serving"));
  }
  for (int64_t v : versions) Unpublish(name, v);
  {
    absl::MutexLock lock(&mu_);
    models_[name].configured = false;  // Readiness no longer waits for it.
  }
  if (options_.on_change) options_.on_change();
  return absl::OkStatus();
}

void ModelRepository::Poll() {
  absl::MutexLock serial(&load_mu_);
  absl::StatusOr<std::map<std::string, std::string>> dirs = ScanRepository(options_.path);
  if (!dirs.ok()) {
    std::cerr << "model repository poll: " << dirs.status().message() << "\n";
    return;
  }
  std::vector<std::pair<std::string, int64_t>> removed;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, e] : models_) {
      if (dirs->count(name)) continue;
      e.configured = false;
      for (const auto& [v, m] : e.serving) removed.emplace_back(name, v);
    }
  }
  for (const auto& [name, v] : removed) Unpublish(name, v);
  for (const auto& [name, dir] : *dirs) {
    Sync(name, dir, /*stable_only=*/true).IgnoreError();
  }
  if (options_.on_change) options_.on_change();
}

void ModelRepository::Run(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void ModelRepository::WorkLoop() {
  absl::Time next_poll = absl::Now() + options_.poll_interval;
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
      if (options_.control == ModelControl::kPoll) {
        mu_.AwaitWithDeadline(absl::Condition(&wake), next_poll);
      } else {
        mu_.Await(absl::Condition(&wake));
      }
      if (stop_) break;
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
    }
    if (task) {
      task();
    } else if (absl::Now() >= next_poll) {
      Poll();
      next_poll = absl::Now() + options_.poll_interval;
    }
  }
  // Tasks still queued are answered (their callers wait for them).
  std::deque<std::function<void()>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(tasks_);
  }
  for (auto& task : left) task();
}

void ModelRepository::StopAccepting() {
  for (const ModelRef& m : Snapshot()) m->batcher->Stop();
}

int64_t ModelRepository::queued() const {
  int64_t n = 0;
  for (const ModelRef& m : Snapshot()) n += m->batcher->queue_depth();
  return n;
}

int64_t ModelRepository::resident_bytes() const {
  absl::ReaderMutexLock lock(&mu_);
  return resident_bytes_;
}

}  // namespace attention::server
