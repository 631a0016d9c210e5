// File: server/frontends/protocol/sequence_sessions.h
//
// Triton's sequence parameters on the Open Inference Protocol, mapped onto
// sessions: a ModelInferRequest with `sequence_start` creates a self-attention
// session (replacing one the sequence already had), every request of the
// sequence appends its `query` tokens to it (so attention over the sequence
// is causal and incremental, as with SessionService.Append), and
// `sequence_end` closes it after its append. A sequence is named by the
// caller (its token's Principal::id, with authentication), the model and
// `sequence_id` (at most kMaxIdentifierBytes), so callers cannot reach each
// other's sequences. A start's session is created only once its step has
// been validated and admitted, and ended again if the step fails, so a
// refused start holds nothing.
//
// Behind a gateway, each request of a sequence carries the metadata header
// `x-attention-session: <sequence_id>` (the gateway hashes on it; the server
// does not read it). The optional parameter `expected_length` (int64) is the
// number of tokens the sequence holds before the step (0 for a start): a
// mismatch fails the step with FAILED_PRECONDITION, unapplied, as
// AppendRequest.expected_length does, so a sequence id that moves back to a
// replica holding an older copy of its sequence cannot extend a stale prefix.
// A client restarting a lost sequence takes a new sequence_id.
//
// Thread-safe. The session path (and its manager) must outlive it.
#ifndef ATTENTION_SERVER_FRONTENDS_PROTOCOL_SEQUENCE_SESSIONS_H_
#define ATTENTION_SERVER_FRONTENDS_PROTOCOL_SEQUENCE_SESSIONS_H_

#include <functional>
#include <memory>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/frontends/protocol/oip_codec.h"
#include "server/requests/call_context.h"
#include "server/requests/request_path.h"
#include "server/sessions/session_path.h"

namespace attention::server {

class SequenceSessions {
 public:
  // `sessions` (and its request path) must outlive it.
  explicit SequenceSessions(SessionPath* sessions);

  // A sequence step decoded and validated (its session found, unless it
  // starts the sequence), not yet admitted: see Prepare and Commit.
  struct Step;

  // Appends the query of `decoded` (a request of sequence
  // decoded.sequence_id to `model`, by `caller`, null without
  // authentication) to the sequence's session: Prepare, the in-flight
  // admission (held by `holder` until the response is sent, when given),
  // then Commit. OK: queued, and `done` will be called with the outcome
  // (output and weights shaped like a stateless call's: [1, T, E] for a
  // [1, T, E] query). Errors: INVALID_ARGUMENT (inputs other than the
  // query, a batch of more than one), NOT_FOUND (no live session: not
  // started, ended, expired or evicted), RESOURCE_EXHAUSTED, and those of
  // session appends.
  absl::Status Submit(const CallContext& call, const inference::ModelInferRequest& request,
                      OipRequest decoded, const ServedModel* model, const Principal* caller,
                      std::shared_ptr<const void> keep_alive,
                      std::function<void(RequestOutcome)> done, AdmissionHolder* holder = nullptr);

  // The first half of Submit, for callers that admit the step themselves
  // (a stream): validates it and sizes its response (Step::response_bytes).
  // `keep_alive` owns the request's bytes.
  absl::StatusOr<std::shared_ptr<Step>> Prepare(const CallContext& call,
                                                const inference::ModelInferRequest& request,
                                                OipRequest decoded, const ServedModel* model,
                                                const Principal* caller,
                                                std::shared_ptr<const void> keep_alive);
  // The second half: starts the sequence's session if the step starts it,
  // and queues the step, its request and response held by `admission`
  // (grown when the exact response is larger). Once per step.
  absl::Status Commit(const std::shared_ptr<Step>& step, Admission* admission,
                      std::function<void(RequestOutcome)> done);
  static int64_t ResponseBytes(const Step& step);

  // How long a sequence of `model` may stay idle before it is ended (its
  // sessions' TTL); zero when the model serves no sessions.
  absl::Duration IdleTimeout(const ServedModel* model) const;

  // Sequences with a live mapping (for tests and metrics).
  size_t size() const;

 private:
  // A sequence: its caller (the token's Principal::id, empty without
  // authentication), its model and its id; typed, so no two differ only in
  // where one field ends (Triton keeps sequence ids per model too).
  using Key = std::tuple<std::string, std::string, std::string>;

  // The live session of sequence `key`; NOT_FOUND otherwise. Its version
  // is held by `pin` when given (needed to read its model).
  absl::StatusOr<std::shared_ptr<Session>> Find(const Key& key, CallLeases* pin = nullptr);
  // Makes `session_id` the sequence's session; the one it had is kept until
  // Started() says whether the restart's step was applied.
  std::string Start(const Key& key, const std::string& session_id);
  // The first step of `session_id` is done: OK ends the session it
  // replaced, a failure ends `session_id` and brings the replaced one back.
  void Started(const Key& key, const std::string& session_id, bool ok);
  void Forget(const Key& key, const std::string& session_id);

  // A sequence's session, and while a restart's first step is pending, the
  // session it replaces.
  struct Ids {
    std::string current;
    std::string previous;
  };

  SessionPath* const sessions_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, Ids> sequences_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_PROTOCOL_SEQUENCE_SESSIONS_H_
