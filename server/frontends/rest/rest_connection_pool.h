// File: server/frontends/rest/rest_connection_pool.h
//
// RestConnectionPool: the task queue cpp-httplib serves REST connections
// with (httplib::Server::new_task_queue). A task is one connection, served
// until it closes (keep-alive requests included). httplib's own ThreadPool
// starts all its threads at once and serves connections beyond them only
// when one closes, so a 33rd client waits for as long as 32 busy keep-alive
// clients keep sending. This pool starts a thread when a connection finds
// none idle, up to `max_threads` (threads stay for the next connections),
// and tells, through its Load, how many accepted connections wait for a
// thread: the front-end then closes busy keep-alive connections after their
// current reply, so that waiting ones are served in turn (fairness) instead
// of starving.
//
// Thread-safe. httplib owns the pool (it deletes it after shutdown());
// Load is shared, so it may outlive the pool.
#ifndef ATTENTION_SERVER_FRONTENDS_REST_REST_CONNECTION_POOL_H_
#define ATTENTION_SERVER_FRONTENDS_REST_REST_CONNECTION_POOL_H_

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace attention::server {

class RestConnectionPool : public httplib::TaskQueue {
 public:
  // What the pool's handlers and the front-end's metrics read.
  struct Load {
    // Accepted connections that wait because every thread serves one.
    std::atomic<int64_t> waiting{0};
    std::atomic<int64_t> threads{0};  // Threads started (idle or serving).
  };

  RestConnectionPool(int max_threads, std::shared_ptr<Load> load);
  ~RestConnectionPool() override;

  RestConnectionPool(const RestConnectionPool&) = delete;
  RestConnectionPool& operator=(const RestConnectionPool&) = delete;

  void enqueue(std::function<void()> fn) override;
  // Serves what is queued, then joins every thread.
  void shutdown() override;

 private:
  void Work();
  void PublishWaiting() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_threads_;
  const std::shared_ptr<Load> load_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // Threads waiting for a task.
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_FRONTENDS_REST_REST_CONNECTION_POOL_H_
