#include "server/allocator_trimmer.h"

#include <malloc.h>

#include <cstdlib>
#include <utility>

#include "server/memory_limit.h"

namespace attention::server {

void ConfigureAllocator() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 1);
}

AllocatorTrimmer::AllocatorTrimmer(Options options) : options_(std::move(options)) {
  if (options_.period > absl::ZeroDuration()) thread_ = std::thread([this] { Loop(); });
}

AllocatorTrimmer::~AllocatorTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t AllocatorTrimmer::HeapResidentBytes() const {
  int64_t heap = ResidentBytes() - options_.unmanaged_bytes;
  if (options_.mapped_elsewhere) heap -= options_.mapped_elsewhere();
  return heap;
}

int64_t AllocatorTrimmer::FreeResidentBytes() const {
  const struct mallinfo2 info = mallinfo2();
  return HeapResidentBytes() - static_cast<int64_t>(info.uordblks + info.hblkhd);
}

bool AllocatorTrimmer::Check() {
  // Cheap first: if the whole heap part of the resident set fits the
  // reserve, so does its free part (mallinfo2 locks and walks every arena).
  if (HeapResidentBytes() <= options_.reserve_bytes) return false;
  if (FreeResidentBytes() <= options_.reserve_bytes) return false;
  malloc_trim(0);
  trims_.fetch_add(1);
  return true;
}

void AllocatorTrimmer::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.period)) return;
    }
    Check();
  }
}

}  // namespace attention::server
