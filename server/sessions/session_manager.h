// File: server/sessions/session_manager.h
//
// SessionManager holds every session of the server: their ids, their
// key/value caches (one KvBlockPool per model, all under one MemoryBudget),
// the per-model and per-tenant limits, and their ends (closed, expired after
// their idle TTL, evicted for memory or count).
//
// Tenants. A session's tenant is its owner, the creating caller's
// Principal::id ("" without authentication: every caller is then one
// tenant). Each tenant may hold at most max_sessions_per_tenant live sessions
// of a model and memory_per_tenant_bytes of cache. Eviction never lets one
// tenant take another's room: a new session over a count limit (the model's
// or the tenant's) may evict only the caller's own idle sessions; an append
// over the tenant's memory limit likewise; an append that finds the whole
// budget spent may evict the caller's own idle sessions or those of a tenant
// holding more than its fair share (the budget over the tenants holding
// session memory, the caller included), never of one at or below it.
//
// Appends to one session are serialised in arrival order: while one is
// queued or computing (the session is "busy"), later ones wait in the
// session's own queue and are passed to the model's batcher one at a time.
// The batcher computes them with RunSessionBatch (session_batch_runner.h),
// which asks Reserve() for cache memory; when the pool is full, Reserve
// evicts whole idle sessions, least recently used first and only those idle
// for at least `evict_grace`, and otherwise refuses. A busy session is never
// evicted, and an append that fails leaves its session unchanged.
//
// Ended sessions are remembered (a bounded number of ids) so that NOT_FOUND
// says whether a session was closed, expired or evicted. A reaper thread
// expires idle sessions once a second.
//
// Thread-safe. The repository and metrics must outlive the manager; the
// manager must outlive every batcher's use of it (destroy it after draining).
#ifndef ATTENTION_SERVER_SESSIONS_SESSION_MANAGER_H_
#define ATTENTION_SERVER_SESSIONS_SESSION_MANAGER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/kv_block_pool.h"
#include "core/memory_budget.h"
#include "core/session_engine.h"
#include "server/batching/model_repository.h"
#include "server/metrics/metrics.h"
#include "server/requests/call_leases.h"
#include "server/sessions/ended_sessions.h"
#include "server/sessions/session.h"
#include "server/sessions/tenant_ledger.h"

namespace attention::server {

struct SessionOptions {
  int64_t memory_bytes = int64_t{1} << 30;  // Budget of every session cache.
  // Defaults for models whose config.json leaves them out:
  int64_t max_sessions = 4096;
  int64_t max_session_tokens = 32768;
  absl::Duration ttl = absl::Minutes(10);
  // Longest ttl_s a CreateSession may ask for (longer: INVALID_ARGUMENT).
  absl::Duration max_ttl = absl::Hours(24);
  // Live sessions of one model one tenant may hold. 0: a quarter of the
  // model's max_sessions (at least 1) for an authenticated caller, the
  // model's max_sessions for the unauthenticated one (then every caller is
  // one tenant, and a quarter would only shrink what it had).
  int64_t max_sessions_per_tenant = 0;
  // Cache bytes one tenant's sessions may hold, all models together. 0: a
  // quarter of memory_bytes for an authenticated caller, all of it for the
  // unauthenticated one.
  int64_t memory_per_tenant_bytes = 0;
  // Only sessions idle this long may be evicted to make room.
  absl::Duration evict_grace = absl::Seconds(2);
  // Appended to session ids ("<hex>@<address>") so clients find the replica.
  std::string advertise_address;
  // Ended session ids remembered for NOT_FOUND messages (about 100 bytes each).
  int64_t remembered_ends = 10000;
};

// One model's session state.
struct SessionModel {
  const ServedModel* served = nullptr;
  std::unique_ptr<SessionEngine> engine;
  std::unique_ptr<KvBlockPool> pool;
  int64_t max_sessions = 0;
  int64_t max_session_tokens = 0;
  absl::Duration ttl;
  int64_t live = 0;      // Guarded by SessionManager::mu_.
  bool removed = false;  // Guarded by SessionManager::mu_: its version stopped serving.
};

// A snapshot of a session for GetSession.
struct SessionSnapshot {
  std::string id;
  std::string model;
  int64_t model_version = 0;  // The version it was created on.
  bool cross = false;
  int64_t length = 0, keys = 0, bytes = 0, max_tokens = 0;
  absl::Time created, last_used;
  absl::Duration ttl;
};

// Every version serving now, of every model (a policy may serve several,
// and a rollback makes an older one the newest): start-up wiring.
std::vector<ModelRef> ServingVersions(const ModelRepository& repository);

class SessionManager {
 public:
  SessionManager(const ModelRepository* repository, Metrics* metrics, SessionOptions options);
  ~SessionManager();

  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;

  // A new session of `model` owned by `owner`, the creating caller's
  // Principal::id (empty without authentication), under the routing key
  // `key` (valid, or empty: none; see proto/codec/routing_key.h).
  // RESOURCE_EXHAUSTED, naming the limit, when the owner is at its
  // max_sessions_per_tenant for the model or the model at its max_sessions
  // and none of the owner's own sessions of the model has been idle for
  // evict_grace to evict; FAILED_PRECONDITION when the model allows none.
  // A key already naming a live session gets ALREADY_EXISTS, unless this is
  // a retry of the same creation (same owner and model, a self session with
  // nothing appended or queued): then that session, with *existing set. A
  // cross session's keys are then projected by its first work,
  // SessionWork::kInitCross.
  absl::StatusOr<std::shared_ptr<Session>> Create(const ServedModel* model, bool cross,
                                                  bool is_causal, absl::Duration ttl,
                                                  const std::string& owner = "",
                                                  const std::string& key = "",
                                                  bool* existing = nullptr);

  // The live session `id`; NOT_FOUND naming why otherwise. Its model
  // version is held by `pin` when given (found while the session is live,
  // so the version cannot be freed before): whoever reads the session's
  // model (its SessionModel, engine or served version) outside the
  // manager's lock must hold its version so.
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& id,
                                                CallLeases* pin = nullptr) const;

  // Queues `request` (session work) behind the session's earlier appends.
  // OK: its `done` will be called exactly once. NOT_FOUND if the session has
  // ended; errors of DynamicBatcher::Enqueue when it could be queued at once.
  absl::Status Submit(std::shared_ptr<Session> session, std::unique_ptr<PendingRequest> request);

  // Ends a session: its memory is freed now, or after its computing append.
  // Appends waiting for it get NOT_FOUND. Returns the bytes freed.
  absl::StatusOr<int64_t> Close(const std::string& id);

  // Batcher thread, session busy: room for `tokens` more tokens in its
  // cache, within its tenant's memory limit and the budget, evicting idle
  // sessions as the class comment says. RESOURCE_EXHAUSTED naming the limit
  // (the tenant's or the server's) if none can go; the session is unchanged.
  absl::Status Reserve(Session& session, int64_t tokens);
  // After session work succeeds: records the new length and memory.
  void Committed(Session& session, int64_t tokens);

  SessionSnapshot Snapshot(Session& session) const;
  // The session state of a model version, serving or removed; valid while
  // the caller holds the version (a lease), null for one never added.
  SessionModel* model(const ServedModel* served) const;
  // Session state for a version loaded after the manager was made.
  SessionModel* AddModel(const ServedModel* served);
  // Ends every session of `served` (a version being unloaded): waiting
  // appends and later calls get NOT_FOUND saying "model version N was
  // unloaded", and Create refuses new ones likewise. Its state stays for
  // work already computing and calls holding the version, until
  // ForgetModel.
  void RemoveModel(const ServedModel* served);
  // Frees the state of a removed version once the version itself is freed
  // (its batcher has computed everything): `served` is only a key then.
  void ForgetModel(const void* served);
  int64_t live_sessions() const;
  // What tenant `owner` holds now: live sessions (all models) and cache bytes.
  struct TenantUsage {
    int64_t sessions = 0;
    int64_t bytes = 0;
  };
  TenantUsage tenant_usage(const std::string& owner) const;
  const SessionOptions& options() const { return options_; }

  // Refuses new sessions and appends with UNAVAILABLE from now on.
  void StopAccepting();

 private:
  // The work of `session` is done (or was not queued): queue its next
  // waiting append, or mark it idle.
  void Finished(const std::shared_ptr<Session>& session);
  // Ends `session` (the caller holds a reference, mu_ and its mu): removes
  // it, frees its cache unless an append is computing (Finished frees it
  // then), and moves its waiting appends to *failed for the caller to answer
  // NOT_FOUND after unlocking. Why (and after how long idle) is remembered
  // for NOT_FOUND messages.
  void EndLocked(Session& session, SessionEnd end, absl::Duration idle,
                 std::vector<std::unique_ptr<PendingRequest>>* failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, session.mu);
  // Which sessions an eviction may take.
  enum class Victims {
    kOwnOfModel,  // The owner's sessions of the model (count limits).
    kOwn,         // The owner's sessions of any model (its memory limit).
    kFairShare,   // Those, and any of a tenant over its fair share (the budget).
  };
  // Evicts the least recently used session idle for evict_grace among
  // `victims` of `owner` (of `model` first), never `keep`, and counts it as
  // `why`. False if there is none.
  bool EvictOne(const std::string& owner, const SessionModel* model, Victims victims,
                const Session* keep, SessionEnd why);
  // Adds `delta` to the bytes charged to `session` and its tenant.
  void ChargeLocked(Session& session, int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, session.mu);
  // Frees `session`'s cache and its tenant's charge for it.
  void FreeCacheLocked(Session& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, session.mu);
  // "session_id: ..." NOT_FOUND for an id not in the table.
  absl::Status NotFoundLocked(const std::string& id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Reap();
  void UpdateMemoryMetrics();
  // The live session of routing key `key` if a retried creation may have
  // it; ALREADY_EXISTS if another session holds the key; null if none does.
  absl::StatusOr<std::shared_ptr<Session>> KeyHolderLocked(const std::string& key,
                                                           const SessionModel* model, bool cross,
                                                           const std::string& owner) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const ModelRepository* const repository_;
  Metrics* const metrics_;
  const SessionOptions options_;
  MemoryBudget budget_;
  mutable absl::Mutex models_mu_;  // Taken before mu_ when both are.
  std::map<const ServedModel*, std::unique_ptr<SessionModel>> models_ ABSL_GUARDED_BY(models_mu_);
  // Removed versions' state by address, oldest first: a version freed may
  // have its address reused by a newer one, unloaded too before the older
  // one's ForgetModel comes (ForgetModel frees the oldest).
  std::map<const void*, std::deque<std::unique_ptr<SessionModel>>> removed_
      ABSL_GUARDED_BY(models_mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  // Live sessions by routing key (those created with one).
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> keys_ ABSL_GUARDED_BY(mu_);
  TenantLedger tenants_ ABSL_GUARDED_BY(mu_);
  EndedSessions ended_ ABSL_GUARDED_BY(mu_);
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SESSIONS_SESSION_MANAGER_H_
