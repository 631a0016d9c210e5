// File: server/frontends/grpc/session_service.h
//
// The attention.v1.SessionService implementation on gRPC's callback API:
// CreateSession, Append, SessionStream, GetSession and CloseSession over the
// SessionManager. Like AttentionService, a handler only decodes, validates
// (once) and queues; an append's completion, on its model's batcher thread,
// encodes the response and finishes the call. No reaction blocks: even a
// cross session's creation projects its keys on the batcher.
//
// Requests take the session path (sessions/session_path.h) and the request
// path's accounting (metrics by method, the in-flight gauge, drain, the log),
// so a drain waits for appends too.
//
// Thread-safe. The session path must outlive the service.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_SESSION_SERVICE_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_SESSION_SERVICE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "server/requests/call_context.h"
#include "server/requests/request_path.h"
#include "server/sessions/session_path.h"

namespace attention::server {

class SessionServiceImpl final : public v1::SessionService::CallbackService {
 public:
  // `sessions` (and its request path) must outlive the service.
  explicit SessionServiceImpl(SessionPath* sessions);

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

  using PreparedAppend = SessionPath::PreparedAppend;
  using Step = SessionPath::Step;

 private:
  // An append that came with the x-attention-session metadata `routing`
  // (the stream's, when `stream`). Errors: UNAVAILABLE (not ready,
  // draining), NOT_FOUND (session), INVALID_ARGUMENT (tokens, not_key,
  // output_dtype, expected_length, the routing header), RESOURCE_EXHAUSTED
  // (the response would be too large).
  absl::Status PrepareAppend(const v1::AppendRequest& request,
                             const std::optional<std::string>& routing, bool stream,
                             std::shared_ptr<const void> keep_alive, const CallContext& call,
                             PreparedAppend* prepared);
  // GetSession and CloseSession: the caller's live session `id`, then `act`
  // on it; the call is counted as `method` and finished with the status.
  grpc::ServerUnaryReactor* OnSession(
      grpc::CallbackServerContext* context, Method method, const std::string& id,
      absl::FunctionRef<absl::Status(SessionManager&, const std::shared_ptr<Session>&)> act);
  // Fills `response` from a computed append (on `model_version`, the
  // session's); RESOURCE_EXHAUSTED if it would exceed the response size limit.
  absl::Status EncodeAppend(RequestOutcome& outcome, int64_t model_version,
                            v1::AppendResponse* response) const;
  SessionPath* const sessions_;
  RequestPath* const requests_;
};

// Fills a SessionInfo from a snapshot.
void DescribeSession(const SessionSnapshot& snapshot, v1::SessionInfo* info);

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_SESSION_SERVICE_H_
