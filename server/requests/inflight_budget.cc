#include "server/requests/inflight_budget.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attention::server {

void InflightBudget::Added(int64_t bytes, int64_t now) {
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  if (metrics_ != nullptr) metrics_->inflight_bytes().Increment(static_cast<double>(bytes));
}

absl::Status InflightBudget::Admit(int64_t bytes) {
  int64_t current = used_.load();
  do {
    if (bytes > limit_ - current) {
      if (metrics_ != nullptr) metrics_->CountRefusal(absl::StatusCode::kResourceExhausted);
      if (bytes > limit_) {
        return absl::ResourceExhaustedError(
            absl::StrCat("request: needs ", bytes,
                         " bytes with its response and working memory, more than the server's "
                         "whole --max_inflight_bytes ",
                         limit_));
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "request: needs ", bytes, " bytes with its response and working memory; ", current,
          " of the server's --max_inflight_bytes ", limit_, " are in flight; retry later"));
    }
  } while (!used_.compare_exchange_weak(current, current + bytes));
  Added(bytes, current + bytes);
  return absl::OkStatus();
}

bool InflightBudget::Force(int64_t bytes) {
  const int64_t now = used_.fetch_add(bytes) + bytes;
  Added(bytes, now);
  return now <= limit_;
}

void InflightBudget::Release(int64_t bytes) {
  if (bytes == 0) return;
  // The gauge first: once the count drops, the budget (and the metrics) may
  // be gone.
  if (metrics_ != nullptr) metrics_->inflight_bytes().Decrement(static_cast<double>(bytes));
  used_.fetch_sub(bytes);  // The last touch of the budget.
}

bool InflightBudget::WaitReleased(absl::Time deadline) {
  while (used_.load() != 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

absl::StatusOr<std::shared_ptr<Admission>> InflightBudget::Take(int64_t bytes) {
  if (absl::Status s = Admit(bytes); !s.ok()) return s;
  return std::make_shared<Admission>(this, bytes);
}

absl::Status Admission::AtLeast(int64_t total) {
  const int64_t held = bytes_.load();
  if (total <= held) return absl::OkStatus();
  if (absl::Status s = budget_->Admit(total - held); !s.ok()) return s;
  bytes_.fetch_add(total - held);
  return absl::OkStatus();
}

}  // namespace attention::server
