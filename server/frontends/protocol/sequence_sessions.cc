#include "server/frontends/protocol/sequence_sessions.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/codec/routing_key.h"
#include "server/requests/identifiers.h"
#include "server/requests/inflight_budget.h"
#include "server/sessions/session_manager.h"

namespace attention::server {
namespace {

// Past this many mappings a new sequence first forgets those whose session
// has ended (expired, evicted) without a sequence_end.
constexpr size_t kSweepAbove = 4096;

// The optional parameter `expected_length`: the tokens the sequence holds
// before this step (0 for a start), as AppendRequest.expected_length.
absl::StatusOr<std::optional<int64_t>> ExpectedLength(const inference::ModelInferRequest& request) {
  const auto it = request.parameters().find("expected_length");
  if (it == request.parameters().end()) return std::nullopt;
  const inference::InferParameter& p = it->second;
  if (p.parameter_choice_case() == inference::InferParameter::kInt64Param) return p.int64_param();
  if (p.parameter_choice_case() == inference::InferParameter::kUint64Param &&
      p.uint64_param() <= static_cast<uint64_t>(INT64_MAX)) {
    return static_cast<int64_t>(p.uint64_param());
  }
  return absl::InvalidArgumentError(
      "parameters['expected_length']: expected int64_param or uint64_param (the tokens the "
      "sequence holds before this step)");
}

// The sequence id as the caller sent it (without the decoder's "n:"/"s:").
std::string SentId(const std::string& sequence_id) { return sequence_id.substr(2); }

// A step's query is one sequence's tokens: (T, E), or one batch item in the
// layout of the version that computes it, (1, T, E), or (T, 1, E) for a
// batch_first=False model. Makes *tokens (T, E) and returns the batch axis
// the outputs get back (-1: none). InvalidArgument for a batch of more.
absl::StatusOr<int> OneItem(const ServedModel& model, TensorView* tokens) {
  if (tokens->rank() != 3) return -1;  // (T, E), or refused by the session path.
  const int axis = model.model->serving().batch_first ? 0 : 1;
  if (tokens->dim(axis) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs['query']: a sequence step is one item, shape ",
        axis == 0 ? "[1, T, E]" : "[T, 1, E] (the model takes batch_first=False tensors)",
        " or [T, E], got batch ", tokens->dim(axis), " in ", ShapeToString(tokens->shape)));
  }
  tokens->shape.erase(tokens->shape.begin() + axis);
  return axis;
}

}  // namespace

SequenceSessions::SequenceSessions(SessionPath* sessions) : sessions_(sessions) {}

absl::Duration SequenceSessions::IdleTimeout(const ServedModel* model) const {
  SessionManager* manager = sessions_->manager();
  const SessionModel* m = manager != nullptr ? manager->model(model) : nullptr;
  return m != nullptr ? m->ttl : absl::ZeroDuration();
}

size_t SequenceSessions::size() const {
  absl::MutexLock lock(&mu_);
  return sequences_.size();
}

void SequenceSessions::Forget(const Key& key, const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  const auto it = sequences_.find(key);
  if (it != sequences_.end() && it->second.current == session_id) sequences_.erase(it);
}

absl::StatusOr<std::shared_ptr<Session>> SequenceSessions::Find(const Key& key, CallLeases* pin) {
  SessionManager* manager = sessions_->manager();
  if (manager == nullptr) return absl::UnavailableError("server is not ready yet");
  std::string existing;
  {
    absl::MutexLock lock(&mu_);
    const auto it = sequences_.find(key);
    if (it != sequences_.end()) existing = it->second.current;
  }
  if (existing.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "parameters['sequence_id']: the sequence has no session on this model here; start it "
        "with sequence_start (behind a gateway, every request of a sequence carries the metadata "
        "header '",
        wire::kRoutingHeader, ": ", Shown(SentId(std::get<2>(key))),
        "' so that it reaches the replica holding the sequence, and a restarted sequence takes a "
        "new sequence_id)"));
  }
  auto session = manager->Find(existing, pin);
  if (!session.ok()) {
    Forget(key, existing);
    return absl::NotFoundError(
        absl::StrCat("parameters['sequence_id']: ", session.status().message()));
  }
  return session;
}

std::string SequenceSessions::Start(const Key& key, const std::string& session_id) {
  SessionManager* manager = sessions_->manager();
  std::vector<std::string> stale;
  std::string dropped;  // An earlier restart's kept session, replaced again.
  {
    absl::MutexLock lock(&mu_);
    if (sequences_.size() > kSweepAbove) {
      for (const auto& [k, ids] : sequences_) stale.push_back(ids.current);
    }
    Ids& ids = sequences_[key];
    dropped = std::exchange(ids.previous, ids.current);
    ids.current = session_id;
  }
  if (!dropped.empty()) (void)manager->Close(dropped);
  // Mappings whose session has ended without a sequence_end (expired,
  // evicted) are forgotten, looked up outside the lock.
  for (const std::string& id : stale) {
    if (!manager->Find(id).ok()) {
      absl::MutexLock lock(&mu_);
      for (auto it = sequences_.begin(); it != sequences_.end(); ++it) {
        if (it->second.current == id) {
          sequences_.erase(it);
          break;
        }
      }
    }
  }
  return session_id;
}

void SequenceSessions::Started(const Key& key, const std::string& session_id, bool ok) {
  SessionManager* manager = sessions_->manager();
  std::string to_close;
  {
    absl::MutexLock lock(&mu_);
    const auto it = sequences_.find(key);
    if (it == sequences_.end() || it->second.current != session_id) {
      to_close = ok ? "" : session_id;  // Replaced or ended meanwhile.
    } else if (ok) {
      to_close = std::exchange(it->second.previous, "");
    } else {
      to_close = session_id;  // Back to the sequence the failed restart replaced.
      it->second.current = std::exchange(it->second.previous, "");
      if (it->second.current.empty()) sequences_.erase(it);
    }
  }
  if (!to_close.empty() && manager != nullptr) (void)manager->Close(to_close);
}

struct SequenceSessions::Step {
  Key key;
  const ServedModel* model = nullptr;
  std::string owner;                 // The caller's Principal::id; empty without tokens.
  std::shared_ptr<Session> session;  // Null until Commit for a start.
  std::shared_ptr<void> queued;      // The step's tokens in its session's queue.
  SessionPath::PreparedAppend prepared;
  int64_t tokens = 0;
  int64_t request_bytes = 0;
  int batch_axis = -1;  // Where the outputs get the query's batch of 1 back (-1: unbatched).
  bool start = false, end = false;
};

int64_t SequenceSessions::ResponseBytes(const Step& step) { return step.prepared.response_bytes; }

absl::StatusOr<std::shared_ptr<SequenceSessions::Step>> SequenceSessions::Prepare(
    const CallContext& call, const inference::ModelInferRequest& request, OipRequest decoded,
    const ServedModel* model, const Principal* caller, std::shared_ptr<const void> keep_alive) {
  SessionManager* manager = sessions_->manager();
  if (manager == nullptr) return absl::UnavailableError("server is not ready yet");
  const MhaInputs& in = decoded.inputs;
  if (in.key || in.value || in.key_padding_mask || in.attn_mask) {
    return absl::InvalidArgumentError(
        "inputs: a sequence step takes only 'query' (its tokens are the keys and values)");
  }
  RETURN_IF_ERROR(CheckIdentifier(*decoded.sequence_id, "parameters['sequence_id']"));
  RETURN_IF_ERROR(CheckIdentifier(request.id(), "id"));
  SessionPath::Step step;
  step.tokens = in.query;  // Made (T, E) below, in the layout of the version computing it.
  step.need_weights = in.need_weights;
  step.average_attn_weights = in.average_attn_weights;
  step.output_dtype = in.output_dtype;
  step.id_bytes = request.id().size();
  ASSIGN_OR_RETURN(step.expected_length, ExpectedLength(request));

  auto out = std::make_shared<Step>();
  out->owner = caller != nullptr ? caller->id : "";
  out->key = Key(out->owner, model->name, *decoded.sequence_id);
  out->model = model;
  out->start = decoded.sequence_start;
  out->end = decoded.sequence_end;
  out->request_bytes = static_cast<int64_t>(request.ByteSizeLong());
  SessionModel* session_model = manager->model(model);
  if (session_model == nullptr) {
    return absl::FailedPreconditionError("model: serves no sessions, so no sequences");
  }
  // A start is validated and admitted before its session exists.
  int64_t held_keys = 0;
  if (!out->start) {
    ASSIGN_OR_RETURN(out->session, Find(out->key, call.leases.get()));
    // A later step runs on the version its sequence started on (a newer one
    // may serve by now): validated against that one.
    session_model = out->session->model;
    out->model = session_model->served;
  }
  ASSIGN_OR_RETURN(out->batch_axis, OneItem(*out->model, &step.tokens));
  if (step.tokens.rank() == 2) out->tokens = step.tokens.dim(0);
  if (!out->start) held_keys = SessionPath::HeldKeys(out->session, out->tokens, &out->queued);
  RETURN_IF_ERROR(sessions_->PrepareStep(step, *session_model, /*cross=*/false, held_keys,
                                         std::move(keep_alive), call, &out->prepared));
  if (decoded.timeout) {
    out->prepared.pending->deadline =
        std::min(out->prepared.pending->deadline, absl::Now() + *decoded.timeout);
  }
  return out;
}

absl::Status SequenceSessions::Commit(const std::shared_ptr<Step>& step, Admission* admission,
                                      std::function<void(RequestOutcome)> done) {
  SessionManager* manager = sessions_->manager();
  if (manager == nullptr) return absl::UnavailableError("server is not ready yet");
  const Key& key = step->key;
  std::shared_ptr<Session> session = step->session;
  if (step->start) {
    auto created = manager->Create(step->model, /*cross=*/false, /*is_causal=*/true,
                                   absl::ZeroDuration(), step->owner);
    if (created.status().code() == absl::StatusCode::kResourceExhausted) {
      // At a session limit a restart takes its own sequence's slot (it can
      // then not go back to it if its step fails).
      auto live = Find(key);
      if (live.ok()) {
        (void)manager->Close((*live)->id);
        Forget(key, (*live)->id);
        created = manager->Create(step->model, /*cross=*/false, /*is_causal=*/true,
                                  absl::ZeroDuration(), step->owner);
      }
    }
    ASSIGN_OR_RETURN(session, std::move(created));
    Start(key, session->id);
    SessionPath::HeldKeys(session, step->tokens, &step->queued);
  }
  SessionPath::PreparedAppend& prepared = step->prepared;
  sessions_->Attach(session, std::move(step->queued), admission, step->request_bytes, &prepared);
  const int batch_axis = step->batch_axis;
  const bool start = step->start, end = step->end;
  const std::string session_id = session->id;
  const int64_t version = session->model->served->version;
  prepared.pending->done = [this, batch_axis, start, end, key, session_id, version,
                            done = std::move(done)](RequestOutcome outcome) mutable {
    outcome.model_version = version;
    if (batch_axis >= 0) {  // Shaped like the stateless call's results.
      // (1, T, E) or (T, 1, E): the same bytes as (T, E). The weights are
      // (N, ...) in both layouts, as PyTorch returns them.
      outcome.output.shape.insert(outcome.output.shape.begin() + batch_axis, 1);
      if (outcome.attn_weights) {
        outcome.attn_weights->shape.insert(outcome.attn_weights->shape.begin(), 1);
      }
    }
    // A start replaces the sequence it restarts only if its step is OK, and
    // a failed start leaves nothing behind; the sequence ends after its last
    // step, if that is OK (a failed one may be retried).
    const bool ok = outcome.status.ok();
    if (start) Started(key, session_id, ok);
    if (end && ok) {
      if (SessionManager* manager = sessions_->manager()) (void)manager->Close(session_id);
      Forget(key, session_id);
    }
    done(std::move(outcome));
  };
  const absl::Status submitted = manager->Submit(session, std::move(prepared.pending));
  if (!submitted.ok() && start) Started(key, session_id, /*ok=*/false);
  return submitted;
}

absl::Status SequenceSessions::Submit(
    const CallContext& call, const inference::ModelInferRequest& request, OipRequest decoded,
    const ServedModel* model, const Principal* caller, std::shared_ptr<const void> keep_alive,
    std::function<void(RequestOutcome)> done, AdmissionHolder* holder) {
  ASSIGN_OR_RETURN(std::shared_ptr<Step> step, Prepare(call, request, std::move(decoded), model,
                                                       caller, std::move(keep_alive)));
  ASSIGN_OR_RETURN(
      std::shared_ptr<Admission> held,
      sessions_->requests().budget().Take(step->request_bytes + step->prepared.response_bytes));
  Admission* admission = held.get();
  return Commit(step, admission,
                [held, holder, done = std::move(done)](RequestOutcome outcome) mutable {
                  // Until the response is sent.
                  if (holder != nullptr) holder->Hold(std::move(held));
                  held.reset();
                  done(std::move(outcome));
                });
}

}  // namespace attention::server
