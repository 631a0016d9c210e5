// File: core/checked_math.h
//
// Overflow-checked arithmetic on tensor shapes. Every product of dimensions
// that comes from outside the process (a request, a model file, an .npy
// header) goes through CheckedProduct, so that no shape can wrap around to a
// small byte count and pass a size check.
//
// Example:
//   std::optional<int64_t> n = CheckedProduct(shape, kMaxElements);
//   if (!n) return absl::InvalidArgumentError("shape is too large");
//
// Stateless; safe from any thread.
#ifndef ATTENTION_CORE_CHECKED_MATH_H_
#define ATTENTION_CORE_CHECKED_MATH_H_

#include <cstdint>
#include <limits>
#include <optional>

#include "absl/types/span.h"

namespace attention {

// The largest dimension any tensor may have anywhere (2^31).
inline constexpr int64_t kMaxDim = int64_t{1} << 31;

// *out = a * b. False (and *out unspecified) if the product overflows int64.
inline bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// The product of `dims` when every dim is in [0, kMaxDim] and every partial
// product stays within `limit`; nullopt otherwise. Each dim is checked before
// it is multiplied, so nothing overflows on the way.
inline std::optional<int64_t> CheckedProduct(absl::Span<const int64_t> dims,
                                             int64_t limit = std::numeric_limits<int64_t>::max()) {
  int64_t product = 1;
  for (int64_t d : dims) {
    if (d < 0 || d > kMaxDim) return std::nullopt;
    if (!CheckedMul(product, d, &product) || product > limit) return std::nullopt;
  }
  return product;
}

}  // namespace attention

#endif  // ATTENTION_CORE_CHECKED_MATH_H_
