// File: server/frontends/grpc/parse_pool.h
//
// ParsePool: a few threads (named `infer-parse`, at a lower CPU priority,
// nice +5) that run the slow part of large calls (parsing a request of
// megabytes, decoding and submitting it) off the thread that drives a
// completion queue, so that small calls are not held behind them. Tasks run
// in the order posted; each is counted as its byte size while it waits or
// runs (queued_bytes()). Bounding those bytes is the poster's affair (the
// async Infer path holds them in the in-flight budget).
//
// Example:
//   ParsePool pool(1);
//   if (!pool.Post(bytes, [call] { call->Decode(); })) ... // stopped: answer it
//   pool.Stop();  // runs what was posted, then joins
//
// Thread-safe. Stop() (or the destructor) runs every task posted before it,
// then joins the threads; a task must not Stop() its own pool.
#ifndef ATTENTION_SERVER_FRONTENDS_GRPC_PARSE_POOL_H_
#define ATTENTION_SERVER_FRONTENDS_GRPC_PARSE_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace attention::server {

class ParsePool {
 public:
  // Starts `threads` threads (at least 1).
  explicit ParsePool(int threads);
  // Stop()s.
  ~ParsePool();

  ParsePool(const ParsePool&) = delete;
  ParsePool& operator=(const ParsePool&) = delete;

  // Queues `task`, counted as `bytes` until it has run. True: it will run
  // on a pool thread. False once Stop() has begun: `task` is dropped
  // unrun, and the caller answers for what it stood for.
  bool Post(int64_t bytes, absl::AnyInvocable<void() &&> task);
  // Runs every task already posted, refuses new ones, joins the threads.
  // Idempotent.
  void Stop();

  // Tasks posted (accepted by Post) since construction.
  int64_t posted() const;
  // Bytes of the tasks posted and not yet finished.
  int64_t queued_bytes() const;
  // Tests only: `hook` runs on the pool thread before each task (it may
  // block, holding the task in the pool). Set it before posting.
  void SetBeforeTaskForTesting(std::function<void()> hook);

 private:
  struct Task {
    int64_t bytes = 0;
    absl::AnyInvocable<void() &&> run;
  };
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t posted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> before_task_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;  // Constructor and Stop() only.
  bool joined_ = false;               // Stop() only (one caller at a time).
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_GRPC_PARSE_POOL_H_
