// File: core/fused_attention_pack.h
//
// Internal to the fused attention kernel (fused_attention.cc): reading and
// writing one head's rows, and packing an item's keys and values into the layouts the
// kernel's tiles read. Compiled with the kernel's AVX-512 flags and called
// only after its run-time CPU check. Stateless; thread-safe.
#ifndef ATTENTION_CORE_FUSED_ATTENTION_PACK_H_
#define ATTENTION_CORE_FUSED_ATTENTION_PACK_H_

#include <immintrin.h>

#include <cstdint>

#include "core/avx512_tiles.h"
#include "core/fused_attention.h"
#include "core/tensor.h"

namespace attention::fused_internal {

inline const char* Element(const HeadsView& t, int64_t n, int64_t h, int64_t row) {
  return static_cast<const char*>(t.data) + (n * t.stride_n + h * t.stride_h + row * t.stride_t) *
                                                static_cast<int64_t>(DTypeSize(t.dtype));
}

// Asks for the cache lines of `bytes` bytes from `p` ahead of use (`write`:
// about to be written). Rows of one head lie a whole model row apart: too
// far for the hardware's stride prefetch to run ahead of the tiles.
inline void PrefetchBytes(const void* p, int64_t bytes, bool write) {
  if (bytes <= 0) return;
  const char* c = static_cast<const char*>(p);
  const char* last = c + bytes - 1;
  // Stepped by offset: a pointer stepped past one beyond the row's end would
  // be undefined behaviour even though nothing is read there.
  for (int64_t offset = 0; offset < bytes; offset += 64) {
    if (write) {
      __builtin_prefetch(c + offset, 1, 3);
    } else {
      __builtin_prefetch(c + offset, 0, 3);
    }
  }
  // The last line when `p` is not line-aligned.
  if (((reinterpret_cast<uintptr_t>(c) ^ reinterpret_cast<uintptr_t>(last)) & ~uintptr_t{63}) !=
      0) {
    // (Constant arguments: clang rejects `write ? 1 : 0` there.)
    if (write) {
      __builtin_prefetch(last, 1, 3);
    } else {
      __builtin_prefetch(last, 0, 3);
    }
  }
}

// `count` values of float32 or bfloat16 `src` as float32 times `scale`.
inline void LoadRow(DType dtype, const char* src, int64_t count, float scale, float* dst) {
  const __m512 k = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = avx512::TailMask(count - i);
    __m512 x;
    if (dtype == DType::kFloat32) {
      x = _mm512_maskz_loadu_ps(lanes, reinterpret_cast<const float*>(src) + i);
    } else {  // bfloat16: the high half of a float32.
      const __m256i b = _mm256_maskz_loadu_epi16(lanes, reinterpret_cast<const uint16_t*>(src) + i);
      x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
    _mm512_mask_storeu_ps(dst + i, lanes, _mm512_mul_ps(x, k));
  }
}

// `count` float32 values times `scale` into float32 or bfloat16 (rounded to
// nearest even, as FloatToBFloat16) `dst`.
inline void StoreRow(const float* src, int64_t count, float scale, DType dtype, char* dst) {
  const __m512 k = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = avx512::TailMask(count - i);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, src + i), k);
    if (dtype == DType::kFloat32) {
      _mm512_mask_storeu_ps(reinterpret_cast<float*>(dst) + i, lanes, x);
    } else {  // FloatToBFloat16's rounding, in AVX512F/BW integer steps.
      const __m512i u = _mm512_castps_si512(x);
      const __m512i one = _mm512_set1_epi32(1);
      const __m512i rounded = _mm512_srli_epi32(
          _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                               _mm512_and_si512(_mm512_srli_epi32(u, 16), one))),
          16);
      const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      const __m512i bits =
          _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
      _mm256_mask_storeu_epi16(reinterpret_cast<uint16_t*>(dst) + i, lanes,
                               _mm512_cvtepi32_epi16(bits));
    }
  }
}

// K^T of one item and head as float32 panels of avx512::kPanel keys, each
// (D, kPanel) and zero-padded: the first `main_keys` keys' panels, then one
// panel of the appended keys (if any). V as (S', ldq) float32 rows.
void PackFloat32(const AttentionProblem& p, int64_t item, int64_t h, int64_t main_keys, int64_t ldq,
                 float* kt, float* v);

// bfloat16 mode: K^T as panels of words of feature pairs (ceil(D/2),
// kPanel), laid out as in PackFloat32, and V as rows of key pairs (ldq words:
// feature d of keys 2u and 2u + 1), the main `main_keys` keys' pairs first,
// then the appended keys' pairs.
void PackBFloat16(const AttentionProblem& p, int64_t item, int64_t h, int64_t main_keys,
                  int64_t ldq, uint32_t* kt, uint32_t* v);

// True when one of `count` packed words is NaN or infinite: float32 words,
// or (`pairs`) either bfloat16 half of a word.
bool AnyNonFinite(const uint32_t* words, int64_t count, bool pairs);

// True when one of `count` float32 rows `ld` apart holds a NaN or infinity
// in its first `width` values.
bool AnyNonFiniteRows(const float* rows, int64_t count, int64_t ld, int64_t width);

}  // namespace attention::fused_internal

#endif  // ATTENTION_CORE_FUSED_ATTENTION_PACK_H_
