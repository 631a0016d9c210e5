// File: server/allocator_trimmer.h
//
// Keeps the memory malloc holds freed-but-resident within a budget (the
// memory plan's allocator reserve). glibc keeps freed blocks for reuse: each
// arena keeps what it once held unless its top grows past M_TRIM_THRESHOLD,
// and holes between live blocks are never returned. Under a flood of large
// requests, gRPC's threads and the batcher allocate 16 MiB messages, and the
// process then holds the sum of every arena's peak: measured 750 MiB of free
// memory resident at rest after one flood under a 1 GiB limit. Setting the
// thresholds low would fault pages in again on every steady-state call;
// instead, a thread checks the resident set every `period` and, when what
// malloc holds free exceeds the budget, calls malloc_trim(). That returns
// every free page of the main arena (holes and top), but of a thread's own
// arena only the holes: the free top of a thread arena (where a large block
// freed last ends up) is released only by free() itself, and only past
// M_TRIM_THRESHOLD. So the server runs with one arena (ConfigureAllocator).
// Measured: one stream of refused 30 MiB messages left about 115 MiB free
// resident in thread arenas for good (95 trims in 10 s, none effective);
// with one arena the flood of tests/memory/receive_test.cc ends
// within the reserve.
//
// Thread-safe: Check() may be called from any thread (the tests call it
// directly); the destructor stops and joins the thread.
#ifndef ATTENTION_SERVER_ALLOCATOR_TRIMMER_H_
#define ATTENTION_SERVER_ALLOCATOR_TRIMMER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attention::server {

// The allocator settings the trimmer relies on, for the server's main()
// before any thread starts: blocks up to 32 MiB from the heap, up to 256 MiB
// of a free top kept for reuse (the trimmer bounds both), and one arena, so
// that malloc_trim() reaches every free page. MALLOC_ARENA_MAX in the
// environment, if set, is left in force (more arenas: less lock contention
// between threads, but free memory the trimmer cannot return).
void ConfigureAllocator();

class AllocatorTrimmer {
 public:
  struct Options {
    // Free memory malloc may keep resident.
    int64_t reserve_bytes = 0;
    // The resident set that is not malloc's (code, libraries, stacks): the
    // process's resident set at start-up is a fair figure.
    int64_t unmanaged_bytes = 0;
    // Bytes mapped outside malloc now (the sessions' caches); may be empty.
    std::function<int64_t()> mapped_elsewhere;
    // How often the thread checks; zero starts no thread (call Check()).
    absl::Duration period = absl::Milliseconds(100);
  };

  explicit AllocatorTrimmer(Options options);
  ~AllocatorTrimmer();

  AllocatorTrimmer(const AllocatorTrimmer&) = delete;
  AllocatorTrimmer& operator=(const AllocatorTrimmer&) = delete;

  // Free memory malloc holds resident, estimated as the resident set minus
  // the unmanaged and elsewhere-mapped bytes minus what malloc has handed
  // out.
  int64_t FreeResidentBytes() const;
  // Trims if FreeResidentBytes() exceeds the reserve. True if it trimmed.
  bool Check();
  // How many times Check() trimmed.
  int64_t trims() const { return trims_.load(); }

 private:
  void Loop();
  // The resident set minus the unmanaged and elsewhere-mapped bytes.
  int64_t HeapResidentBytes() const;

  const Options options_;
  std::atomic<int64_t> trims_{0};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace attention::server

#endif  // ATTENTION_SERVER_ALLOCATOR_TRIMMER_H_
