// File: core/sdpa.h
//
// Plain scaled dot-product attention on already projected heads, with the
// same masks, options and fully-masked-row rule as MhaEngine:
//   out = softmax(scale * q k^T + mask) v
// Safe to call from several threads at once (the cache is thread-safe).
#ifndef ATTENTION_CORE_SDPA_H_
#define ATTENTION_CORE_SDPA_H_

#include <optional>

#include "absl/status/statusor.h"
#include "core/attention_kernel.h"
#include "core/primitive_cache.h"
#include "core/tensor.h"

namespace attention {

// Plain scaled dot-product attention on already projected heads.
struct SdpaInputs {
  TensorView q;                                // (N, H, L, D)
  TensorView k;                                // (N, H, S, D)
  TensorView v;                                // (N, H, S, Dv)
  std::optional<TensorView> key_padding_mask;  // (N, S), as in MhaInputs.
  std::optional<TensorView> attn_mask;         // (L, S) or (N*H, L, S).
  bool is_causal = false;
  std::optional<float> scale;             // Default 1/sqrt(D).
  DType compute_dtype = DType::kFloat32;  // float32 or bfloat16.
  std::optional<DType> output_dtype;      // Default: q's dtype.
};
// Returns (N, H, L, Dv) in output_dtype. InvalidArgument naming the tensor,
// the expected and the actual shape or dtype for bad inputs; Internal if
// oneDNN fails. Primitives are created in, and reused from, `cache`.
absl::StatusOr<Tensor> ScaledDotProductAttention(const SdpaInputs& inputs, PrimitiveCache& cache,
                                                 const KernelOptions& options = {});

}  // namespace attention

#endif  // ATTENTION_CORE_SDPA_H_
