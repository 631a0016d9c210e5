// Compiled with AVX-512 flags (core/CMakeLists.txt); see session_decode.h.
#include "core/session_decode.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/avx512_tiles.h"
#include "core/fused_softmax.h"

namespace attention {
namespace {

constexpr int64_t kB = KvCache::kBlockTokens;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;

inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
// bfloat16 widened exactly: its bits are a float32's upper half.
inline __m512 Load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The block's scores in log2 units, s2 (lanes past the range -inf), have one
// above m + kSlack, a NaN or a +inf, or m is -inf: marks NaN and +inf lanes
// bad (the head falls back to the reference kernel) and treats them as -inf;
// moves m up to the block's maximum rounded up to a whole number (so that
// rescaling by 2^(m_old - m_new) is exact) when it exceeds m + kSlack, and
// rescales the sums and context. Returns s2 - m.
template <int NV>
__attribute__((noinline)) __m512 MoveReference(__m512 s2, float* st, int64_t d, __m512 (&acc)[NV],
                                               __m512& sum) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  const __mmask16 odd = _mm512_cmp_ps_mask(s2, s2, _CMP_UNORD_Q) |
                        _mm512_cmp_ps_mask(s2, _mm512_set1_ps(-kNegInf), _CMP_EQ_OQ);
  if (odd != 0) {
    st[d + kDecodeBadAt] = 1.0f;
    s2 = _mm512_mask_mov_ps(s2, odd, neg_inf);
  }
  float& m = st[d + kDecodeMaxAt];
  const float top = _mm512_reduce_max_ps(s2);
  if (top != kNegInf && (m == kNegInf || top > m + fused_internal::kSlack)) {
    const float m_new = std::ceil(top);
    // While m was -inf only zero probabilities (and 0 x V) were added:
    // nothing to rescale then.
    if (m != kNegInf) {
      const __m512 k = _mm512_set1_ps(m - m_new);
      sum = _mm512_scalef_ps(sum, k);
#pragma GCC unroll 8
      for (int w = 0; w < NV; ++w) acc[w] = _mm512_scalef_ps(acc[w], k);
    }
    m = m_new;
  }
  if (m == kNegInf) return neg_inf;  // Every score so far -inf: probabilities 0.
  return _mm512_sub_ps(s2, _mm512_set1_ps(m));
}

template <typename T, int NV>
void Walk(const DecodeRange& r, int64_t prefetch, int hint) {
  constexpr int64_t d = 16 * NV;
  const KvCache& cache = *r.cache;
  const int64_t heads = cache.heads(), stride = DecodePartialStride(d);
  const float* key_bias = cache.key_bias();
  for (int64_t h = 0; h < heads; ++h) {
    float* st = r.partial + h * stride;
    std::fill(st, st + stride, 0.0f);
    st[d + kDecodeMaxAt] = kNegInf;
  }
  if (r.end <= r.begin) return;
  const int64_t b0 = r.begin / kB, b1 = (r.end + kB - 1) / kB;
  const int64_t plane_bytes = 2 * d * kB * static_cast<int64_t>(sizeof(T));
  const int64_t last_plane = b1 * heads;
  const __m512 log2e = _mm512_set1_ps(kLog2e), slack = _mm512_set1_ps(fused_internal::kSlack);
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n = std::min(kB, r.end - b * kB);
    const __mmask16 valid = avx512::TailMask(n);
    // The keys' additive biases (-inf: not a key), -inf past the range.
    const __m512 bias = _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), valid, key_bias + b * kB);
    // Head h's planes follow one another in the block (KvCache's layout);
    // blocks lie anywhere in the pool, so a plane ahead is found by its block.
    const char* block = static_cast<const char*>(cache.Keys(b, 0));
    const char* ahead_block = nullptr;
    int64_t ahead_b = -1;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t ahead = b * heads + h + prefetch;
      if (prefetch > 0 && ahead < last_plane) {
        if (ahead / heads != ahead_b) {
          ahead_b = ahead / heads;
          ahead_block = static_cast<const char*>(cache.Keys(ahead_b, 0));
        }
        const char* p = ahead_block + (ahead % heads) * plane_bytes;
        switch (hint) {
          case 1:
            for (int64_t at = 0; at < plane_bytes; at += 64) _mm_prefetch(p + at, _MM_HINT_T1);
            break;
          case 2:
            for (int64_t at = 0; at < plane_bytes; at += 64) _mm_prefetch(p + at, _MM_HINT_NTA);
            break;
          default:
            for (int64_t at = 0; at < plane_bytes; at += 64) _mm_prefetch(p + at, _MM_HINT_T0);
        }
      }
      const T* kt = reinterpret_cast<const T*>(block + h * plane_bytes);
      const T* v = kt + d * kB;
      const float* q = r.q + h * d;
      float* st = r.partial + h * stride;
      // Scores: four chains over the features.
      __m512 s4[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                      _mm512_setzero_ps()};
#pragma GCC unroll 16
      for (int64_t j = 0; j < d; j += 4) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          s4[u] = _mm512_fmadd_ps(_mm512_set1_ps(q[j + u]), Load16(kt + (j + u) * kB), s4[u]);
        }
      }
      __m512 s = _mm512_add_ps(_mm512_add_ps(s4[0], s4[1]), _mm512_add_ps(s4[2], s4[3]));
      s = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), valid, _mm512_add_ps(s, bias));
      __m512 acc[NV];
#pragma GCC unroll 8
      for (int w = 0; w < NV; ++w) acc[w] = _mm512_load_ps(st + 16 * w);
      __m512 sum = _mm512_load_ps(st + d + kDecodeSumAt);
      __m512 x = _mm512_fmsub_ps(s, log2e, _mm512_set1_ps(st[d + kDecodeMaxAt]));
      if (_mm512_cmp_ps_mask(x, slack, _CMP_NLE_UQ) != 0) {
        x = MoveReference<NV>(_mm512_mul_ps(s, log2e), st, d, acc, sum);
      }
      const __m512 p = avx512::Exp2<5>(x);
      _mm512_store_ps(st + d + kDecodeSumAt, _mm512_add_ps(sum, p));
      alignas(64) float pt[kB];
      _mm512_store_ps(pt, p);
      // P.V over the keys in range (masked ones too: 0 x a NaN value is
      // NaN, as in the reference); two sets of accumulators, even and odd keys.
      __m512 odd[NV];
#pragma GCC unroll 8
      for (int w = 0; w < NV; ++w) odd[w] = _mm512_setzero_ps();
      if (n == kB) {
#pragma GCC unroll 16
        for (int64_t t = 0; t < kB; t += 2) {
          const __m512 pe = _mm512_set1_ps(pt[t]), po = _mm512_set1_ps(pt[t + 1]);
#pragma GCC unroll 8
          for (int w = 0; w < NV; ++w) {
            acc[w] = _mm512_fmadd_ps(pe, Load16(v + t * d + 16 * w), acc[w]);
            odd[w] = _mm512_fmadd_ps(po, Load16(v + (t + 1) * d + 16 * w), odd[w]);
          }
        }
      } else {
        for (int64_t t = 0; t < n; ++t) {
          const __m512 pe = _mm512_set1_ps(pt[t]);
#pragma GCC unroll 8
          for (int w = 0; w < NV; ++w)
            acc[w] = _mm512_fmadd_ps(pe, Load16(v + t * d + 16 * w), acc[w]);
        }
      }
#pragma GCC unroll 8
      for (int w = 0; w < NV; ++w) _mm512_store_ps(st + 16 * w, _mm512_add_ps(acc[w], odd[w]));
    }
  }
}

template <typename T>
void WalkFor(const DecodeRange& r, int64_t prefetch, int hint) {
  switch (r.cache->head_dim() / 16) {
    case 1:
      return Walk<T, 1>(r, prefetch, hint);
    case 2:
      return Walk<T, 2>(r, prefetch, hint);
    case 3:
      return Walk<T, 3>(r, prefetch, hint);
    case 4:
      return Walk<T, 4>(r, prefetch, hint);
    case 5:
      return Walk<T, 5>(r, prefetch, hint);
    case 6:
      return Walk<T, 6>(r, prefetch, hint);
    case 7:
      return Walk<T, 7>(r, prefetch, hint);
    default:
      return Walk<T, 8>(r, prefetch, hint);
  }
}

}  // namespace

void DecodeRangeAvx512(const DecodeRange& r) {
  const int64_t planes = std::max<int64_t>(0, r.prefetch.planes);
  const int hint = std::clamp(r.prefetch.hint, 0, 2);
  if (r.cache->dtype() == DType::kBFloat16) {
    WalkFor<uint16_t>(r, planes, hint);
  } else {
    WalkFor<float>(r, planes, hint);
  }
}

}  // namespace attention
