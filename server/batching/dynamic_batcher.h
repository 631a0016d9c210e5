// File: server/batching/dynamic_batcher.h
//
// One model's queue and batcher, in the manner of Triton's dynamic batcher.
// A batch is sent when it holds max_batch_size requests or max_batch_tokens
// padded query tokens, or when its oldest request has waited
// max_queue_delay_us; otherwise the batcher sleeps exactly until then, or
// until a request arrives that completes a batch or expires sooner (one
// wake-up per batch, not one per request). Requests of different lengths
// share a batch unless padding would more than double the query tokens, or
// the key tokens, computed; padded key tokens (items x longest key) are
// bounded by max_batch_tokens too, and a request whose own keys exceed it
// runs alone.
// Requests queue per tenant (the caller's token) and are served in weighted
// fair order (FairQueue): the head of that order goes first, and the batch
// fills with the requests that can join it, of any tenant, in that order.
// With one tenant (no tokens) the order is arrival. Self-attention requests and requests
// with their own key/value are batched separately, and session work (steps
// of different sessions, packed without padding up to max_batch_tokens) only
// with session work, run by the session runner.
//
// A request whose deadline passes while queued is answered
// DEADLINE_EXCEEDED, and a cancelled one CANCELLED, without being computed.
//
// Thread-safe. The batcher computes on its own thread, with `compute_threads`
// OpenMP threads for oneDNN, holding `compute_mutex` (shared by every model)
// so that batches of different models never oversubscribe the cores.
#ifndef ATTENTION_SERVER_BATCHING_DYNAMIC_BATCHER_H_
#define ATTENTION_SERVER_BATCHING_DYNAMIC_BATCHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/mha_engine.h"
#include "server/batching/batch_runner.h"
#include "server/batching/fair_queue.h"
#include "server/batching/pending_request.h"
#include "server/metrics/metrics.h"

namespace attention::server {

struct BatchingOptions {
  int64_t max_batch_size = 16;       // Requests per batch; 1 turns batching off.
  int64_t max_batch_tokens = 8192;   // Padded query tokens per batch.
  int64_t max_queue_delay_us = 500;  // Longest wait of the oldest request for company.
  int64_t max_queue_size = 1024;     // Queued requests before RESOURCE_EXHAUSTED.
  double max_padding_ratio = 2.0;    // Padded / real tokens a batch may reach.
  // Memory one batch may take to compute, besides its requests' messages and
  // responses: padded inputs, attention weights, the engine's workspaces
  // (BatchWorkingBytes, AppendWorkingBytes). Requests join a batch only while
  // it stays under this; a request over it alone is refused before it is
  // queued. One batch computes at a time, so this is also the server's.
  int64_t max_working_bytes = int64_t{512} << 20;
  // Largest float32 attention-weights buffer of a batch (the memory plan's
  // value); at most DynamicBatcher::kMaxBatchWeightsBytes.
  int64_t max_batch_weights_bytes = int64_t{512} << 20;
};

class DynamicBatcher {
 public:
  // Starts the batcher thread. `engine`, `metrics` and `compute_mutex` must
  // outlive it. InvalidArgument for options out of range.
  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(const MhaEngine* engine,
                                                                BatchingOptions options,
                                                                const ModelMetrics* metrics,
                                                                absl::Mutex* compute_mutex,
                                                                int compute_threads);

  // Stops accepting, computes everything queued, and joins the thread.
  ~DynamicBatcher();

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Queues `request`. OK: the batcher owns it and will call its `done`
  // exactly once (RESOURCE_EXHAUSTED if it is later pushed out of the full
  // queue for a tenant under its share). RESOURCE_EXHAUSTED when the queue is
  // full and the request's tenant holds its share of it, INVALID_ARGUMENT
  // when the request alone exceeds max_batch_tokens, RESOURCE_EXHAUSTED
  // when its attention weights alone exceed max_batch_weights_bytes,
  // UNAVAILABLE after
  // Stop(); on error `done` is not called and the request is dropped.
  absl::Status Enqueue(std::unique_ptr<PendingRequest> request);

  // Refuses new requests from now on; queued ones are still computed.
  void Stop();

  // Computes a batch of session work (PendingRequest::session set): one
  // outcome per request, in order.
  using SessionRunner = std::function<std::vector<RequestOutcome>(
      const std::vector<std::unique_ptr<PendingRequest>>&, BatchStats*)>;
  // Set once, before any session work is enqueued.
  void SetSessionRunner(SessionRunner runner) { session_runner_ = std::move(runner); }

  // A batch needing attention weights keeps them all, (items, H, L, S')
  // float32: never more than options.max_batch_weights_bytes (the memory
  // plan's value, at most this), whatever max_working_bytes says.
  static constexpr int64_t kMaxBatchWeightsBytes = int64_t{512} << 20;

  const BatchingOptions& options() const { return options_; }
  int64_t queue_depth() const;
  // The largest working memory (estimated, an upper bound) of a batch
  // computed since the last ResetPeakWorking(): what tests compare the
  // MemoryMeter's peak with.
  int64_t peak_working_bytes() const { return peak_working_.load(); }
  void ResetPeakWorking() { peak_working_.store(0); }

 private:
  DynamicBatcher(const MhaEngine* engine, BatchingOptions options, const ModelMetrics* metrics,
                 absl::Mutex* compute_mutex, int compute_threads);

  void Loop();
  // Adds the change in queue_'s size to the model's queue_depth gauge.
  void ReportDepthLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether Enqueue() of `added` (now queued) must wake the
  // batcher: it sleeps on an empty queue, or `added` expires before the
  // batcher would wake, or a batch is ready to go.
  bool MustWake(const PendingRequest& added) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes cancelled and expired requests into *dropped.
  void DropDead(absl::Time now,
                std::vector<std::pair<std::unique_ptr<PendingRequest>, absl::Status>>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Execute(std::vector<std::unique_ptr<PendingRequest>> batch);
  double EstimateFlops(const std::vector<std::unique_ptr<PendingRequest>>& batch) const;
  // An upper bound on the working memory of computing `batch`.
  int64_t EstimateWorking(const std::vector<std::unique_ptr<PendingRequest>>& batch) const;

  // Below this a batch computes on one thread.
  static constexpr double kSmallBatchFlops = 32e6;

  const MhaEngine* const engine_;
  const BatchingOptions options_;
  const ModelMetrics* const metrics_;
  absl::Mutex* const compute_mutex_;
  const int compute_threads_;
  SessionRunner session_runner_;
  std::atomic<int64_t> peak_working_{0};

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  FairQueue queue_ ABSL_GUARDED_BY(mu_);
  // Requests pushed out of a full queue for a tenant under its share, to be
  // answered on the batcher's thread.
  std::vector<FairQueue::Evicted> evicted_ ABSL_GUARDED_BY(mu_);
  // queue_'s size as last added to the model's queue_depth gauge.
  int64_t depth_reported_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool exit_ ABSL_GUARDED_BY(mu_) = false;
  // While the batcher waits: when it wakes by itself (InfiniteFuture on an
  // empty queue); InfinitePast while it is not waiting.
  absl::Time sleeping_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_BATCHING_DYNAMIC_BATCHER_H_
