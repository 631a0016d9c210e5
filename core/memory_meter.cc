#include "core/memory_meter.h"

#include <atomic>

namespace attention {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

}  // namespace

void MemoryMeter::Add(int64_t bytes) {
  if (bytes == 0) return;
  const int64_t now = g_current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryMeter::Sub(int64_t bytes) {
  if (bytes != 0) g_current.fetch_sub(bytes, std::memory_order_relaxed);
}

int64_t MemoryMeter::current() { return g_current.load(std::memory_order_relaxed); }
int64_t MemoryMeter::peak() { return g_peak.load(std::memory_order_relaxed); }
void MemoryMeter::ResetPeak() { g_peak.store(current(), std::memory_order_relaxed); }

}  // namespace attention
