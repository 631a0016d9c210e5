#include "server/batching/dynamic_batcher.h"

#include <omp.h>

#include <algorithm>
#include <new>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "server/batching/batch_runner.h"
#include "server/batching/outcome_flush.h"

namespace attention::server {
namespace {

// Calls Flush() once on each distinct OutcomeFlush that `requests` name
// (their `done` already called). A batch rarely names more than one or two.
template <typename Requests, typename Get>
void FlushOutcomes(const Requests& requests, Get get) {
  std::vector<OutcomeFlush*> flushed;
  for (const auto& r : requests) {
    OutcomeFlush* f = get(r)->flush;
    if (f == nullptr || std::find(flushed.begin(), flushed.end(), f) != flushed.end()) continue;
    flushed.push_back(f);
    f->Flush();
  }
}

// Session work: steps are packed, not padded, so only their tokens add up;
// a cross session's creation goes alone.
std::vector<FairQueue::Position> PickSessionBatch(const FairQueue& queue,
                                                  const BatchingOptions& options, bool* ready) {
  std::vector<FairQueue::Position> picked;
  int64_t tokens = 0, working = 0;
  queue.Visit([&](const PendingRequest& r, FairQueue::Position p) {
    if (picked.empty()) {  // The head.
      picked.push_back(p);
      tokens = r.tokens();
      working = r.working_bytes;
      *ready = options.max_batch_size == 1 || r.session->kind == SessionWork::Kind::kInitCross;
      return !*ready;
    }
    if (static_cast<int64_t>(picked.size()) >= options.max_batch_size) return false;
    if (r.session == nullptr || r.session->kind != SessionWork::Kind::kAppend) return true;
    if (tokens + r.tokens() > options.max_batch_tokens) {
      *ready = true;
      return false;
    }
    // Steps' working memory adds up; a step that does not fit waits.
    if (working + r.working_bytes > options.max_working_bytes) return true;
    working += r.working_bytes;
    tokens += r.tokens();
    picked.push_back(p);
    return true;
  });
  if (static_cast<int64_t>(picked.size()) >= options.max_batch_size) *ready = true;
  return picked;
}

// The next batch, head first: the fair queue's head, then, in fair order,
// every request that can share its batch (the rules of the header). A request
// that cannot join keeps its place for a later batch. *ready: it must go now
// (full, or nothing more can join it). The queue must not be empty.
std::vector<FairQueue::Position> PickBatch(const FairQueue& queue, const BatchingOptions& options,
                                           const MhaEngine& engine, bool* ready) {
  const PendingRequest& first = queue.Head();
  *ready = false;
  if (first.session != nullptr) return PickSessionBatch(queue, options, ready);
  const bool self_attention = first.call.self_attention;
  std::vector<FairQueue::Position> picked;
  int64_t items = first.call.batch, max_l = first.call.queries, real = first.tokens();
  int64_t max_s = first.call.keys, real_keys = first.key_tokens();
  bool weights = first.inputs.need_weights;
  const int64_t heads = engine.model().spec().num_heads;
  queue.Visit([&](const PendingRequest& r, FairQueue::Position p) {
    if (picked.empty()) {  // The head.
      picked.push_back(p);
      // A request that alone exceeds the key-token limit (long
      // cross-attention keys) goes by itself: padding others to its keys
      // could take any memory.
      *ready = options.max_batch_size == 1 || first.key_tokens() > options.max_batch_tokens;
      return !*ready;
    }
    if (static_cast<int64_t>(picked.size()) >= options.max_batch_size) return false;
    if (r.call.self_attention != self_attention || r.session != nullptr) return true;
    const int64_t l = std::max(max_l, r.call.queries);
    const int64_t padded = (items + r.call.batch) * l;
    if (padded > options.max_batch_tokens) {
      *ready = true;  // The batch cannot grow past the token limit.
      return false;
    }
    if (padded > options.max_padding_ratio * static_cast<double>(real + r.tokens())) {
      return true;  // Leave it for a batch of its own length.
    }
    // The same two rules for keys: every item is padded to the longest key.
    const int64_t s = std::max(max_s, r.call.keys);
    const int64_t padded_keys = (items + r.call.batch) * s;
    if (padded_keys > options.max_batch_tokens ||
        padded_keys > options.max_padding_ratio * static_cast<double>(real_keys + r.key_tokens())) {
      return true;
    }
    const bool with_weights = weights || r.inputs.need_weights;
    if ((with_weights && padded * heads * s * 4 > options.max_batch_weights_bytes) ||
        BatchWorkingBytes(engine, items + r.call.batch, l, s, self_attention, with_weights) >
            options.max_working_bytes) {
      return true;  // The batch's weights or working memory would grow too large.
    }
    max_s = s;
    weights |= r.inputs.need_weights;
    picked.push_back(p);
    items += r.call.batch;
    max_l = l;
    real += r.tokens();
    real_keys += r.key_tokens();
    return true;
  });
  if (static_cast<int64_t>(picked.size()) >= options.max_batch_size) *ready = true;
  return picked;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(const MhaEngine* engine,
                                                                       BatchingOptions options,
                                                                       const ModelMetrics* metrics,
                                                                       absl::Mutex* compute_mutex,
                                                                       int compute_threads) {
  if (options.max_batch_size < 1 || options.max_batch_tokens < 1 ||
      options.max_queue_delay_us < 0 || options.max_queue_size < 1 ||
      options.max_batch_weights_bytes < 1 ||
      options.max_batch_weights_bytes > kMaxBatchWeightsBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("batching options out of range: max_batch_size ", options.max_batch_size,
                     ", max_batch_tokens ", options.max_batch_tokens, ", max_queue_delay_us ",
                     options.max_queue_delay_us, ", max_queue_size ", options.max_queue_size,
                     ", max_batch_weights_bytes ", options.max_batch_weights_bytes,
                     " (need >= 1, >= 1, >= 0, >= 1, 1 to ", kMaxBatchWeightsBytes, ")"));
  }
  return std::unique_ptr<DynamicBatcher>(
      new DynamicBatcher(engine, options, metrics, compute_mutex, compute_threads));
}

DynamicBatcher::DynamicBatcher(const MhaEngine* engine, BatchingOptions options,
                               const ModelMetrics* metrics, absl::Mutex* compute_mutex,
                               int compute_threads)
    : engine_(engine),
      options_(options),
      metrics_(metrics),
      compute_mutex_(compute_mutex),
      compute_threads_(compute_threads),
      queue_(options.max_queue_size, metrics->tenants.get()) {
  // The model's gauges add up its versions' queues (several are resident
  // while one replaces another): each batcher adds its own share.
  metrics_->queue_capacity->Increment(static_cast<double>(options_.max_queue_size));
  thread_ = std::thread([this] { Loop(); });
}

DynamicBatcher::~DynamicBatcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    exit_ = true;
  }
  wake_.SignalAll();
  thread_.join();
  metrics_->queue_capacity->Decrement(static_cast<double>(options_.max_queue_size));
  absl::MutexLock lock(&mu_);
  metrics_->queue_depth->Decrement(static_cast<double>(depth_reported_));
  depth_reported_ = 0;
}

void DynamicBatcher::ReportDepthLocked() {
  const int64_t depth = queue_.size();
  metrics_->queue_depth->Increment(static_cast<double>(depth - depth_reported_));
  depth_reported_ = depth;
}

void DynamicBatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
}

int64_t DynamicBatcher::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

absl::Status DynamicBatcher::Enqueue(std::unique_ptr<PendingRequest> request) {
  if (request->tokens() > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("query: ", request->tokens(),
                     " query tokens (batch x length) exceed the model's "
                     "max_batch_tokens ",
                     options_.max_batch_tokens,
                     " (its config.json's max_batch_tokens, else the server's "
                     "--max_batch_tokens); send fewer or shorter sequences"));
  }
  if (request->session == nullptr && request->inputs.need_weights) {
    const MhaSpec& spec = engine_->model().spec();
    const std::optional<int64_t> weights =
        CheckedProduct({request->call.batch, spec.num_heads, request->call.queries,
                        request->call.keys + spec.extra_keys(), 4});
    if (!weights || *weights > options_.max_batch_weights_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "need_weights: computing the attention weights takes ",
          weights ? absl::StrCat(*weights) : std::string("more than 2^63"),
          " bytes (batch x heads x queries x keys x 4), over the server's limit of ",
          options_.max_batch_weights_bytes, " (--max_batch_working_bytes, at most ",
          kMaxBatchWeightsBytes, "); leave need_weights off, or send fewer or shorter sequences"));
    }
  }
  const double cost = request->cost > 0 ? request->cost
                                        : ForwardFlops(engine_->model().spec(), request->call.batch,
                                                       request->call.queries, request->call.keys);
  bool wake = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("server is shutting down");
    request->enqueued = absl::Now();
    request->cost = cost;
    const PendingRequest* added = request.get();
    FairQueue::Evicted evicted;
    RETURN_IF_ERROR(queue_.Push(request, cost, &evicted));
    if (evicted.request != nullptr) evicted_.push_back(std::move(evicted));
    ReportDepthLocked();
    // A pushed-out request is answered on the batcher's thread.
    wake = MustWake(*added) || (!evicted_.empty() && sleeping_until_ != absl::InfinitePast());
  }
  if (wake) wake_.Signal();
  return absl::OkStatus();
}

bool DynamicBatcher::MustWake(const PendingRequest& added) const {
  // Not asleep: the batcher looks at the queue before it sleeps again.
  if (sleeping_until_ == absl::InfinitePast()) return false;
  // Asleep on an empty queue, or until sooner than its timer would fire.
  if (queue_.size() == 1 || added.deadline < sleeping_until_) return true;
  // Asleep until the oldest request's delay runs out: only a batch that
  // must go now is worth waking for (one wake-up per batch, not per request).
  if (queue_.size() >= options_.max_batch_size) return true;
  bool ready = false;
  PickBatch(queue_, options_, *engine_, &ready);
  return ready;
}

void DynamicBatcher::DropDead(
    absl::Time now,
    std::vector<std::pair<std::unique_ptr<PendingRequest>, absl::Status>>* dropped) {
  for (FairQueue::Evicted& e : evicted_) dropped->emplace_back(std::move(e.request), e.why);
  evicted_.clear();
  queue_.RemoveIf(
      [now](const PendingRequest& r) {
        // The deadline first: gRPC also cancels a call whose deadline passed.
        if (now >= r.deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat("deadline passed after ", absl::ToInt64Microseconds(now - r.enqueued),
                           " us in the queue; the request was not computed"));
        }
        if (r.is_cancelled && r.is_cancelled()) {
          return absl::CancelledError("request was cancelled while queued");
        }
        return absl::OkStatus();
      },
      dropped);
}

void DynamicBatcher::Loop() {
  // Start this thread's OpenMP team now rather than on the first request.
  omp_set_num_threads(compute_threads_);
#pragma omp parallel
  { (void)omp_get_thread_num(); }
  for (;;) {
    std::vector<std::unique_ptr<PendingRequest>> batch;
    std::vector<std::pair<std::unique_ptr<PendingRequest>, absl::Status>> dropped;
    {
      absl::MutexLock lock(&mu_);
      while (queue_.empty() && evicted_.empty() && !exit_) {
        queue_.Idle();  // The last batch has been computed and answered.
        sleeping_until_ = absl::InfiniteFuture();
        wake_.Wait(&mu_);
      }
      sleeping_until_ = absl::InfinitePast();
      if (queue_.empty() && evicted_.empty()) return;  // Exiting with nothing left to do.
      const absl::Time now = absl::Now();
      DropDead(now, &dropped);
      if (!queue_.empty()) {
        bool ready = false;
        std::vector<FairQueue::Position> picked = PickBatch(queue_, options_, *engine_, &ready);
        const absl::Time send_at =
            queue_.OldestEnqueued() + absl::Microseconds(options_.max_queue_delay_us);
        if (ready || stopping_ || now >= send_at) {
          batch = queue_.Take(picked);
        } else if (dropped.empty()) {
          // Sleep until the oldest request's delay runs out, the earliest
          // deadline passes, or a request arrives.
          const absl::Time wake_at = std::min(send_at, queue_.EarliestDeadline());
          sleeping_until_ = wake_at;
          wake_.WaitWithDeadline(&mu_, wake_at);
          sleeping_until_ = absl::InfinitePast();
        }
      }
      ReportDepthLocked();
    }
    for (auto& [request, why] : dropped) {
      RequestOutcome outcome;
      outcome.status = why;
      outcome.queue_us = absl::ToInt64Microseconds(absl::Now() - request->enqueued);
      request->done(std::move(outcome));
    }
    FlushOutcomes(dropped, [](const auto& d) { return d.first.get(); });
    if (!batch.empty()) Execute(std::move(batch));
  }
}

int64_t DynamicBatcher::EstimateWorking(
    const std::vector<std::unique_ptr<PendingRequest>>& batch) const {
  if (batch.front()->session != nullptr) {
    int64_t working = 0;
    for (const auto& r : batch) working += r->working_bytes;
    return working;
  }
  int64_t items = 0, max_l = 0, max_s = 0;
  bool weights = false;
  for (const auto& r : batch) {
    items += r->call.batch;
    max_l = std::max(max_l, r->call.queries);
    max_s = std::max(max_s, r->call.keys);
    weights |= r->inputs.need_weights;
  }
  const bool self_attention = batch.front()->call.self_attention;
  return BatchWorkingBytes(*engine_, items, max_l, self_attention ? max_l : max_s, self_attention,
                           weights);
}

void DynamicBatcher::Execute(std::vector<std::unique_ptr<PendingRequest>> batch) {
  absl::Time start;
  absl::Duration compute;
  BatchStats stats;
  std::vector<RequestOutcome> outcomes;
  {
    absl::MutexLock compute_lock(compute_mutex_);
    start = absl::Now();
    // Small batches run on one thread: waking an OpenMP team for each of a
    // forward pass's primitives costs more than it saves below ~32 MFLOP.
    const bool sessions = batch.front()->session != nullptr;
    const int64_t working = EstimateWorking(batch);
    for (int64_t peak = peak_working_.load();
         working > peak && !peak_working_.compare_exchange_weak(peak, working);) {
    }
    omp_set_num_threads(!sessions && EstimateFlops(batch) < kSmallBatchFlops ? 1
                                                                             : compute_threads_);
    try {
      outcomes = sessions ? session_runner_(batch, &stats) : RunBatch(*engine_, batch, &stats);
    } catch (const std::bad_alloc&) {
      // Admission bounds every batch's memory; this is the last line, so
      // that running out is every request's error and never a crash.
      outcomes = std::vector<RequestOutcome>(batch.size());
      for (RequestOutcome& o : outcomes) {
        o.status = absl::ResourceExhaustedError(absl::StrCat(
            "out of memory computing a batch of ", batch.size(), " requests; retry later"));
      }
      stats.real_tokens = std::max<int64_t>(stats.real_tokens, 1);
    }
    compute = absl::Now() - start;
  }
  metrics_->compute_duration->Observe(absl::ToDoubleSeconds(compute));
  metrics_->batch_size->Observe(static_cast<double>(batch.size()));
  uint64_t items = 0;
  for (const auto& r : batch) items += static_cast<uint64_t>(r->call.batch);
  metrics_->stats->Executed(batch.size(), items, compute, start + compute);
  metrics_->padding_ratio->Observe(static_cast<double>(stats.padded_tokens) /
                                   static_cast<double>(stats.real_tokens));
  metrics_->tokens->Increment(static_cast<double>(stats.real_tokens));
  metrics_->flops->Increment(stats.flops);
  for (size_t i = 0; i < batch.size(); ++i) {
    outcomes[i].queue_us = absl::ToInt64Microseconds(start - batch[i]->enqueued);
    outcomes[i].compute_us = absl::ToInt64Microseconds(compute);
    metrics_->queue_duration->Observe(absl::ToDoubleSeconds(start - batch[i]->enqueued));
    metrics_->stats->Queued(start - batch[i]->enqueued);
    if (const TenantSeries* tenant = batch[i]->tenant_series; tenant != nullptr) {
      tenant->queue_duration->Observe(absl::ToDoubleSeconds(start - batch[i]->enqueued));
      tenant->flops->Increment(batch[i]->cost);
    }
    batch[i]->done(std::move(outcomes[i]));
  }
  FlushOutcomes(batch, [](const auto& r) { return r.get(); });
}

double DynamicBatcher::EstimateFlops(
    const std::vector<std::unique_ptr<PendingRequest>>& batch) const {
  int64_t items = 0, max_l = 0, max_s = 0;
  for (const auto& r : batch) {
    items += r->call.batch;
    max_l = std::max(max_l, r->call.queries);
    max_s = std::max(max_s, r->call.keys);
  }
  return ForwardFlops(engine_->model().spec(), items, max_l, max_s);
}

}  // namespace attention::server
