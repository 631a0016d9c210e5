#include "core/workspace.h"

#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace attention {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Restores the process-wide limit when a test ends.
class WorkspaceTest : public ::testing::Test {
 protected:
  void TearDown() override { Workspace::SetKeptLimit(Workspace::kDefaultKeptLimit); }
};

TEST_F(WorkspaceTest, ReusesTheThreadsBufferPerSlot) {
  std::thread([] {
    void* first = nullptr;
    {
      Workspace w(Workspace::kContext, kMiB);
      first = w.data();
      std::memset(w.data(), 1, kMiB);
    }
    Workspace again(Workspace::kContext, kMiB / 2);
    EXPECT_EQ(again.data(), first);
    Workspace other(Workspace::kScores, kMiB);  // A different slot, in use at once.
    EXPECT_NE(other.data(), again.data());
    EXPECT_EQ(Workspace::KeptBytes(), 2 * kMiB);
  }).join();
}

// Every thread's kept buffers together stay within the process-wide limit
// (before it, each thread kept up to 64 MiB per slot: 24 slots x threads).
TEST_F(WorkspaceTest, AllThreadsTogetherKeepAtMostTheLimit) {
  const size_t before = Workspace::TotalKeptBytes();
  Workspace::SetKeptLimit(before + 8 * kMiB);
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::vector<size_t> kept(kThreads);
  absl::BlockingCounter asked(kThreads);
  absl::Notification exit;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &kept, &asked, &exit] {
      for (Workspace::Slot slot :
           {Workspace::kBatchQuery, Workspace::kBatchOutput, Workspace::kProjected}) {
        Workspace w(slot, 2 * kMiB);
        std::memset(w.data(), t, 2 * kMiB);  // Usable whether kept or not.
      }
      kept[t] = Workspace::KeptBytes();
      asked.DecrementCount();
      exit.WaitForNotification();  // Keep them while the others ask.
    });
  }
  // 8 threads x 3 slots x 2 MiB = 48 MiB asked for at once, 8 MiB may be kept.
  asked.Wait();
  size_t kept_sum = 0;
  for (size_t k : kept) kept_sum += k;
  EXPECT_GT(kept_sum, 0u);
  EXPECT_LE(kept_sum, 8 * kMiB);
  EXPECT_EQ(Workspace::TotalKeptBytes(), before + kept_sum);
  exit.Notify();
  for (std::thread& thread : threads) thread.join();
  // Threads that exit give their bytes back.
  EXPECT_EQ(Workspace::TotalKeptBytes(), before);
}

TEST_F(WorkspaceTest, ABufferOverHalfTheLimitIsNotKept) {
  Workspace::SetKeptLimit(Workspace::TotalKeptBytes() + 16 * kMiB);
  EXPECT_EQ(Workspace::MaxKeptBufferBytes(), (Workspace::TotalKeptBytes() + 16 * kMiB) / 2);
  std::thread([] {
    {
      Workspace big(Workspace::kScores, Workspace::MaxKeptBufferBytes() + 1);
      std::memset(big.data(), 0, Workspace::MaxKeptBufferBytes() + 1);
    }
    EXPECT_EQ(Workspace::KeptBytes(), 0u);
    { Workspace small(Workspace::kScores, kMiB); }
    EXPECT_EQ(Workspace::KeptBytes(), kMiB);
  }).join();
  Workspace::SetKeptLimit(Workspace::kDefaultKeptLimit);
  EXPECT_EQ(Workspace::MaxKeptBufferBytes(), Workspace::kDefaultKeptLimit / 2);
}

TEST_F(WorkspaceTest, ALargeBufferWithinHalfTheLimitIsKept) {
  // A long sequence's projections (1 x 16384 x 1024: 192 MiB) are reused
  // from call to call when the budget allows, whatever their size.
  Workspace::SetKeptLimit(Workspace::TotalKeptBytes() + 512 * kMiB);
  std::thread([] {
    void* first;
    {
      Workspace big(Workspace::kProjected, 192 * kMiB);
      first = big.data();
    }
    EXPECT_EQ(Workspace::KeptBytes(), 192 * kMiB);
    Workspace again(Workspace::kProjected, 192 * kMiB);
    EXPECT_EQ(again.data(), first);
  }).join();
}

}  // namespace
}  // namespace attention
