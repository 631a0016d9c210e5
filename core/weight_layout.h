// File: core/weight_layout.h
//
// Where a projection's weights live once prepared: the layout oneDNN 2.6's
// matmul reads (brgemm's blocked `BA16a64b`, `BA16a64b2a` for bfloat16,
// `BA16a64b4a` for int8, on AVX-512 machines; plain on others), asked of
// oneDNN rather than assumed, and the reorder that writes a PyTorch (out, in)
// float32 matrix straight into it (transposed, scaled and converted in one
// pass, with no plain copy in between).
//
// A WeightLayout plans the in-projections of a layer: when q, k and v are
// exact thirds of one (E, 3E) buffer in that layout (oneDNN blocks N by 64,
// so E % 64 == 0), the fused q|k|v projection and the three separate ones
// share it; otherwise each has its own buffer and there is no fused one.
//
// Thread-safe: free functions over values; they throw dnnl::error (callers
// in core catch it).
#ifndef ATTENTION_CORE_WEIGHT_LAYOUT_H_
#define ATTENTION_CORE_WEIGHT_LAYOUT_H_

#include <cstdint>

#include "dnnl.hpp"

namespace attention {

// The weights layout matmul prefers for (rows, in) x (in, out) -> (rows, out)
// with the given data types (asked for a representative 128 rows; brgemm
// accepts the same layout for any row count).
dnnl::memory::desc PreferredWeights(int64_t in, int64_t out, dnnl::memory::data_type weights,
                                    dnnl::memory::data_type src, dnnl::memory::data_type dst);

// True when the three (E, E) column blocks of `qkv` (an (E, 3E) layout) are
// each laid out exactly as `part`, one after the other: part j starts at byte
// j * part.get_size() of a qkv buffer.
bool ThirdsOf(const dnnl::memory::desc& qkv, const dnnl::memory::desc& part, int64_t e);

// Writes W^T * scale, W given as (out, in) row-major float32 at `w`, into
// `dst` laid out as `to` ((in, out) in any layout and data type).
void ReorderTransposed(const float* w, int64_t out, int64_t in, float scale,
                       const dnnl::memory::desc& to, void* dst);

}  // namespace attention

#endif  // ATTENTION_CORE_WEIGHT_LAYOUT_H_
