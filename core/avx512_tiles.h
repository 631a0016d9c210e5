// File: core/avx512_tiles.h
//
// The AVX-512 register-blocked pieces of the fused attention kernel: a
// vector 2^x, S = Q K^T for up to 4 rows x 64 keys at a time, and O += P V for up to 8 rows x 32 or
// 4 rows x 64 features at a time, in float32 FMAs and in bfloat16 dot products. Include only from
// translation units compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16, and run
// them only after a CPU check (the bfloat16-pair overloads need AVX512_BF16 too). Stateless; safe
// from any thread.
#ifndef ATTENTION_CORE_AVX512_TILES_H_
#define ATTENTION_CORE_AVX512_TILES_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace attention::avx512 {

// 2^x for x <= 0 (scores in log2 units minus their running max), -inf -> 0,
// NaN -> NaN. x = n + f with n an integer and |f| <= 1/2; 2^f is a polynomial
// 1 + f q(f) fitted for least relative error (minimax), of degree `kDegree`:
// 5 is within 1.7e-7 of 2^f in float32 arithmetic (float32 results), 3 within
// 1e-4, far below what rounding probabilities to bfloat16 (2^-9) costs.
// (Measured here: as fast as a 16-entry table with a cubic, and faster than
// vreduceps in place of the clamp and the rounding.)
template <int kDegree>
inline __m512 Exp2(__m512 x) {
  static_assert(kDegree == 3 || kDegree == 5, "fitted for degrees 3 and 5");
  // Below -150, 2^x rounds to zero. vmaxps returns its second operand when
  // either is NaN: x last keeps NaN.
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p;
  if constexpr (kDegree == 5) {
    p = _mm512_fmadd_ps(_mm512_set1_ps(1.326471101e-03f), f, _mm512_set1_ps(9.671507403e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550733581e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402224243e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931470037e-01f));
  } else {
    p = _mm512_fmadd_ps(_mm512_set1_ps(5.500872433e-02f), f, _mm512_set1_ps(2.422104627e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.932829022e-01f));
  }
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  // p * 2^n; 2^-150 rounds to +0.
  return _mm512_scalef_ps(p, n);
}

// Lanes [0, n) of a 16-lane vector (n in 0..16).
inline __mmask16 TailMask(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// Keys per panel of K^T: the kernel packs K^T as panels of kPanel keys, each
// (depth, kPanel) contiguous, so that one panel stays in L1 while every row
// of a query tile reads it (K^T rows a whole sequence apart would fall into a
// few cache sets).
constexpr int64_t kPanel = 64;

// acc += a * b per lane: float32 FMA, or (uint32_t words of bfloat16 pairs)
// the pair's dot product, vdpbf16ps.
inline __m512 MulAdd(__m512 acc, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, acc); }
inline __m512 MulAdd(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
inline __m512 LoadVec(const float* p) { return _mm512_loadu_ps(p); }
inline __m512i LoadVec(const uint32_t* p) { return _mm512_loadu_si512(p); }
inline __m512 Broadcast(const float* p) { return _mm512_set1_ps(*p); }
inline __m512i Broadcast(const uint32_t* p) { return _mm512_set1_epi32(static_cast<int>(*p)); }
template <typename T>
using Vec = decltype(LoadVec(static_cast<const T*>(nullptr)));

// s[r][16v + i] = sum_d q[r][d] * panel[d][16v + i] for R rows and NV vectors
// of 16 keys: T = float (d over features) or uint32_t (d over feature pairs,
// bfloat16). q is (R, depth) with row stride ldq; the panel is (depth,
// kPanel).
template <int R, int NV, typename T>
inline void ScoreBlock(const T* q, int64_t ldq, const T* panel, int64_t depth, float* s,
                       int64_t lds) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < depth; ++d) {
    Vec<T> k[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) k[v] = LoadVec(panel + d * kPanel + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Vec<T> b = Broadcast(q + r * ldq + d);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = MulAdd(acc[r][v], k[v], b);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s + r * lds + 16 * v, acc[r][v]);
}

template <int R, typename T>
inline void ScorePanel(int64_t nv, const T* q, int64_t ldq, const T* panel, int64_t depth, float* s,
                       int64_t lds) {
  switch (nv) {
    case 4:
      return ScoreBlock<R, 4>(q, ldq, panel, depth, s, lds);
    case 3:
      return ScoreBlock<R, 3>(q, ldq, panel, depth, s, lds);
    case 2:
      return ScoreBlock<R, 2>(q, ldq, panel, depth, s, lds);
    default:
      return ScoreBlock<R, 1>(q, ldq, panel, depth, s, lds);
  }
}

// S = Q K^T for `rows` queries and `keys` keys (row stride lds): T = float
// (depth features) or uint32_t (depth feature pairs, bfloat16); `kt` is the
// keys' panels, one after another. Panel by panel, so that each stays in L1
// for every row.
template <typename T>
inline void Scores(const T* q, int64_t ldq, const T* kt, int64_t depth, int64_t rows, int64_t keys,
                   float* s, int64_t lds) {
  for (int64_t c = 0; c < keys; c += kPanel) {
    const T* panel = kt + c / kPanel * depth * kPanel;
    const int64_t nv = std::min<int64_t>(4, (keys - c + 15) / 16);
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
      ScorePanel<4>(nv, q + r * ldq, ldq, panel, depth, s + r * lds + c, lds);
    for (; r < rows; ++r) ScorePanel<1>(nv, q + r * ldq, ldq, panel, depth, s + r * lds + c, lds);
  }
}

// o[r][16w + i] += sum_j p[r][j] * v[j][16w + i] for R rows and NV vectors of
// features: T = float (j over keys) or uint32_t (j over key pairs, bfloat16
// dot products). v's rows are zero-padded to whole vectors; o has whole
// vectors per row.
template <int R, int NV, typename T>
inline void ContextBlock(const T* p, int64_t ldp, const T* v, int64_t ldv, int64_t keys, float* o,
                         int64_t ldo) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) acc[r][w] = _mm512_loadu_ps(o + r * ldo + 16 * w);
  for (int64_t j = 0; j < keys; ++j) {
    Vec<T> x[NV];
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) x[w] = LoadVec(v + j * ldv + 16 * w);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Vec<T> b = Broadcast(p + r * ldp + j);
#pragma GCC unroll 16
      for (int w = 0; w < NV; ++w) acc[r][w] = MulAdd(acc[r][w], x[w], b);
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
    switch ((std::min<int64_t>(depth - d0, 64) + 15) / 16) {
      case 4:
        ContextBlock<R, 4>(p, ldp, v + d0, ldv, keys, o + d0, ldo);
        break;
      case 3:
        ContextBlock<R, 3>(p, ldp, v + d0, ldv, keys, o + d0, ldo);
        break;
      case 2:
        ContextBlock<R, 2>(p, ldp, v + d0, ldv, keys, o + d0, ldo);
        break;
      default:
        ContextBlock<R, 1>(p, ldp, v + d0, ldv, keys, o + d0, ldo);
    }
  }
}

// O += P V for `rows` x `keys` probabilities and `depth` features: T = float
// or uint32_t (`keys` key pairs, bfloat16). A chunk of keys at a time, so that
// its rows of V stay in L1 for every row of P; 8 rows at a time for heads of
// up to 32 features (16 accumulators), else 4.
template <typename T>
inline void Context(const T* p, int64_t ldp, const T* v, int64_t ldv, int64_t rows, int64_t keys,
                    int64_t depth, float* o, int64_t ldo) {
  constexpr int64_t kChunk = 64;
  for (int64_t c = 0; c < keys; c += kChunk) {
    const int64_t n = std::min(kChunk, keys - c);
    const T* pc = p + c;
    const T* vc = v + c * ldv;
    int64_t r = 0;
    if (depth <= 32) {
      for (; r + 8 <= rows; r += 8)
        ContextRows<8>(pc + r * ldp, ldp, vc, ldv, n, depth, o + r * ldo, ldo);
    }
    for (; r + 4 <= rows; r += 4)
      ContextRows<4>(pc + r * ldp, ldp, vc, ldv, n, depth, o + r * ldo, ldo);
    for (; r < rows; ++r) ContextRows<1>(pc + r * ldp, ldp, vc, ldv, n, depth, o + r * ldo, ldo);
  }
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
