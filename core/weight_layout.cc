#include "core/weight_layout.h"

#include "core/primitive_cache.h"

namespace attention {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

dnnl::memory::desc PreferredWeights(int64_t in, int64_t out, dt weights, dt src, dt dst) {
  constexpr int64_t kRows = 128;  // A representative batch of tokens.
  const dnnl::memory::desc src_md({kRows, in}, src, dims{in, 1});
  const dnnl::memory::desc any_md({in, out}, weights, dnnl::memory::format_tag::any);
  const dnnl::memory::desc dst_md({kRows, out}, dst, dims{out, 1});
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, any_md, dst_md), CpuEngine())
      .weights_desc();
}

bool ThirdsOf(const dnnl::memory::desc& qkv, const dnnl::memory::desc& part, int64_t e) {
  const size_t elem = dnnl::memory::data_type_size(part.data_type());
  if (qkv.get_size() != 3 * part.get_size()) return false;
  for (int64_t j = 0; j < 3; ++j) {
    dnnl::memory::desc sub;
    try {
      sub = qkv.submemory_desc({e, e}, {0, j * e});
    } catch (const dnnl::error&) {
      return false;  // Not on a block boundary.
    }
    if (static_cast<size_t>(sub.data.offset0) * elem != static_cast<size_t>(j) * part.get_size()) {
      return false;
    }
    sub.data.offset0 = 0;
    if (!(sub == part)) return false;
  }
  return true;
}

void ReorderTransposed(const float* w, int64_t out, int64_t in, float scale,
                       const dnnl::memory::desc& to, void* dst) {
  // W (out, in) row-major is W^T (in, out) with strides {1, in}.
  const dnnl::memory::desc from_md({in, out}, dt::f32, dims{1, in});
  dnnl::memory from = Wrap(from_md, w), into = Wrap(to, dst);
  dnnl::primitive_attr attr;
  if (scale != 1.0f) attr.set_output_scales(0, {scale});
  dnnl::stream stream(CpuEngine());
  dnnl::reorder(dnnl::reorder::primitive_desc(from, into, attr)).execute(stream, from, into);
  stream.wait();
}

}  // namespace attention
