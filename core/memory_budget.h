// File: core/memory_budget.h
//
// MemoryBudget is a byte limit that several allocators charge against (the
// key/value block pools of every model share one). TryReserve either takes
// all the bytes asked for or none.
//
// Thread-safe (lock-free).
#ifndef ATTENTION_CORE_MEMORY_BUDGET_H_
#define ATTENTION_CORE_MEMORY_BUDGET_H_

#include <atomic>
#include <cstddef>

namespace attention {

class MemoryBudget {
 public:
  explicit MemoryBudget(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Takes `bytes` if they fit under the capacity; false (nothing taken) if not.
  bool TryReserve(size_t bytes) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > capacity_ || used > capacity_ - bytes) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  void Release(size_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  const size_t capacity_;
  std::atomic<size_t> used_{0};
};

}  // namespace attention

#endif  // ATTENTION_CORE_MEMORY_BUDGET_H_
