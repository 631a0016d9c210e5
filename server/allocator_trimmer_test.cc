#include "server/allocator_trimmer.h"

#include <malloc.h>

#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/memory_limit.h"

namespace attention::server {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// The server's allocator settings (server_main.cc): blocks up to 32 MiB come
// from the heap, and up to 256 MiB of a heap's free top is kept.
class AllocatorTrimmerTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "the sanitizers replace glibc's malloc";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    GTEST_SKIP() << "the sanitizers replace glibc's malloc";
#endif
#endif
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  }
};

// What a flood leaves behind: 8 MiB blocks freed between small live ones (a
// request's message freed, its bookkeeping kept), in a thread's own arena.
// glibc keeps those holes resident; nothing else ever returns them.
void LeaveFreeHoles(int64_t blocks, std::vector<void*>* pins) {
  std::thread([blocks, pins] {
    std::vector<void*> big;
    for (int64_t i = 0; i < blocks; ++i) {
      big.push_back(malloc(8 * kMiB));
      std::memset(big.back(), 1, 8 * kMiB);  // Resident.
      pins->push_back(malloc(64));
    }
    for (void* p : big) free(p);
  }).join();
}

TEST_F(AllocatorTrimmerTest, ReturnsFreeMemoryOverTheReserve) {
  AllocatorTrimmer::Options options;
  options.reserve_bytes = 16 * kMiB;
  options.unmanaged_bytes = ResidentBytes();
  options.period = absl::ZeroDuration();
  AllocatorTrimmer trimmer(options);
  std::vector<void*> pins;
  LeaveFreeHoles(12, &pins);
  const int64_t held = trimmer.FreeResidentBytes();
  const int64_t resident = ResidentBytes();
  EXPECT_GT(held, 64 * kMiB);  // Without a trim, malloc keeps the holes.

  EXPECT_TRUE(trimmer.Check());
  EXPECT_EQ(trimmer.trims(), 1);
  EXPECT_LT(trimmer.FreeResidentBytes(), options.reserve_bytes);
  EXPECT_LT(ResidentBytes(), resident - 64 * kMiB);
  // Within the reserve now: nothing more to do.
  EXPECT_FALSE(trimmer.Check());
  EXPECT_EQ(trimmer.trims(), 1);
  for (void* p : pins) free(p);
}

TEST_F(AllocatorTrimmerTest, KeepsFreeMemoryWithinTheReserve) {
  AllocatorTrimmer::Options options;
  options.reserve_bytes = 256 * kMiB;
  options.unmanaged_bytes = ResidentBytes();
  options.period = absl::ZeroDuration();
  AllocatorTrimmer trimmer(options);
  std::vector<void*> pins;
  LeaveFreeHoles(4, &pins);
  const int64_t resident = ResidentBytes();
  EXPECT_FALSE(trimmer.Check());  // 32 MiB free, under 256 MiB: kept for reuse.
  EXPECT_GT(ResidentBytes(), resident - 8 * kMiB);
  for (void* p : pins) free(p);
}

// Memory mapped outside malloc (the sessions' caches) is not malloc's to
// return: counted as such, it does not make the trimmer trim.
TEST_F(AllocatorTrimmerTest, CountsMemoryMappedElsewhere) {
  AllocatorTrimmer::Options options;
  options.reserve_bytes = 16 * kMiB;
  options.unmanaged_bytes = ResidentBytes();
  options.period = absl::ZeroDuration();
  std::vector<void*> pins;
  LeaveFreeHoles(6, &pins);
  options.mapped_elsewhere = [] { return 48 * kMiB; };
  AllocatorTrimmer trimmer(options);
  EXPECT_LT(trimmer.FreeResidentBytes(), 16 * kMiB);
  EXPECT_FALSE(trimmer.Check());
  for (void* p : pins) free(p);
}

TEST_F(AllocatorTrimmerTest, ItsThreadStopsWhenDestroyed) {
  AllocatorTrimmer::Options options;
  options.reserve_bytes = 16 * kMiB;
  options.unmanaged_bytes = ResidentBytes();
  options.period = absl::Milliseconds(1);
  { AllocatorTrimmer trimmer(options); }  // Joins; a hang fails by timeout.
  SUCCEED();
}

}  // namespace
}  // namespace attention::server
