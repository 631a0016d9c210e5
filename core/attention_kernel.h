// File: core/attention_kernel.h
//
// Scaled dot-product attention over per-head views, built from oneDNN
// primitives: a 4-D strided matmul for Q K^T (heads read in place, no
// transpose copies) with the additive mask as a binary post-op, softmax on
// the last axis, and a 4-D matmul with V writing the context in place.
//
// Query rows are processed in blocks sized so that one block's scores stay
// within a memory budget: the (L, S) score matrix of a head is never
// materialised whole, so memory grows with L (and S), not L * S. When even
// one query row of every batch item exceeds the budget (many items, long
// keys), items are processed a chunk at a time as well, so the budget holds
// down to one row of one item (H * S' * 4 bytes). Each block's softmax is
// exact over all keys (no online rescaling needed).
//
// A query row whose keys are all masked (every score -inf) gets zero
// attention weights and a zero context (PyTorch >= 2.5's SDPA behaviour).
// NaN propagates as in PyTorch: a row with a NaN score (a NaN or infinite
// query, key or float mask entry; masks and the causal mask are added, so a
// masked NaN key counts) is NaN, weights included; a NaN value makes the
// context NaN through 0 * NaN.
//
// RunAttention is safe to call from several threads at once with distinct
// outputs: it only reads the shared PrimitiveCache.
#ifndef ATTENTION_CORE_ATTENTION_KERNEL_H_
#define ATTENTION_CORE_ATTENTION_KERNEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/attention_mask.h"
#include "core/dtype.h"
#include "core/primitive_cache.h"

namespace attention {

// A (N, H, T, D) view with a contiguous last dimension; strides in elements.
struct HeadsView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;  // float32 or bfloat16.
  int64_t n = 0, h = 0, t = 0, d = 0;
  int64_t stride_n = 0, stride_h = 0, stride_t = 0;
};

// A (n, h, t, d) view of `data` with the given element strides.
HeadsView MakeHeadsView(const void* data, DType dtype, int64_t n, int64_t h, int64_t t, int64_t d,
                        int64_t stride_n, int64_t stride_h, int64_t stride_t);

struct AttentionProblem {
  HeadsView q;                      // (N, H, L, D)
  HeadsView k;                      // (N, H, S', D), S' = keys + extra keys.
  HeadsView v;                      // (N, H, S', D)
  HeadsView out;                    // (N, H, L, D), written; same dtype as q.
  const MaskPlan* masks = nullptr;  // One ItemMask per batch item.
  float scale = 1.0f;               // Applied to Q K^T.
  // Optional attention probabilities, float32: (N, L, S') averaged over heads
  // or (N, H, L, S') per head.
  float* weights = nullptr;
  bool average_weights = true;
};

struct KernelOptions {
  // Upper bound on one block's float32 scores (N * H * rows * S' * 4 bytes).
  // 32 MiB measured fastest on the goal shapes here (fewer, larger primitive
  // calls) while still bounding memory for long sequences.
  int64_t score_block_bytes = 32 << 20;
  // Calls without attention weights run the fused kernel (fused_attention.h)
  // where the CPU has it; false forces the oneDNN-primitive path.
  bool allow_fused = true;
};

// Computes softmax(scale * Q K^T + mask) V into problem.out. Internal if
// oneDNN fails; the views are trusted (validated by the caller).
absl::Status RunAttention(const AttentionProblem& problem, const KernelOptions& options,
                          PrimitiveCache& cache);

// The oneDNN data type of a compute dtype.
dnnl::memory::data_type ToDnnl(DType dtype);

}  // namespace attention

#endif  // ATTENTION_CORE_ATTENTION_KERNEL_H_
