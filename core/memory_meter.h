// File: core/memory_meter.h
//
// A process-wide count of the bytes that requests' buffers take: engine
// workspaces (counted at the size asked for, whether or not a kept buffer
// serves them), tensors, and the server's result buffers. It exists so that
// tests and fuzzers can check that what a request or batch really allocates
// stays within what admission reserved for it (the server's in-flight byte
// budget): reset the peak, run the work alone, compare.
//
// Example:
//   MemoryMeter::ResetPeak();
//   const int64_t before = MemoryMeter::current();
//   ... run one batch ...
//   EXPECT_LE(MemoryMeter::peak() - before, admitted);
//
// Thread-safe (relaxed atomics: two per buffer, never a lock).
#ifndef ATTENTION_CORE_MEMORY_METER_H_
#define ATTENTION_CORE_MEMORY_METER_H_

#include <cstdint>
#include <utility>

namespace attention {

class MemoryMeter {
 public:
  static void Add(int64_t bytes);
  static void Sub(int64_t bytes);
  // Bytes counted now, and the most at once since the last ResetPeak().
  static int64_t current();
  static int64_t peak();
  static void ResetPeak();
};

// `bytes` counted for as long as the charge lives. Movable, not copyable.
class MeterCharge {
 public:
  MeterCharge() = default;
  explicit MeterCharge(int64_t bytes) : bytes_(bytes) { MemoryMeter::Add(bytes_); }
  ~MeterCharge() { MemoryMeter::Sub(bytes_); }
  MeterCharge(MeterCharge&& other) noexcept : bytes_(std::exchange(other.bytes_, 0)) {}
  MeterCharge& operator=(MeterCharge&& other) noexcept {
    if (this != &other) {
      MemoryMeter::Sub(bytes_);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  MeterCharge(const MeterCharge&) = delete;
  MeterCharge& operator=(const MeterCharge&) = delete;

 private:
  int64_t bytes_ = 0;
};

}  // namespace attention

#endif  // ATTENTION_CORE_MEMORY_METER_H_
