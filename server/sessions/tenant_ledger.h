// File: server/sessions/tenant_ledger.h
//
// TenantLedger counts what each tenant holds in sessions (live sessions per
// model, and cache bytes, all models together) and says what it may hold. A
// tenant is a session's owner, the creating caller's Principal::id ("" without
// authentication). An entry exists while its tenant holds a live session or
// cache bytes, so the ledger stays as small as the set of tenants with
// sessions.
//
// Limits, unless set explicitly: an authenticated tenant may hold a quarter
// of a model's max_sessions (at least 1) and a quarter of the session memory
// budget; the unauthenticated tenant (every caller, when there are no tokens)
// all of both, as before tenants existed.
//
// Not thread-safe: SessionManager guards it with its own mutex. Holds no
// pointers it owns; a SessionModel key is only compared.
#ifndef ATTENTION_SERVER_SESSIONS_TENANT_LEDGER_H_
#define ATTENTION_SERVER_SESSIONS_TENANT_LEDGER_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attention::server {

struct SessionModel;

class TenantLedger {
 public:
  // `max_sessions_per_tenant` and `memory_per_tenant_bytes`: 0 for the
  // defaults above; `budget_bytes`: the session memory budget.
  TenantLedger(int64_t max_sessions_per_tenant, int64_t memory_per_tenant_bytes,
               int64_t budget_bytes);

  // Live sessions of a model with `model_max_sessions` that `owner` may hold.
  int64_t SessionLimit(const std::string& owner, int64_t model_max_sessions) const;
  // Cache bytes `owner` may hold.
  int64_t MemoryLimit(const std::string& owner) const;

  // Live sessions of `model` held by `owner`.
  int64_t Live(const std::string& owner, const SessionModel* model) const;
  // Live sessions of every model held by `owner`.
  int64_t Sessions(const std::string& owner) const;
  // Cache bytes charged to `owner`.
  int64_t Bytes(const std::string& owner) const;

  // A session of `model` begins or ends for `owner`.
  void AddSession(const std::string& owner, const SessionModel* model);
  void RemoveSession(const std::string& owner, const SessionModel* model);
  // Adds `delta` (negative: frees) to the bytes charged to `owner`.
  void Charge(const std::string& owner, int64_t delta);

  // The fair share of the budget for `owner`: the budget over the tenants
  // holding cache bytes, `owner` counted in even if it holds none.
  int64_t FairShare(const std::string& owner) const;
  // RESOURCE_EXHAUSTED messages, each naming its limit. A new session of
  // `model` over a count: the tenant's own limit (`tenant_limit` true; it
  // holds `mine` of `limit`) or the model's `model_max_sessions`.
  static std::string CountRefusal(const std::string& model, bool tenant_limit, int64_t mine,
                                  int64_t limit, int64_t model_max_sessions, absl::Duration grace);
  // `tokens` more tokens needing `need` bytes over the tenant's memory limit.
  static std::string MemoryRefusal(int64_t held, int64_t tokens, int64_t need, int64_t limit,
                                   absl::Duration grace);
  // `tokens` more tokens finding the budget spent (`pool`: the pool's error).
  static std::string BudgetRefusal(int64_t tokens, absl::string_view pool, int64_t fair_share,
                                   absl::Duration grace);

  // Tenants listed (holding a session or bytes).
  size_t size() const { return tenants_.size(); }

 private:
  struct Tenant {
    absl::flat_hash_map<const SessionModel*, int64_t> live;  // Live sessions per model.
    int64_t bytes = 0;
  };
  // Drops `owner`'s entry once it holds nothing.
  void ForgetIfEmpty(const std::string& owner);

  const int64_t max_sessions_per_tenant_;
  const int64_t memory_per_tenant_bytes_;
  const int64_t budget_bytes_;
  absl::flat_hash_map<std::string, Tenant> tenants_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_SESSIONS_TENANT_LEDGER_H_
