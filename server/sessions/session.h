// File: server/sessions/session.h
//
// One session: its model, its key/value cache and its bookkeeping. Created,
// found and ended by SessionManager.
//
// Thread safety: `mu` guards the bookkeeping. The cache and `position` are
// touched only by the model's batcher thread while the session is `busy`
// (its one append in flight), or by SessionManager when it frees an idle
// session; so an append never races with another append or an eviction.
// Shared (shared_ptr) by the manager's table and the work in flight.
#ifndef ATTENTION_SERVER_SESSIONS_SESSION_H_
#define ATTENTION_SERVER_SESSIONS_SESSION_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/kv_cache.h"

namespace attention::server {

struct PendingRequest;
struct SessionModel;

struct Session {
  std::string id;
  // The routing key it was created with (x-attention-session; the id
  // carries it), empty without one. Names at most one live session.
  std::string key;
  SessionModel* model = nullptr;  // Owned by SessionManager; outlives the session.
  bool cross = false;
  bool is_causal = false;  // Cross sessions.
  // The creating caller's Principal::id (its token's SHA-256, hex), never its
  // name (two token entries may share a name); empty without authentication.
  // Also the session's tenant for the per-tenant limits.
  std::string owner;
  absl::Time created;
  absl::Duration ttl;
  std::unique_ptr<KvCache> cache;  // Null once ended.
  int64_t position = 0;            // Cross sessions: queries appended.
  // Tokens of appends read and not yet done (queued, waiting or computing):
  // with the length, an upper bound on the length an append will run at, so
  // its response is sized right when it is read (see SessionWork).
  std::atomic<int64_t> queued_tokens{0};

  absl::Mutex mu;
  absl::Time last_used ABSL_GUARDED_BY(mu);
  bool busy ABSL_GUARDED_BY(mu) = false;  // An append is queued or computing.
  // Why it ended ("closed", "expired", "evicted ..."); empty while live.
  std::string ended ABSL_GUARDED_BY(mu);
  // Appends received while busy, in arrival order.
  std::deque<std::unique_ptr<PendingRequest>> waiting ABSL_GUARDED_BY(mu);
  int64_t length ABSL_GUARDED_BY(mu) = 0;  // Tokens appended.
  int64_t keys ABSL_GUARDED_BY(mu) = 0;    // Keys held (cross: S).
  int64_t bytes ABSL_GUARDED_BY(mu) = 0;   // Cache bytes held.
  // Cache bytes charged to the owner's tenant (blocks held, reserved ones
  // included) until the cache is freed; changed with SessionManager's mu_ held too.
  int64_t charged ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SESSIONS_SESSION_H_
