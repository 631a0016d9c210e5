// File: server/requests/tenant_rates.h
//
// TenantRates: each token's rate limits (the tokens file's rate= and
// token_rate=), as token buckets holding one second's worth: a caller may
// send a burst of up to `rate` requests (and `token_rate` query tokens),
// then `rate` a second. A request over either is refused RESOURCE_EXHAUSTED
// with the time after which it would pass (a RetryAfter payload and the
// message; over both, the longer wait), and costs nothing. A request larger
// than a second's token budget passes while the bucket holds any tokens, and
// leaves it in debt.
//
// Thread-safe (one mutex, taken only for callers that have a limit). Keyed by
// Principal::id; entries idle for a minute are forgotten once full again.
#ifndef ATTENTION_SERVER_REQUESTS_TENANT_RATES_H_
#define ATTENTION_SERVER_REQUESTS_TENANT_RATES_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/security/token_authenticator.h"

namespace attention::server {

class TenantRates {
 public:
  explicit TenantRates(std::function<absl::Time()> clock = [] { return absl::Now(); });

  // Takes one request of `tokens` query tokens from `caller`'s buckets. OK
  // (always, for a caller without limits), or RESOURCE_EXHAUSTED with a
  // retry hint.
  absl::Status Take(const Principal& caller, int64_t tokens);

 private:
  struct Bucket {
    double requests = 0;  // Requests the caller may send now.
    double tokens = 0;    // Query tokens likewise; may be negative (a debt).
    absl::Time last;      // When the levels were last brought up to date.
    absl::Time full_at;   // When both are full again (then it may be forgotten).
  };

  const std::function<absl::Time()> clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  absl::Time pruned_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_TENANT_RATES_H_
