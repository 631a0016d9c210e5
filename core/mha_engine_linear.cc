// MhaEngine's projections: y = x W^T + bias (Linear) with the weights packed
// at Create (mha_engine_prepare.cc), by oneDNN matmul with the calling
// thread's bound call (core/bound_call.h) or by QuantizedLinear for int8
// weights. The rest of the forward pass is in mha_engine.cc.
#include <omp.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "core/bound_call.h"
#include "core/mha_engine.h"
#include "core/status_macros.h"

namespace attention {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

}  // namespace

absl::Status MhaEngine::Linear(const Projection& proj, const void* x, DType x_dtype,
                               int64_t batches, int64_t rows, void* y, DType dst_dtype,
                               int64_t dst_block_stride) const {
  if (proj.quantized != nullptr) {
    const int64_t block = dst_block_stride > 0 ? dst_block_stride : rows * proj.out;
    const int64_t x_size = static_cast<int64_t>(DTypeSize(x_dtype));
    const int64_t y_size = static_cast<int64_t>(DTypeSize(dst_dtype));
    // One call over every row when the blocks are dense, else one per block.
    const bool dense = block == rows * proj.out;
    for (int64_t b = 0; b < (dense ? 1 : batches); ++b) {
      RowsOut out{static_cast<char*>(y) + b * block * y_size, dst_dtype, proj.out};
      RETURN_IF_ERROR(proj.quantized->Run(static_cast<const char*>(x) + b * rows * proj.in * x_size,
                                          x_dtype, dense ? batches * rows : rows, proj.in, out,
                                          cache_));
    }
    return absl::OkStatus();
  }
  const dt ct = ToDnnl(compute_);
  const dt dst_dt = ToDnnl(dst_dtype);
  // One dense GEMM over every row, or (K and V with appended keys: blocks
  // written with a stride) one per block: brgemm reads packed weights in
  // 2-D calls only.
  const int64_t block = dst_block_stride > 0 ? dst_block_stride : rows * proj.out;
  const bool dense = block == rows * proj.out;
  const int64_t m = dense ? batches * rows : rows;
  // Everything the primitive and its descriptors depend on (see BoundCall).
  const BoundCallKey call_key = {reinterpret_cast<int64_t>(&proj),
                                 reinterpret_cast<int64_t>(proj.packed),
                                 proj.in,
                                 proj.out,
                                 static_cast<int64_t>(ct),
                                 static_cast<int64_t>(dst_dt),
                                 1,
                                 m,
                                 0,
                                 proj.bias != nullptr,
                                 omp_get_max_threads(),
                                 true};
  // Found (or made) for each block: a call holds its primitive for one run.
  auto bind = [&]() -> absl::StatusOr<BoundCall*> {
    BoundCall* call = BoundCall::Find(call_key);
    if (call != nullptr) return call;
    const dnnl::memory::desc src_md({m, proj.in}, ct, dims{proj.in, 1});
    const dnnl::memory::desc& w_md = proj.packed_md;
    const dnnl::memory::desc b_md({1, proj.out}, dt::f32, dims{proj.out, 1});
    const dnnl::memory::desc dst_md({m, proj.out}, dst_dt, dims{proj.out, 1});
    std::string key = absl::StrCat("linear", reinterpret_cast<uintptr_t>(proj.packed));
    AppendMdKey(w_md, &key);
    AppendMdKey(src_md, &key);
    AppendMdKey(dst_md, &key);
    absl::StrAppend(&key, proj.bias != nullptr ? "b" : "");
    ASSIGN_OR_RETURN(
        auto prim, (cache_.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>(key, [&] {
          dnnl::primitive_attr attr;
          attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
          auto desc = proj.bias != nullptr ? dnnl::matmul::desc(src_md, w_md, b_md, dst_md)
                                           : dnnl::matmul::desc(src_md, w_md, dst_md);
          return dnnl::matmul::primitive_desc(desc, attr, CpuEngine());
        })));
    if (proj.bias != nullptr) {
      return BoundCall::Insert(call_key, std::move(prim),
                               {{DNNL_ARG_SRC, src_md},
                                {DNNL_ARG_WEIGHTS, w_md},
                                {DNNL_ARG_BIAS, b_md},
                                {DNNL_ARG_DST, dst_md}});
    }
    return BoundCall::Insert(
        call_key, std::move(prim),
        {{DNNL_ARG_SRC, src_md}, {DNNL_ARG_WEIGHTS, w_md}, {DNNL_ARG_DST, dst_md}});
  };
  const size_t x_size = DTypeSize(compute_), y_size = DTypeSize(dst_dtype);
  for (int64_t b = 0; b < (dense ? 1 : batches); ++b) {
    ASSIGN_OR_RETURN(BoundCall * call, bind());
    call->Set(DNNL_ARG_WEIGHTS, proj.packed);
    if (proj.bias != nullptr) call->Set(DNNL_ARG_BIAS, proj.bias);
    call->Set(DNNL_ARG_SRC, static_cast<const char*>(x) + b * rows * proj.in * x_size);
    call->Set(DNNL_ARG_DST, static_cast<char*>(y) + b * block * y_size);
    RETURN_IF_ERROR(call->Execute());
  }
  return absl::OkStatus();
}

}  // namespace attention
