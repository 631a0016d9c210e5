// AVX-512 versions of int8_rows.h's per-row steps (compiled with AVX-512
// flags; called only where int8_internal::AvxAvailable()).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/avx512_tiles.h"
#include "core/int8_rows.h"

namespace attention::int8_internal {
namespace {

// Lanes [k, k + 16) of a float32 or bfloat16 row as float32 (zero past the
// `lanes` mask).
__m512 Load(const void* row, DType dtype, int64_t k, __mmask16 lanes) {
  if (dtype == DType::kFloat32)
    return _mm512_maskz_loadu_ps(lanes, static_cast<const float*>(row) + k);
  const __m256i b = _mm256_maskz_loadu_epi16(lanes, static_cast<const uint16_t*>(row) + k);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// FloatToBFloat16's rounding (nearest even, NaN stays NaN) on 16 lanes.
__m256i ToBFloat16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(
          u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                              _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)))),
      16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(
      _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

}  // namespace

void AvxQuantizeRows(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ld, uint8_t* q,
                     float* scale, float* zero_point) {
  const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));
  for (int64_t m = 0; m < rows; ++m) {
    const void* row = static_cast<const char*>(x) + m * ld * esize;
    __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
    __mmask16 bad = 0;  // NaN or infinite lanes: x - x is NaN there.
    for (int64_t k = 0; k < cols; k += 16) {
      const __m512 v = Load(row, dtype, k, avx512::TailMask(cols - k));
      bad |= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_UNORD_Q);
      lo = _mm512_min_ps(lo, v);
      hi = _mm512_max_ps(hi, v);
    }
    uint8_t* out = q + m * cols;
    if (bad != 0) {
      scale[m] = std::numeric_limits<float>::quiet_NaN();
      zero_point[m] = 0.0f;
      std::fill(out, out + cols, uint8_t{0});
      continue;
    }
    const float low = _mm512_reduce_min_ps(lo), high = _mm512_reduce_max_ps(hi);
    float s = (high - low) / 255.0f;
    if (s == 0.0f) s = 1.0f;
    const float inv_s = 1.0f / s;
    const float z = std::clamp(std::nearbyint(-low * inv_s), 0.0f, 255.0f);
    const __m512 inv = _mm512_set1_ps(inv_s);
    const __m512i zv = _mm512_set1_epi32(static_cast<int>(z));
    for (int64_t k = 0; k < cols; k += 16) {
      const __mmask16 lanes = avx512::TailMask(cols - k);
      // cvtps rounds to nearest even, as nearbyint does.
      __m512i v =
          _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(Load(row, dtype, k, lanes), inv)), zv);
      v = _mm512_min_epi32(_mm512_max_epi32(v, _mm512_setzero_si512()), _mm512_set1_epi32(255));
      _mm_mask_storeu_epi8(out + k, lanes, _mm512_cvtepi32_epi8(v));
    }
    scale[m] = s;
    zero_point[m] = z;
  }
}

void AvxDequantizeRows(const int32_t* acc, int64_t rows, int64_t cols, const float* scale,
                       const float* zero_point, const float* w_scale, const float* col_sum,
                       const float* bias, const RowsOut& out) {
  for (int64_t m = 0; m < rows; ++m) {
    const __m512 s = _mm512_set1_ps(scale[m]), z = _mm512_set1_ps(zero_point[m]);
    for (int64_t n = 0; n < cols; n += 16) {
      const __mmask16 lanes = avx512::TailMask(cols - n);
      const __m512 a = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(lanes, acc + m * cols + n));
      const __m512 t = _mm512_fnmadd_ps(z, _mm512_maskz_loadu_ps(lanes, col_sum + n), a);
      const __m512 b =
          bias != nullptr ? _mm512_maskz_loadu_ps(lanes, bias + n) : _mm512_setzero_ps();
      const __m512 y =
          _mm512_fmadd_ps(t, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(lanes, w_scale + n)), b);
      if (out.dtype == DType::kFloat32) {
        _mm512_mask_storeu_ps(static_cast<float*>(out.y) + m * out.ld + n, lanes, y);
      } else {
        _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out.y) + m * out.ld + n, lanes,
                                 ToBFloat16(y));
      }
    }
  }
}

}  // namespace attention::int8_internal
