// File: server/sessions/ended_sessions.h
//
// EndedSessions remembers why recent sessions ended (closed, expired,
// evicted and for which limit), a bounded number of ids, oldest forgotten
// first, so that NOT_FOUND says what happened to a session instead of only
// that it is unknown.
//
// Not thread-safe: SessionManager guards it with its own mutex.
#ifndef ATTENTION_SERVER_SESSIONS_ENDED_SESSIONS_H_
#define ATTENTION_SERVER_SESSIONS_ENDED_SESSIONS_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/metrics/metrics.h"

namespace attention::server {

class EndedSessions {
 public:
  // Remembers at most `capacity` ids (about 100 bytes each).
  explicit EndedSessions(int64_t capacity) : capacity_(capacity) {}

  // "was closed", "expired after 10s idle", "was evicted after 3s idle to
  // make room for ... (--max_sessions_per_tenant)", ...
  static std::string Reason(SessionEnd end, absl::Duration idle);

  // Session `id` ended for `end` after `idle`.
  void Remember(const std::string& id, SessionEnd end, absl::Duration idle);
  // Session `id` ended for `reason` ("ended: model version 2 was unloaded").
  void Remember(const std::string& id, const std::string& reason);

  // NOT_FOUND for a session id not in the live table, saying why it ended
  // if it is remembered.
  absl::Status NotFound(const std::string& id) const;

 private:
  const int64_t capacity_;
  absl::flat_hash_map<std::string, std::string> reasons_;
  std::deque<std::string> order_;  // Oldest first.
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SESSIONS_ENDED_SESSIONS_H_
