// ParsePool: tasks run on its threads in order, counted by bytes until they
// finish; Stop() runs what was posted and refuses what comes after; the test
// hook holds a task in the pool. Also run under TSan (scripts/sanitize.sh).
#include "server/frontends/grpc/parse_pool.h"

#include <pthread.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace attention::server {
namespace {

TEST(ParsePoolTest, RunsTasksInOrderOnItsOwnNamedThread) {
  ParsePool pool(1);
  absl::Mutex mu;
  std::vector<int> order;
  std::string name;
  absl::Notification last;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(pool.Post(10, [&, i] {
      absl::MutexLock lock(&mu);
      order.push_back(i);
      if (i == 0) {
        char buffer[16] = {};
        pthread_getname_np(pthread_self(), buffer, sizeof(buffer));
        name = buffer;
      }
      if (i == 4) last.Notify();
    }));
  }
  last.WaitForNotification();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(name, "infer-parse");
  EXPECT_EQ(pool.posted(), 5);
}

TEST(ParsePoolTest, CountsBytesUntilTheTaskFinishes) {
  ParsePool pool(1);
  absl::Notification entered, release, done;
  pool.SetBeforeTaskForTesting([&] {
    entered.Notify();
    release.WaitForNotification();
  });
  ASSERT_TRUE(pool.Post(1000, [&] { done.Notify(); }));
  entered.WaitForNotification();  // Held by the hook: counted, not run.
  EXPECT_EQ(pool.queued_bytes(), 1000);
  EXPECT_FALSE(done.HasBeenNotified());
  pool.SetBeforeTaskForTesting(nullptr);
  ASSERT_TRUE(pool.Post(24, [] {}));
  EXPECT_EQ(pool.queued_bytes(), 1024);
  release.Notify();
  done.WaitForNotification();
  pool.Stop();  // Runs the second task, then joins.
  EXPECT_EQ(pool.queued_bytes(), 0);
  EXPECT_EQ(pool.posted(), 2);
}

TEST(ParsePoolTest, StopRunsWhatWasPostedAndRefusesWhatComesAfter) {
  ParsePool pool(2);
  std::atomic<int> ran{0};
  absl::Notification release;
  pool.SetBeforeTaskForTesting([&] { release.WaitForNotification(); });
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(pool.Post(1, [&] { ++ran; }));
  std::thread stopper([&] { pool.Stop(); });
  // Stop() waits for the held tasks; Post() is refused once it has begun.
  while (pool.Post(1, [&] { ++ran; })) {
    std::this_thread::yield();
  }
  release.Notify();
  stopper.join();
  EXPECT_EQ(ran.load(), pool.posted());
  EXPECT_GE(ran.load(), 20);
  EXPECT_EQ(pool.queued_bytes(), 0);
  EXPECT_FALSE(pool.Post(1, [&] { ++ran; }));
  pool.Stop();  // Idempotent.
}

TEST(ParsePoolTest, ManyPostersManyThreads) {
  std::atomic<int64_t> sum{0};
  {
    ParsePool pool(3);
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&] {
        for (int i = 1; i <= 500; ++i) ASSERT_TRUE(pool.Post(i, [&sum, i] { sum += i; }));
      });
    }
    for (auto& t : posters) t.join();
  }  // The destructor stops the pool: every task has run.
  EXPECT_EQ(sum.load(), 4 * 500 * 501 / 2);
}

}  // namespace
}  // namespace attention::server
