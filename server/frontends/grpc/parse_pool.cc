#include "server/frontends/grpc/parse_pool.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

namespace attention::server {

ParsePool::ParsePool(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) {
    threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "infer-parse");  // For profiles and /proc.
      // Best effort: on a busy machine small calls (on infer-cq, at the
      // default priority) go first; the pool takes the cores they leave.
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 5);
      Loop();
    });
  }
}

ParsePool::~ParsePool() { Stop(); }

bool ParsePool::Post(int64_t bytes, absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  tasks_.push_back(Task{bytes, std::move(task)});
  ++posted_;
  queued_bytes_ += bytes;
  return true;
}

void ParsePool::Stop() {
  if (joined_) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
  joined_ = true;
}

int64_t ParsePool::posted() const {
  absl::MutexLock lock(&mu_);
  return posted_;
}

int64_t ParsePool::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return queued_bytes_;
}

void ParsePool::SetBeforeTaskForTesting(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  before_task_ = std::move(hook);
}

void ParsePool::Loop() {
  for (;;) {
    Task task;
    std::function<void()> hook;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // Stopping, and nothing left to run.
      task = std::move(tasks_.front());
      tasks_.pop_front();
      hook = before_task_;
    }
    if (hook) hook();
    std::move(task.run)();
    absl::MutexLock lock(&mu_);
    queued_bytes_ -= task.bytes;
  }
}

}  // namespace attention::server
