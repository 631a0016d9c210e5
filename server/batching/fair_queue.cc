#include "server/batching/fair_queue.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace attention::server {
namespace {

// Past this many tenants known, idle ones are forgotten once the queue
// empties (their tags mean nothing then anyway).
constexpr size_t kKeptTenants = 256;

}  // namespace

FairQueue::FairQueue(int64_t max_size, TenantMetrics* tenants)
    : max_size_(max_size), metrics_(tenants) {}

uint32_t FairQueue::TenantOf(const TenantTag& tag) {
  if (last_ < tenants_.size() && tenants_[last_].id == tag.id) return last_;
  auto it = index_.find(tag.id);
  uint32_t t;
  if (it != index_.end()) {
    t = it->second;
  } else {
    t = static_cast<uint32_t>(tenants_.size());
    Tenant& added = tenants_.emplace_back();
    added.id = std::string(tag.id);
    added.last_finish = v_;
    if (metrics_ != nullptr) added.series = metrics_->For(tag.name);
    index_.emplace(added.id, t);
  }
  last_ = t;
  return t;
}

void FairQueue::SetDepth(const Tenant& t, int64_t change) const {
  if (t.series != nullptr) t.series->queue_depth->Increment(static_cast<double>(change));
}

absl::Status FairQueue::Push(std::unique_ptr<PendingRequest>& request, double cost,
                             Evicted* evicted) {
  const uint32_t t = TenantOf(request->tenant);
  Tenant& tenant = tenants_[t];
  tenant.weight = std::max<int64_t>(1, request->tenant.weight);
  if (size_ >= max_size_) {
    absl::Status room = MakeRoom(t, evicted);
    if (!room.ok()) {
      if (tenant.series != nullptr) tenant.series->Refused(TenantRefusal::kQueueShare);
      return room;
    }
  }
  Entry e;
  e.start = std::max(v_, tenant.last_finish);
  e.finish = e.start + std::max(cost, 1.0) / static_cast<double>(tenant.weight);
  e.seq = seq_++;
  tenant.last_finish = e.finish;
  request->tenant_series = tenant.series;
  e.request = std::move(request);
  if (tenant.fifo.empty()) active_.push_back(t);
  tenant.fifo.push_back(std::move(e));
  ++size_;
  SetDepth(tenant, 1);
  return absl::OkStatus();
}

absl::Status FairQueue::MakeRoom(uint32_t t, Evicted* evicted) {
  Tenant& tenant = tenants_[t];
  const auto mine = static_cast<int64_t>(tenant.fifo.size());
  if (mine == size_) {  // One tenant: today's FIFO and its message.
    return absl::ResourceExhaustedError(absl::StrCat(
        "queue is full: ", size_, " requests waiting (max_queue_size ", max_size_,
        ": the model's config.json max_queue_size, else the server's --max_queue_size); "
        "retry later"));
  }
  int64_t weights = mine == 0 ? tenant.weight : 0;
  for (uint32_t a : active_) weights += tenants_[a].weight;
  const double share =
      static_cast<double>(max_size_) * static_cast<double>(tenant.weight) / weights;
  if (static_cast<double>(mine + 1) > share) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue is full: ", size_, " requests waiting (max_queue_size ", max_size_,
                     ", --max_queue_size or config.json); this caller has ", mine,
                     " of them, its share is ", static_cast<int64_t>(std::floor(share)),
                     " (weight ", tenant.weight, " of ", weights, " queued); retry later"));
  }
  // Under its share, so another tenant is over its own: push out the newest
  // request of the one most over.
  uint32_t victim = UINT32_MAX;
  for (uint32_t a : active_) {
    if (a == t) continue;
    if (victim == UINT32_MAX) {
      victim = a;
      continue;
    }
    const Tenant& x = tenants_[a];
    const Tenant& v = tenants_[victim];
    // x.n / x.w against v.n / v.w, without division.
    const double lhs = static_cast<double>(x.fifo.size()) * static_cast<double>(v.weight);
    const double rhs = static_cast<double>(v.fifo.size()) * static_cast<double>(x.weight);
    if (lhs > rhs || (lhs == rhs && x.fifo.size() > v.fifo.size())) victim = a;
  }
  Tenant& v = tenants_[victim];
  const double v_share = static_cast<double>(max_size_) * static_cast<double>(v.weight) / weights;
  evicted->why = absl::ResourceExhaustedError(
      absl::StrCat("queue is full: pushed out for a caller under its share of max_queue_size ",
                   max_size_, "; this caller had ", v.fifo.size(), " queued, over its share of ",
                   static_cast<int64_t>(std::floor(v_share)), " (weight ", v.weight, " of ",
                   weights, "); retry later"));
  // The newest goes, and its tags with it: the tenant is charged nothing.
  v.last_finish = v.fifo.back().start;
  evicted->request = std::move(v.fifo.back().request);
  v.fifo.pop_back();
  if (v.series != nullptr) v.series->Refused(TenantRefusal::kPushedOut);
  Shrunk(victim, 1);
  return absl::OkStatus();
}

void FairQueue::Shrunk(uint32_t t, int64_t removed) {
  size_ -= removed;
  SetDepth(tenants_[t], -removed);
  if (tenants_[t].fifo.empty()) active_.erase(std::find(active_.begin(), active_.end(), t));
}

void FairQueue::Idle() {
  if (size_ != 0) return;
  // Every debt is forgiven, so tags restart from zero.
  v_ = 0;
  if (tenants_.size() > kKeptTenants) {
    tenants_.clear();
    index_.clear();
    last_ = UINT32_MAX;
    return;
  }
  for (Tenant& x : tenants_) x.last_finish = 0;
}

const PendingRequest& FairQueue::Head() const {
  const Entry* best = nullptr;
  for (uint32_t a : active_) {
    const Entry& e = tenants_[a].fifo.front();
    if (best == nullptr || Before(e, *best)) best = &e;
  }
  return *best->request;
}

void FairQueue::Visit(absl::FunctionRef<bool(const PendingRequest&, Position)> visit) const {
  if (active_.size() == 1) {  // One tenant: its FIFO is the order.
    const uint32_t t = active_[0];
    const std::deque<Entry>& fifo = tenants_[t].fifo;
    for (size_t i = 0; i < fifo.size(); ++i) {
      if (!visit(*fifo[i].request, Position{t, static_cast<uint32_t>(i)})) return;
    }
    return;
  }
  // A merge of the tenants' FIFOs (each already in tag order).
  std::vector<Position> heap;
  heap.reserve(active_.size());
  for (uint32_t a : active_) heap.push_back(Position{a, 0});
  const auto after = [this](const Position& x, const Position& y) {
    return Before(tenants_[y.tenant].fifo[y.index], tenants_[x.tenant].fifo[x.index]);
  };
  std::make_heap(heap.begin(), heap.end(), after);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const Position p = heap.back();
    if (!visit(*tenants_[p.tenant].fifo[p.index].request, p)) return;
    if (p.index + 1 < tenants_[p.tenant].fifo.size()) {
      heap.back().index = p.index + 1;
      std::push_heap(heap.begin(), heap.end(), after);
    } else {
      heap.pop_back();
    }
  }
}

std::vector<std::unique_ptr<PendingRequest>> FairQueue::Take(absl::Span<const Position> picked) {
  std::vector<std::unique_ptr<PendingRequest>> out;
  out.reserve(picked.size());
  double start = -1;
  for (const Position& p : picked) {
    Entry& e = tenants_[p.tenant].fifo[p.index];
    if (start < 0 || e.start < start) start = e.start;
    out.push_back(std::move(e.request));
  }
  if (start > v_) v_ = start;
  // Close the gaps, tenant by tenant.
  std::vector<uint32_t> touched;
  for (const Position& p : picked) {
    if (std::find(touched.begin(), touched.end(), p.tenant) == touched.end()) {
      touched.push_back(p.tenant);
    }
  }
  for (uint32_t t : touched) {
    std::deque<Entry>& fifo = tenants_[t].fifo;
    const auto before = static_cast<int64_t>(fifo.size());
    fifo.erase(std::remove_if(fifo.begin(), fifo.end(),
                              [](const Entry& e) { return e.request == nullptr; }),
               fifo.end());
    Shrunk(t, before - static_cast<int64_t>(fifo.size()));
  }
  return out;
}

void FairQueue::RemoveIf(
    absl::FunctionRef<absl::Status(const PendingRequest&)> why,
    std::vector<std::pair<std::unique_ptr<PendingRequest>, absl::Status>>* removed) {
  const std::vector<uint32_t> active = active_;
  for (uint32_t t : active) {
    Tenant& tenant = tenants_[t];
    std::deque<Entry>& fifo = tenant.fifo;
    int64_t gone = 0;
    double first_gone_start = 0;
    for (Entry& e : fifo) {
      absl::Status s = why(*e.request);
      if (s.ok()) continue;
      if (gone == 0) first_gone_start = e.start;
      removed->emplace_back(std::move(e.request), std::move(s));
      ++gone;
    }
    if (gone == 0) continue;
    const bool newest_gone = fifo.back().request == nullptr;
    fifo.erase(std::remove_if(fifo.begin(), fifo.end(),
                              [](const Entry& e) { return e.request == nullptr; }),
               fifo.end());
    // Never computed, so never charged (as when pushed out): the tenant's
    // next request starts where its newest one still queued finishes, or,
    // with none left, where the first one dropped started.
    if (newest_gone) tenant.last_finish = fifo.empty() ? first_gone_start : fifo.back().finish;
    Shrunk(t, gone);
  }
}

absl::Time FairQueue::OldestEnqueued() const {
  absl::Time oldest = absl::InfiniteFuture();
  for (uint32_t a : active_) oldest = std::min(oldest, tenants_[a].fifo.front().request->enqueued);
  return oldest;
}

absl::Time FairQueue::EarliestDeadline() const {
  absl::Time earliest = absl::InfiniteFuture();
  for (uint32_t a : active_) {
    for (const Entry& e : tenants_[a].fifo) earliest = std::min(earliest, e.request->deadline);
  }
  return earliest;
}

int64_t FairQueue::depth(absl::string_view tenant_id) const {
  auto it = index_.find(tenant_id);
  return it == index_.end() ? 0 : static_cast<int64_t>(tenants_[it->second].fifo.size());
}

}  // namespace attention::server
