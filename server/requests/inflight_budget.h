// File: server/requests/inflight_budget.h
//
// The server's in-flight byte budget (--max_inflight_bytes): bytes of every
// request accepted and not yet answered, counting its message, the response
// it will produce and the working memory computing it takes. Admit() takes
// all the bytes asked for or none; an Admission holds them until it goes.
//
// Example:
//   ASSIGN_OR_RETURN(std::shared_ptr<Admission> held, budget.Take(bytes));
//   ... // later, with the exact need known:
//   RETURN_IF_ERROR(held->AtLeast(exact));
//
// Thread-safe (lock-free). Must outlive every Admission
// taken from it: its owner calls WaitReleased() before destroying it, since
// gRPC may run a call's OnDone (which drops the call's Admission) on its own
// thread after the server has shut down.
#ifndef ATTENTION_SERVER_REQUESTS_INFLIGHT_BUDGET_H_
#define ATTENTION_SERVER_REQUESTS_INFLIGHT_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/metrics/metrics.h"

namespace attention::server {

class Admission;

class InflightBudget {
 public:
  // `metrics` (may be null) must outlive the budget.
  InflightBudget(int64_t limit, Metrics* metrics) : limit_(limit), metrics_(metrics) {}

  InflightBudget(const InflightBudget&) = delete;
  InflightBudget& operator=(const InflightBudget&) = delete;

  // Reserves `bytes`, or RESOURCE_EXHAUSTED naming the limit (and counted as
  // a refusal). Every admitted byte is released with Release().
  absl::Status Admit(int64_t bytes);
  // Reserves `bytes` even past the limit: for the small error responses a
  // stream must still send (the stream then stops reading; see
  // stream_reactor.h). Returns false if the bytes went past the limit.
  bool Force(int64_t bytes);
  // Gives back bytes from Admit() or Force(). The budget is not touched after
  // the count drops, so a WaitReleased() that saw zero may destroy it.
  void Release(int64_t bytes);
  // Blocks until every byte is released or `deadline` passes; false then.
  // Polls (every millisecond): it is only for shutdown, and a lock Release()
  // took to wake it would itself be touched after the count dropped.
  bool WaitReleased(absl::Time deadline);
  // Admit() held by an Admission, released when the last reference goes.
  absl::StatusOr<std::shared_ptr<Admission>> Take(int64_t bytes);

  int64_t limit() const { return limit_; }
  int64_t used() const { return used_.load(); }
  // The most bytes held at once since the last ResetPeak() (for tests).
  int64_t peak() const { return peak_.load(); }
  void ResetPeak() { peak_.store(used_.load()); }

 private:
  void Added(int64_t bytes, int64_t now);

  const int64_t limit_;
  Metrics* const metrics_;
  std::atomic<int64_t> used_{0};
  std::atomic<int64_t> peak_{0};
};

// Bytes of an InflightBudget held for one request. Shared by whoever must
// keep them (the queued work, a stream's unwritten response); released when
// the last reference goes. Thread-safe.
class Admission {
 public:
  Admission(InflightBudget* budget, int64_t bytes) : budget_(budget), bytes_(bytes) {}
  ~Admission() { budget_->Release(bytes_.load()); }

  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Holds at least `total` bytes from now on, admitting the difference.
  // RESOURCE_EXHAUSTED (holding what it held) if the budget cannot give it.
  absl::Status AtLeast(int64_t total);
  int64_t bytes() const { return bytes_.load(); }

 private:
  InflightBudget* const budget_;
  std::atomic<int64_t> bytes_;
};

// Whoever keeps a request's Admission until its response is sent: a unary
// call's reactor, which holds it until the transport is done with the call.
class AdmissionHolder {
 public:
  virtual ~AdmissionHolder() = default;
  // Keeps `held` until the holder goes. Called at most once, from any thread.
  virtual void Hold(std::shared_ptr<Admission> held) = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_REQUESTS_INFLIGHT_BUDGET_H_
