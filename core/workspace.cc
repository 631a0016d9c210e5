#include "core/workspace.h"

namespace attention {
namespace {

struct Kept {
  AlignedBuffer buffer;
  size_t capacity = 0;
};

Kept* ThreadSlots() {
  thread_local Kept slots[Workspace::kSlotCount];
  return slots;
}

}  // namespace

Workspace::Workspace(Slot slot, size_t bytes) : charge_(static_cast<int64_t>(bytes)) {
  if (bytes > kMaxKeptBytes) {
    own_ = AlignedBuffer(bytes);
    data_ = own_.data();
    return;
  }
  Kept& kept = ThreadSlots()[slot];
  if (kept.capacity < bytes) {
    kept.buffer = AlignedBuffer();  // Free the old one first.
    kept.buffer = AlignedBuffer(bytes);
    kept.capacity = bytes;
  }
  data_ = kept.buffer.data();
}

size_t Workspace::KeptBytes() {
  size_t total = 0;
  for (int i = 0; i < kSlotCount; ++i) total += ThreadSlots()[i].capacity;
  return total;
}

}  // namespace attention
