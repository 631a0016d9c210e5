// ModelRepository::Sync, Poll and LoadModel: bringing a model's serving
// versions in line with its folder and policy, and what that may unload
// (the rest of the class is in model_repository.cc; the rule is in
// server/batching/README.md, "Rollouts and drain").
#include <algorithm>
#include <iostream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "server/batching/model_repository.h"

namespace attention::server {

absl::Status ModelRepository::Sync(const std::string& name, const std::string& dir,
                                   bool stable_only) {
  absl::StatusOr<ModelLayout> layout = ScanModel(dir, list_);
  if (!layout.ok()) {  // Nothing read: nothing changes (a poll retries).
    std::cerr << "model '" << name << "': " << layout.status().message()
              << (stable_only ? " (what serves keeps serving; retried at the next poll)" : "")
              << "\n";
    absl::MutexLock lock(&mu_);
    Entry& e = models_[name];  // Known, so that the index says why it does not serve.
    e.dir = dir;
    e.problem = std::string(layout.status().message());
    return layout.status();
  }
  {
    absl::MutexLock lock(&mu_);
    Entry& e = models_[name];
    e.emptied = false;  // It has versions again.
    // A refused version whose folder is gone is no longer reported.
    for (auto it = e.refused.begin(); it != e.refused.end();) {
      it = layout->versions.count(it->first) ? std::next(it) : e.refused.erase(it);
    }
  }
  std::vector<int64_t> ready;   // Ascending: serving, or complete and stable: loadable now.
  std::vector<int64_t> coming;  // Seen, not loadable yet: changing, or unreadable this time.
  std::map<int64_t, std::string> prints;
  for (const auto& [v, vdir] : layout->versions) {
    absl::StatusOr<std::string> print = Fingerprint(vdir, list_);
    bool changed = false;
    {
      absl::MutexLock lock(&mu_);
      Entry& e = models_[name];
      e.dir = dir;
      if (e.serving.count(v)) {
        ready.push_back(v);
        std::string& loaded = e.loaded_print[v];
        if (stable_only && print.ok() && !loaded.empty() && loaded != *print) {
          std::cerr << "model '" << name << "' version " << v
                    << ": its files changed after it was loaded; it keeps serving what was loaded "
                       "(versions are immutable: write new weights as a new version)\n";
          loaded = *print;  // Said once per change.
        }
        continue;
      }
      if (print.ok()) {
        prints[v] = *print;
        auto refused = e.refused.find(v);
        // Broken: until its folder changes. No room: until a version is freed.
        if (refused != e.refused.end() && refused->second.print == *print &&
            (!refused->second.no_room || refused->second.frees == frees_)) {
          continue;
        }
        changed = e.seen[v] != *print;
        e.seen[v] = *print;
      }
    }
    if (!print.ok()) {
      std::cerr << "model '" << name << "' version " << v << ": " << print.status().message()
                << " (retried at the next poll)\n";
      coming.push_back(v);
      continue;
    }
    if (stable_only && changed) {  // Seen once: wait for one more poll.
      coming.push_back(v);
      continue;
    }
    const absl::Status complete = CheckComplete(vdir);
    if (complete.code() == absl::StatusCode::kFailedPrecondition) {
      // Unchanged since the last poll (or loaded on request): not a copy in
      // progress but a broken version. Refused until its folder changes.
      load_metrics_.Load(name, v, "failure", 0);
      std::cerr << "model '" << name << "' version " << v << ": not loaded: " << complete.message()
                << "\n";
      absl::MutexLock lock(&mu_);
      models_[name].refused[v] = {*print, std::string(complete.message())};
      continue;
    }
    if (!complete.ok()) {  // Could not be read: no verdict, retried.
      std::cerr << "model '" << name << "' version " << v << ": " << complete.message()
                << " (retried at the next poll)\n";
      coming.push_back(v);
      continue;
    }
    ready.push_back(v);
  }
  absl::Status last_error = absl::OkStatus();
  std::set<int64_t> want;
  for (;;) {
    want = SelectVersions(layout->policy, ready);
    int64_t next = 0;
    int64_t frees = 0;
    {
      absl::MutexLock lock(&mu_);
      const Entry& e = models_[name];
      for (int64_t v : want) {
        if (!e.serving.count(v)) next = v;  // The newest first.
      }
      frees = frees_;  // Before the load: a free during it means a retry.
    }
    if (next == 0) break;
    bool no_room = false;
    absl::StatusOr<std::shared_ptr<ServedModel>> loaded =
        LoadVersion(name, next, layout->versions[next], &no_room);
    if (!loaded.ok() && abandoned()) return loaded.status();  // Nothing recorded or unloaded.
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
      // Only --max_model_bytes's refusal waits for room. A load that ran out
      // of memory made a version first, and freeing it moves frees_: counted
      // as room, it would be loaded again at every poll.
      e.refused[next] = {prints[next], std::string(loaded.status().message()), no_room, frees};
      ready.erase(std::find(ready.begin(), ready.end(), next));
    }
  }
  // Versions on their way that the policy would select once loadable: they
  // justify keeping a version that would otherwise go (refused ones do not).
  std::vector<int64_t> seen = ready;
  seen.insert(seen.end(), coming.begin(), coming.end());
  std::sort(seen.begin(), seen.end());
  bool replacement_coming = false;
  for (int64_t v : SelectVersions(layout->policy, seen)) {
    if (std::find(coming.begin(), coming.end(), v) != coming.end()) replacement_coming = true;
  }
  Retire(name, want, replacement_coming);
  absl::MutexLock lock(&mu_);
  Entry& e = models_[name];
  e.problem.clear();
  if (e.serving.empty()) {
    const absl::Status none =
        !last_error.ok()
            ? last_error
            : absl::NotFoundError(absl::StrCat("model '", name, "': no loadable version in '", dir,
                                               "' (policy ", layout->policy.ToString(), ")"));
    e.problem = std::string(none.message());
    return none;
  }
  return absl::OkStatus();
}

void ModelRepository::LeftOut(const std::string& name, const std::string& dir) {
  absl::StatusOr<std::vector<DirEntry>> listed =
      dir.empty() ? absl::StatusOr<std::vector<DirEntry>>(absl::NotFoundError("no folder"))
                  : list_(dir);
  if (!listed.ok() && listed.status().code() != absl::StatusCode::kNotFound) {
    std::cerr << "model '" << name << "': " << listed.status().message()
              << " (what serves keeps serving; retried at the next poll)\n";
    return;
  }
  // Its folder is there with no version: perhaps mid-swap (`rm -r m/1`, then
  // `mv m/.2.tmp m/2`), as a replacement on its way: the newest version
  // serves until the next poll. Still no version then, or the folder gone:
  // the model unloads and readiness no longer waits for it.
  bool keep = false;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = models_[name];
    keep = listed.ok() && !e.emptied && !e.serving.empty();
    e.emptied = keep;
    if (!keep) {
      e.configured = false;
      // What was wrong with its files no longer applies: it has none.
      e.refused.clear();
      e.problem = listed.ok() ? "its folder holds no version" : "its folder is gone";
    }
  }
  if (keep) {
    std::cerr << "model '" << name << "': its folder holds no version (a replacement may be on "
              << "its way); unloaded if the next poll finds none\n";
  }
  Retire(name, {}, keep);
}

void ModelRepository::Retire(const std::string& name, const std::set<int64_t>& want, bool coming) {
  std::vector<int64_t> outgoing;  // Newest first.
  {
    absl::MutexLock lock(&mu_);
    const Entry& e = models_[name];
    for (auto it = e.serving.rbegin(); it != e.serving.rend(); ++it) {
      if (!want.count(it->first)) outgoing.push_back(it->first);
    }
  }
  if (outgoing.empty()) return;
  // Everything wanted serves (Sync loaded it first). When that is nothing
  // while a replacement is on its way (seen once, not loaded yet), the
  // newest outgoing version serves until the replacement does, so that the
  // model is never without a version in between.
  if (want.empty() && coming) {
    std::cerr << "model '" << name << "' version " << outgoing.front()
              << ": no longer selected (or its folder is gone); it serves until the version "
                 "replacing it does\n";
    outgoing.erase(outgoing.begin());
  }
  for (int64_t v : outgoing) Unpublish(name, v);
}

absl::Status ModelRepository::LoadModel(const std::string& name) {
  absl::MutexLock serial(&load_mu_);
  if (options_.path.empty()) {
    return absl::FailedPreconditionError("model: this server serves the built-in demo model only");
  }
  ASSIGN_OR_RETURN(auto dirs, ScanRepository(options_.path, list_));
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

void ModelRepository::Poll() {
  absl::MutexLock serial(&load_mu_);
  absl::StatusOr<std::map<std::string, std::string>> dirs = ScanRepository(options_.path, list_);
  if (!dirs.ok()) {
    // Not "every model is gone": what serves keeps serving, and the next
    // poll reads the repository again.
    std::cerr << "model repository poll: " << dirs.status().message()
              << " (nothing changed; retried at the next poll)\n";
    return;
  }
  std::vector<std::pair<std::string, std::string>> left_out;  // Name, folder.
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, e] : models_) {
      if (!dirs->count(name)) left_out.emplace_back(name, e.dir);
    }
  }
  for (const auto& [name, dir] : left_out) LeftOut(name, dir);
  for (const auto& [name, dir] : *dirs) {
    if (abandoned()) break;
    Sync(name, dir, /*stable_only=*/true).IgnoreError();
  }
  if (options_.on_change) options_.on_change();
}

}  // namespace attention::server
