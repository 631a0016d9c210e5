// SessionManager's model versions coming and going (AddModel, RemoveModel,
// ForgetModel); the rest of the class is in session_manager.cc.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/batching/pending_request.h"
#include "server/sessions/session_manager.h"

namespace attention::server {

std::vector<ModelRef> ServingVersions(const ModelRepository& repository) {
  std::vector<ModelRef> serving;
  for (const VersionState& v : repository.Index()) {
    if (v.state != "READY") continue;
    if (ModelRef served = repository.Find(v.model, v.version)) serving.push_back(std::move(served));
  }
  return serving;
}

SessionModel* SessionManager::AddModel(const ServedModel* served) {
  const ServingConfig& config = served->model->serving();
  auto m = std::make_unique<SessionModel>();
  m->served = served;
  m->engine = std::make_unique<SessionEngine>(
      served->engine.get(),
      config.session_cache_dtype.value_or(served->model->spec().compute_dtype));
  m->pool = std::make_unique<KvBlockPool>(m->engine->block_bytes(), &budget_);
  m->max_sessions = config.max_sessions.value_or(options_.max_sessions);
  m->max_session_tokens = config.max_session_tokens.value_or(options_.max_session_tokens);
  m->ttl = config.session_ttl_s ? absl::Seconds(*config.session_ttl_s) : options_.ttl;
  SessionModel* added = m.get();
  absl::MutexLock lock(&models_mu_);
  models_[served] = std::move(m);
  return added;
}

void SessionManager::RemoveModel(const ServedModel* served) {
  SessionModel* gone = nullptr;
  {
    // Kept (in removed_) until ForgetModel: calls holding the version may
    // still read it.
    absl::MutexLock lock(&models_mu_);
    auto it = models_.find(served);
    if (it == models_.end()) return;
    gone = it->second.get();
    removed_[served].push_back(std::move(it->second));
    models_.erase(it);
  }
  const std::string reason =
      absl::StrCat("ended: model version ", served->version, " was unloaded");
  std::vector<std::unique_ptr<PendingRequest>> failed;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::shared_ptr<Session>> victims;
    gone->removed = true;  // Create refuses it from now on.
    for (const auto& [id, session] : sessions_) {
      if (session->model == gone) victims.push_back(session);
    }
    for (const auto& session : victims) {
      absl::MutexLock session_lock(&session->mu);
      EndLocked(*session, SessionEnd::kClosed, absl::ZeroDuration(), &failed);
      session->ended = reason;
      ended_.Remember(session->id, reason);
    }
  }
  for (auto& r : failed) {
    RequestOutcome outcome;
    outcome.status = absl::NotFoundError(absl::StrCat(
        "session_id: session ", reason, "; create a new session and re-send its prefix"));
    r->done(std::move(outcome));
  }
  UpdateMemoryMetrics();
}

void SessionManager::ForgetModel(const void* served) {
  std::unique_ptr<SessionModel> gone;
  absl::MutexLock lock(&models_mu_);
  auto it = removed_.find(served);
  if (it == removed_.end()) return;
  gone = std::move(it->second.front());  // Freed first: the oldest at this address.
  it->second.pop_front();
  if (it->second.empty()) removed_.erase(it);
}

}  // namespace attention::server
