#include "server/sequence_sessions.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
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

void SequenceSessions::Forget(const std::string& key, const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(key);
  if (it != sequences_.end() && it->second == session_id) sequences_.erase(it);
}

absl::StatusOr<std::shared_ptr<Session>> SequenceSessions::SessionOf(const std::string& key,
                                                                     bool start,
                                                                     const ServedModel* model,
                                                                     const Principal* caller) {
  SessionManager* manager = sessions_->manager();
  if (manager == nullptr) return absl::UnavailableError("server is not ready yet");
  std::string existing;
  {
    absl::MutexLock lock(&mu_);
    const auto it = sequences_.find(key);
    if (it != sequences_.end()) existing = it->second;
  }
  if (!start) {
    if (existing.empty()) {
      return absl::NotFoundError(
          absl::StrCat("parameters['sequence_id']: the sequence has no session here; start it with "
                       "sequence_start"));
    }
    auto session = manager->Find(existing);
    if (!session.ok()) {
      Forget(key, existing);
      return absl::NotFoundError(
          absl::StrCat("parameters['sequence_id']: ", session.status().message()));
    }
    if ((*session)->model->served != model) {
      return absl::InvalidArgumentError(absl::StrCat("model_name: the sequence runs on model '",
                                                     (*session)->model->served->name, "', not '",
                                                     model->name, "'"));
    }
    return session;
  }
  if (!existing.empty()) (void)manager->Close(existing);  // A restart replaces it.
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   manager->Create(model, /*cross=*/false, /*is_causal=*/true, absl::ZeroDuration(),
                                   caller != nullptr ? caller->name : ""));
  absl::MutexLock lock(&mu_);
  if (sequences_.size() > kSweepAbove) {
    for (auto it = sequences_.begin(); it != sequences_.end();) {
      auto next = std::next(it);
      if (!manager->Find(it->second).ok()) sequences_.erase(it);
      it = next;
    }
  }
  sequences_[key] = session->id;
  return session;
}

absl::Status SequenceSessions::Submit(grpc::CallbackServerContext* context,
                                      const inference::ModelInferRequest& request,
                                      OipRequest decoded, const ServedModel* model,
                                      const Principal* caller,
                                      std::shared_ptr<const void> keep_alive,
                                      std::function<void(RequestOutcome)> done) {
  const MhaInputs& in = decoded.inputs;
  if (in.key || in.value || in.key_padding_mask || in.attn_mask) {
    return absl::InvalidArgumentError(
        "inputs: a sequence step takes only 'query' (its tokens are the keys and values)");
  }
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

  const std::string key =
      absl::StrCat(caller != nullptr ? caller->name : "", "/", *decoded.sequence_id);
  SessionServiceImpl::PreparedAppend prepared;
  ASSIGN_OR_RETURN(prepared.session, SessionOf(key, decoded.sequence_start, model, caller));
  RETURN_IF_ERROR(sessions_->PrepareStep(step, std::move(keep_alive), context, &prepared));
  if (decoded.timeout) {
    prepared.pending->deadline =
        std::min(prepared.pending->deadline, absl::Now() + *decoded.timeout);
  }
  const int64_t admitted = static_cast<int64_t>(request.ByteSizeLong()) + prepared.response_bytes;
  RETURN_IF_ERROR(requests_->Admit(admitted));
  const bool end = decoded.sequence_end;
  const std::string session_id = prepared.session->id;
  prepared.pending->done = [this, admitted, batched, end, key, session_id,
                            done = std::move(done)](RequestOutcome outcome) {
    requests_->Release(admitted);
    if (batched) {  // Shaped like the stateless call's results.
      outcome.output.shape.insert(outcome.output.shape.begin(), 1);
      if (outcome.attn_weights) {
        outcome.attn_weights->shape.insert(outcome.attn_weights->shape.begin(), 1);
      }
    }
    if (end) {
      if (SessionManager* manager = sessions_->manager()) (void)manager->Close(session_id);
      Forget(key, session_id);
    }
    done(std::move(outcome));
  };
  const absl::Status queued =
      sessions_->manager()->Submit(prepared.session, std::move(prepared.pending));
  if (!queued.ok()) requests_->Release(admitted);
  return queued;
}

}  // namespace attention::server
