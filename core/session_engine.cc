#include "core/session_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/input_validation.h"
#include "core/session_attention.h"
#include "core/status_macros.h"
#include "core/workspace.h"

namespace attention {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

size_t Floats(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }

}  // namespace

SessionEngine::SessionEngine(const MhaEngine* engine, DType cache_dtype, SessionKernel kernel)
    : engine_(engine), cache_dtype_(cache_dtype), kernel_(kernel) {
  const MhaWeights& w = engine_->model().weights();
  if (engine_->model().spec().add_bias_kv) {
    bias_k_.assign(w.bias_k.as<float>(), w.bias_k.as<float>() + w.bias_k.num_elements());
    bias_v_.assign(w.bias_v.as<float>(), w.bias_v.as<float>() + w.bias_v.num_elements());
  }
}

size_t SessionEngine::block_bytes() const {
  return KvCache::BlockBytes(spec().num_heads, spec().head_dim(), cache_dtype_);
}

absl::Status SessionEngine::SupportsSelf() const {
  const MhaSpec& s = spec();
  if (s.kdim == s.embed_dim && s.vdim == s.embed_dim) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "kind: a self-attention session stores its tokens as keys and values, so it needs kdim == "
      "vdim == embed_dim ",
      s.embed_dim, "; the model has kdim ", s.kdim, " and vdim ", s.vdim,
      " (use a cross session with its own key and value)"));
}

absl::Status SessionEngine::ValidateStep(bool cross, const TensorView& tokens,
                                         const std::optional<TensorView>& not_key) const {
  if (!cross) RETURN_IF_ERROR(SupportsSelf());
  RETURN_IF_ERROR(CheckFloatTensor(tokens, "tokens", 2));
  RETURN_IF_ERROR(CheckShape(tokens, "tokens", Shape{-1, spec().embed_dim}));
  if (!not_key) return absl::OkStatus();
  if (cross) {
    return absl::InvalidArgumentError(
        "not_key: only a self-attention session stores appended tokens as keys; a cross "
        "session's keys are fixed at creation");
  }
  if (not_key->dtype != DType::kBool) {
    return absl::InvalidArgumentError(
        absl::StrCat("not_key: expected bool, got ", DTypeName(not_key->dtype)));
  }
  return CheckShape(*not_key, "not_key", Shape{tokens.dim(0)});
}

absl::Status SessionEngine::ValidateCross(const CrossKeys& keys) const {
  RETURN_IF_ERROR(CheckFloatTensor(keys.key, "key", 2));
  RETURN_IF_ERROR(CheckShape(keys.key, "key", Shape{-1, spec().kdim}));
  const int64_t s = keys.key.dim(0);
  RETURN_IF_ERROR(CheckFloatTensor(keys.value, "value", 2));
  RETURN_IF_ERROR(CheckShape(keys.value, "value", Shape{s, spec().vdim}));
  if (keys.key_padding_mask) {
    RETURN_IF_ERROR(CheckShape(*keys.key_padding_mask, "key_padding_mask", Shape{s}));
  }
  return absl::OkStatus();
}

absl::Status SessionEngine::InitCross(const CrossKeys& keys, KvCache* cache) const {
  return ResourceExhaustedOnBadAlloc("SessionEngine::InitCross", [&]() -> absl::Status {
    const int64_t s = keys.key.dim(0), e = spec().embed_dim;
    Workspace k(Workspace::kStepKey, Floats(s * e)), v(Workspace::kStepValue, Floats(s * e));
    RETURN_IF_ERROR(engine_->Project(MhaEngine::Part::kKey, keys.key, k.as<float>()));
    RETURN_IF_ERROR(engine_->Project(MhaEngine::Part::kValue, keys.value, v.as<float>()));
    RETURN_IF_ERROR(cache->Reserve(s));
    for (int64_t j = 0; j < s; ++j) {
      float bias = 0;
      if (keys.key_padding_mask) {
        const TensorView& m = *keys.key_padding_mask;
        bias = m.dtype == DType::kBool ? (LoadAsFloat(m.dtype, m.data, j) != 0 ? kNegInf : 0.0f)
                                       : LoadAsFloat(m.dtype, m.data, j);
      }
      cache->Store(j, k.as<float>() + j * e, v.as<float>() + j * e, bias);
    }
    cache->Commit(s);
    return absl::OkStatus();
  });
}

int64_t SessionEngine::WeightColumns(const SessionStep& step) const {
  const int64_t stored =
      step.cross ? step.cache->length() : step.cache->length() + step.tokens.dim(0);
  return stored + spec().extra_keys();
}

int64_t SessionEngine::StepWorkingBytes(int64_t t, int64_t columns, bool need_weights,
                                        bool average_weights) const {
  const int64_t e = spec().embed_dim, f32 = static_cast<int64_t>(sizeof(float));
  // Tokens, q|k|v, the self tokens, k, v, context and out-projection in
  // float32, and the row -> step map.
  int64_t bytes = 9 * t * e * f32 + t * static_cast<int64_t>(sizeof(int32_t));
  if (need_weights && average_weights) bytes += spec().num_heads * t * columns * f32;
  // The decode kernel's partials (split-K).
  bytes += DecodePartialBytes(t, spec().num_heads, spec().head_dim());
  // Each projection's own conversions (one runs at a time).
  return bytes + engine_->ProjectWorkingBytes(MhaEngine::Part::kQueryKeyValue, t);
}

int64_t SessionEngine::CrossWorkingBytes(int64_t keys) const {
  const int64_t e = spec().embed_dim, f32 = static_cast<int64_t>(sizeof(float));
  return 2 * keys * e * f32 + std::max(engine_->ProjectWorkingBytes(MhaEngine::Part::kKey, keys),
                                       engine_->ProjectWorkingBytes(MhaEngine::Part::kValue, keys));
}

absl::Status SessionEngine::Run(const std::vector<SessionStep>& steps, bool commit) const {
  return ResourceExhaustedOnBadAlloc("SessionEngine::Run", [&]() -> absl::Status {
    const MhaSpec& s = spec();
    const int64_t e = s.embed_dim, heads = s.num_heads;
    const int64_t extra = s.extra_keys();
    // Each step's first row among all the steps' tokens, and among the self steps'.
    std::vector<int64_t> first(steps.size()), first_self(steps.size());
    int64_t total = 0, self_total = 0, averaged = 0;
    for (size_t a = 0; a < steps.size(); ++a) {
      const SessionStep& st = steps[a];
      const int64_t t = st.tokens.dim(0);
      first[a] = total;
      total += t;
      if (!st.cross) {
        first_self[a] = self_total;
        self_total += t;
      }
      if (st.need_weights && st.average_weights) averaged += heads * t * WeightColumns(st);
    }
    if (total == 0) return absl::OkStatus();
    for (const SessionStep& st : steps) {
      if (!st.cross) RETURN_IF_ERROR(SupportsSelf());
      if (st.tokens.rank() != 2 || st.tokens.dim(1) != e) {
        return absl::InvalidArgumentError(absl::StrCat("tokens: expected shape [*, ", e, "], got ",
                                                       ShapeToString(st.tokens.shape)));
      }
    }

    // All tokens in float32, and their projections, one GEMM each.
    Workspace tokens(Workspace::kStepTokens, Floats(total * e));
    for (size_t a = 0; a < steps.size(); ++a) {
      const SessionStep& st = steps[a];
      ConvertFloats(st.tokens.dtype, st.tokens.data, DType::kFloat32,
                    tokens.as<float>() + first[a] * e,
                    static_cast<size_t>(st.tokens.num_elements()));
    }
    // Queries of every token; keys and values of the self steps' tokens.
    // When every step is a self step and the layer has a fused in-projection,
    // one GEMM gives all three (rows q | k | v); otherwise one GEMM each.
    const bool fused = self_total == total && engine_->has_fused_qkv();
    const int64_t q_stride = fused ? 3 * e : e;
    Workspace q(Workspace::kStepQuery, Floats(total * q_stride));
    const TensorView all_tokens{DType::kFloat32, {total, e}, tokens.data()};
    RETURN_IF_ERROR(
        engine_->Project(fused ? MhaEngine::Part::kQueryKeyValue : MhaEngine::Part::kQuery,
                         all_tokens, q.as<float>()));
    if (self_total > 0) {
      // The self steps' tokens (all of them, in the usual batch of one kind).
      Workspace self_tokens(Workspace::kStepOutput,
                            Floats(self_total < total ? self_total * e : 0));
      for (size_t a = 0; a < steps.size() && self_total < total; ++a) {
        if (steps[a].cross) continue;
        std::memcpy(self_tokens.as<float>() + first_self[a] * e, tokens.as<float>() + first[a] * e,
                    Floats(steps[a].tokens.dim(0) * e));
      }
      const TensorView x{DType::kFloat32,
                         {self_total, e},
                         self_total < total ? self_tokens.data() : tokens.data()};
      Workspace k(Workspace::kStepKey, Floats(fused ? 0 : self_total * e));
      Workspace v(Workspace::kStepValue, Floats(fused ? 0 : self_total * e));
      if (!fused) {
        RETURN_IF_ERROR(engine_->Project(MhaEngine::Part::kKey, x, k.as<float>()));
        RETURN_IF_ERROR(engine_->Project(MhaEngine::Part::kValue, x, v.as<float>()));
      }
      const float* k_rows = fused ? q.as<float>() + e : k.as<float>();
      const float* v_rows = fused ? q.as<float>() + 2 * e : v.as<float>();
      const int64_t kv_stride = fused ? 3 * e : e;
      // Stored past each session's length: not part of it until Commit.
      for (size_t a = 0; a < steps.size(); ++a) {
        const SessionStep& st = steps[a];
        if (st.cross) continue;
        const int64_t length = st.cache->length();
        for (int64_t i = 0; i < st.tokens.dim(0); ++i) {
          const bool skip = st.not_key && LoadAsFloat(DType::kBool, st.not_key->data, i) != 0;
          const int64_t row = (first_self[a] + i) * kv_stride;
          st.cache->Store(length + i, k_rows + row, v_rows + row, skip ? kNegInf : 0.0f);
        }
      }
    }

    std::vector<int32_t> step_of(static_cast<size_t>(total));
    for (size_t a = 0; a < steps.size(); ++a) {
      std::fill(step_of.begin() + first[a], step_of.begin() + first[a] + steps[a].tokens.dim(0),
                static_cast<int32_t>(a));
    }
    std::vector<int64_t> averaged_at(steps.size());
    for (size_t a = 0, at = 0; a < steps.size(); ++a) {
      averaged_at[a] = static_cast<int64_t>(at);
      const SessionStep& st = steps[a];
      if (st.need_weights && st.average_weights) at += heads * st.tokens.dim(0) * WeightColumns(st);
    }
    Workspace context(Workspace::kStepContext, Floats(total * e));
    Workspace per_head(Workspace::kStepWeights, Floats(averaged));
    // Attention: each token's row, all heads, over its session's blocks.
    std::vector<AttentionRow> rows(static_cast<size_t>(total));
    for (int64_t g = 0; g < total; ++g) {
      const size_t a = static_cast<size_t>(step_of[static_cast<size_t>(g)]);
      const SessionStep& st = steps[a];
      const int64_t i = g - first[a], t = st.tokens.dim(0);
      AttentionRow& row = rows[static_cast<size_t>(g)];
      row.cache = st.cache;
      if (st.cross) {
        row.stored = st.cache->length();
        row.keys = st.is_causal ? std::min(row.stored, st.position + i + 1) : row.stored;
      } else {
        row.stored = st.cache->length() + t;
        row.keys = st.cache->length() + i + 1;
      }
      row.q = q.as<float>() + g * q_stride;
      row.context = context.as<float>() + g * e;
      if (st.need_weights) {
        const int64_t columns = row.stored + extra;
        row.weights = st.average_weights ? per_head.as<float>() + averaged_at[a] + i * columns
                                         : st.weights + i * columns;
        row.weights_head_stride = t * columns;
      }
    }
    AttentionExtras extras;
    if (!bias_k_.empty()) {
      extras.bias_k = bias_k_.data();
      extras.bias_v = bias_v_.data();
    }
    extras.zero_attn = s.add_zero_attn;
    AttendRows(rows, extras, kernel_);
    for (size_t a = 0; a < steps.size(); ++a) {
      const SessionStep& st = steps[a];
      if (!st.need_weights || !st.average_weights) continue;
      const int64_t t = st.tokens.dim(0), columns = WeightColumns(st);
      const float* from = per_head.as<float>() + averaged_at[a];
      std::fill(st.weights, st.weights + t * columns, 0.0f);
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < t * columns; ++j) {
          st.weights[j] += from[h * t * columns + j] / static_cast<float>(heads);
        }
      }
    }

    Workspace out(Workspace::kStepOutput, Floats(total * e));
    RETURN_IF_ERROR(engine_->Project(MhaEngine::Part::kOut,
                                     TensorView{DType::kFloat32, {total, e}, context.data()},
                                     out.as<float>()));
    for (size_t a = 0; a < steps.size(); ++a) {
      const SessionStep& st = steps[a];
      std::memcpy(st.output, out.as<float>() + first[a] * e, Floats(st.tokens.dim(0) * e));
      if (commit && !st.cross) st.cache->Commit(st.cache->length() + st.tokens.dim(0));
    }
    return absl::OkStatus();
  });
}

}  // namespace attention
