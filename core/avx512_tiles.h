// File: core/avx512_tiles.h
//
// The AVX-512 register-blocked pieces of the fused attention kernel: a
// vector exp, S = Q K^T for up to 4 rows x 64 keys at a time, and O += P V
// for up to 4 rows x 64 features at a time, in float32 FMAs and in bfloat16
// dot products. Include only from translation units compiled with -mavx512f
// -mavx512bw -mavx512vl -mavx512dq -mavx512bf16, and run them only after a
// CPU check (the bfloat16-pair overloads need AVX512_BF16 too). Stateless; safe from any
// thread.
#ifndef ATTENTION_CORE_AVX512_TILES_H_
#define ATTENTION_CORE_AVX512_TILES_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace attention::avx512 {

// exp(x) for x <= 0 (scores minus their running max), -inf -> 0, NaN -> NaN.
// Range reduction by ln 2 and a Taylor polynomial of degree `kDegree`: 7 gives
// a relative error of ~1e-7 (float32 results), 4 about 4e-5, far below what
// rounding probabilities to bfloat16 (2^-9) costs.
template <int kDegree = 7>
inline __m512 Exp(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  // vmaxps returns its second operand when either is NaN: x last keeps NaN.
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  // Horner from 1/kDegree! down to 1.
  constexpr float kInvFactorial[8] = {1.0f,      1.0f,       0.5f,       1.0f / 6,
                                      1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};
  __m512 p = _mm512_set1_ps(kInvFactorial[kDegree]);
#pragma GCC unroll 8
  for (int i = kDegree - 1; i >= 0; --i)
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kInvFactorial[i]));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_scalef_ps(p, n));
}

// Lanes [0, n) of a 16-lane vector (n in 0..16).
inline __mmask16 TailMask(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// s[r][c0 + 16v + i] = sum_d q[r][d] * kt[d][c0 + 16v + i] for R rows and NV
// vectors of 16 keys. q is (R, depth) with row stride ldq; kt is
// (depth, keys) with row stride ldk, zero-padded to whole vectors.
template <int R, int NV>
inline void ScoreBlock(const float* q, int64_t ldq, const float* kt, int64_t ldk, int64_t depth,
                       float* s, int64_t lds) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < depth; ++d) {
    __m512 k[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) k[v] = _mm512_loadu_ps(kt + d * ldk + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(q[r * ldq + d]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(b, k[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s + r * lds + 16 * v, acc[r][v]);
}

// bfloat16 dot products (vdpbf16ps, AVX512_BF16): operands are 32-bit words
// holding two bfloat16 values each, the pair that one instruction multiplies
// and adds into a float32 lane.

// s[r][16v + i] = sum_p dot(q[r][p], kt[p][16v + i]) over `pairs` word rows:
// q is (R, pairs) words with row stride ldq; kt is (pairs, keys) words.
template <int R, int NV>
inline void ScoreBlock(const uint32_t* q, int64_t ldq, const uint32_t* kt, int64_t ldk,
                       int64_t pairs, float* s, int64_t lds) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i k[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) k[v] = _mm512_loadu_si512(kt + p * ldk + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(q[r * ldq + p]));
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) {
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)k[v], (__m512bh)b);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s + r * lds + 16 * v, acc[r][v]);
}

// S = Q K^T for `rows` x `keys` (keys padded to whole vectors in kt and s).
template <int R, typename T>
inline void ScoreRows(const T* q, int64_t ldq, const T* kt, int64_t ldk, int64_t depth,
                      int64_t keys, float* s, int64_t lds) {
  int64_t c = 0;
  for (; c + 64 <= keys; c += 64) ScoreBlock<R, 4>(q, ldq, kt + c, ldk, depth, s + c, lds);
  const int64_t left = (keys - c + 15) / 16;
  if (left == 4) ScoreBlock<R, 4>(q, ldq, kt + c, ldk, depth, s + c, lds);
  if (left == 3) ScoreBlock<R, 3>(q, ldq, kt + c, ldk, depth, s + c, lds);
  if (left == 2) ScoreBlock<R, 2>(q, ldq, kt + c, ldk, depth, s + c, lds);
  if (left == 1) ScoreBlock<R, 1>(q, ldq, kt + c, ldk, depth, s + c, lds);
}

// S = Q K^T for `rows` queries and `keys` keys: T = float (depth features)
// or uint32_t (depth feature pairs, bfloat16).
template <typename T>
inline void Scores(const T* q, int64_t ldq, const T* kt, int64_t ldk, int64_t depth, int64_t rows,
                   int64_t keys, float* s, int64_t lds) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    ScoreRows<4>(q + r * ldq, ldq, kt, ldk, depth, keys, s + r * lds, lds);
  for (; r < rows; ++r) ScoreRows<1>(q + r * ldq, ldq, kt, ldk, depth, keys, s + r * lds, lds);
}

// o[r][d0 + 16v + i] += sum_j p[r][j] * v[j][d0 + 16v + i] for R rows and NV
// vectors of features; `last` masks the final vector's lanes (the head's
// depth need not be a multiple of 16). o has whole vectors per row.
template <int R, int NV>
inline void ContextBlock(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t keys,
                         __mmask16 last, float* o, int64_t ldo) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) acc[r][w] = _mm512_loadu_ps(o + r * ldo + 16 * w);
  for (int64_t j = 0; j < keys; ++j) {
    __m512 x[NV];
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) {
      x[w] = w == NV - 1 ? _mm512_maskz_loadu_ps(last, v + j * ldv + 16 * w)
                         : _mm512_loadu_ps(v + j * ldv + 16 * w);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(p[r * ldp + j]);
#pragma GCC unroll 16
      for (int w = 0; w < NV; ++w) acc[r][w] = _mm512_fmadd_ps(b, x[w], acc[r][w]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) _mm512_storeu_ps(o + r * ldo + 16 * w, acc[r][w]);
}

// o[r][d0 + 16w + i] += sum_t dot(p[r][t], v[t][16w + i]) over `pairs` key
// pairs: p is (R, pairs) words of probabilities, v is (pairs, depth) words
// (zero-padded to whole vectors), o float32 with whole vectors per row.
template <int R, int NV>
inline void ContextBlock(const uint32_t* p, int64_t ldp, const uint32_t* v, int64_t ldv,
                         int64_t pairs, __mmask16 /*last: v is zero-padded*/, float* o,
                         int64_t ldo) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) acc[r][w] = _mm512_loadu_ps(o + r * ldo + 16 * w);
  for (int64_t t = 0; t < pairs; ++t) {
    __m512i x[NV];
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) x[w] = _mm512_loadu_si512(v + t * ldv + 16 * w);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i b = _mm512_set1_epi32(static_cast<int>(p[r * ldp + t]));
#pragma GCC unroll 16
      for (int w = 0; w < NV; ++w) {
        acc[r][w] = _mm512_dpbf16_ps(acc[r][w], (__m512bh)x[w], (__m512bh)b);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) _mm512_storeu_ps(o + r * ldo + 16 * w, acc[r][w]);
}

template <int R, typename T>
inline void ContextRows(const T* p, int64_t ldp, const T* v, int64_t ldv, int64_t keys,
                        int64_t depth, float* o, int64_t ldo) {
  for (int64_t d0 = 0; d0 < depth; d0 += 64) {
    const int64_t left = depth - d0;
    const int64_t nv = (std::min<int64_t>(left, 64) + 15) / 16;
    const __mmask16 last = TailMask(left - 16 * (nv - 1));
    switch (nv) {
      case 4:
        ContextBlock<R, 4>(p, ldp, v + d0, ldv, keys, last, o + d0, ldo);
        break;
      case 3:
        ContextBlock<R, 3>(p, ldp, v + d0, ldv, keys, last, o + d0, ldo);
        break;
      case 2:
        ContextBlock<R, 2>(p, ldp, v + d0, ldv, keys, last, o + d0, ldo);
        break;
      default:
        ContextBlock<R, 1>(p, ldp, v + d0, ldv, keys, last, o + d0, ldo);
    }
  }
}

// O += P V for `rows` x `keys` probabilities and `depth` features: T = float
// or uint32_t (`keys` key pairs, bfloat16).
template <typename T>
inline void Context(const T* p, int64_t ldp, const T* v, int64_t ldv, int64_t rows, int64_t keys,
                    int64_t depth, float* o, int64_t ldo) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    ContextRows<4>(p + r * ldp, ldp, v, ldv, keys, depth, o + r * ldo, ldo);
  for (; r < rows; ++r) ContextRows<1>(p + r * ldp, ldp, v, ldv, keys, depth, o + r * ldo, ldo);
}

// `count` float32 values rounded to bfloat16 (nearest even) as (count + 1) / 2
// words of pairs, value 2u in word u's low half (the last one padded with 0).
inline void ToBf16Pairs(const float* src, int64_t count, uint32_t* dst) {
  for (int64_t j = 0; j < count; j += 32) {
    const __m512 lo = _mm512_maskz_loadu_ps(TailMask(count - j), src + j);
    const __m512 hi = _mm512_maskz_loadu_ps(TailMask(count - j - 16), src + j + 16);
    const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    const int64_t words = std::min<int64_t>(16, (count - j + 1) / 2);
    _mm512_mask_storeu_epi32(dst + j / 2, TailMask(words), pairs);
  }
}

}  // namespace attention::avx512

#endif  // ATTENTION_CORE_AVX512_TILES_H_
