#include "core/attention_kernel.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/fused_attention.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "core/workspace.h"

namespace attention {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

// The (N, H, rows, D) block of `v` starting at query row `row0`.
dnnl::memory::desc RowsMd(const HeadsView& v, int64_t rows) {
  return dnnl::memory::desc(dims{v.n, v.h, rows, v.d}, ToDnnl(v.dtype),
                            dims{v.stride_n, v.stride_h, v.stride_t, 1});
}

const void* RowPtr(const HeadsView& v, int64_t row0) {
  return static_cast<const char*>(v.data) +
         row0 * v.stride_t * static_cast<int64_t>(DTypeSize(v.dtype));
}

// K viewed as (N, H, D, S') without a copy.
dnnl::memory::desc TransposedMd(const HeadsView& k) {
  return dnnl::memory::desc(dims{k.n, k.h, k.d, k.t}, ToDnnl(k.dtype),
                            dims{k.stride_n, k.stride_h, 1, k.stride_t});
}

dnnl::memory::desc DenseMd(dims d, dt type) {
  dims strides(d.size(), 1);
  for (int i = static_cast<int>(d.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * d[i + 1];
  return dnnl::memory::desc(d, type, strides);
}

absl::StatusOr<std::shared_ptr<const CachedPrimitive>> ScoresPrimitive(
    PrimitiveCache& cache, const dnnl::memory::desc& q, const dnnl::memory::desc& kt,
    const dnnl::memory::desc& scores, const dnnl::memory::desc* mask, float scale) {
  std::string key = "qk";
  AppendMdKey(q, &key);
  AppendMdKey(kt, &key);
  AppendMdKey(scores, &key);
  if (mask != nullptr) AppendMdKey(*mask, &key);
  absl::StrAppend(&key, "s", scale);
  return cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>(key, [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (scale != 1.0f) attr.set_output_scales(0, {scale});
    if (mask != nullptr) {
      dnnl::post_ops ops;
      ops.append_binary(dnnl::algorithm::binary_add, *mask);
      attr.set_post_ops(ops);
    }
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(q, kt, scores), attr, CpuEngine());
  });
}

// In-place softmax over the last axis.
absl::StatusOr<std::shared_ptr<const CachedPrimitive>> SoftmaxPrimitive(
    PrimitiveCache& cache, const dnnl::memory::desc& md) {
  std::string key = "softmax";
  AppendMdKey(md, &key);
  return cache.GetOrCreate<dnnl::softmax_v2_forward, dnnl::softmax_v2_forward::primitive_desc>(
      key, [&] {
        dnnl::primitive_attr attr;
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        return dnnl::softmax_v2_forward::primitive_desc(
            dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_inference,
                                           dnnl::algorithm::softmax_accurate, md, md, 3),
            attr, CpuEngine());
      });
}

absl::StatusOr<std::shared_ptr<const CachedPrimitive>> ContextPrimitive(
    PrimitiveCache& cache, const dnnl::memory::desc& probs, const dnnl::memory::desc& v,
    const dnnl::memory::desc& out) {
  std::string key = "pv";
  AppendMdKey(probs, &key);
  AppendMdKey(v, &key);
  AppendMdKey(out, &key);
  return cache.GetOrCreate<dnnl::matmul, dnnl::matmul::primitive_desc>(key, [&] {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(probs, v, out), attr, CpuEngine());
  });
}

// Marks in `zero` the score rows of the items [item0, item0 + n_items) whose
// keys are all masked, to be zeroed after the softmax (which makes them NaN).
// `flags` follows the mask layout: per item (kKeyOnly), per item and row
// (kShared) or per item, head and row (kPerHead), counted from item0. A row
// whose mask is all -inf but whose scores are not (a NaN or infinite query or
// key makes NaN + -inf = NaN) is not masked: its NaN stays, as in PyTorch.
void FindMaskedRows(const MaskPlan& plan, const uint8_t* flags, int64_t item0, int64_t n_items,
                    int64_t heads, int64_t rows, int64_t keys, const float* scores,
                    std::vector<uint8_t>* zero) {
  zero->clear();
  if (plan.mode() == MaskMode::kNone) return;
  zero->assign(static_cast<size_t>(n_items * heads * rows), 0);
  for (int64_t n = 0; n < n_items; ++n) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t r = 0; r < rows; ++r) {
        bool masked;
        switch (plan.mode()) {
          case MaskMode::kKeyOnly:
            masked = plan.item_fully_masked(item0 + n);
            break;
          case MaskMode::kShared:
            masked = flags[n * rows + r] != 0;
            break;
          default:
            masked = flags[(n * heads + h) * rows + r] != 0;
        }
        if (!masked) continue;
        const int64_t row = (n * heads + h) * rows + r;
        const float* s = scores + row * keys;
        (*zero)[static_cast<size_t>(row)] = std::all_of(
            s, s + keys, [](float x) { return x == -std::numeric_limits<float>::infinity(); });
      }
    }
  }
}

void ZeroRows(const std::vector<uint8_t>& zero, int64_t keys, float* probs) {
  for (size_t row = 0; row < zero.size(); ++row) {
    if (zero[row]) std::fill_n(probs + static_cast<int64_t>(row) * keys, keys, 0.0f);
  }
}

// Makes every row of `count` (x `keys`) that holds a NaN wholly NaN: PyTorch's
// softmax turns a row with one NaN score into NaN, oneDNN's keeps the others.
void SpreadNanRows(int64_t count, int64_t keys, float* rows) {
  for (int64_t r = 0; r < count; ++r) {
    float* row = rows + r * keys;
    int nan = 0;
    for (int64_t j = 0; j < keys; ++j) nan |= row[j] != row[j];
    if (nan) std::fill_n(row, keys, std::numeric_limits<float>::quiet_NaN());
  }
}

// Copies (or averages over heads) a block of float32 probabilities
// (N, H, rows, S') into the weights output at query row `row0`.
void StoreWeights(const float* probs, int64_t n_items, int64_t heads, int64_t rows, int64_t row0,
                  int64_t queries, int64_t keys, bool average, float* weights) {
  const float inv_heads = 1.0f / static_cast<float>(heads);
  for (int64_t n = 0; n < n_items; ++n) {
    if (!average) {
      for (int64_t h = 0; h < heads; ++h) {
        float* dst = weights + ((n * heads + h) * queries + row0) * keys;
        std::memcpy(dst, probs + (n * heads + h) * rows * keys, rows * keys * sizeof(float));
        SpreadNanRows(rows, keys, dst);
      }
      continue;
    }
    float* dst = weights + (n * queries + row0) * keys;
    std::fill(dst, dst + rows * keys, 0.0f);
    for (int64_t h = 0; h < heads; ++h) {
      const float* src = probs + (n * heads + h) * rows * keys;
      for (int64_t i = 0; i < rows * keys; ++i) dst[i] += src[i];
    }
    for (int64_t i = 0; i < rows * keys; ++i) dst[i] *= inv_heads;
    SpreadNanRows(rows, keys, dst);
  }
}

}  // namespace

HeadsView MakeHeadsView(const void* data, DType dtype, int64_t n, int64_t h, int64_t t, int64_t d,
                        int64_t stride_n, int64_t stride_h, int64_t stride_t) {
  HeadsView v;
  v.data = data;
  v.dtype = dtype;
  v.n = n;
  v.h = h;
  v.t = t;
  v.d = d;
  v.stride_n = stride_n;
  v.stride_h = stride_h;
  v.stride_t = stride_t;
  return v;
}

dnnl::memory::data_type ToDnnl(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return dt::f32;
    case DType::kBFloat16:
      return dt::bf16;
    case DType::kFloat16:
      return dt::f16;
    case DType::kBool:
      return dt::u8;
  }
  return dt::undef;
}

namespace {

// The items [item0, item0 + items) of `v`.
HeadsView Items(const HeadsView& v, int64_t item0, int64_t items) {
  HeadsView sub = v;
  sub.data = static_cast<const char*>(v.data) +
             item0 * v.stride_n * static_cast<int64_t>(DTypeSize(v.dtype));
  sub.n = items;
  return sub;
}

// One chunk of batch items, processed in blocks of query rows.
absl::Status RunChunk(const AttentionProblem& p, int64_t item0, int64_t block,
                      PrimitiveCache& cache) {
  const MaskPlan& plan = *p.masks;
  const int64_t n = p.q.n, heads = p.q.h, queries = p.q.t, keys = p.k.t;
  const bool bf16 = p.q.dtype == DType::kBFloat16;
  const int64_t mask_heads = plan.mask_heads();

  Workspace scores(Workspace::kScores,
                   static_cast<size_t>(n * heads * block * keys) * sizeof(float));
  // bfloat16 probabilities for the PV product (float32 ones stay in place).
  // Softmax itself always writes float32: measured faster here than its
  // bfloat16 output, and float32 weights need it anyway.
  Workspace probs16(Workspace::kProbabilities16,
                    bf16 ? static_cast<size_t>(n * heads * block * keys) * 2 : 0);
  const bool row_mask = plan.mode() == MaskMode::kShared || plan.mode() == MaskMode::kPerHead;
  Workspace mask(Workspace::kScoreMask,
                 row_mask ? static_cast<size_t>(n * mask_heads * block * keys) * 4 : 0);
  std::vector<uint8_t> fully_masked(row_mask ? n * mask_heads * block : 0);
  std::vector<uint8_t> zero_rows;  // Per (item, head, row) of a block: wholly masked.
  // This chunk's part of the weights output.
  float* weights = p.weights == nullptr ? nullptr
                   : p.average_weights  ? p.weights + item0 * queries * keys
                                        : p.weights + item0 * heads * queries * keys;

  for (int64_t row0 = 0; row0 < queries; row0 += block) {
    const int64_t rows = std::min(block, queries - row0);
    const dnnl::memory::desc q_md = RowsMd(p.q, rows);
    const dnnl::memory::desc kt_md = TransposedMd(p.k);
    const dnnl::memory::desc scores_md = DenseMd({n, heads, rows, keys}, dt::f32);
    dnnl::memory::desc mask_md;
    const void* mask_data = nullptr;
    if (plan.mode() == MaskMode::kKeyOnly) {
      mask_md = DenseMd({n, 1, 1, keys}, dt::f32);
      mask_data = plan.key_rows() + item0 * keys;
    } else if (row_mask) {
      mask_md = DenseMd({n, mask_heads, rows, keys}, dt::f32);
      plan.BuildRows(item0, n, row0, rows, mask.as<float>(), fully_masked.data());
      mask_data = mask.data();
    }
    const bool has_mask = mask_data != nullptr;

    ASSIGN_OR_RETURN(auto qk, ScoresPrimitive(cache, q_md, kt_md, scores_md,
                                              has_mask ? &mask_md : nullptr, p.scale));
    std::unordered_map<int, dnnl::memory> qk_args = {
        {DNNL_ARG_SRC, Wrap(q_md, RowPtr(p.q, row0))},
        {DNNL_ARG_WEIGHTS, Wrap(kt_md, p.k.data)},
        {DNNL_ARG_DST, Wrap(scores_md, scores.data())}};
    if (has_mask) {
      qk_args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, Wrap(mask_md, mask_data));
    }
    RETURN_IF_ERROR(Execute(*qk, std::move(qk_args)));
    FindMaskedRows(plan, fully_masked.data(), item0, n, heads, rows, keys, scores.as<float>(),
                   &zero_rows);

    ASSIGN_OR_RETURN(auto softmax, SoftmaxPrimitive(cache, scores_md));
    RETURN_IF_ERROR(Execute(*softmax, {{DNNL_ARG_SRC, Wrap(scores_md, scores.data())},
                                       {DNNL_ARG_DST, Wrap(scores_md, scores.data())}}));
    ZeroRows(zero_rows, keys, scores.as<float>());

    if (weights != nullptr) {
      StoreWeights(scores.as<float>(), n, heads, rows, row0, queries, keys, p.average_weights,
                   weights);
    }
    dnnl::memory::desc pv_src_md = scores_md;
    const void* probs_data = scores.data();
    if (bf16) {
      ConvertFloats(DType::kFloat32, scores.data(), DType::kBFloat16, probs16.data(),
                    static_cast<size_t>(n * heads * rows * keys));
      pv_src_md = DenseMd({n, heads, rows, keys}, dt::bf16);
      probs_data = probs16.data();
    }
    const dnnl::memory::desc v_md = RowsMd(p.v, keys);
    const dnnl::memory::desc out_md = RowsMd(p.out, rows);
    ASSIGN_OR_RETURN(auto pv, ContextPrimitive(cache, pv_src_md, v_md, out_md));
    RETURN_IF_ERROR(Execute(*pv, {{DNNL_ARG_SRC, Wrap(pv_src_md, probs_data)},
                                  {DNNL_ARG_WEIGHTS, Wrap(v_md, p.v.data)},
                                  {DNNL_ARG_DST, Wrap(out_md, RowPtr(p.out, row0))}}));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunAttention(const AttentionProblem& p, const KernelOptions& options,
                          PrimitiveCache& cache) {
  if (p.weights == nullptr && options.allow_fused && FusedAttentionAvailable() &&
      FusedAttentionFits(p.q.n * p.q.h, p.q.d, p.masks != nullptr ? p.masks->keys() : p.k.t,
                         p.k.t)) {
    return RunFusedAttention(p);
  }
  const int64_t n = p.q.n, heads = p.q.h, queries = p.q.t, keys = p.k.t;
  // One query row of one item, every head: the smallest block of scores.
  const int64_t item_row_bytes = heads * keys * static_cast<int64_t>(sizeof(float));
  // All items at once with as many query rows as fit the budget; when not
  // even one row of every item fits, one row of as many items as fit.
  int64_t items = n, block = 1;
  if (n * item_row_bytes <= options.score_block_bytes) {
    block = std::clamp<int64_t>(options.score_block_bytes / (n * item_row_bytes), 1, queries);
  } else {
    items = std::clamp<int64_t>(options.score_block_bytes / item_row_bytes, 1, n);
  }
  for (int64_t item0 = 0; item0 < n; item0 += items) {
    const int64_t count = std::min(items, n - item0);
    AttentionProblem chunk = p;
    chunk.q = Items(p.q, item0, count);
    chunk.k = Items(p.k, item0, count);
    chunk.v = Items(p.v, item0, count);
    chunk.out = Items(p.out, item0, count);
    RETURN_IF_ERROR(RunChunk(chunk, item0, block, cache));
  }
  return absl::OkStatus();
}

}  // namespace attention
