// File: tests/fuzz/fuzz_input.h
//
// FuzzInput reads a fuzz input's bytes as a stream of small decisions, for
// the structured fuzz targets (sessions, inference-protocol requests): each
// call takes the next byte(s) and maps them onto a range, so libFuzzer's
// byte mutations become changes of a model's shape, a chunk's length or a
// flag. Past the end every call returns its range's lowest value (all-zero
// bytes), so any prefix of an input is itself a complete input.
//
// Not thread-safe; borrows the bytes, which must outlive it.
#ifndef ATTENTION_TESTS_FUZZ_FUZZ_INPUT_H_
#define ATTENTION_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace attention::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // The next byte (0 past the end).
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  // An integer in [lo, hi] (hi - lo < 65536).
  int64_t Range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    uint64_t v = Byte();
    if (span > 256) v = v << 8 | Byte();
    return lo + static_cast<int64_t>(v % span);
  }
  bool Bool() { return (Byte() & 1) != 0; }
  // True with probability about `percent` / 100 (false past the end).
  bool Percent(int percent) { return at_ < size_ && Byte() % 100 < percent; }
  // A finite value in [-4, 4) on a grid of 1/32, exact in float32, bfloat16
  // and float16 alike, so every dtype carries the same number.
  float Value() { return static_cast<float>(static_cast<int8_t>(Byte())) / 32.0f; }
  // Up to `max` bytes as a string.
  std::string Bytes(size_t max) {
    const size_t n = static_cast<size_t>(Range(0, static_cast<int64_t>(max)));
    std::string out;
    for (size_t i = 0; i < n && at_ < size_; ++i) out.push_back(static_cast<char>(Byte()));
    return out;
  }
  // What has not been read yet.
  const uint8_t* rest() const { return data_ + at_; }
  size_t remaining() const { return size_ - at_; }
  bool empty() const { return at_ >= size_; }

 private:
  const uint8_t* const data_;
  const size_t size_;
  size_t at_ = 0;
};

}  // namespace attention::fuzz

#endif  // ATTENTION_TESTS_FUZZ_FUZZ_INPUT_H_
