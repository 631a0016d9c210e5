#include "core/quantized_linear.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/weight_layout.h"
#include "core/workspace.h"

namespace attention {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

// The int32 block of one matmul call stays about this size.
constexpr int64_t kChunkBytes = int64_t{4} << 20;

int64_t Align64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

absl::StatusOr<std::unique_ptr<QuantizedLinear>> QuantizedLinear::Create(const float* w_t,
                                                                         int64_t in, int64_t out,
                                                                         const float* bias) {
  std::unique_ptr<QuantizedLinear> q(new QuantizedLinear(in, out));
  q->w_scale_.assign(static_cast<size_t>(out), 0.0f);
  q->col_sum_.assign(static_cast<size_t>(out), 0.0f);
  for (int64_t k = 0; k < in; ++k) {
    for (int64_t n = 0; n < out; ++n) {
      q->w_scale_[n] = std::max(q->w_scale_[n], std::abs(w_t[k * out + n]));
    }
  }
  for (float& s : q->w_scale_) s = s == 0.0f ? 1.0f : s / 127.0f;
  std::vector<int8_t> plain(static_cast<size_t>(in * out));
  for (int64_t k = 0; k < in; ++k) {
    for (int64_t n = 0; n < out; ++n) {
      const float v =
          std::clamp(std::nearbyint(w_t[k * out + n] / q->w_scale_[n]), -127.0f, 127.0f);
      plain[k * out + n] = static_cast<int8_t>(v);
      q->col_sum_[n] += v;
    }
  }
  if (bias != nullptr) q->bias_.assign(bias, bias + out);
  // The weights layout oneDNN's u8 x s8 matmul prefers (VNNI-blocked),
  // reordered into once.
  try {
    q->packed_md_ = PreferredWeights(in, out, dt::s8, dt::u8, dt::s32);
    auto storage = std::make_shared<AlignedBuffer>(q->packed_md_.get_size());
    q->packed_ = storage->data();
    q->storage_ = std::move(storage);
    const dnnl::memory::desc plain_md({in, out}, dt::s8, dims{out, 1});
    dnnl::stream stream(CpuEngine());
    dnnl::memory from = Wrap(plain_md, plain.data()), to = Wrap(q->packed_md_, q->packed_);
    dnnl::reorder(from, to).execute(stream, from, to);
    stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("QuantizedLinear: oneDNN: ", e.what()));
  }
  return q;
}

std::unique_ptr<QuantizedLinear> QuantizedLinear::Third(int64_t j) const {
  if (out_ % 3 != 0 || j < 0 || j >= 3) return nullptr;
  const int64_t cols = out_ / 3;
  const dnnl::memory::desc part = PreferredWeights(in_, cols, dt::s8, dt::u8, dt::s32);
  if (!ThirdsOf(packed_md_, part, cols) || in_ != cols) return nullptr;
  std::unique_ptr<QuantizedLinear> q(new QuantizedLinear(in_, cols));
  q->storage_ = storage_;
  q->packed_ = static_cast<const char*>(packed_) + j * part.get_size();
  q->owns_storage_ = false;
  q->packed_md_ = part;
  auto slice = [&](const std::vector<float>& v) {
    return v.empty() ? v : std::vector<float>(v.begin() + j * cols, v.begin() + (j + 1) * cols);
  };
  q->w_scale_ = slice(w_scale_);
  q->col_sum_ = slice(col_sum_);
  q->bias_ = slice(bias_);
  return q;
}

int64_t QuantizedLinear::resident_bytes() const {
  const int64_t vectors =
      static_cast<int64_t>((w_scale_.size() + col_sum_.size() + bias_.size()) * sizeof(float));
  return vectors + (owns_storage_ ? static_cast<int64_t>(packed_md_.get_size()) : 0);
}

int64_t QuantizedLinear::EstimateResidentBytes(int64_t in, int64_t out, bool bias) {
  return static_cast<int64_t>(PreferredWeights(in, out, dt::s8, dt::u8, dt::s32).get_size()) +
         (bias ? 3 : 2) * out * static_cast<int64_t>(sizeof(float));
}

int64_t QuantizedLinear::ChunkRows(int64_t rows) const {
  return std::min(rows, std::max<int64_t>(16, kChunkBytes / (out_ * 4)));
}

int64_t QuantizedLinear::WorkingBytes(int64_t rows) const {
  return Align64(rows * in_) + 2 * Align64(rows * 4) + ChunkRows(rows) * out_ * 4;
}

absl::Status QuantizedLinear::Run(const void* x, DType x_dtype, int64_t rows, int64_t x_ld,
                                  const RowsOut& out, PrimitiveCache& cache) const {
  if (rows == 0) return absl::OkStatus();
  Workspace quantized(Workspace::kQuantizedInput,
                      static_cast<size_t>(Align64(rows * in_) + 2 * Align64(rows * 4)));
  uint8_t* q = quantized.as<uint8_t>();
  float* scale = reinterpret_cast<float*>(q + Align64(rows * in_));
  float* zero_point = reinterpret_cast<float*>(reinterpret_cast<char*>(scale) + Align64(rows * 4));
  QuantizeRows(x, x_dtype, rows, in_, x_ld, q, scale, zero_point);

  const int64_t chunk = ChunkRows(rows);
  Workspace acc(Workspace::kQuantizedAccumulators, static_cast<size_t>(chunk * out_ * 4));
  const int64_t out_size = static_cast<int64_t>(DTypeSize(out.dtype));
  for (int64_t m0 = 0; m0 < rows; m0 += chunk) {
    const int64_t m = std::min(chunk, rows - m0);
    const dnnl::memory::desc src_md({m, in_}, dt::u8, dims{in_, 1});
    const dnnl::memory::desc dst_md({m, out_}, dt::s32, dims{out_, 1});
    std::string key = absl::StrCat("int8", reinterpret_cast<uintptr_t>(packed_), "x", out_);
    AppendMdKey(src_md, &key);
    AppendMdKey(dst_md, &key);
    ASSIGN_OR_RETURN(auto prim,
                     (cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>(key, [&] {
                       dnnl::primitive_attr attr;
                       attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
                       return dnnl::matmul::primitive_desc(
                           dnnl::matmul::desc(src_md, packed_md_, dst_md), attr, CpuEngine());
                     })));
    RETURN_IF_ERROR(Execute(*prim, {{DNNL_ARG_SRC, Wrap(src_md, q + m0 * in_)},
                                    {DNNL_ARG_WEIGHTS, Wrap(packed_md_, packed_)},
                                    {DNNL_ARG_DST, Wrap(dst_md, acc.data())}}));
    RowsOut block = out;
    block.y = static_cast<char*>(out.y) + m0 * out.ld * out_size;
    DequantizeRows(acc.as<int32_t>(), m, out_, scale + m0, zero_point + m0, w_scale_.data(),
                   col_sum_.data(), bias_.empty() ? nullptr : bias_.data(), block);
  }
  return absl::OkStatus();
}

}  // namespace attention
