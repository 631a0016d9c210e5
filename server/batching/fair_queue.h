// File: server/batching/fair_queue.h
//
// One model version's queued requests: a FIFO per tenant (the caller's token,
// PendingRequest::tenant), served in weighted fair order by start-time fair
// queuing (Goyal, Vin and Cheng, 1996). A request gets a virtual start tag,
// max(V, its tenant's last finish tag), and a finish tag, start + cost /
// weight, where cost is its work in FLOPs; requests come out in (start,
// finish, arrival) order, and V is the start tag of the last taken batch's
// head. So while tenants are backlogged each gets compute in proportion to
// its weight, whatever the size of its requests; a tenant that was idle is
// served next; no request starves; and the order depends only on the order
// of pushes and takes, never on a clock.
//
// max_size (the model's max_queue_size) bounds the queue. While it is full,
// a tenant holding at least its share, max_size x weight / the weights of
// the tenants with requests queued (its own included), is refused; one under
// its share pushes out the newest request of the tenant most over its share
// (the classic "drop from the longest queue" of fair queuing). A server
// without tokens has one tenant: the queue is then the FIFO it always was,
// refusing with the same message when full.
//
// Thread-compatible: DynamicBatcher's mutex guards it. It owns the requests
// it holds and never calls their `done`; `tenants` (optional) must outlive
// it.
#ifndef ATTENTION_SERVER_BATCHING_FAIR_QUEUE_H_
#define ATTENTION_SERVER_BATCHING_FAIR_QUEUE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/batching/pending_request.h"
#include "server/metrics/tenant_metrics.h"

namespace attention::server {

class FairQueue {
 public:
  // A queued request's place: valid until the queue next changes.
  struct Position {
    uint32_t tenant = 0;
    uint32_t index = 0;
  };
  // A request pushed out to make room, and the status to answer it with.
  struct Evicted {
    std::unique_ptr<PendingRequest> request;
    absl::Status why;
  };

  FairQueue(int64_t max_size, TenantMetrics* tenants);

  // Queues `request` (moved from) at `cost` (> 0; FLOPs). RESOURCE_EXHAUSTED
  // with `request` left untouched when the queue is full and its tenant holds
  // at least its share. A request pushed out to make room goes to *evicted.
  absl::Status Push(std::unique_ptr<PendingRequest>& request, double cost, Evicted* evicted);

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The request the fair order serves next. The queue must not be empty.
  const PendingRequest& Head() const;
  // Visits the requests in fair order until `visit` returns false.
  void Visit(absl::FunctionRef<bool(const PendingRequest&, Position)> visit) const;
  // Removes the requests at `picked` (from one Visit) and returns them in
  // that order; V moves to the earliest start tag among them.
  std::vector<std::unique_ptr<PendingRequest>> Take(absl::Span<const Position> picked);
  // Removes, in fair order within each tenant, every request for which `why`
  // is not OK, into *removed with its status. Like a pushed-out request, a
  // removed one costs its tenant nothing: when its newest requests go, the
  // tenant's next request is tagged as if they had never been queued.
  void RemoveIf(absl::FunctionRef<absl::Status(const PendingRequest&)> why,
                std::vector<std::pair<std::unique_ptr<PendingRequest>, absl::Status>>* removed);
  // The server is idle: nothing queued and nothing computing. Every tenant's
  // debt is forgiven and tags restart from zero (a busy period ends). The
  // queue emptying is not enough: while the batch just taken computes, its
  // tenant's next request still starts after that batch's finish tag, so a
  // tenant arriving meanwhile goes first. No-op unless empty.
  void Idle();
  // The earliest `enqueued` and `deadline` of the requests queued
  // (InfiniteFuture when empty).
  absl::Time OldestEnqueued() const;
  absl::Time EarliestDeadline() const;

  // For tests: the requests queued for `tenant_id`, and V.
  int64_t depth(absl::string_view tenant_id) const;
  double virtual_time() const { return v_; }

 private:
  struct Entry {
    std::unique_ptr<PendingRequest> request;
    double start = 0;
    double finish = 0;
    uint64_t seq = 0;
  };
  struct Tenant {
    std::string id;
    int64_t weight = 1;
    double last_finish = 0;
    std::deque<Entry> fifo;
    const TenantSeries* series = nullptr;  // Null without TenantMetrics.
  };
  // (start, finish, seq) of `a` before that of `b`.
  static bool Before(const Entry& a, const Entry& b) {
    if (a.start != b.start) return a.start < b.start;
    if (a.finish != b.finish) return a.finish < b.finish;
    return a.seq < b.seq;
  }

  uint32_t TenantOf(const TenantTag& tag);
  // RESOURCE_EXHAUSTED, or OK after pushing out another tenant's request.
  absl::Status MakeRoom(uint32_t t, Evicted* evicted);
  // Book-keeping after a tenant's FIFO lost requests: the active list and
  // the depth gauge.
  void Shrunk(uint32_t t, int64_t removed);
  void SetDepth(const Tenant& t, int64_t change) const;

  const int64_t max_size_;
  TenantMetrics* const metrics_;
  std::deque<Tenant> tenants_;  // A deque: a tenant never moves.
  absl::flat_hash_map<std::string, uint32_t> index_;
  std::vector<uint32_t> active_;  // Tenants with requests queued.
  uint32_t last_ = UINT32_MAX;    // The last Push's tenant: the fast path.
  int64_t size_ = 0;
  double v_ = 0;
  uint64_t seq_ = 0;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_FAIR_QUEUE_H_
