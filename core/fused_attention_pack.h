// File: core/fused_attention_pack.h
//
// Internal to the fused attention kernel (fused_attention.cc): reading one
// head's rows, and packing an item's keys and values into the layouts the
// kernel's tiles read. Compiled with the kernel's AVX-512 flags and called
// only after its run-time CPU check. Stateless; thread-safe.
#ifndef ATTENTION_CORE_FUSED_ATTENTION_PACK_H_
#define ATTENTION_CORE_FUSED_ATTENTION_PACK_H_

#include <cstdint>

#include "core/fused_attention.h"
#include "core/tensor.h"

namespace attention::fused_internal {

inline const char* Element(const HeadsView& t, int64_t n, int64_t h, int64_t row) {
  return static_cast<const char*>(t.data) + (n * t.stride_n + h * t.stride_h + row * t.stride_t) *
                                                static_cast<int64_t>(DTypeSize(t.dtype));
}

// `count` values of float32 or bfloat16 `src` as float32 times `scale`.
inline void LoadRow(DType dtype, const char* src, int64_t count, float scale, float* dst) {
  if (dtype == DType::kFloat32) {
    const float* f = reinterpret_cast<const float*>(src);
    for (int64_t i = 0; i < count; ++i) dst[i] = f[i] * scale;
  } else {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < count; ++i) dst[i] = BFloat16ToFloat(b[i]) * scale;
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

}  // namespace attention::fused_internal

#endif  // ATTENTION_CORE_FUSED_ATTENTION_PACK_H_
