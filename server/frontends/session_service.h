// File: server/frontends/session_service.h
//
// The attention.v1.SessionService implementation on gRPC's callback API:
// CreateSession, Append, SessionStream, GetSession and CloseSession over the
// SessionManager. Like AttentionService, a handler only decodes, validates
// (once) and queues; an append's completion, on its model's batcher thread,
// encodes the response and finishes the call. No reaction blocks: even a
// cross session's creation projects its keys on the batcher.
//
// Requests are counted with AttentionServiceImpl's accounting (metrics by
// method, the in-flight gauge, drain), so a drain waits for appends too.
//
// Thread-safe. `requests` must outlive the service; the manager, once set,
// must outlive every call (the server drains before destroying it).
#ifndef ATTENTION_SERVER_FRONTENDS_SESSION_SERVICE_H_
#define ATTENTION_SERVER_FRONTENDS_SESSION_SERVICE_H_

#include <atomic>
#include <memory>

#include "attention/v1/sessions.grpc.pb.h"
#include "server/frontends/attention_service.h"
#include "server/sessions/session_manager.h"

namespace attention::server {

class SessionServiceImpl final : public v1::SessionService::CallbackService {
 public:
  explicit SessionServiceImpl(AttentionServiceImpl* requests);

  // Calls get UNAVAILABLE ("not ready") until the manager is set.
  void SetManager(SessionManager* manager) { manager_.store(manager); }

  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* context,
                                          const v1::CreateSessionRequest* request,
                                          v1::SessionInfo* response) override;
  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext* context,
                                   const v1::AppendRequest* request,
                                   v1::AppendResponse* response) override;
  grpc::ServerBidiReactor<v1::AppendRequest, v1::AppendResponse>* SessionStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const v1::GetSessionRequest* request,
                                       v1::SessionInfo* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* context,
                                         const v1::CloseSessionRequest* request,
                                         v1::CloseSessionResponse* response) override;

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
  };
  // Validates `step` for a session of `model` (cross or self) that will
  // hold at most `held_keys` keys when the step runs, into prepared->pending
  // (session work without its session yet: see Attach), ready for
  // SessionManager::Submit once `done` is set. Sizes its response and
  // working memory. INVALID_ARGUMENT (tokens, not_key, output_dtype; a self
  // step on a model whose kdim or vdim is not embed_dim), RESOURCE_EXHAUSTED
  // (the response, or the memory computing it, would be too large).
  absl::Status PrepareStep(const Step& step, const SessionModel& model, bool cross,
                           int64_t held_keys, std::shared_ptr<const void> keep_alive,
                           grpc::CallbackServerContext* context, PreparedAppend* prepared);
  // Gives prepared->pending its session, counting its tokens as queued in
  // it until the work goes, and `admission` (held by the caller until the
  // response is sent; grown if the exact response is larger), for a request
  // message of `request_bytes`.
  // `queued` is the handle HeldKeys gave for its tokens.
  void Attach(std::shared_ptr<Session> session, std::shared_ptr<void> queued, Admission* admission,
              int64_t request_bytes, PreparedAppend* prepared) const;
  // Keys a session will hold when an append of `tokens` read now runs, at
  // most: its keys plus the tokens of appends queued before it (self
  // sessions). Counts the tokens as queued in the same step (so appends read
  // at once each see the others) until the handle in *queued goes.
  static int64_t HeldKeys(const std::shared_ptr<Session>& session, int64_t tokens,
                          std::shared_ptr<void>* queued);
  // Null until SetManager().
  SessionManager* manager() const { return manager_.load(); }

 private:
  // Errors: UNAVAILABLE (not ready, draining), NOT_FOUND (session),
  // INVALID_ARGUMENT (tokens, not_key, output_dtype), RESOURCE_EXHAUSTED
  // (the response would be too large).
  absl::Status PrepareAppend(const v1::AppendRequest& request,
                             std::shared_ptr<const void> keep_alive,
                             grpc::CallbackServerContext* context, PreparedAppend* prepared);
  // Fills `response` from a computed append; RESOURCE_EXHAUSTED if it would
  // exceed the response size limit.
  absl::Status EncodeAppend(RequestOutcome& outcome, v1::AppendResponse* response) const;
  SessionManager* ReadyManager(absl::Status* status) const;
  // The live session `id` if the caller of `context` may use it: it must be
  // the session's creator (with authentication on) and may still use its
  // model. UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND.
  absl::StatusOr<std::shared_ptr<Session>> FindForCaller(SessionManager* manager,
                                                         grpc::CallbackServerContext* context,
                                                         const std::string& id) const;

  AttentionServiceImpl* const requests_;
  std::atomic<SessionManager*> manager_{nullptr};
};

// Fills a SessionInfo from a snapshot.
void DescribeSession(const SessionSnapshot& snapshot, v1::SessionInfo* info);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_SESSION_SERVICE_H_
