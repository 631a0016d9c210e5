// File: core/quantized_linear.h
//
// A QuantizedLinear is one projection y = x W^T + b run in int8, as
// PyTorch's dynamic quantization and ONNX Runtime's DynamicQuantizeMatMul
// do: the weights are quantized once, per output channel and symmetric
// (wscale[n] = max |W[n, :]| / 127, int8 in [-127, 127]); each call quantizes
// its activations per row (int8_rows.h: u8 with a zero point), multiplies
// u8 x s8 into int32 with oneDNN's int8 matmul (vpdpbusd where the CPU has
// VNNI), and dequantizes into float32 or bfloat16 with the bias added.
//
// The error is the quantization's: about 1/255 of a row's range per input
// value and 1/254 of a column's largest weight per weight, summed over the
// row; MhaEngine's int8 tests bound what it does to a layer's output.
//
// Thread safety: Run() may be called from any number of threads at once
// (primitives come from the shared PrimitiveCache, buffers from the calling
// thread's workspaces). Immutable after Create(); it owns its weights.
#ifndef ATTENTION_CORE_QUANTIZED_LINEAR_H_
#define ATTENTION_CORE_QUANTIZED_LINEAR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/int8_rows.h"
#include "core/primitive_cache.h"
#include "core/tensor.h"

namespace attention {

class QuantizedLinear {
 public:
  // Quantizes W^T, given as `w_t` (in, out) float32 row-major, and keeps the
  // bias (out, float32; null: none). Internal if oneDNN cannot reorder the
  // weights into its int8 layout.
  static absl::StatusOr<std::unique_ptr<QuantizedLinear>> Create(const float* w_t, int64_t in,
                                                                 int64_t out, const float* bias);

  // y = x W^T + b for `rows` rows of x (float32 or bfloat16, `in` values each,
  // row stride x_ld elements): row m of y goes to out.y + m * out.ld elements
  // of out.dtype (float32 or bfloat16). Internal if oneDNN fails.
  absl::Status Run(const void* x, DType x_dtype, int64_t rows, int64_t x_ld, const RowsOut& out,
                   PrimitiveCache& cache) const;

  // Column block j of three (out / 3 columns each, j in [0, 3)) as a
  // projection of its own that shares this one's int8 weights (the caller
  // keeps this one alive while it is used), when oneDNN's layout makes the
  // block a contiguous part of the buffer (weight_layout.h ThirdsOf);
  // nullptr otherwise. Throws dnnl::error.
  std::unique_ptr<QuantizedLinear> Third(int64_t j) const;

  // The bytes Run() takes from the calling thread's workspaces for `rows`
  // rows (oneDNN's scratchpad aside).
  int64_t WorkingBytes(int64_t rows) const;

  // The bytes it keeps: its int8 weights (unless shared from another: Third)
  // and the per-channel vectors.
  int64_t resident_bytes() const;
  // resident_bytes() of a projection of `in` x `out` with or without bias,
  // before building it. Throws dnnl::error.
  static int64_t EstimateResidentBytes(int64_t in, int64_t out, bool bias);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  // The quantized weights' per-channel scales (for tests).
  const std::vector<float>& weight_scales() const { return w_scale_; }

 private:
  QuantizedLinear(int64_t in, int64_t out) : in_(in), out_(out) {}
  // Rows per matmul call: the int32 block stays within a few MiB (cache).
  int64_t ChunkRows(int64_t rows) const;

  const int64_t in_, out_;
  // s8 weights in oneDNN's layout for u8 x s8 matmul: packed_ points into
  // storage_, which a Third() shares with the projection it came from.
  std::shared_ptr<const AlignedBuffer> storage_;
  const void* packed_ = nullptr;
  bool owns_storage_ = true;  // False for a Third().
  dnnl::memory::desc packed_md_;
  std::vector<float> w_scale_;  // (out)
  std::vector<float> col_sum_;  // (out): sum over `in` of the int8 weights.
  std::vector<float> bias_;     // (out) or empty.
};

}  // namespace attention

#endif  // ATTENTION_CORE_QUANTIZED_LINEAR_H_
