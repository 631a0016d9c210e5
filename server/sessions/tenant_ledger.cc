#include "server/sessions/tenant_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace attention::server {

TenantLedger::TenantLedger(int64_t max_sessions_per_tenant, int64_t memory_per_tenant_bytes,
                           int64_t budget_bytes)
    : max_sessions_per_tenant_(max_sessions_per_tenant),
      memory_per_tenant_bytes_(memory_per_tenant_bytes),
      budget_bytes_(budget_bytes) {}

int64_t TenantLedger::SessionLimit(const std::string& owner, int64_t model_max_sessions) const {
  if (max_sessions_per_tenant_ > 0) return max_sessions_per_tenant_;
  return owner.empty() ? model_max_sessions : std::max<int64_t>(1, model_max_sessions / 4);
}

int64_t TenantLedger::MemoryLimit(const std::string& owner) const {
  if (memory_per_tenant_bytes_ > 0) return memory_per_tenant_bytes_;
  return owner.empty() ? budget_bytes_ : budget_bytes_ / 4;
}

int64_t TenantLedger::Live(const std::string& owner, const SessionModel* model) const {
  auto tenant = tenants_.find(owner);
  if (tenant == tenants_.end()) return 0;
  auto live = tenant->second.live.find(model);
  return live == tenant->second.live.end() ? 0 : live->second;
}

int64_t TenantLedger::Sessions(const std::string& owner) const {
  auto tenant = tenants_.find(owner);
  if (tenant == tenants_.end()) return 0;
  int64_t sessions = 0;
  for (const auto& [model, live] : tenant->second.live) sessions += live;
  return sessions;
}

int64_t TenantLedger::Bytes(const std::string& owner) const {
  auto tenant = tenants_.find(owner);
  return tenant == tenants_.end() ? 0 : tenant->second.bytes;
}

void TenantLedger::AddSession(const std::string& owner, const SessionModel* model) {
  ++tenants_[owner].live[model];
}

void TenantLedger::RemoveSession(const std::string& owner, const SessionModel* model) {
  auto tenant = tenants_.find(owner);
  if (tenant == tenants_.end()) return;
  auto live = tenant->second.live.find(model);
  if (live != tenant->second.live.end() && --live->second <= 0) tenant->second.live.erase(live);
  ForgetIfEmpty(owner);
}

void TenantLedger::Charge(const std::string& owner, int64_t delta) {
  if (delta == 0) return;
  tenants_[owner].bytes += delta;
  ForgetIfEmpty(owner);
}

int64_t TenantLedger::FairShare(const std::string& owner) const {
  int64_t holders = 0;
  bool counted = false;
  for (const auto& [id, tenant] : tenants_) {
    if (tenant.bytes <= 0) continue;
    ++holders;
    counted = counted || id == owner;
  }
  if (!counted) ++holders;
  return budget_bytes_ / holders;
}

std::string TenantLedger::CountRefusal(const std::string& model, bool tenant_limit, int64_t mine,
                                       int64_t limit, int64_t model_max_sessions,
                                       absl::Duration grace) {
  if (tenant_limit) {
    return absl::StrCat("max_sessions_per_tenant: this caller holds ", mine,
                        " live session(s) of model '", model, "', its limit (", limit,
                        ", --max_sessions_per_tenant), and none of them has been idle for ",
                        absl::FormatDuration(grace), " to evict; close one of its sessions first");
  }
  return absl::StrCat(
      "max_sessions: model '", model, "' has its max_sessions ", model_max_sessions,
      " live sessions (", mine,
      " of them this caller's) and none of this caller's has been idle for ",
      absl::FormatDuration(grace),
      " to evict (other callers' sessions are never evicted for it); retry later (the "
      "limit: the model's config.json max_sessions, else the server's "
      "--max_sessions)");
}

std::string TenantLedger::MemoryRefusal(int64_t held, int64_t tokens, int64_t need, int64_t limit,
                                        absl::Duration grace) {
  return absl::StrCat("session_memory_per_tenant_bytes: this caller's sessions hold ", held,
                      " bytes of cache; ", tokens, " more tokens need ", need,
                      " more, over its limit of ", limit,
                      " bytes (--session_memory_per_tenant_bytes), and none of its other sessions "
                      "has been idle for ",
                      absl::FormatDuration(grace), " to evict; close some of its sessions");
}

std::string TenantLedger::BudgetRefusal(int64_t tokens, absl::string_view pool, int64_t fair_share,
                                        absl::Duration grace) {
  return absl::StrCat(
      "session memory: no room for ", tokens, " more tokens (", pool,
      ") and no session may be evicted for them: none of this caller's other sessions, nor any "
      "of a caller holding more than its fair share (",
      fair_share,
      " bytes: --session_memory_bytes over the callers holding session memory), has been idle "
      "for ",
      absl::FormatDuration(grace), "; close sessions or raise --session_memory_bytes");
}

void TenantLedger::ForgetIfEmpty(const std::string& owner) {
  auto tenant = tenants_.find(owner);
  if (tenant != tenants_.end() && tenant->second.live.empty() && tenant->second.bytes == 0) {
    tenants_.erase(tenant);
  }
}

}  // namespace attention::server
