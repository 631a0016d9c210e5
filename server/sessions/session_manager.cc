#include "server/sessions/session_manager.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/codec/routing_key.h"
#include "server/batching/pending_request.h"

namespace attention::server {

SessionManager::SessionManager(const ModelRepository* repository, Metrics* metrics,
                               SessionOptions options)
    : repository_(repository),
      metrics_(metrics),
      options_(std::move(options)),
      budget_(static_cast<size_t>(std::max<int64_t>(0, options_.memory_bytes))),
      tenants_(options_.max_sessions_per_tenant, options_.memory_per_tenant_bytes,
               static_cast<int64_t>(budget_.capacity())),
      ended_(options_.remembered_ends) {
  for (const ModelRef& served : ServingVersions(*repository_)) AddModel(served.get());
  metrics_->session_memory_capacity_bytes().Set(static_cast<double>(budget_.capacity()));
  reaper_ = std::thread([this] { Reap(); });
}

SessionManager::~SessionManager() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  reaper_.join();
  // Every batcher has stopped: no work holds a session any more. Free the
  // caches before their pools go.
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    sessions.swap(sessions_);
    keys_.clear();
  }
  for (auto& [id, session] : sessions) session->cache.reset();
}

SessionModel* SessionManager::model(const ServedModel* served) const {
  absl::ReaderMutexLock lock(&models_mu_);
  if (auto it = models_.find(served); it != models_.end()) return it->second.get();
  auto it = removed_.find(served);  // The newest removed at this address.
  return it == removed_.end() ? nullptr : it->second.back().get();
}

int64_t SessionManager::live_sessions() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sessions_.size());
}

SessionManager::TenantUsage SessionManager::tenant_usage(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  return {tenants_.Sessions(owner), tenants_.Bytes(owner)};
}

void SessionManager::ChargeLocked(Session& session, int64_t delta) {
  tenants_.Charge(session.owner, delta);
  session.charged += delta;
}

void SessionManager::FreeCacheLocked(Session& session) {
  session.cache.reset();
  ChargeLocked(session, -session.charged);
}

void SessionManager::StopAccepting() {
  absl::MutexLock lock(&mu_);
  accepting_ = false;
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::KeyHolderLocked(
    const std::string& key, const SessionModel* model, bool cross, const std::string& owner) const {
  const auto it = keys_.find(key);
  if (key.empty() || it == keys_.end()) return nullptr;
  Session& held = *it->second;
  absl::MutexLock lock(&held.mu);
  if (held.owner == owner && held.model == model && !cross && !held.cross && held.length == 0 &&
      !held.busy && held.queued_tokens.load() == 0) {
    return it->second;  // A retried CreateSession whose answer was lost.
  }
  return absl::AlreadyExistsError(absl::StrCat(
      wire::kRoutingHeader, ": key '", key,
      "' already names a live session on this replica; draw a fresh key for every new session "
      "(a re-created one included)"));
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Create(
    const ServedModel* served, bool cross, bool is_causal, absl::Duration ttl,
    const std::string& owner, const std::string& key, bool* existing) {
  SessionModel* m = model(served);
  if (m == nullptr) return absl::InternalError("model has no session state");
  if (m->max_sessions == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("model: '", served->name,
                     "' allows no sessions (max_sessions 0: config.json, else --max_sessions)"));
  }
  for (;;) {
    SessionEnd why;
    int64_t mine = 0, tenant_limit = 0;
    {
      absl::MutexLock lock(&mu_);
      if (!accepting_) return absl::UnavailableError("server is shutting down");
      if (m->removed) {  // Unloaded since the caller found it: RemoveModel ended its sessions.
        return absl::NotFoundError(absl::StrCat("model: '", served->name, "' version ",
                                                served->version,
                                                " was unloaded; create the session again"));
      }
      ASSIGN_OR_RETURN(std::shared_ptr<Session> held, KeyHolderLocked(key, m, cross, owner));
      if (existing != nullptr) *existing = held != nullptr;
      if (held != nullptr) return held;
      mine = tenants_.Live(owner, m);
      tenant_limit = tenants_.SessionLimit(owner, m->max_sessions);
      if (mine < tenant_limit && m->live < m->max_sessions) {
        auto s = std::make_shared<Session>();
        s->key = key;
        s->id = wire::SessionIdOf(wire::NewRoutingKey(), key, options_.advertise_address);
        s->model = m;
        s->cross = cross;
        s->is_causal = is_causal;
        s->owner = owner;
        s->created = absl::Now();
        s->ttl = ttl > absl::ZeroDuration() ? ttl : m->ttl;
        const MhaSpec& spec = served->model->spec();
        s->cache = std::make_unique<KvCache>(m->pool.get(), spec.num_heads, spec.head_dim(),
                                             m->engine->cache_dtype());
        {
          absl::MutexLock session_lock(&s->mu);
          s->last_used = s->created;
        }
        sessions_[s->id] = s;
        if (!key.empty()) keys_[key] = s;
        ++m->live;
        tenants_.AddSession(owner, m);
        served->metrics->sessions->Increment();  // Every version's sessions add up.
        return s;
      }
      // The tenant's own limit is named when it is the tighter one.
      why = mine >= tenant_limit && tenant_limit < m->max_sessions
                ? SessionEnd::kEvictedTenantSessions
                : SessionEnd::kEvictedModelSessions;
    }
    // Over a count: only the caller's own idle sessions of the model may go.
    if (!EvictOne(owner, m, Victims::kOwnOfModel, nullptr, why)) {
      return absl::ResourceExhaustedError(
          TenantLedger::CountRefusal(served->name, why == SessionEnd::kEvictedTenantSessions, mine,
                                     tenant_limit, m->max_sessions, options_.evict_grace));
    }
  }
}

absl::Status SessionManager::NotFoundLocked(const std::string& id) const {
  return ended_.NotFound(id);
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Find(const std::string& id,
                                                              CallLeases* pin) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return NotFoundLocked(id);
  if (pin != nullptr) {
    // Live, so its version has not finished unloading (RemoveModel ends its
    // sessions under mu_ while the repository still holds it).
    std::shared_ptr<const ServedModel> version = it->second->model->served->weak_from_this().lock();
    if (version == nullptr) return NotFoundLocked(id);
    pin->Hold(std::move(version));
  }
  return it->second;
}

absl::Status SessionManager::Submit(std::shared_ptr<Session> session,
                                    std::unique_ptr<PendingRequest> request) {
  {
    absl::MutexLock lock(&mu_);
    if (!accepting_) return absl::UnavailableError("server is shutting down");
    absl::MutexLock session_lock(&session->mu);
    if (!session->ended.empty()) return NotFoundLocked(session->id);
    if (session->busy) {
      session->waiting.push_back(std::move(request));
      return absl::OkStatus();
    }
    session->busy = true;
  }
  auto done = std::move(request->done);
  // The session is released (its next append queued) before the response
  // goes out, so a client that has its answer finds the session idle: a
  // CloseSession right after frees the memory at once. Order holds: the next
  // append computes on this same batcher thread, after this returns.
  request->done = [this, session, done](RequestOutcome outcome) {
    Finished(session);
    done(std::move(outcome));
  };
  absl::Status status = session->model->served->batcher->Enqueue(std::move(request));
  if (!status.ok()) Finished(session);  // Not queued: the caller answers it.
  return status;
}

void SessionManager::Finished(const std::shared_ptr<Session>& session) {
  for (;;) {
    std::unique_ptr<PendingRequest> next;
    {
      absl::MutexLock lock(&mu_);
      absl::MutexLock session_lock(&session->mu);
      session->last_used = absl::Now();
      if (!session->ended.empty()) {  // Ended while its append computed.
        session->busy = false;
        FreeCacheLocked(*session);
        break;
      }
      if (session->waiting.empty()) {
        session->busy = false;
        return;
      }
      next = std::move(session->waiting.front());
      session->waiting.pop_front();
    }
    auto done = next->done;
    next->done = [this, session, done](RequestOutcome outcome) {
      Finished(session);
      done(std::move(outcome));
    };
    const absl::Status status = session->model->served->batcher->Enqueue(std::move(next));
    if (status.ok()) return;
    RequestOutcome outcome;
    outcome.status = status;
    done(std::move(outcome));
  }
  UpdateMemoryMetrics();
}

void SessionManager::EndLocked(Session& session, SessionEnd end, absl::Duration idle,
                               std::vector<std::unique_ptr<PendingRequest>>* failed) {
  session.ended = EndedSessions::Reason(end, idle);
  sessions_.erase(session.id);
  if (!session.key.empty()) keys_.erase(session.key);
  ended_.Remember(session.id, end, idle);
  SessionModel& m = *session.model;
  --m.live;
  tenants_.RemoveSession(session.owner, &m);
  m.served->metrics->sessions->Decrement();
  m.served->metrics->session_ends[static_cast<int>(end)]->Increment();
  if (!session.busy) FreeCacheLocked(session);  // Else Finished frees it.
  for (auto& r : session.waiting) failed->push_back(std::move(r));
  session.waiting.clear();
}

absl::StatusOr<int64_t> SessionManager::Close(const std::string& id) {
  std::shared_ptr<Session> session;
  std::vector<std::unique_ptr<PendingRequest>> failed;
  int64_t bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return NotFoundLocked(id);
    session = it->second;
    absl::MutexLock session_lock(&session->mu);
    bytes = session->bytes;
    EndLocked(*session, SessionEnd::kClosed, absl::ZeroDuration(), &failed);
  }
  for (auto& r : failed) {
    RequestOutcome outcome;
    outcome.status = absl::NotFoundError(
        absl::StrCat("session_id: session '", id, "' was closed before this append ran"));
    r->done(std::move(outcome));
  }
  UpdateMemoryMetrics();
  return bytes;
}

bool SessionManager::EvictOne(const std::string& owner, const SessionModel* model, Victims victims,
                              const Session* keep, SessionEnd why) {
  std::shared_ptr<Session> victim;
  std::vector<std::unique_ptr<PendingRequest>>
      failed;  // Stays empty: idle sessions wait for nothing.
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    const int64_t fair_share = tenants_.FairShare(owner);
    auto eligible = [&](const Session& candidate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (candidate.owner == owner) {
        return victims != Victims::kOwnOfModel || candidate.model == model;
      }
      // Another tenant's: only for the budget, and never one at or below its fair share.
      return victims == Victims::kFairShare && tenants_.Bytes(candidate.owner) > fair_share;
    };
    bool victim_preferred = false;
    absl::Time victim_used;
    for (const auto& [id, candidate] : sessions_) {
      if (candidate.get() == keep || !eligible(*candidate)) continue;
      const bool preferred = candidate->model == model;
      absl::MutexLock session_lock(&candidate->mu);
      if (candidate->busy || now - candidate->last_used < options_.evict_grace) continue;
      if (victim == nullptr || (preferred && !victim_preferred) ||
          (preferred == victim_preferred && candidate->last_used < victim_used)) {
        victim = candidate;
        victim_preferred = preferred;
        victim_used = candidate->last_used;
      }
    }
    if (victim == nullptr) return false;
    absl::MutexLock session_lock(&victim->mu);
    EndLocked(*victim, why, now - victim_used, &failed);
  }
  UpdateMemoryMetrics();
  return true;
}

absl::Status SessionManager::Reserve(Session& session, int64_t tokens) {
  KvCache& cache = *session.cache;
  const int64_t block_bytes = static_cast<int64_t>(session.model->pool->block_bytes());
  const int64_t capacity = static_cast<int64_t>(budget_.capacity());
  for (;;) {
    const int64_t blocks =
        (cache.length() + tokens + KvCache::kBlockTokens - 1) / KvCache::kBlockTokens -
        cache.capacity() / KvCache::kBlockTokens;
    const int64_t need = std::max<int64_t>(0, blocks) * block_bytes;
    int64_t held = 0, limit = 0;
    bool over = false;
    {
      absl::MutexLock lock(&mu_);
      absl::MutexLock session_lock(&session.mu);
      ChargeLocked(session, static_cast<int64_t>(cache.bytes()) - session.charged);
      held = tenants_.Bytes(session.owner);
      limit = tenants_.MemoryLimit(session.owner);
      // A limit of the whole budget is the budget's check below.
      over = limit < capacity && need > 0 && held + need > limit;
      if (!over) ChargeLocked(session, need);  // Held while the pool is asked.
    }
    if (over) {
      if (EvictOne(session.owner, session.model, Victims::kOwn, &session,
                   SessionEnd::kEvictedTenantMemory)) {
        continue;
      }
      return absl::ResourceExhaustedError(
          TenantLedger::MemoryRefusal(held, tokens, need, limit, options_.evict_grace));
    }
    absl::Status status = cache.Reserve(tokens);
    {
      absl::MutexLock lock(&mu_);
      absl::MutexLock session_lock(&session.mu);
      ChargeLocked(session, static_cast<int64_t>(cache.bytes()) - session.charged);
    }
    if (status.ok()) {
      UpdateMemoryMetrics();
      return status;
    }
    if (status.code() != absl::StatusCode::kResourceExhausted) return status;
    if (EvictOne(session.owner, session.model, Victims::kFairShare, &session,
                 SessionEnd::kEvictedMemory)) {
      continue;
    }
    int64_t fair_share = 0;
    {
      absl::MutexLock lock(&mu_);
      fair_share = tenants_.FairShare(session.owner);
    }
    return absl::ResourceExhaustedError(
        TenantLedger::BudgetRefusal(tokens, status.message(), fair_share, options_.evict_grace));
  }
}

void SessionManager::Committed(Session& session, int64_t tokens) {
  absl::MutexLock lock(&session.mu);
  session.length += tokens;
  session.keys = session.cache->length();
  session.bytes = static_cast<int64_t>(session.cache->bytes());
  session.last_used = absl::Now();
}

SessionSnapshot SessionManager::Snapshot(Session& session) const {
  SessionSnapshot s;
  s.id = session.id;
  s.model = session.model->served->name;
  s.model_version = session.model->served->version;
  s.cross = session.cross;
  s.max_tokens = session.model->max_session_tokens;
  s.created = session.created;
  s.ttl = session.ttl;
  absl::MutexLock lock(&session.mu);
  s.length = session.length;
  s.keys = session.keys;
  s.bytes = session.bytes;
  s.last_used = session.last_used;
  return s;
}

void SessionManager::UpdateMemoryMetrics() {
  metrics_->session_memory_bytes().Set(static_cast<double>(budget_.used()));
}

void SessionManager::Reap() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Seconds(1))) return;
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<Session>> expired;
    for (const auto& [id, session] : sessions_) {
      absl::MutexLock session_lock(&session->mu);
      if (!session->busy && now - session->last_used > session->ttl) expired.push_back(session);
    }
    std::vector<std::unique_ptr<PendingRequest>> failed;  // Idle: none.
    for (const auto& session : expired) {
      absl::MutexLock session_lock(&session->mu);
      EndLocked(*session, SessionEnd::kExpired, session->ttl, &failed);
    }
    if (!expired.empty()) {
      mu_.Unlock();
      expired.clear();
      UpdateMemoryMetrics();
      mu_.Lock();
    }
  }
}

}  // namespace attention::server
