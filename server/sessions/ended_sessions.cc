#include "server/sessions/ended_sessions.h"

#include "absl/strings/str_cat.h"

namespace attention::server {

std::string EndedSessions::Reason(SessionEnd end, absl::Duration idle) {
  const std::string evicted =
      absl::StrCat("was evicted after ", absl::ToInt64Seconds(idle), "s idle");
  switch (end) {
    case SessionEnd::kClosed:
      return "was closed";
    case SessionEnd::kExpired:
      return absl::StrCat("expired after ", absl::ToInt64Seconds(idle), "s idle");
    case SessionEnd::kEvictedMemory:
      return absl::StrCat(evicted, " to free memory for other sessions (--session_memory_bytes)");
    case SessionEnd::kEvictedTenantMemory:
      return absl::StrCat(evicted,
                          " to free memory for another session of the same caller "
                          "(--session_memory_per_tenant_bytes)");
    case SessionEnd::kEvictedModelSessions:
      return absl::StrCat(evicted,
                          " to make room for a new session of the same caller (the model's "
                          "max_sessions)");
    case SessionEnd::kEvictedTenantSessions:
      return absl::StrCat(evicted,
                          " to make room for a new session of the same caller "
                          "(--max_sessions_per_tenant)");
  }
  return "ended";
}

void EndedSessions::Remember(const std::string& id, SessionEnd end, absl::Duration idle) {
  Remember(id, Reason(end, idle));
}

void EndedSessions::Remember(const std::string& id, const std::string& reason) {
  if (capacity_ <= 0) return;
  if (reasons_.insert_or_assign(id, reason).second) order_.push_back(id);
  while (static_cast<int64_t>(order_.size()) > capacity_) {
    reasons_.erase(order_.front());
    order_.pop_front();
  }
}

absl::Status EndedSessions::NotFound(const std::string& id) const {
  auto it = reasons_.find(id);
  if (it != reasons_.end()) {
    return absl::NotFoundError(absl::StrCat("session_id: session '", id, "' ", it->second,
                                            "; create a new session and re-send its prefix"));
  }
  return absl::NotFoundError(absl::StrCat(
      "session_id: session '", id,
      "' is not known to this server (created on another replica, or before a restart); "
      "create a new session and re-send its prefix"));
}

}  // namespace attention::server
