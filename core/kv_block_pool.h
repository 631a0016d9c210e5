// File: core/kv_block_pool.h
//
// KvBlockPool hands out fixed-size blocks of key/value cache memory (one
// size per pool: one model's block) under a byte budget that several pools
// may share. Blocks come from slabs of about 1 MiB mapped with mmap; a slab
// whose blocks are all free again is unmapped at once, so memory freed by
// closed sessions goes back to the system instead of staying in the heap.
//
// The budget counts mapped slab bytes (what the process really holds);
// used_bytes() counts blocks handed out. Allocation is all or nothing.
//
// Thread-safe. The pool owns its slabs; callers own the blocks they were
// given until they Free() them, and must free every block before the pool
// goes. The shared budget must outlive the pool.
#ifndef ATTENTION_CORE_KV_BLOCK_POOL_H_
#define ATTENTION_CORE_KV_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/memory_budget.h"

namespace attention {

class KvBlockPool {
 public:
  // Blocks of `block_bytes` (rounded up to 64) charged to `budget`.
  KvBlockPool(size_t block_bytes, MemoryBudget* budget);
  ~KvBlockPool();

  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  // Appends `count` blocks (64-byte aligned, contents undefined) to `out`,
  // or returns ResourceExhausted naming the budget and leaves `out` as it
  // was.
  absl::Status Allocate(int64_t count, std::vector<void*>* out);
  // Returns blocks given by Allocate.
  void Free(const void* const* blocks, size_t count);

  size_t block_bytes() const { return block_bytes_; }
  size_t used_bytes() const;    // Blocks handed out x block_bytes.
  size_t mapped_bytes() const;  // Slabs held, charged to the budget.

 private:
  struct Slab {
    char* base = nullptr;
    std::vector<int> free;  // Indices of free blocks.
  };

  const size_t block_bytes_;
  const int blocks_per_slab_;
  const size_t slab_bytes_;
  MemoryBudget* const budget_;
  mutable absl::Mutex mu_;
  std::map<uintptr_t, Slab> slabs_ ABSL_GUARDED_BY(mu_);  // By base address.
  int64_t used_blocks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attention

#endif  // ATTENTION_CORE_KV_BLOCK_POOL_H_
