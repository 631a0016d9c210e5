#include "core/workspace.h"

#include <atomic>

namespace attention {
namespace {

std::atomic<size_t> kept_total{0};
std::atomic<size_t> kept_limit{Workspace::kDefaultKeptLimit};

struct Kept {
  AlignedBuffer buffer;
  size_t capacity = 0;
};

// One thread's slots; their bytes leave the process total when it exits.
struct ThreadKept {
  Kept slots[Workspace::kSlotCount];
  ~ThreadKept() {
    size_t mine = 0;
    for (const Kept& k : slots) mine += k.capacity;
    kept_total.fetch_sub(mine);
  }
};

Kept* ThreadSlots() {
  thread_local ThreadKept kept;
  return kept.slots;
}

// Adds `more` bytes to the process total if it stays within the limit.
bool Reserve(size_t more) {
  const size_t limit = kept_limit.load(std::memory_order_relaxed);
  size_t total = kept_total.load(std::memory_order_relaxed);
  do {
    if (total > limit || more > limit - total) return false;
  } while (!kept_total.compare_exchange_weak(total, total + more));
  return true;
}

}  // namespace

Workspace::Workspace(Slot slot, size_t bytes) : charge_(static_cast<int64_t>(bytes)) {
  Kept& kept = ThreadSlots()[slot];
  if (kept.capacity >= bytes) {
    data_ = kept.buffer.data();
    return;
  }
  if (bytes <= MaxKeptBufferBytes() && Reserve(bytes - kept.capacity)) {
    // The total now counts `bytes` for this slot.
    kept.buffer = AlignedBuffer();  // Free the old one first.
    kept.capacity = 0;
    try {
      kept.buffer = AlignedBuffer(bytes);
    } catch (...) {
      kept_total.fetch_sub(bytes);
      throw;
    }
    kept.capacity = bytes;
    data_ = kept.buffer.data();
    return;
  }
  own_ = AlignedBuffer(bytes);
  data_ = own_.data();
}

size_t Workspace::KeptBytes() {
  size_t total = 0;
  for (int i = 0; i < kSlotCount; ++i) total += ThreadSlots()[i].capacity;
  return total;
}

size_t Workspace::TotalKeptBytes() { return kept_total.load(); }

void Workspace::SetKeptLimit(size_t bytes) { kept_limit.store(bytes); }

size_t Workspace::KeptLimit() { return kept_limit.load(); }

size_t Workspace::MaxKeptBufferBytes() { return KeptLimit() / 2; }

}  // namespace attention
