// File: server/batching/model_repository.h
//
// The models a server serves, each as one or more versions (see
// version_folder.h for the layout), each version with its engine, batcher
// and the model's metrics. Versions come and go while serving:
//
// * A version is a ServedModel held by shared_ptrs: the repository's while
//   it serves, and a lease per request admitted to it (RequestPath takes
//   them), so a request finishes on the version it was admitted to. When the
//   last holder lets go, the version is destroyed on the VersionReaper's
//   thread (its batcher first computes whatever is queued).
// * A new version is checked (complete on disk), admitted against
//   max_model_bytes (the load is refused, never traffic), loaded and warmed
//   up beside the serving ones, then published: new lookups see it at once.
// * Control (--model_control): kNone loads once at start; kPoll re-scans the
//   repository every poll_interval (a version folder is loaded only when
//   complete and unchanged across two polls; never reloaded in place); with
//   kExplicit only LoadModel/UnloadModel change what serves.
// * What a poll or load may free, and when (server/batching/README.md,
//   "Rollouts and drain"): a serving version the policy no longer selects
//   is unloaded once what the policy selects serves; if nothing it selects
//   serves yet and a replacement is on its way, the newest such version
//   keeps serving until the replacement does; a model folder found with no
//   version keeps its newest serving until the next poll (mid-swap). Only
//   max_model_bytes's refusal is retried once room frees (a load out of
//   memory is a failure, as a broken version). A scan that fails changes
//   nothing. A drain answers queued loads UNAVAILABLE and abandons the one
//   in progress at its deadline.
//
// Thread-safe. Find() returns a lease; raw pointers from models() are valid
// only while the version serves (start-up wiring).
#ifndef ATTENTION_SERVER_BATCHING_MODEL_REPOSITORY_H_
#define ATTENTION_SERVER_BATCHING_MODEL_REPOSITORY_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/mha_engine.h"
#include "core/mha_model.h"
#include "server/batching/dynamic_batcher.h"
#include "server/batching/version_folder.h"
#include "server/metrics/metrics.h"
#include "server/metrics/model_load_metrics.h"

namespace attention::server {

class VersionReaper;
struct ServedModel;

struct RepositoryOptions {
  std::string path;           // Folder of model directories; empty: the demo model.
  std::string default_model;  // Empty: the only model, else the first by name.
  BatchingOptions batching;   // Defaults for keys a model's config.json leaves out.
  int compute_threads = 1;    // OpenMP threads per batch computation.
  bool warmup = true;         // Create primitives for common shapes at load.
  ModelControl control = ModelControl::kNone;
  absl::Duration poll_interval = absl::Seconds(15);  // kPoll: between scans.
  // Resident bytes of the prepared weights of every resident version,
  // serving or retiring, at most (model_bytes.h: estimated before a load,
  // MhaEngine::resident_bytes() after); a load that would pass it is
  // refused. 0: no limit.
  int64_t max_model_bytes = 0;
  // At start (Load): a model folder none of whose versions loads stops the
  // start-up (Load fails naming it). False: it is reported (Index, the
  // log) and the other models serve, as a poll reports a bad folder
  // (Triton's --exit-on-error=false).
  bool exit_on_error = false;
  // Called with a loaded version before it is published (the assembly
  // installs its session state), and after one stops serving.
  std::function<void(ServedModel&)> on_load;
  std::function<void(const ServedModel&)> on_unload;
  // Called once a version is freed, with its address (a key only).
  std::function<void(const void*)> on_freed;
  // Called after what serves changed (a load, an unload, a poll).
  std::function<void()> on_change;
  // Set (from any thread, e.g. on a stop signal): loads in progress stop at
  // their next check (between chunks of reading, before the engine, between
  // warm-up passes) and fail with UNAVAILABLE; later ones fail at once. Null:
  // the repository makes its own (AbandonLoads, FinishControl).
  std::shared_ptr<std::atomic<bool>> abandon;
  // Test seam: how scans list folders (empty: ListDirectory).
  DirectoryLister list_directory;
  // Test hook: runs on a load's thread before the version's files are read;
  // an error fails the load. A slow hook polls `abandoned` as reading does.
  std::function<absl::Status(const std::string& model, int64_t version,
                             const std::function<bool()>& abandoned)>
      load_hook;
};

// One version of one model.
struct ServedModel : std::enable_shared_from_this<ServedModel> {
  std::string name;
  int64_t version = 1;
  // Its weights' resident bytes (admitted against max_model_bytes by the
  // estimate, then the engine's resident_bytes()).
  int64_t bytes = 0;
  std::shared_ptr<const MhaModel> model;
  std::unique_ptr<MhaEngine> engine;
  const ModelMetrics* metrics = nullptr;
  std::unique_ptr<DynamicBatcher> batcher;  // Declared last: stops first.
};
using ModelRef = std::shared_ptr<const ServedModel>;

// A version's state, for listings (Triton's RepositoryIndex states).
struct VersionState {
  std::string model;
  int64_t version = 0;
  std::string state;   // "READY", "UNAVAILABLE" (refused or unloaded).
  std::string reason;  // Why not READY.
};

class ModelRepository {
 public:
  // Loads every model folder of options.path (the folder's name is the
  // model's name) per its version policy, or the demo model "demo" when
  // path is empty, and starts polling in kPoll. A model with no loadable
  // version is reported (Index: UNAVAILABLE with the reason; not needed for
  // AllServing) and the others serve; with exit_on_error it is an error
  // naming the model and its folder. NotFound / InvalidArgument when the
  // folder has no model, default_model is not among them, or (kNone) no
  // model loaded at all.
  static absl::StatusOr<std::unique_ptr<ModelRepository>> Load(RepositoryOptions options,
                                                               Metrics* metrics);
  // Stops polling (abandoning a load in progress), lets go of every version
  // and waits (bounded) until all are freed: every request must have ended
  // (see AttentionServer::Drain).
  ~ModelRepository();

  // The version `version` (0: the newest serving) of the model `name`
  // (empty: the default), or null.
  ModelRef Find(const std::string& name, int64_t version = 0) const;
  // The newest serving version of each model with one, by name.
  std::vector<ModelRef> Snapshot() const;
  // Snapshot() as raw pointers, for start-up wiring only.
  std::vector<const ServedModel*> models() const;
  // Every known version of `name` (empty: every model), serving or not.
  std::vector<VersionState> Index(const std::string& name = "") const;
  // Whether a model called `name` is known (serving or not).
  bool Known(const std::string& name) const;
  // Why the known model `name` has no serving version ("unloaded", or the
  // reason its newest version was refused), or "" when one serves.
  std::string WhyNotServing(const std::string& name) const;
  const std::string& default_model() const { return default_model_; }
  ModelControl control() const { return options_.control; }
  // Every model loaded at start has a serving version.
  bool AllServing() const;

  // Loads (or re-reads) `name` from the repository per its policy, then
  // unloads its versions the policy no longer selects. NotFound when the
  // repository has no such folder; the load's error when no version of it
  // could serve (versions already serving go on).
  absl::Status LoadModel(const std::string& name);
  // Stops serving every version of `name`; requests admitted finish first,
  // then each version is freed. NotFound when it has no serving version.
  absl::Status UnloadModel(const std::string& name);
  // One scan of the repository (what kPoll does every poll_interval). A
  // scan that fails (the repository or a model folder cannot be listed, even
  // part-way) changes nothing for what it could not read: the next poll
  // retries.
  void Poll();
  // Runs `task` on the repository's worker thread, in order with polls (a
  // load takes seconds: gRPC reactions hand it over instead of blocking).
  // Once control stops (StopControl), a task not yet started runs
  // `if_stopped` instead (may be null), at once.
  void Run(std::function<void()> task, std::function<void()> if_stopped = nullptr);

  // Starts no poll, load or unload from now on: queued tasks get their
  // `if_stopped` now. Returns at once; the task in progress goes on (see
  // FinishControl).
  void StopControl();
  // After StopControl: waits until the task in progress ends, up to
  // `deadline`, then abandons the loads still running (they fail with
  // UNAVAILABLE at their next check) and joins the worker thread. False if
  // a load had to be abandoned.
  bool FinishControl(absl::Time deadline);
  // Loads in progress stop at their next check; later ones fail at once.
  // Thread-safe; for a shutdown (it cannot be undone).
  void AbandonLoads() { abandon_->store(true); }
  // Stops every batcher from accepting requests; queued ones still complete.
  void StopAccepting();
  // Requests queued across all serving versions.
  int64_t queued() const;
  // Bytes of resident versions' weights (serving or retiring).
  int64_t resident_bytes() const;

  // Held while a batch computes (any model). Tests hold it to keep batches
  // waiting deterministically.
  absl::Mutex* compute_mutex() { return &compute_mutex_; }

 private:
  // A version that did not load, with the fingerprint its folder had.
  struct Refusal {
    std::string print;
    std::string reason;
    // Refused for room by --max_model_bytes (before anything was made):
    // retried once a version was freed since (frees_ moved on from `frees`).
    // Else broken (a failure, out of memory too): retried only when its
    // folder changes.
    bool no_room = false;
    int64_t frees = 0;
  };
  struct Entry {
    std::string dir;
    std::map<int64_t, std::shared_ptr<ServedModel>> serving;
    std::map<int64_t, Refusal> refused;
    // Versions seen incomplete or changing: the fingerprint of the last poll.
    std::map<int64_t, std::string> seen;
    std::map<int64_t, std::string> loaded_print;  // A serving version's files when loaded.
    bool configured = false;                      // Loaded at start: readiness needs it.
    bool emptied = false;                         // The last poll found its folder with no version.
    // Why its last Sync served no version (its folder could not be read,
    // its policy selects none, ...); "" once one serves, or after an unload.
    std::string problem;
  };

  ModelRepository(RepositoryOptions options, Metrics* metrics);
  // Brings `name` (folder `dir`) in line with its policy. `stable_only`:
  // load a version only once seen complete and unchanged on the last scan.
  absl::Status Sync(const std::string& name, const std::string& dir, bool stable_only);
  // Loads one version; the load's metrics are counted. `no_room` (may be
  // null) is set when max_model_bytes refused it (nothing was made).
  absl::StatusOr<std::shared_ptr<ServedModel>> LoadVersion(const std::string& name, int64_t version,
                                                           const std::string& dir,
                                                           bool* no_room = nullptr);
  // A known model the poll's scan left out: its folder `dir` is gone, or
  // holds no version (kept one poll: it may be mid-swap), or cannot be read
  // (nothing changes).
  void LeftOut(const std::string& name, const std::string& dir) ABSL_LOCKS_EXCLUDED(mu_);
  // Unpublishes the serving versions of `name` that `want` leaves out, per
  // the rule in the header comment; `coming`: a version the policy would
  // select is on its way (seen, not loadable yet).
  void Retire(const std::string& name, const std::set<int64_t>& want, bool coming)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Unpublish(const std::string& name, int64_t version) ABSL_LOCKS_EXCLUDED(mu_);
  bool abandoned() const { return abandon_->load(std::memory_order_relaxed); }
  void WorkLoop();

  const RepositoryOptions options_;
  const DirectoryLister list_;
  const std::shared_ptr<std::atomic<bool>> abandon_;
  Metrics* const metrics_;
  ModelLoadMetrics load_metrics_;
  std::string default_model_;
  absl::Mutex compute_mutex_;  // One batch computes at a time, on all cores.
  absl::Mutex load_mu_;        // One load or unload at a time.
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> models_ ABSL_GUARDED_BY(mu_);
  int64_t resident_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t frees_ ABSL_GUARDED_BY(mu_) = 0;  // Versions freed so far.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool worker_done_ ABSL_GUARDED_BY(mu_) = true;  // No worker thread running.
  struct Task {
    std::function<void()> run;
    std::function<void()> if_stopped;
  };
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<VersionReaper> reaper_;
  std::thread worker_;  // Runs tasks, and polls in kPoll.
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_MODEL_REPOSITORY_H_
