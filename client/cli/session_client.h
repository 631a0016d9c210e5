// File: client/cli/session_client.h
//
// SessionClient calls attention.v1.SessionService, sending each session's
// calls to the replica that holds it: a session id "<hex>@<address>" (a
// server started with --advertise_address) names that replica, and the
// client keeps one channel per address; other ids go to the default
// channel. Sessions are created through the default channel (balanced over
// replicas).
//
// ReplayingSession is the documented recovery helper: it remembers the
// tokens appended, and when its session is lost (NOT_FOUND: closed, expired,
// evicted, or a restarted replica; UNAVAILABLE: a replica gone) it creates a
// new one, re-sends the history, and retries the append once. The outputs it
// returns are those of the new session, which equal the lost one's.
//
// Thread-safe: channels are shared; one ReplayingSession is used by one
// thread at a time.
#ifndef ATTENTION_CLIENT_CLI_SESSION_CLIENT_H_
#define ATTENTION_CLIENT_CLI_SESSION_CLIENT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "attention/v1/sessions.grpc.pb.h"
#include "core/tensor.h"

namespace attention::client {

class SessionClient {
 public:
  SessionClient(std::string target, std::string lb_policy, int64_t deadline_ms);

  absl::StatusOr<v1::SessionInfo> Create(const v1::CreateSessionRequest& request);
  absl::StatusOr<v1::AppendResponse> Append(const v1::AppendRequest& request);
  absl::StatusOr<v1::SessionInfo> Get(const std::string& session_id);
  absl::StatusOr<int64_t> Close(const std::string& session_id);

  // The stub for `session_id`'s replica.
  v1::SessionService::Stub* StubFor(const std::string& session_id);
  int64_t deadline_ms() const { return deadline_ms_; }

 private:
  const std::string lb_policy_;
  const int64_t deadline_ms_;
  std::unique_ptr<v1::SessionService::Stub> default_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<v1::SessionService::Stub>> replicas_ ABSL_GUARDED_BY(mu_);
};

// A self-attention session that survives losing its server.
class ReplayingSession {
 public:
  ReplayingSession(SessionClient* client, std::string model);

  // Appends `tokens` (T, E) and returns the output rows (float32).
  absl::StatusOr<Tensor> Append(const Tensor& tokens);
  // Closes the session (if any).
  void Close();

  const std::string& session_id() const { return id_; }
  int recoveries() const { return recoveries_; }

 private:
  absl::Status Recreate();

  SessionClient* const client_;
  const std::string model_;
  std::string id_;
  std::vector<Tensor> history_;  // Every chunk appended, in order.
  int recoveries_ = 0;
};

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_SESSION_CLIENT_H_
