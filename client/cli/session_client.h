// File: client/cli/session_client.h
//
// SessionClient calls attention.v1.SessionService, sending each session's
// calls where the session lives, whichever way the replicas are reached:
//   * directly: a session id "<hex>@<address>" (a server started with
//     --advertise_address) names its replica, and the client keeps one
//     channel per address;
//   * through an L7 gateway hashing on the routing key (nginx, HAProxy,
//     Istio): every call carries the metadata header x-attention-session.
//     Create() draws a fresh key (128 random bits) for each session, and
//     the id then carries it ("<hex>.<key>"), so later calls set the header
//     from the id alone (proto/codec/routing_key.h);
//   * a single server: the same calls, on the default channel.
// Sessions are created through the default channel (balanced over replicas).
// AppendResending sends an append again after UNAVAILABLE, safely thanks to
// its expected_length (the decode load's appends go through it).
//
// ReplayingSession is the documented recovery helper: it remembers the
// tokens appended and the session's length, sends that length with every
// append (expected_length), and when the session is lost (NOT_FOUND:
// closed, expired, evicted, a restarted replica, or a key the gateway moved;
// UNAVAILABLE: a replica gone; FAILED_PRECONDITION "expected_length:": a
// diverged copy) it creates a new session under a fresh key, re-sends the
// history (merged into appends of up to replay_chunk_tokens), and retries
// the append, up to kMaxRecoveries times per call. The outputs it returns
// are those of the new session, which equal the lost one's to float
// rounding.
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

  // CreateSession under routing key `key` (empty: a fresh one drawn). A
  // retry of the call (the channel retries UNAVAILABLE) sends the same key,
  // and the server answers it with the session the first attempt created.
  absl::StatusOr<v1::SessionInfo> Create(const v1::CreateSessionRequest& request,
                                         std::string key = "");
  absl::StatusOr<v1::AppendResponse> Append(const v1::AppendRequest& request);
  // Append, sent again when it fails UNAVAILABLE (its connection closed
  // under it, a replica draining), up to kMaxResends times. `request` must
  // carry expected_length (INVALID_ARGUMENT otherwise): a copy that finds
  // the append already applied is then refused (FAILED_PRECONDITION
  // "expected_length: ...") instead of applied twice. When a resend is so
  // refused and the session holds expected_length + T tokens, the first
  // attempt was applied and only its answer lost: DATA_LOSS (the session is
  // intact, the rows are gone). `resends` (if set) counts the resends.
  static constexpr int kMaxResends = 3;
  absl::StatusOr<v1::AppendResponse> AppendResending(const v1::AppendRequest& request,
                                                     int* resends = nullptr);
  absl::StatusOr<v1::SessionInfo> Get(const std::string& session_id);
  absl::StatusOr<int64_t> Close(const std::string& session_id);

  // The stub for `session_id`'s replica.
  v1::SessionService::Stub* StubFor(const std::string& session_id);
  // Sets `context`'s x-attention-session from the key `session_id` carries
  // (none: nothing). A SessionStream is routed as a whole by the header it
  // opens with: open one per session.
  static void SetRoutingKey(grpc::ClientContext* context, const std::string& session_id);
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
  static constexpr int kMaxRecoveries = 3;  // Per Append call.

  // `replay_chunk_tokens`: the most tokens one replayed append carries
  // (at most the model's max_batch_tokens).
  ReplayingSession(SessionClient* client, std::string model, int64_t replay_chunk_tokens = 256);

  // Appends `tokens` (T, E) and returns the output rows (float32).
  absl::StatusOr<Tensor> Append(const Tensor& tokens);
  // Closes the session (if any).
  void Close();

  const std::string& session_id() const { return id_; }
  int64_t length() const { return length_; }
  // Sessions re-created, and the tokens their replays re-sent.
  int recoveries() const { return recoveries_; }
  int64_t replayed_tokens() const { return replayed_tokens_; }

 private:
  // A new session (fresh key) holding the history. `stale`: the old one is
  // alive but diverged; it is closed first (best effort).
  absl::Status Recreate(bool stale);

  SessionClient* const client_;
  const std::string model_;
  const int64_t replay_chunk_tokens_;
  std::string id_;
  int64_t length_ = 0;           // Tokens the session holds (the history's).
  std::vector<Tensor> history_;  // Every chunk appended, in order.
  int recoveries_ = 0;
  int64_t replayed_tokens_ = 0;
};

}  // namespace attention::client

#endif  // ATTENTION_CLIENT_CLI_SESSION_CLIENT_H_
