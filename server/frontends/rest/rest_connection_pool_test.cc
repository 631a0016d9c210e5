// RestConnectionPool: threads start when a task finds none idle, up to the
// limit; tasks beyond it wait and are counted in Load::waiting; shutdown
// serves what is queued, then joins.
#include "server/frontends/rest/rest_connection_pool.h"

#include <atomic>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace attention::server {
namespace {

// Waits (bounded) until `done` holds; false when it never did.
template <typename F>
bool WaitFor(F done) {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(RestConnectionPoolTest, StartsThreadsOnDemandUpToTheLimitAndCountsWaitingTasks) {
  auto load = std::make_shared<RestConnectionPool::Load>();
  auto pool = std::make_unique<RestConnectionPool>(2, load);
  EXPECT_EQ(load->threads.load(), 0);  // No thread before the first connection.

  absl::Notification release_first, release_second;
  std::atomic<int> started{0}, finished{0};
  pool->enqueue([&] {
    ++started;
    release_first.WaitForNotification();
    ++finished;
  });
  pool->enqueue([&] {
    ++started;
    release_second.WaitForNotification();
    ++finished;
  });
  ASSERT_TRUE(WaitFor([&] { return started.load() == 2; }));
  EXPECT_EQ(load->threads.load(), 2);
  EXPECT_EQ(load->waiting.load(), 0);

  // A third task finds both threads busy and the limit reached: it waits.
  pool->enqueue([&] {
    ++started;
    ++finished;
  });
  EXPECT_EQ(load->threads.load(), 2);
  EXPECT_EQ(load->waiting.load(), 1);
  EXPECT_EQ(started.load(), 2);

  // The first thread to come free serves it, and no thread is added.
  release_first.Notify();
  ASSERT_TRUE(WaitFor([&] { return finished.load() == 2; }));
  EXPECT_EQ(load->waiting.load(), 0);
  EXPECT_EQ(load->threads.load(), 2);

  // An idle thread takes the next task: still two threads.
  std::atomic<bool> ran{false};
  pool->enqueue([&] { ran = true; });
  ASSERT_TRUE(WaitFor([&] { return ran.load(); }));
  EXPECT_EQ(load->threads.load(), 2);

  release_second.Notify();
  pool->shutdown();
  EXPECT_EQ(finished.load(), 3);
}

TEST(RestConnectionPoolTest, ShutdownServesWhatIsQueuedThenJoins) {
  auto load = std::make_shared<RestConnectionPool::Load>();
  auto pool = std::make_unique<RestConnectionPool>(1, load);
  absl::Notification started, release;
  std::atomic<int> served{0};
  pool->enqueue([&] {
    started.Notify();
    release.WaitForNotification();
    ++served;
  });
  started.WaitForNotification();
  for (int i = 0; i < 3; ++i) pool->enqueue([&] { ++served; });
  EXPECT_EQ(load->waiting.load(), 3);
  release.Notify();
  pool->shutdown();
  EXPECT_EQ(served.load(), 4);
  pool->shutdown();  // Again: nothing left, returns.
  pool.reset();      // The destructor after shutdown joins nothing.
  EXPECT_EQ(load->threads.load(), 1);
}

}  // namespace
}  // namespace attention::server
