#include "server/requests/inflight_budget.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attention::server {
namespace {

using ::testing::HasSubstr;

TEST(InflightBudgetTest, AdmitsAllOrNothingAndNamesTheLimit) {
  InflightBudget budget(100, nullptr);
  ASSERT_TRUE(budget.Admit(60).ok());
  const absl::Status refused = budget.Admit(41);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("--max_inflight_bytes 100"));
  EXPECT_EQ(budget.used(), 60);  // Nothing of the refused 41 was taken.
  EXPECT_THAT(budget.Admit(101).message(), HasSubstr("more than the server's whole"));
  budget.Release(60);
  EXPECT_EQ(budget.used(), 0);
  EXPECT_EQ(budget.peak(), 60);
}

TEST(InflightBudgetTest, AdmissionGrowsOrKeepsWhatItHeldAndReleasesOnce) {
  InflightBudget budget(100, nullptr);
  {
    auto held = budget.Take(30);
    ASSERT_TRUE(held.ok());
    ASSERT_TRUE((*held)->AtLeast(20).ok());  // Already holds more.
    EXPECT_EQ((*held)->bytes(), 30);
    ASSERT_TRUE((*held)->AtLeast(90).ok());
    EXPECT_EQ(budget.used(), 90);
    EXPECT_EQ((*held)->AtLeast(101).code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ((*held)->bytes(), 90);
  }
  EXPECT_EQ(budget.used(), 0);
}

TEST(InflightBudgetTest, ForceGoesPastTheLimitAndSaysSo) {
  InflightBudget budget(10, nullptr);
  EXPECT_TRUE(budget.Force(10));
  EXPECT_FALSE(budget.Force(1));
  EXPECT_EQ(budget.used(), 11);
  budget.Release(11);
  EXPECT_EQ(budget.used(), 0);
}

TEST(InflightBudgetTest, ConcurrentTakersNeverHoldMoreThanTheLimitAndReleaseAll) {
  InflightBudget budget(1000, nullptr);
  constexpr int kThreads = 4, kRounds = 2000;
  std::vector<std::thread> threads;
  std::vector<int> admitted(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        auto held = budget.Take(100 + (t * 37 + i) % 200);
        if (!held.ok()) continue;
        ++admitted[t];
        (void)(*held)->AtLeast(350);  // Grows, or keeps what it held.
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(budget.used(), 0);
  EXPECT_LE(budget.peak(), 1000);
  for (int t = 0; t < kThreads; ++t) EXPECT_GT(admitted[t], 0) << "thread " << t;
}

TEST(InflightBudgetTest, WaitReleasedTimesOutWhileHeldAndReturnsOnceReleased) {
  InflightBudget budget(100, nullptr);
  EXPECT_TRUE(budget.WaitReleased(absl::Now()));  // Nothing held.
  auto held = budget.Take(40);
  ASSERT_TRUE(held.ok());
  EXPECT_FALSE(budget.WaitReleased(absl::Now() + absl::Milliseconds(20)));
  // Dropped on another thread, as gRPC drops a finished call's hold.
  std::thread releaser([h = std::move(*held)]() mutable { h.reset(); });
  EXPECT_TRUE(budget.WaitReleased(absl::InfiniteFuture()));
  EXPECT_EQ(budget.used(), 0);
  releaser.join();
}

}  // namespace
}  // namespace attention::server
