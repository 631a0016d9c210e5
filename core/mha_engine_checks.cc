// MhaEngine's checks and estimates: the shapes ForwardBatch accepts, the
// working memory a call takes, and Validate() (the public check of a call's
// inputs). The computing half is in mha_engine.cc.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/fused_attention.h"
#include "core/input_validation.h"
#include "core/mha_engine.h"
#include "core/status_macros.h"

namespace attention {

absl::Status MhaEngine::CheckBatchShapes(const TensorView& query,
                                         const std::optional<TensorView>& key,
                                         const std::optional<TensorView>& value,
                                         const std::vector<ItemMask>& items) const {
  const MhaSpec& s = model_->spec();
  if (query.rank() != 3 || query.dim(2) != s.embed_dim) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: query: expected shape [*, *, ",
                                                   s.embed_dim, "], got ",
                                                   ShapeToString(query.shape)));
  }
  const int64_t n = query.dim(0);
  if (static_cast<int64_t>(items.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBatch: items: expected ", n, " (the batch), got ", items.size()));
  }
  if (!key) {
    if (value) return absl::InvalidArgumentError("ForwardBatch: value given without key");
    if (s.kdim != s.embed_dim || s.vdim != s.embed_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardBatch: self-attention needs kdim == vdim == embed_dim ", s.embed_dim,
                       ", the model has kdim ", s.kdim, " and vdim ", s.vdim));
    }
    return absl::OkStatus();
  }
  if (key->rank() != 3 || key->dim(0) != n || key->dim(2) != s.kdim) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: key: expected shape [", n,
                                                   ", *, ", s.kdim, "], got ",
                                                   ShapeToString(key->shape)));
  }
  const TensorView& v = value ? *value : *key;
  if (v.rank() != 3 || v.dim(0) != n || v.dim(1) != key->dim(1) || v.dim(2) != s.vdim) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: value: expected shape [", n, ", ",
                                                   key->dim(1), ", ", s.vdim, "], got ",
                                                   ShapeToString(v.shape)));
  }
  return absl::OkStatus();
}

int64_t MhaEngine::ProjectWorkingBytes(Part part, int64_t rows) const {
  const MhaSpec& s = model_->spec();
  const int64_t in = part == Part::kKey ? s.kdim : part == Part::kValue ? s.vdim : s.embed_dim;
  const int64_t out = part == Part::kQueryKeyValue ? 3 * s.embed_dim : s.embed_dim;
  const int64_t esize = static_cast<int64_t>(DTypeSize(compute_));
  // The input converted to the compute dtype, and the output before its
  // conversion to float32.
  int64_t quantized = 0;  // int8: the rows quantized and a block of products.
  for (const auto& q : quantized_) quantized = std::max(quantized, q->WorkingBytes(rows));
  return rows * in * esize + (compute_ == DType::kFloat32 ? 0 : rows * out * esize) + quantized +
         kScratchpadAllowance;
}

int64_t MhaEngine::WorkingBytes(int64_t n, int64_t l, int64_t keys, bool self_attention,
                                bool need_weights) const {
  const MhaSpec& s = model_->spec();
  const int64_t e = s.embed_dim, heads = s.num_heads, d = s.head_dim();
  const int64_t esize = static_cast<int64_t>(DTypeSize(compute_));
  const int64_t total_keys = keys + s.extra_keys();
  int64_t bytes = 0;
  if (compute_ != DType::kFloat32) {  // Inputs in the compute dtype.
    bytes += n * l * e * esize + (self_attention ? 0 : n * keys * (s.kdim + s.vdim) * esize);
  }
  bytes += 3 * n * l * e * esize;           // Projected q (with k and v when fused).
  bytes += 2 * n * total_keys * e * esize;  // K and V with the appended keys.
  bytes += n * l * e * esize;               // Context.
  const int64_t f32 = static_cast<int64_t>(sizeof(float));
  if (!need_weights && options_.kernel.allow_fused && FusedAttentionAvailable() &&
      FusedAttentionFits(n * heads, d, keys, total_keys)) {
    // The fused kernel's K^T in panels (the main keys', then one of the
    // appended keys) and V padded to whole vectors (fused_attention.cc).
    const int64_t ldq = (d + 15) / 16 * 16;
    bytes += FusedKeyPanelBytes(n * heads, d, keys, total_keys) +
             n * heads * (total_keys + 1) * ldq * f32;
  } else {
    // The primitive path's blocks of scores, masks and bfloat16
    // probabilities, sized as RunAttention sizes them.
    const int64_t budget = options_.kernel.score_block_bytes;
    const int64_t row = heads * total_keys * f32;
    int64_t items = n, block = 1;
    if (n * row <= budget) {
      block = std::clamp<int64_t>(budget / (n * row), 1, l);
    } else {
      items = std::clamp<int64_t>(budget / row, 1, n);
    }
    const int64_t cells = items * heads * block * total_keys;
    bytes += cells * (f32 + 2 + f32) + items * heads * block;
  }
  // int8: the rows quantized and a block of products, one projection at a time.
  int64_t quantized = 0;
  for (const auto& q : quantized_) {
    quantized = std::max(quantized, q->WorkingBytes(n * std::max(l, keys)));
  }
  return bytes + quantized + 4 * kScratchpadAllowance;  // Up to four primitives' scratchpads.
}

absl::StatusOr<MhaCall> MhaEngine::Validate(const MhaInputs& in) const {
  const MhaSpec& s = model_->spec();
  const int64_t e = s.embed_dim, heads = s.num_heads;
  const bool batched = in.query.rank() == 3;
  if (in.query.rank() != 2 && in.query.rank() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query: expected rank 3 (N, L, E) or 2 (L, E), got shape ", ShapeToString(in.query.shape)));
  }
  const int64_t rank = in.query.rank();
  RETURN_IF_ERROR(CheckFloatTensor(in.query, "query", rank));
  const int64_t n = batched ? in.query.dim(0) : 1;
  const int64_t l = in.query.dim(rank - 2);
  RETURN_IF_ERROR(CheckShape(in.query, "query", batched ? Shape{-1, -1, e} : Shape{-1, e}));

  if (in.value && !in.key) {
    return absl::InvalidArgumentError("value: given without key; pass key too (or neither)");
  }
  int64_t keys = l;
  if (in.key) {
    RETURN_IF_ERROR(CheckFloatTensor(*in.key, "key", rank));
    keys = in.key->dim(rank - 2);
    RETURN_IF_ERROR(CheckShape(*in.key, "key", batched ? Shape{n, -1, s.kdim} : Shape{-1, s.kdim}));
  } else if (s.kdim != e) {
    return absl::InvalidArgumentError(absl::StrCat("key: required because the model's kdim ",
                                                   s.kdim, " differs from embed_dim ", e));
  }
  const TensorView* value = in.value ? &*in.value : in.key ? &*in.key : &in.query;
  RETURN_IF_ERROR(CheckFloatTensor(*value, "value", rank));
  RETURN_IF_ERROR(
      CheckShape(*value, "value", batched ? Shape{n, keys, s.vdim} : Shape{keys, s.vdim}));
  if (in.output_dtype && *in.output_dtype == DType::kBool) {
    return absl::InvalidArgumentError(
        "output_dtype: expected float32, bfloat16 or float16, got bool");
  }
  MhaCall call;
  call.batched = batched;
  call.batch = n;
  call.queries = l;
  call.keys = keys;
  call.self_attention = !in.key.has_value();
  ASSIGN_OR_RETURN(call.items, BuildItemMasks(in.key_padding_mask, in.attn_mask, in.is_causal,
                                              batched, n, heads, l, keys));
  return call;
}

}  // namespace attention
