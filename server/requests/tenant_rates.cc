#include "server/requests/tenant_rates.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/retry_after.h"

namespace attention::server {
namespace {

constexpr absl::Duration kForgetAfter = absl::Minutes(1);

}  // namespace

TenantRates::TenantRates(std::function<absl::Time()> clock) : clock_(std::move(clock)) {}

absl::Status TenantRates::Take(const Principal& caller, int64_t tokens) {
  if (caller.rate <= 0 && caller.token_rate <= 0) return absl::OkStatus();
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  if (now - pruned_ > kForgetAfter) {
    // Only buckets full again: forgetting one is then the same as keeping it
    // (a caller in debt, or with a rate under one a minute, stays limited).
    absl::erase_if(buckets_, [now](const auto& b) {
      return now - b.second.last > kForgetAfter && now >= b.second.full_at;
    });
    pruned_ = now;
  }
  // A bucket holds one second's worth; a new one starts full.
  const double request_cap = std::max(1.0, caller.rate);
  const double token_cap = std::max(1.0, caller.token_rate);
  auto [it, added] = buckets_.try_emplace(caller.id);
  Bucket& b = it->second;
  if (added) {
    b.requests = request_cap;
    b.tokens = token_cap;
  } else {
    const double seconds = std::max(0.0, absl::ToDoubleSeconds(now - b.last));
    b.requests = std::min(request_cap, b.requests + seconds * caller.rate);
    b.tokens = std::min(token_cap, b.tokens + seconds * caller.token_rate);
  }
  b.last = now;
  // Over either limit, the hint is the longer of the two waits, so that a
  // retry after it passes both.
  double wait_s = 0;
  std::string what;
  if (caller.rate > 0 && b.requests < 1) {
    wait_s = (1 - b.requests) / caller.rate;
    what = absl::StrCat(caller.rate, " requests/s");
  }
  if (caller.token_rate > 0 && b.tokens <= 0) {
    // Over 0 again in -tokens / token_rate; a little more, so that it is over 0.
    const double tokens_s = (-b.tokens + 1) / caller.token_rate;
    if (tokens_s > wait_s) {
      wait_s = tokens_s;
      what = absl::StrCat(caller.token_rate, " query tokens/s");
    }
  }
  if (wait_s == 0) {
    if (caller.rate > 0) b.requests -= 1;
    if (caller.token_rate > 0) b.tokens -= static_cast<double>(tokens);
  }
  double refill_s = 0;  // Until both buckets are full again.
  if (caller.rate > 0) refill_s = (request_cap - b.requests) / caller.rate;
  if (caller.token_rate > 0) {
    refill_s = std::max(refill_s, (token_cap - b.tokens) / caller.token_rate);
  }
  b.full_at = now + absl::Seconds(refill_s);
  if (wait_s > 0) {
    const absl::Duration after = absl::Seconds(wait_s);
    return WithRetryAfter(
        absl::ResourceExhaustedError(absl::StrCat(
            "rate: caller '", caller.name, "' is over its rate of ", what,
            " (its entry in --auth_tokens_file); retry after ",
            absl::ToInt64Milliseconds(absl::Ceil(after, absl::Milliseconds(1))), " ms")),
        after);
  }
  return absl::OkStatus();
}

}  // namespace attention::server
