#include "server/sequence_sessions.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/identifiers.h"
#include "server/inflight_budget.h"
#include "server/session_manager.h"

namespace attention::server {
namespace {

// Past this many mappings a new sequence first forgets those whose session
// has ended (expired, evicted) without a sequence_end.
constexpr size_t kSweepAbove = 4096;

}  // namespace

SequenceSessions::SequenceSessions(AttentionServiceImpl* requests, SessionServiceImpl* sessions)
    : requests_(requests), sessions_(sessions) {}

size_t SequenceSessions::size() const {
  absl::MutexLock lock(&mu_);
  return sequences_.size();
}

void SequenceSessions::Forget(const Key& key, const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(key);
  if (it != sequences_.end() && it->second == session_id) sequences_.erase(it);
}

absl::StatusOr<std::shared_ptr<Session>> SequenceSessions::Find(const Key& key) {
  SessionManager* manager = sessions_->manager();
  if (manager == nullptr) return absl::UnavailableError("server is not ready yet");
  std::string existing;
  {
    absl::MutexLock lock(&mu_);
    const auto it = sequences_.find(key);
    if (it != sequences_.end()) existing = it->second;
  }
  if (existing.empty()) {
    return absl::NotFoundError(
        "parameters['sequence_id']: the sequence has no session on this model here; start it "
        "with sequence_start");
  }
  auto session = manager->Find(existing);
  if (!session.ok()) {
    Forget(key, existing);
    return absl::NotFoundError(
        absl::StrCat("parameters['sequence_id']: ", session.status().message()));
  }
  return session;
}

void SequenceSessions::Start(const Key& key, const std::shared_ptr<Session>& session) {
  SessionManager* manager = sessions_->manager();
  std::string replaced;
  {
    absl::MutexLock lock(&mu_);
    if (sequences_.size() > kSweepAbove) {
      for (auto it = sequences_.begin(); it != sequences_.end();) {
        auto next = std::next(it);
        if (!manager->Find(it->second).ok()) sequences_.erase(it);
        it = next;
      }
    }
    std::string& id = sequences_[key];
    replaced = std::exchange(id, session->id);
  }
  if (!replaced.empty()) (void)manager->Close(replaced);  // A restart replaces it.
}

absl::Status SequenceSessions::Submit(grpc::CallbackServerContext* context,
                                      const inference::ModelInferRequest& request,
                                      OipRequest decoded, const ServedModel* model,
                                      const Principal* caller,
                                      std::shared_ptr<const void> keep_alive,
                                      std::function<void(RequestOutcome)> done) {
  SessionManager* manager = sessions_->manager();
  if (manager == nullptr) return absl::UnavailableError("server is not ready yet");
  const MhaInputs& in = decoded.inputs;
  if (in.key || in.value || in.key_padding_mask || in.attn_mask) {
    return absl::InvalidArgumentError(
        "inputs: a sequence step takes only 'query' (its tokens are the keys and values)");
  }
  RETURN_IF_ERROR(CheckIdentifier(*decoded.sequence_id, "parameters['sequence_id']"));
  RETURN_IF_ERROR(CheckIdentifier(request.id(), "id"));
  SessionServiceImpl::Step step;
  step.tokens = in.query;
  const bool batched = in.query.rank() == 3;
  if (batched) {
    if (in.query.dim(0) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inputs['query']: a sequence step is one item, shape [1, T, E] or [T, E], got batch ",
          in.query.dim(0)));
    }
    step.tokens.shape.erase(step.tokens.shape.begin());
  }
  step.need_weights = in.need_weights;
  step.average_attn_weights = in.average_attn_weights;
  step.output_dtype = in.output_dtype;
  step.id_bytes = request.id().size();

  const Key key(caller != nullptr ? caller->id : "", model->name, *decoded.sequence_id);
  SessionModel* session_model = manager->model(model);
  if (session_model == nullptr) {
    return absl::FailedPreconditionError("model: serves no sessions, so no sequences");
  }
  // A start is validated and admitted before its session exists.
  std::shared_ptr<Session> session;
  if (!decoded.sequence_start) {
    ASSIGN_OR_RETURN(session, Find(key));
  }
  SessionServiceImpl::PreparedAppend prepared;
  RETURN_IF_ERROR(
      sessions_->PrepareStep(step, *session_model, /*cross=*/false,
                             session != nullptr ? SessionServiceImpl::HeldKeys(*session) : 0,
                             std::move(keep_alive), context, &prepared));
  if (decoded.timeout) {
    prepared.pending->deadline =
        std::min(prepared.pending->deadline, absl::Now() + *decoded.timeout);
  }
  const int64_t request_bytes = static_cast<int64_t>(request.ByteSizeLong());
  ASSIGN_OR_RETURN(std::shared_ptr<Admission> held,
                   requests_->budget().Take(request_bytes + prepared.response_bytes));
  const bool start = decoded.sequence_start;
  if (start) {
    ASSIGN_OR_RETURN(
        session, manager->Create(model, /*cross=*/false, /*is_causal=*/true, absl::ZeroDuration(),
                                 caller != nullptr ? caller->id : ""));
    Start(key, session);
  }
  sessions_->Attach(session, held.get(), request_bytes, &prepared);
  const bool end = decoded.sequence_end;
  const std::string session_id = session->id;
  prepared.pending->done = [this, held, batched, start, end, key, session_id,
                            done = std::move(done)](RequestOutcome outcome) mutable {
    held.reset();
    if (batched) {  // Shaped like the stateless call's results.
      outcome.output.shape.insert(outcome.output.shape.begin(), 1);
      if (outcome.attn_weights) {
        outcome.attn_weights->shape.insert(outcome.attn_weights->shape.begin(), 1);
      }
    }
    // The sequence ends after its last step, and a start whose step failed
    // leaves nothing behind.
    if (end || (start && !outcome.status.ok())) {
      if (SessionManager* manager = sessions_->manager()) (void)manager->Close(session_id);
      Forget(key, session_id);
    }
    done(std::move(outcome));
  };
  const absl::Status queued = manager->Submit(session, std::move(prepared.pending));
  if (!queued.ok() && start) {
    (void)manager->Close(session_id);
    Forget(key, session_id);
  }
  return queued;
}

}  // namespace attention::server
