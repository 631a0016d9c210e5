// File: server/frontends/rest/rest_connection_pool.cc
#include "server/frontends/rest/rest_connection_pool.h"

#include <algorithm>
#include <utility>

namespace attention::server {

RestConnectionPool::RestConnectionPool(int max_threads, std::shared_ptr<Load> load)
    : max_threads_(std::max(1, max_threads)), load_(std::move(load)) {}

RestConnectionPool::~RestConnectionPool() { shutdown(); }

void RestConnectionPool::enqueue(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(fn));
  // Waiting threads take queued tasks; one more is started for a task that
  // none of them will take.
  if (static_cast<int>(tasks_.size()) > idle_ && static_cast<int>(threads_.size()) < max_threads_ &&
      !shutdown_) {
    threads_.emplace_back([this] { Work(); });
    load_->threads.store(static_cast<int64_t>(threads_.size()), std::memory_order_relaxed);
  }
  PublishWaiting();
}

void RestConnectionPool::PublishWaiting() {
  // Below the thread limit, every queued task has (or is starting) a thread.
  const int64_t waiting = static_cast<int>(threads_.size()) < max_threads_
                              ? 0
                              : std::max<int64_t>(0, static_cast<int64_t>(tasks_.size()) - idle_);
  load_->waiting.store(waiting, std::memory_order_relaxed);
}

void RestConnectionPool::Work() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      mu_.Await(absl::Condition(
          +[](RestConnectionPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return !p->tasks_.empty() || p->shutdown_; },
          this));
      --idle_;
      if (tasks_.empty()) return;  // Shut down, and nothing left to serve.
      task = std::move(tasks_.front());
      tasks_.pop_front();
      PublishWaiting();
    }
    task();
  }
}

void RestConnectionPool::shutdown() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_ && threads_.empty()) return;
    shutdown_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace attention::server
