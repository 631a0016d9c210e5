#include "core/mha_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/fused_attention.h"
#include "core/input_validation.h"
#include "core/status_macros.h"
#include "core/workspace.h"

namespace attention {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

// The bytes of `t` in `dtype`: t.data itself, or a converted copy in the
// calling thread's workspace `slot` (held by *holder).
const void* InDType(const TensorView& t, DType dtype, Workspace::Slot slot,
                    std::unique_ptr<Workspace>* holder) {
  if (t.dtype == dtype) return t.data;
  const size_t count = static_cast<size_t>(t.num_elements());
  *holder = std::make_unique<Workspace>(slot, count * DTypeSize(dtype));
  ConvertFloats(t.dtype, t.data, dtype, (*holder)->data(), count);
  return (*holder)->data();
}

bool SameTensor(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.shape == b.shape;
}

// A (N, T, H*D) buffer, with `token_stride` elements between tokens, viewed
// as (N, H, T, D).
HeadsView SplitHeads(const void* data, DType dtype, int64_t n, int64_t t, int64_t heads,
                     int64_t head_dim, int64_t item_stride, int64_t token_stride) {
  return MakeHeadsView(data, dtype, n, heads, t, head_dim, item_stride, head_dim, token_stride);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MhaEngine>> MhaEngine::Create(std::shared_ptr<const MhaModel> model,
                                                             EngineOptions options) {
  return ResourceExhaustedOnBadAlloc(
      "MhaEngine::Create", [&]() -> absl::StatusOr<std::unique_ptr<MhaEngine>> {
        if (model == nullptr) return absl::InvalidArgumentError("MhaEngine: model is null");
        RETURN_IF_ERROR(ValidateSpec(model->spec()));
        if (model->weights().out_weight.data() == nullptr) {
          return absl::InvalidArgumentError(
              "MhaEngine: the model's matrices were dropped (keep_model_weights false); "
              "give the engine the loaded model");
        }
        std::unique_ptr<MhaEngine> engine(new MhaEngine(std::move(model), options));
        RETURN_IF_ERROR(engine->Prepare());
        return engine;
      });
}

MhaEngine::MhaEngine(std::shared_ptr<const MhaModel> model, EngineOptions options)
    : model_(std::move(model)),
      options_(options),
      int8_(model_->spec().int8_weights || options.int8_weights),
      compute_(ComputeDType(model_->spec(), options)),
      cache_(options.primitive_cache_capacity) {
  const MhaSpec& s = model_->spec();
  const MhaWeights& w = model_->weights();
  const int64_t e = s.embed_dim;
  const size_t esize = DTypeSize(compute_);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim()));
  if (s.bias) {
    qkv_bias_ = w.in_bias.Clone();
    float* b = qkv_bias_.mutable_as<float>();
    for (int64_t i = 0; i < e; ++i) b[i] *= scale;
    out_bias_ = w.out_bias.Clone();
  }
  if (s.add_bias_kv) {
    bias_kv_ = Tensor(compute_, {2, e});
    ConvertFloats(DType::kFloat32, w.bias_k.data(), compute_, bias_kv_.data(), e);
    ConvertFloats(DType::kFloat32, w.bias_v.data(), compute_,
                  static_cast<char*>(bias_kv_.data()) + e * esize, e);
  }
  // Shapes and biases here; the weights in Prepare().
  const float* in_bias = s.bias ? qkv_bias_.as<float>() : nullptr;
  q_proj_ = MakeProjection(in_bias, e, e);
  k_proj_ = MakeProjection(in_bias ? in_bias + e : nullptr, s.kdim, e);
  v_proj_ = MakeProjection(in_bias ? in_bias + 2 * e : nullptr, s.vdim, e);
  out_proj_ = MakeProjection(s.bias ? out_bias_.as<float>() : nullptr, e, e);
  if (s.packed_in_proj()) qkv_proj_ = MakeProjection(in_bias, e, 3 * e);
}

DType MhaEngine::InputDType(DType given) const {
  if (!int8_) return compute_;
  return given == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
}

absl::Status MhaEngine::RunForward(const TensorView& query, const std::optional<TensorView>& key,
                                   const std::optional<TensorView>& value, const MaskPlan& plan,
                                   float* output, float* weights, bool average_weights) const {
  const MhaSpec& s = model_->spec();
  const int64_t e = s.embed_dim, heads = s.num_heads, d = s.head_dim();
  const int64_t n = query.dim(0), l = query.dim(1);
  const TensorView& key_view = key ? *key : query;
  const TensorView& value_view = value ? *value : key_view;
  const int64_t keys = key_view.dim(1);
  const int64_t total_keys = keys + s.extra_keys();
  const size_t esize = DTypeSize(compute_);

  // Every intermediate lives in the calling thread's reused workspaces.
  std::unique_ptr<Workspace> q_conv, k_conv, v_conv, q_buf, kv_buf;
  const DType q_dt = InputDType(query.dtype);
  const void* q_in = InDType(query, q_dt, Workspace::kQueryInput, &q_conv);
  const bool self_attention = SameTensor(key_view, query) && SameTensor(value_view, query);

  int64_t token_stride = e;  // Between tokens of the projected q, k and v.
  const void* q_data;
  const void* k_data;
  const void* v_data;
  if (self_attention && has_fused_qkv() && s.extra_keys() == 0) {
    q_buf = std::make_unique<Workspace>(Workspace::kProjected, 3 * n * l * e * esize);
    RETURN_IF_ERROR(Linear(qkv_proj_, q_in, q_dt, 1, n * l, q_buf->data(), compute_, 0));
    q_data = q_buf->data();
    k_data = q_buf->as<char>() + e * esize;
    v_data = q_buf->as<char>() + 2 * e * esize;
    token_stride = 3 * e;
  } else {
    q_buf = std::make_unique<Workspace>(Workspace::kProjected, n * l * e * esize);
    RETURN_IF_ERROR(Linear(q_proj_, q_in, q_dt, 1, n * l, q_buf->data(), compute_, 0));
    const DType k_dt = InputDType(key_view.dtype), v_dt = InputDType(value_view.dtype);
    const void* k_in =
        self_attention ? q_in : InDType(key_view, k_dt, Workspace::kKeyInput, &k_conv);
    const void* v_in = SameTensor(value_view, key_view) ? k_in
                       : SameTensor(value_view, query)
                           ? q_in
                           : InDType(value_view, v_dt, Workspace::kValueInput, &v_conv);
    // K and V as (N, S', E): each item's projected keys, then the appended ones.
    const int64_t plane = n * total_keys * e;
    kv_buf = std::make_unique<Workspace>(Workspace::kKeysValues, 2 * plane * esize);
    char* k_out = kv_buf->as<char>();
    char* v_out = k_out + plane * esize;
    RETURN_IF_ERROR(Linear(k_proj_, k_in, k_dt, n, keys, k_out, compute_, total_keys * e));
    RETURN_IF_ERROR(Linear(v_proj_, v_in, v_dt, n, keys, v_out, compute_, total_keys * e));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = keys; j < total_keys; ++j) {
        const size_t offset = ((i * total_keys + j) * e) * esize;
        if (s.add_bias_kv && j == keys) {
          std::memcpy(k_out + offset, bias_kv_.data(), e * esize);
          std::memcpy(v_out + offset, bias_kv_.as<char>() + e * esize, e * esize);
        } else {  // add_zero_attn.
          std::memset(k_out + offset, 0, e * esize);
          std::memset(v_out + offset, 0, e * esize);
        }
      }
    }
    q_data = q_buf->data();
    k_data = k_out;
    v_data = v_out;
  }

  Workspace context(Workspace::kContext, n * l * e * esize);
  AttentionProblem problem;
  problem.q = SplitHeads(q_data, compute_, n, l, heads, d, l * token_stride, token_stride);
  problem.k = SplitHeads(k_data, compute_, n, total_keys, heads, d, total_keys * token_stride,
                         token_stride);
  problem.v = SplitHeads(v_data, compute_, n, total_keys, heads, d, total_keys * token_stride,
                         token_stride);
  problem.out = SplitHeads(context.data(), compute_, n, l, heads, d, l * e, e);
  problem.masks = &plan;
  problem.scale = 1.0f;  // Folded into the query projection.
  problem.weights = weights;
  problem.average_weights = average_weights;
  RETURN_IF_ERROR(RunAttention(problem, options_.kernel, cache_));
  return Linear(out_proj_, context.data(), compute_, 1, n * l, output, DType::kFloat32, 0);
}

absl::Status MhaEngine::ForwardBatch(const TensorView& query, const std::optional<TensorView>& key,
                                     const std::optional<TensorView>& value,
                                     const std::vector<ItemMask>& items, float* output,
                                     float* weights) const {
  return ResourceExhaustedOnBadAlloc("MhaEngine::ForwardBatch", [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckBatchShapes(query, key, value, items));
    const int64_t keys = key ? key->dim(1) : query.dim(1);
    MaskPlan plan(items, keys, model_->spec().extra_keys(), model_->spec().num_heads);
    return RunForward(query, key, value, plan, output, weights, /*average_weights=*/false);
  });
}

absl::Status MhaEngine::Project(Part part, const TensorView& x, float* y) const {
  return ResourceExhaustedOnBadAlloc("MhaEngine::Project", [&]() -> absl::Status {
    if (part == Part::kQueryKeyValue && !has_fused_qkv()) {
      return absl::FailedPreconditionError("Project: the model has no fused q/k/v projection");
    }
    const Projection& p = part == Part::kQuery           ? q_proj_
                          : part == Part::kKey           ? k_proj_
                          : part == Part::kValue         ? v_proj_
                          : part == Part::kQueryKeyValue ? qkv_proj_
                                                         : out_proj_;
    // Every caller's input is checked here, so no caller can make the
    // projection write past a workspace sized for its own idea of the rows.
    if (x.rank() != 2 || x.dim(1) != p.in) {
      return absl::InvalidArgumentError(absl::StrCat("Project: expected input of shape [*, ", p.in,
                                                     "], got ", ShapeToString(x.shape)));
    }
    if (x.dtype == DType::kBool) {
      return absl::InvalidArgumentError("Project: expected a float input, got bool");
    }
    const int64_t rows = x.dim(0);
    std::unique_ptr<Workspace> converted;
    const DType x_dt = InputDType(x.dtype);
    const void* in = InDType(x, x_dt, Workspace::kQueryInput, &converted);
    // The in-projections were packed for outputs in the compute dtype (int8
    // ones write any).
    if (part == Part::kOut || compute_ == DType::kFloat32 || int8_) {
      return Linear(p, in, x_dt, 1, rows, y, DType::kFloat32, 0);
    }
    Workspace projected(Workspace::kProjected, rows * p.out * DTypeSize(compute_));
    RETURN_IF_ERROR(Linear(p, in, x_dt, 1, rows, projected.data(), compute_, 0));
    ConvertFloats(compute_, projected.data(), DType::kFloat32, y,
                  static_cast<size_t>(rows * p.out));
    return absl::OkStatus();
  });
}

absl::StatusOr<MhaOutputs> MhaEngine::Forward(const MhaInputs& in) const {
  return ResourceExhaustedOnBadAlloc("MhaEngine::Forward", [&]() -> absl::StatusOr<MhaOutputs> {
    ASSIGN_OR_RETURN(MhaCall call, Validate(in));
    const MhaSpec& s = model_->spec();
    const int64_t heads = s.num_heads, n = call.batch, l = call.queries, keys = call.keys;
    const bool batched = call.batched;
    // Work on (N, L, E) views; unbatched inputs are a batch of one.
    auto batch_view = [&](const TensorView& t) {
      TensorView v = t;
      if (!batched) v.shape.insert(v.shape.begin(), 1);
      return v;
    };
    const TensorView query = batch_view(in.query);
    std::optional<TensorView> key, val;
    if (in.key) key = batch_view(*in.key);
    if (in.value) val = batch_view(*in.value);

    const DType out_dtype = in.output_dtype.value_or(in.query.dtype);
    const int64_t total_keys = keys + s.extra_keys();
    Tensor out_f32 = Tensor::Uninitialized(DType::kFloat32, in.query.shape);  // Written in full.
    std::optional<Tensor> weights;
    if (in.need_weights) {
      Shape wshape = in.average_attn_weights ? Shape{l, total_keys} : Shape{heads, l, total_keys};
      if (batched) wshape.insert(wshape.begin(), n);
      weights.emplace(Tensor::Uninitialized(DType::kFloat32, wshape));  // Written in full.
    }
    MaskPlan plan(call.items, keys, s.extra_keys(), heads);
    RETURN_IF_ERROR(RunForward(query, key, val, plan, out_f32.mutable_as<float>(),
                               weights ? weights->mutable_as<float>() : nullptr,
                               in.average_attn_weights));
    MhaOutputs result;
    result.output =
        out_dtype == DType::kFloat32 ? std::move(out_f32) : out_f32.ConvertTo(out_dtype);
    if (weights) {
      result.attn_weights =
          out_dtype == DType::kFloat32 ? std::move(*weights) : weights->ConvertTo(out_dtype);
    }
    return result;
  });
}

}  // namespace attention
