// File: server/sessions/session_path.h
//
// SessionPath: the protocol-neutral path of session work, which the
// attention.v1 SessionService and the inference protocol's sequences both
// take: the live session a caller may use, the keys an append will find,
// an append's validation and its response and working-memory estimates,
// and the session work handed to the SessionManager. Readiness, identity,
// admission and counting come from the RequestPath.
//
// Thread-safe. The request path must outlive it; the manager, once set,
// must outlive every call (the server drains before destroying it).
#ifndef ATTENTION_SERVER_SESSIONS_SESSION_PATH_H_
#define ATTENTION_SERVER_SESSIONS_SESSION_PATH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/batching/pending_request.h"
#include "server/requests/call_context.h"
#include "server/requests/request_path.h"
#include "server/sessions/session_manager.h"

namespace attention::server {

class SessionPath {
 public:
  explicit SessionPath(RequestPath* requests) : requests_(requests) {}

  SessionPath(const SessionPath&) = delete;
  SessionPath& operator=(const SessionPath&) = delete;

  // Calls get UNAVAILABLE ("not ready") until the manager is set.
  void SetManager(SessionManager* manager) { manager_.store(manager); }
  // Null until SetManager().
  SessionManager* manager() const { return manager_.load(); }
  // The manager, or null with UNAVAILABLE in *status.
  SessionManager* ReadyManager(absl::Status* status) const;
  RequestPath& requests() const { return *requests_; }

  // A decoded, validated append.
  struct PreparedAppend {
    const ServedModel* model = nullptr;
    std::shared_ptr<Session> session;
    std::unique_ptr<PendingRequest> pending;
    int64_t response_bytes = 0;
    std::shared_ptr<void> queued;  // Its tokens counted in the session's queue.
  };
  // What an append asks, whatever the protocol carrying it.
  struct Step {
    TensorView tokens;                  // (T, E).
    std::optional<TensorView> not_key;  // (T) bool.
    bool need_weights = false;
    bool average_attn_weights = true;
    std::optional<DType> output_dtype;
    size_t id_bytes = 0;  // Ids echoed in the response.
    // The session's length when it runs, if the caller states it.
    std::optional<int64_t> expected_length;
  };

  // The live session `id` if the caller of `call` may use it: it must be
  // the session's creator (with authentication on) and may still use its
  // model. UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT (the id),
  // NOT_FOUND.
  absl::StatusOr<std::shared_ptr<Session>> FindForCaller(SessionManager* manager,
                                                         const CallContext& call,
                                                         const std::string& id) const;
  // The routing rules of a call on session `id` that carried the metadata
  // header x-attention-session `header` (nullopt: none), one append of a
  // stream when `stream`: a session created with a routing key (its id
  // carries it) is called with that key. INVALID_ARGUMENT saying what to
  // add otherwise. A stream opened without the header (a direct connection)
  // may carry any sessions.
  static absl::Status CheckRouting(const std::string& id, const std::optional<std::string>& header,
                                   bool stream);
  // Validates `step` for a session of `model` (cross or self) that will
  // hold at most `held_keys` keys when the step runs, into prepared->pending
  // (session work without its session yet: see Attach), ready for
  // SessionManager::Submit once `done` is set. Sizes its response and
  // working memory. INVALID_ARGUMENT (tokens, not_key, output_dtype, a
  // negative expected_length; a self step on a model whose kdim or vdim is
  // not embed_dim), RESOURCE_EXHAUSTED
  // (the response, or the memory computing it, would be too large).
  absl::Status PrepareStep(const Step& step, const SessionModel& model, bool cross,
                           int64_t held_keys, std::shared_ptr<const void> keep_alive,
                           const CallContext& call, PreparedAppend* prepared) const;
  // Gives prepared->pending its session, counting its tokens as queued in
  // it until the work goes, and `admission` (held by the caller until the
  // response is sent; grown if the exact response is larger), for a request
  // message of `request_bytes`. `queued` is the handle HeldKeys gave for
  // its tokens.
  void Attach(std::shared_ptr<Session> session, std::shared_ptr<void> queued, Admission* admission,
              int64_t request_bytes, PreparedAppend* prepared) const;
  // Keys a session will hold when an append of `tokens` read now runs, at
  // most: its keys plus the tokens of appends queued before it (self
  // sessions). Counts the tokens as queued in the same step (so appends read
  // at once each see the others) until the handle in *queued goes.
  static int64_t HeldKeys(const std::shared_ptr<Session>& session, int64_t tokens,
                          std::shared_ptr<void>* queued);

 private:
  RequestPath* const requests_;
  std::atomic<SessionManager*> manager_{nullptr};
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SESSIONS_SESSION_PATH_H_
