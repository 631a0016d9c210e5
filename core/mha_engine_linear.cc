// MhaEngine's projections: the weights packed once into oneDNN's preferred
// layout (Pack) and y = x W^T + bias (Linear), by oneDNN matmul with the
// calling thread's bound call (core/bound_call.h) or by QuantizedLinear for
// int8 weights. The rest of the forward pass is in mha_engine.cc.
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

void MhaEngine::Pack(Projection* proj, DType dst_dtype, std::vector<Tensor>* storage) {
  // Ask oneDNN which weights layout its matmul prefers (bfloat16 brgemm wants
  // VNNI-blocked weights and would otherwise repack them on every call) and
  // reorder the weights into it once. Any failure keeps the plain layout.
  try {
    const dt ct = ToDnnl(compute_);
    constexpr int64_t kRows = 128;  // A representative batch of tokens.
    const dnnl::memory::desc src_md({kRows, proj->in}, ct, dims{proj->in, 1});
    const dnnl::memory::desc any_md({proj->in, proj->out}, ct, dnnl::memory::format_tag::any);
    const dnnl::memory::desc dst_md({kRows, proj->out}, ToDnnl(dst_dtype), dims{proj->out, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, any_md, dst_md), CpuEngine());
    const dnnl::memory::desc packed = pd.weights_desc();
    const dnnl::memory::desc plain({proj->in, proj->out}, ct, dims{proj->out, 1});
    if (packed == plain) return;
    Tensor buffer(DType::kBFloat16, {static_cast<int64_t>((packed.get_size() + 1) / 2)});
    dnnl::stream stream(CpuEngine());
    dnnl::memory from = Wrap(plain, proj->weight), to = Wrap(packed, buffer.data());
    dnnl::reorder(from, to).execute(stream, from, to);
    stream.wait();
    proj->packed_md = packed;
    proj->packed = buffer.data();
    storage->push_back(std::move(buffer));
  } catch (const dnnl::error&) {
    proj->packed = nullptr;
  }
}

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
  // The common case: one dense GEMM with the prepacked weights. Otherwise
  // blocks of rows written with a stride (K and V with appended keys).
  const bool packed = batches == 1 && proj.packed != nullptr;
  const int64_t block = dst_block_stride > 0 ? dst_block_stride : rows * proj.out;
  const void* weights = packed ? proj.packed : proj.weight;
  // Everything the primitive and its descriptors depend on (see BoundCall).
  const BoundCallKey call_key = {reinterpret_cast<int64_t>(&proj),
                                 reinterpret_cast<int64_t>(weights),
                                 proj.in,
                                 proj.out,
                                 static_cast<int64_t>(ct),
                                 static_cast<int64_t>(dst_dt),
                                 packed ? 1 : batches,
                                 rows,
                                 packed ? 0 : block,
                                 proj.bias != nullptr,
                                 omp_get_max_threads(),
                                 packed};
  BoundCall* call = BoundCall::Find(call_key);
  if (call == nullptr) {
    dnnl::memory::desc src_md, w_md, b_md, dst_md;
    std::string key = "linear";
    if (packed) {
      src_md = dnnl::memory::desc({rows, proj.in}, ct, dims{proj.in, 1});
      w_md = proj.packed_md;
      b_md = dnnl::memory::desc({1, proj.out}, dt::f32, dims{proj.out, 1});
      dst_md = dnnl::memory::desc({rows, proj.out}, dst_dt, dims{proj.out, 1});
      absl::StrAppend(&key, "packed", reinterpret_cast<uintptr_t>(proj.packed));
    } else {
      src_md = dnnl::memory::desc({batches, rows, proj.in}, ct, dims{rows * proj.in, proj.in, 1});
      w_md = dnnl::memory::desc({1, proj.in, proj.out}, ct, dims{proj.in * proj.out, proj.out, 1});
      b_md = dnnl::memory::desc({1, 1, proj.out}, dt::f32, dims{proj.out, proj.out, 1});
      dst_md = dnnl::memory::desc({batches, rows, proj.out}, dst_dt, dims{block, proj.out, 1});
      AppendMdKey(w_md, &key);
    }
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
      call = BoundCall::Insert(call_key, std::move(prim),
                               {{DNNL_ARG_SRC, src_md},
                                {DNNL_ARG_WEIGHTS, w_md},
                                {DNNL_ARG_BIAS, b_md},
                                {DNNL_ARG_DST, dst_md}});
    } else {
      call = BoundCall::Insert(
          call_key, std::move(prim),
          {{DNNL_ARG_SRC, src_md}, {DNNL_ARG_WEIGHTS, w_md}, {DNNL_ARG_DST, dst_md}});
    }
  }
  call->Set(DNNL_ARG_SRC, x);
  call->Set(DNNL_ARG_WEIGHTS, weights);
  call->Set(DNNL_ARG_DST, y);
  if (proj.bias != nullptr) call->Set(DNNL_ARG_BIAS, proj.bias);
  return call->Execute();
}

}  // namespace attention
