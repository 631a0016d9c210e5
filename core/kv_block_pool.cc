#include "core/kv_block_pool.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace attention {
namespace {

constexpr size_t kSlabTarget = size_t{1} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

KvBlockPool::KvBlockPool(size_t block_bytes, MemoryBudget* budget)
    : block_bytes_(RoundUp(std::max<size_t>(block_bytes, 64), 64)),
      blocks_per_slab_(static_cast<int>(std::max<size_t>(1, kSlabTarget / block_bytes_))),
      slab_bytes_(RoundUp(block_bytes_ * blocks_per_slab_, 4096)),
      budget_(budget) {}

KvBlockPool::~KvBlockPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [base, slab] : slabs_) {
    munmap(slab.base, slab_bytes_);
    budget_->Release(slab_bytes_);
  }
}

absl::Status KvBlockPool::Allocate(int64_t count, std::vector<void*>* out) {
  if (count <= 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  int64_t available = 0;
  for (const auto& [base, slab] : slabs_) available += static_cast<int64_t>(slab.free.size());
  // Map what is missing first, so that a failure changes nothing.
  const int64_t missing = std::max<int64_t>(0, count - available);
  const int64_t new_slabs = (missing + blocks_per_slab_ - 1) / blocks_per_slab_;
  std::vector<char*> mapped;
  for (int64_t i = 0; i < new_slabs; ++i) {
    void* p = nullptr;
    if (budget_->TryReserve(slab_bytes_)) {
      p = mmap(nullptr, slab_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        budget_->Release(slab_bytes_);
        p = nullptr;
      }
    }
    if (p == nullptr) {
      for (char* m : mapped) {
        munmap(m, slab_bytes_);
        budget_->Release(slab_bytes_);
      }
      return absl::ResourceExhaustedError(
          absl::StrCat("key/value cache: ", count, " blocks of ", block_bytes_,
                       " bytes do not fit: ", budget_->used(), " of the session memory budget's ",
                       budget_->capacity(), " bytes are in use"));
    }
    mapped.push_back(static_cast<char*>(p));
  }
  for (char* m : mapped) {
    Slab& slab = slabs_[reinterpret_cast<uintptr_t>(m)];
    slab.base = m;
    for (int b = blocks_per_slab_ - 1; b >= 0; --b) slab.free.push_back(b);
  }
  int64_t left = count;
  for (auto& [base, slab] : slabs_) {
    while (left > 0 && !slab.free.empty()) {
      out->push_back(slab.base + static_cast<size_t>(slab.free.back()) * block_bytes_);
      slab.free.pop_back();
      --left;
    }
    if (left == 0) break;
  }
  used_blocks_ += count;
  return absl::OkStatus();
}

void KvBlockPool::Free(const void* const* blocks, size_t count) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < count; ++i) {
    const auto address = reinterpret_cast<uintptr_t>(blocks[i]);
    auto it = std::prev(slabs_.upper_bound(address));
    Slab& slab = it->second;
    slab.free.push_back(static_cast<int>((address - it->first) / block_bytes_));
    --used_blocks_;
    if (static_cast<int>(slab.free.size()) == blocks_per_slab_) {
      munmap(slab.base, slab_bytes_);
      budget_->Release(slab_bytes_);
      slabs_.erase(it);
    }
  }
}

size_t KvBlockPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<size_t>(used_blocks_) * block_bytes_;
}

size_t KvBlockPool::mapped_bytes() const {
  absl::MutexLock lock(&mu_);
  return slabs_.size() * slab_bytes_;
}

}  // namespace attention
