#include "core/int8_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace attention {
namespace int8_internal {

bool AvxAvailable() {
  static const bool available = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return available;
}

void ScalarQuantizeRows(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ld,
                        uint8_t* q, float* scale, float* zero_point) {
  for (int64_t m = 0; m < rows; ++m) {
    const size_t row = static_cast<size_t>(m * ld);
    float lo = 0.0f, hi = 0.0f;
    bool finite = true;
    for (int64_t k = 0; k < cols; ++k) {
      const float v = LoadAsFloat(dtype, x, row + static_cast<size_t>(k));
      finite = finite && std::isfinite(v);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    uint8_t* out = q + m * cols;
    if (!finite) {
      scale[m] = std::numeric_limits<float>::quiet_NaN();
      zero_point[m] = 0.0f;
      std::memset(out, 0, static_cast<size_t>(cols));
      continue;
    }
    float s = (hi - lo) / 255.0f;
    if (s == 0.0f) s = 1.0f;
    const float inv = 1.0f / s;
    const float z = std::clamp(std::nearbyint(-lo * inv), 0.0f, 255.0f);
    for (int64_t k = 0; k < cols; ++k) {
      const float v = LoadAsFloat(dtype, x, row + static_cast<size_t>(k));
      out[k] = static_cast<uint8_t>(std::clamp(std::nearbyint(v * inv) + z, 0.0f, 255.0f));
    }
    scale[m] = s;
    zero_point[m] = z;
  }
}

void ScalarDequantizeRows(const int32_t* acc, int64_t rows, int64_t cols, const float* scale,
                          const float* zero_point, const float* w_scale, const float* col_sum,
                          const float* bias, const RowsOut& out) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t n = 0; n < cols; ++n) {
      const float t = std::fma(-zero_point[m], col_sum[n], static_cast<float>(acc[m * cols + n]));
      const float y = std::fma(t, scale[m] * w_scale[n], bias != nullptr ? bias[n] : 0.0f);
      const int64_t at = m * out.ld + n;
      if (out.dtype == DType::kFloat32) {
        static_cast<float*>(out.y)[at] = y;
      } else {
        static_cast<uint16_t*>(out.y)[at] = FloatToBFloat16(y);
      }
    }
  }
}

}  // namespace int8_internal

namespace {

// Blocks of rows for the OpenMP team (large blocks only: small calls stay on
// the calling thread).
template <typename F>
void ForRowBlocks(int64_t rows, int64_t cols, F f) {
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t b = 0; b < blocks; ++b) f(b * kBlock, std::min(kBlock, rows - b * kBlock));
}

}  // namespace

void QuantizeRows(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ld, uint8_t* q,
                  float* scale, float* zero_point) {
  const size_t esize = DTypeSize(dtype);
  ForRowBlocks(rows, cols, [&](int64_t m0, int64_t count) {
    const void* xb = static_cast<const char*>(x) + m0 * ld * static_cast<int64_t>(esize);
    if (int8_internal::AvxAvailable()) {
      int8_internal::AvxQuantizeRows(xb, dtype, count, cols, ld, q + m0 * cols, scale + m0,
                                     zero_point + m0);
    } else {
      int8_internal::ScalarQuantizeRows(xb, dtype, count, cols, ld, q + m0 * cols, scale + m0,
                                        zero_point + m0);
    }
  });
}

void DequantizeRows(const int32_t* acc, int64_t rows, int64_t cols, const float* scale,
                    const float* zero_point, const float* w_scale, const float* col_sum,
                    const float* bias, const RowsOut& out) {
  const int64_t esize = static_cast<int64_t>(DTypeSize(out.dtype));
  ForRowBlocks(rows, cols, [&](int64_t m0, int64_t count) {
    RowsOut block = out;
    block.y = static_cast<char*>(out.y) + m0 * out.ld * esize;
    if (int8_internal::AvxAvailable()) {
      int8_internal::AvxDequantizeRows(acc + m0 * cols, count, cols, scale + m0, zero_point + m0,
                                       w_scale, col_sum, bias, block);
    } else {
      int8_internal::ScalarDequantizeRows(acc + m0 * cols, count, cols, scale + m0, zero_point + m0,
                                          w_scale, col_sum, bias, block);
    }
  });
}

}  // namespace attention
