// MhaEngine's weights, prepared once at Create: the float projections
// reordered straight from the model's (out, in) float32 matrices into the
// layout oneDNN's matmul reads (weight_layout.h), q, k and v as thirds of
// the fused projection's buffer where the layout allows; or the int8
// projections quantized (QuantizedLinear). Also what they cost in memory
// (resident_bytes, and its estimate before loading). The forward pass is in
// mha_engine.cc, the projections' calls in mha_engine_linear.cc.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/mha_engine.h"
#include "core/status_macros.h"
#include "core/weight_layout.h"

namespace attention {
namespace {

using dt = dnnl::memory::data_type;

// W (out, in) float32 -> W^T (in, out) * scale, row-major float32 at `dst`
// with `ld` elements between rows (for int8 quantization).
void TransposeF32(const Tensor& w, float scale, float* dst, int64_t ld) {
  const int64_t out = w.dim(0), in = w.dim(1);
  const float* src = w.as<float>();
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) dst[i * ld + o] = src[o * in + i] * scale;
  }
}

int64_t TensorBytes(const Tensor& t) {
  return t.data() == nullptr ? 0 : static_cast<int64_t>(t.num_bytes());
}

// The bytes of the model without its matrices, as MhaModel::WithoutMatrices
// keeps them, and the engine's own copies of the biases.
int64_t BiasBytes(const MhaSpec& s, DType compute) {
  const int64_t e = s.embed_dim;
  int64_t bytes = 0;
  if (s.bias) bytes += 2 * 4 * e * 4;  // The model's and the engine's (3E + E) float32.
  if (s.add_bias_kv) bytes += 2 * e * 4 + 2 * e * static_cast<int64_t>(DTypeSize(compute));
  return bytes;
}

}  // namespace

DType MhaEngine::ComputeDType(const MhaSpec& spec, const EngineOptions& options) {
  // A float32 model quantized by the options computes attention in
  // bfloat16, as config.json's "int8" does.
  return options.int8_weights && !spec.int8_weights ? DType::kBFloat16 : spec.compute_dtype;
}

MhaEngine::Layouts MhaEngine::PlanLayouts(const MhaSpec& s, DType compute) {
  const dt ct = ToDnnl(compute);
  const int64_t e = s.embed_dim;
  Layouts l;
  l.q = PreferredWeights(e, e, ct, ct, ct);
  l.k = PreferredWeights(s.kdim, e, ct, ct, ct);
  l.v = PreferredWeights(s.vdim, e, ct, ct, ct);
  l.out = PreferredWeights(e, e, ct, ct, dt::f32);
  if (s.packed_in_proj()) {
    l.qkv = PreferredWeights(e, 3 * e, ct, ct, ct);
    l.fused = ThirdsOf(l.qkv, l.q, e);
  }
  return l;
}

absl::Status MhaEngine::Prepare() {
  if (int8_) {
    RETURN_IF_ERROR(Quantize());
  } else {
    try {
      Pack();
    } catch (const dnnl::error& e) {
      return absl::InternalError(
          absl::StrCat("MhaEngine: packing the weights: oneDNN: ", e.what()));
    }
  }
  if (!options_.keep_model_weights) model_ = model_->WithoutMatrices();
  return absl::OkStatus();
}

void MhaEngine::Pack() {
  const MhaSpec& s = model_->spec();
  const MhaWeights& w = model_->weights();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim()));
  const Layouts l = PlanLayouts(s, compute_);
  auto buffer = [&](size_t bytes) {
    // Zero-filled: padding of a blocked layout must read as zeros.
    packed_weights_.emplace_back(DType::kBFloat16, Shape{static_cast<int64_t>((bytes + 1) / 2)});
    return static_cast<char*>(packed_weights_.back().data());
  };
  auto pack = [&](Projection* p, const Tensor& weight, float factor, const dnnl::memory::desc& md,
                  char* dst) {
    ReorderTransposed(weight.as<float>(), weight.dim(0), weight.dim(1), factor, md, dst);
    p->packed = dst;
    p->packed_md = md;
  };
  if (l.fused) {  // One (E, 3E) buffer: q | k | v, each an (E, E) layout of its own.
    const size_t third = l.q.get_size();
    char* qkv = buffer(l.qkv.get_size());
    pack(&q_proj_, w.q_weight, scale, l.q, qkv);
    pack(&k_proj_, w.k_weight, 1.0f, l.q, qkv + third);
    pack(&v_proj_, w.v_weight, 1.0f, l.q, qkv + 2 * third);
    qkv_proj_.packed = qkv;
    qkv_proj_.packed_md = l.qkv;
  } else {
    pack(&q_proj_, w.q_weight, scale, l.q, buffer(l.q.get_size()));
    pack(&k_proj_, w.k_weight, 1.0f, l.k, buffer(l.k.get_size()));
    pack(&v_proj_, w.v_weight, 1.0f, l.v, buffer(l.v.get_size()));
    qkv_proj_ = Projection{};  // No fused projection: one GEMM each.
  }
  pack(&out_proj_, w.out_weight, 1.0f, l.out, buffer(l.out.get_size()));
}

absl::Status MhaEngine::Quantize() {
  const MhaSpec& s = model_->spec();
  const MhaWeights& w = model_->weights();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim()));
  // Each projection's W^T in float32 (the query's scaled as for the other
  // paths), quantized per output column; the transposed copy is freed as
  // soon as it is quantized.
  auto quantize =
      [&](Projection* proj,
          std::initializer_list<std::pair<const Tensor*, float>> parts) -> absl::Status {
    std::vector<float> w_t(static_cast<size_t>(proj->in * proj->out));
    int64_t col = 0;
    for (const auto& [weight, factor] : parts) {
      TransposeF32(*weight, factor, w_t.data() + col, proj->out);
      col += weight->dim(0);
    }
    ASSIGN_OR_RETURN(auto q, QuantizedLinear::Create(w_t.data(), proj->in, proj->out, proj->bias));
    proj->quantized = q.get();
    quantized_.push_back(std::move(q));
    return absl::OkStatus();
  };
  bool shared = false;
  if (s.packed_in_proj()) {
    RETURN_IF_ERROR(
        quantize(&qkv_proj_, {{&w.q_weight, scale}, {&w.k_weight, 1.0f}, {&w.v_weight, 1.0f}}));
    // q, k and v as the thirds of the fused projection's weights, when they are.
    try {
      std::unique_ptr<QuantizedLinear> parts[3];
      shared = true;
      for (int64_t j = 0; j < 3 && shared; ++j) {
        parts[j] = qkv_proj_.quantized->Third(j);
        shared = parts[j] != nullptr;
      }
      if (shared) {
        Projection* projs[3] = {&q_proj_, &k_proj_, &v_proj_};
        for (int64_t j = 0; j < 3; ++j) {
          projs[j]->quantized = parts[j].get();
          quantized_.push_back(std::move(parts[j]));
        }
      }
    } catch (const dnnl::error& e) {
      return absl::InternalError(absl::StrCat("MhaEngine: int8 weights: oneDNN: ", e.what()));
    }
  }
  if (!shared) {
    RETURN_IF_ERROR(quantize(&q_proj_, {{&w.q_weight, scale}}));
    RETURN_IF_ERROR(quantize(&k_proj_, {{&w.k_weight, 1.0f}}));
    RETURN_IF_ERROR(quantize(&v_proj_, {{&w.v_weight, 1.0f}}));
  }
  return quantize(&out_proj_, {{&w.out_weight, 1.0f}});
}

int64_t MhaEngine::resident_bytes() const {
  int64_t bytes = TensorBytes(qkv_bias_) + TensorBytes(out_bias_) + TensorBytes(bias_kv_);
  for (const Tensor& t : packed_weights_) bytes += TensorBytes(t);
  for (const auto& q : quantized_) bytes += q->resident_bytes();
  const MhaWeights& w = model_->weights();
  for (const Tensor* t : {&w.q_weight, &w.k_weight, &w.v_weight, &w.in_bias, &w.out_weight,
                          &w.out_bias, &w.bias_k, &w.bias_v}) {
    bytes += TensorBytes(*t);
  }
  return bytes;
}

absl::StatusOr<int64_t> MhaEngine::EstimateResidentBytes(const MhaSpec& s,
                                                         const EngineOptions& options) {
  RETURN_IF_ERROR(ValidateSpec(s));
  const DType compute = ComputeDType(s, options);
  const int64_t e = s.embed_dim;
  try {
    int64_t bytes = BiasBytes(s, compute);
    if (s.int8_weights || options.int8_weights) {
      auto q = [&](int64_t in, int64_t out) {
        return QuantizedLinear::EstimateResidentBytes(in, out, s.bias);
      };
      if (s.packed_in_proj()) {
        bytes += q(e, 3 * e);
        // Thirds share the fused weights (only their vectors) when the layout allows.
        const dnnl::memory::desc whole = PreferredWeights(e, 3 * e, dt::s8, dt::u8, dt::s32);
        const dnnl::memory::desc part = PreferredWeights(e, e, dt::s8, dt::u8, dt::s32);
        bytes += ThirdsOf(whole, part, e) ? 3 * (q(e, e) - static_cast<int64_t>(part.get_size()))
                                          : 3 * q(e, e);
      } else {
        bytes += q(e, e) + q(s.kdim, e) + q(s.vdim, e);
      }
      return bytes + q(e, e);
    }
    const Layouts l = PlanLayouts(s, compute);
    auto rounded = [](const dnnl::memory::desc& md) {  // Stored as bfloat16 elements.
      return static_cast<int64_t>((md.get_size() + 1) / 2 * 2);
    };
    bytes += l.fused ? rounded(l.qkv) : rounded(l.q) + rounded(l.k) + rounded(l.v);
    return bytes + rounded(l.out);
  } catch (const dnnl::error& err) {
    return absl::InternalError(absl::StrCat("MhaEngine: weights layout: oneDNN: ", err.what()));
  }
}

}  // namespace attention
