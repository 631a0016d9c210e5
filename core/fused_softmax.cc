#include "core/fused_softmax.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/avx512_tiles.h"

namespace attention::fused_internal {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The row's maximum score.
float RowMax(const float* s, int64_t keys) {
  __m512 mx = _mm512_set1_ps(kNegInf);
  int64_t j = 0;
  for (; j + 16 <= keys; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
  if (j < keys) {
    mx = _mm512_max_ps(
        mx, _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), avx512::TailMask(keys - j), s + j));
  }
  return _mm512_reduce_max_ps(mx);
}

// s = 2^(s - shift) over `keys` values; returns their sum as 16 lanes.
template <int kDegree>
__m512 ExpRow(float* s, int64_t keys, float shift_value) {
  const __m512 shift = _mm512_set1_ps(shift_value);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= keys; j += 16) {
    const __m512 e = avx512::Exp2<kDegree>(_mm512_sub_ps(_mm512_loadu_ps(s + j), shift));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (j < keys) {
    const __mmask16 tail = avx512::TailMask(keys - j);
    const __m512 e =
        avx512::Exp2<kDegree>(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + j), shift));
    _mm512_mask_storeu_ps(s + j, tail, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, e));
  }
  return sum;
}

// The same, written as bfloat16 pairs of keys instead ((keys + 1) / 2 words,
// key 2u in word u's low half, the odd last one with a zero); the sum is of
// the float32 values.
__m512 ExpRowPairs(const float* s, int64_t keys, float shift_value, uint32_t* pairs) {
  const __m512 shift = _mm512_set1_ps(shift_value);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= keys; j += 32) {
    const __m512 lo = avx512::Exp2<3>(_mm512_sub_ps(_mm512_loadu_ps(s + j), shift));
    const __m512 hi = avx512::Exp2<3>(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), shift));
    sum = _mm512_add_ps(sum, _mm512_add_ps(lo, hi));
    _mm512_storeu_si512(pairs + j / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  if (j < keys) {
    const __mmask16 lo_lanes = avx512::TailMask(keys - j),
                    hi_lanes = avx512::TailMask(keys - j - 16);
    const __m512 lo = _mm512_maskz_mov_ps(
        lo_lanes, avx512::Exp2<3>(_mm512_sub_ps(_mm512_maskz_loadu_ps(lo_lanes, s + j), shift)));
    const __m512 hi = _mm512_maskz_mov_ps(
        hi_lanes,
        avx512::Exp2<3>(_mm512_sub_ps(_mm512_maskz_loadu_ps(hi_lanes, s + j + 16), shift)));
    sum = _mm512_add_ps(sum, _mm512_add_ps(lo, hi));
    _mm512_mask_storeu_epi32(pairs + j / 2, avx512::TailMask((keys - j + 1) / 2),
                             (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  return sum;
}

// A row with nothing attendable so far: zero probabilities; a NaN score
// poisons the row's sum.
void NothingAttendable(float* s, int64_t keys, float* sum_lanes) {
  __mmask16 nan = 0;
  for (int64_t j = 0; j < keys; j += 16) {
    const __m512 x = _mm512_maskz_loadu_ps(avx512::TailMask(keys - j), s + j);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  }
  if (nan != 0) sum_lanes[0] = std::numeric_limits<float>::quiet_NaN();
  std::fill(s, s + keys, 0.0f);
}

}  // namespace

void SoftmaxTile(float* s, int64_t lds, int64_t rows, int64_t keys, uint32_t* pairs, int64_t ldp,
                 float* m, float* sums, float* alpha) {
  // The new maxima, then the rows' factors 16 rows at a time (one vector 2^x
  // instead of a scalar exp per row).
  alignas(64) float m_new[16];
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t count = std::min<int64_t>(16, rows - r0);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = r0 + i;
      const float row_max = RowMax(s + r * lds, keys);
      // std::max keeps its first operand when the second is NaN, and a NaN
      // running maximum stays (its row is NaN already).
      m_new[i] = std::max(m[r], row_max);
    }
    const __mmask16 lanes = avx512::TailMask(count);
    const __m512 old_max = _mm512_maskz_loadu_ps(lanes, m + r0);
    const __m512 new_max = _mm512_maskz_load_ps(lanes, m_new);
    // 2^(old - new): 0 when old is -inf; 1 for rows with nothing attendable
    // (new is -inf: their state does not move).
    __m512 a = avx512::Exp2<5>(_mm512_sub_ps(old_max, new_max));
    a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(new_max, _mm512_set1_ps(kNegInf), _CMP_EQ_OQ),
                           _mm512_set1_ps(1.0f));
    _mm512_mask_storeu_ps(alpha + r0, lanes, a);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = r0 + i;
      float* row = s + r * lds;
      float* row_sums = sums + 16 * r;
      if (m_new[i] == kNegInf) {
        NothingAttendable(row, keys, row_sums);
        if (pairs != nullptr) std::fill_n(pairs + r * ldp, (keys + 1) / 2, 0u);
        continue;
      }
      m[r] = m_new[i];
      const __m512 sum = pairs != nullptr ? ExpRowPairs(row, keys, m_new[i], pairs + r * ldp)
                                          : ExpRow<5>(row, keys, m_new[i]);
      _mm512_storeu_ps(row_sums,
                       _mm512_fmadd_ps(_mm512_loadu_ps(row_sums), _mm512_set1_ps(alpha[r]), sum));
    }
  }
}

float SumLanes(const float* lanes) { return _mm512_reduce_add_ps(_mm512_loadu_ps(lanes)); }

void MoveReference(const TileRows& st, int64_t r, int64_t c, const float* scores, int64_t count) {
  float top = kNegInf;
  for (int64_t i = 0; i < count; ++i) top = std::max(top, scores[i]);  // NaN left out.
  const float old = st.m[r];  // Never -inf here (see the header).
  // k >= 1 whole steps (+inf for an infinite score: everything else becomes 0).
  const float k = std::max(1.0f, std::ceil(top - old));
  st.m[r] = old + k;
  const float alpha = k > 149.0f ? 0.0f : std::ldexp(1.0f, -static_cast<int>(k));
  const __m512 a = _mm512_set1_ps(alpha);
  float* sums = st.sums + 16 * r;
  _mm512_storeu_ps(sums, _mm512_mul_ps(_mm512_loadu_ps(sums), a));
  float* o = st.o + r * st.ld_o;
  for (int64_t d = 0; d < st.ld_o; d += 16) {
    _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), a));
  }
  if (st.p16 == nullptr) {
    float* p = st.p32 + r * st.ld_p;
    for (int64_t j = 0; j < c; j += 16)
      _mm512_storeu_ps(p + j, _mm512_mul_ps(_mm512_loadu_ps(p + j), a));
    return;
  }
  uint32_t* words = st.p16 + r * st.ld_p;
  for (int64_t w = 0; w < c / 2; w += 16) {  // c is a multiple of 32: whole vectors.
    const __m512i x = _mm512_loadu_si512(words + w);
    const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(-65536)));
    _mm512_storeu_si512(words + w,
                        (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, a), _mm512_mul_ps(lo, a)));
  }
}

}  // namespace attention::fused_internal
