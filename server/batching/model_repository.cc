#include "server/batching/model_repository.h"
#include "server/batching/version_reaper.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace attention::server {

ModelRepository::ModelRepository(RepositoryOptions options, Metrics* metrics)
    : options_(std::move(options)),
      list_(options_.list_directory ? options_.list_directory : DirectoryLister(ListDirectory)),
      abandon_(options_.abandon ? options_.abandon : std::make_shared<std::atomic<bool>>(false)),
      metrics_(metrics),
      load_metrics_(*metrics->registry()) {
  reaper_ = std::make_shared<VersionReaper>([this](const void* key, int64_t bytes) {
    {
      absl::MutexLock lock(&mu_);
      resident_bytes_ -= bytes;
      ++frees_;  // Room may have freed: versions refused for room are retried.
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
    ASSIGN_OR_RETURN(dirs, ScanRepository(o.path, repo->list_));
    if (dirs.empty()) {
      return absl::NotFoundError(absl::StrCat("model repository '", o.path,
                                              "' has no model directory (a folder with "
                                              "config.json and model.safetensors)"));
    }
    for (const auto& [name, dir] : dirs) {
      const absl::Status synced = repo->Sync(name, dir, /*stable_only=*/false);
      if (synced.ok()) continue;
      if (repo->abandoned()) return synced;  // A stop signal: no verdict on the folder.
      const std::string why = absl::StrCat(
          "model '", name, "'",
          absl::StrContains(synced.message(), dir) ? "" : absl::StrCat(" (folder '", dir, "')"),
          ": ", synced.message());
      if (o.exit_on_error)
        return absl::Status(synced.code(), absl::StrCat(why, " (--exit_on_error)"));
      std::cerr << why << ": not served; the other models are (the repository index says why; "
                << "--exit_on_error makes a bad folder stop the start-up)\n";
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
    // Readiness waits for what loaded; a model that did not is reported.
    for (auto& [name, entry] : repo->models_) entry.configured = !entry.serving.empty();
  }
  std::vector<ModelRef> serving = repo->Snapshot();
  if (serving.empty() && o.control == ModelControl::kNone) {
    return absl::FailedPreconditionError(
        absl::StrCat("model repository '", o.path,
                     "': no model could be loaded (see above); "
                     "with --model_control=none nothing could ever serve"));
  }
  // Unless named: the first model by name, whether or not it loaded (a
  // request naming no model is refused while it does not serve, not handed
  // to whichever model loaded: the next start, or its fix, would move it).
  repo->default_model_ = !o.default_model.empty() ? o.default_model : dirs.begin()->first;
  if (dirs.count(repo->default_model_) == 0) {
    std::vector<std::string> names;
    for (const auto& [name, unused] : dirs) names.push_back(name);
    return absl::NotFoundError(
        absl::StrCat("default model '", repo->default_model_,
                     "' is not among the loaded models: ", absl::StrJoin(names, ", ")));
  }
  {
    absl::MutexLock lock(&repo->mu_);
    repo->worker_done_ = false;
  }
  repo->worker_ = std::thread([r = repo.get()] { r->WorkLoop(); });
  return repo;
}

void ModelRepository::StopControl() {
  std::deque<Task> left;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    left.swap(tasks_);
  }
  for (Task& task : left) {
    if (task.if_stopped) task.if_stopped();
  }
}

bool ModelRepository::FinishControl(absl::Time deadline) {
  bool finished = false;
  {
    absl::MutexLock lock(&mu_);
    finished = mu_.AwaitWithDeadline(absl::Condition(&worker_done_), deadline);
  }
  if (!finished) {
    std::cerr << "model control: still busy at the drain deadline: a load in progress is "
                 "abandoned\n";
    AbandonLoads();
  }
  if (worker_.joinable()) worker_.join();
  return finished;
}

ModelRepository::~ModelRepository() {
  StopControl();
  AbandonLoads();  // A load still running (no drain waited for it) stops.
  if (worker_.joinable()) worker_.join();
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
    for (const auto& [v, r] : e.refused) versions[v] = {model, v, "UNAVAILABLE", r.reason};
    for (const auto& [v, m] : e.serving) versions[v] = {model, v, "READY", ""};
    if (versions.empty()) {
      versions[0] = {model, 0, "UNAVAILABLE", e.problem.empty() ? "unloaded" : e.problem};
    }
    for (auto& [v, s] : versions) out.push_back(std::move(s));
  }
  return out;
}

bool ModelRepository::Known(const std::string& name) const {
  absl::ReaderMutexLock lock(&mu_);
  return models_.count(name) > 0;
}

std::string ModelRepository::WhyNotServing(const std::string& name) const {
  std::string why;
  for (const VersionState& v : Index(name)) {
    if (v.state == "READY") return "";
    if (!v.reason.empty()) why = v.reason;  // The newest refused version's.
  }
  return why;
}

bool ModelRepository::AllServing() const {
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, e] : models_) {
    if (e.configured && e.serving.empty()) return false;
  }
  return true;
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
    models_[name].problem.clear();
  }
  if (options_.on_change) options_.on_change();
  return absl::OkStatus();
}

void ModelRepository::Run(std::function<void()> task, std::function<void()> if_stopped) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      tasks_.push_back({std::move(task), std::move(if_stopped)});
      return;
    }
  }
  if (if_stopped) if_stopped();
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
      if (stop_) break;  // StopControl answers what is still queued.
      if (!tasks_.empty()) {
        task = std::move(tasks_.front().run);
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
  absl::MutexLock lock(&mu_);
  worker_done_ = true;
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
