#include "core/sdpa.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/input_validation.h"
#include "core/status_macros.h"

namespace attention {
absl::StatusOr<Tensor> ScaledDotProductAttention(const SdpaInputs& in, PrimitiveCache& cache,
                                                 const KernelOptions& options) {
  return ResourceExhaustedOnBadAlloc("ScaledDotProductAttention", [&]() -> absl::StatusOr<Tensor> {
    RETURN_IF_ERROR(CheckFloatTensor(in.q, "q", 4));
    RETURN_IF_ERROR(CheckFloatTensor(in.k, "k", 4));
    RETURN_IF_ERROR(CheckFloatTensor(in.v, "v", 4));
    const int64_t n = in.q.dim(0), heads = in.q.dim(1), l = in.q.dim(2), d = in.q.dim(3);
    const int64_t keys = in.k.dim(2), dv = in.v.dim(3);
    RETURN_IF_ERROR(CheckShape(in.k, "k", {n, heads, -1, d}));
    RETURN_IF_ERROR(CheckShape(in.v, "v", {n, heads, keys, -1}));
    if (in.compute_dtype != DType::kFloat32 && in.compute_dtype != DType::kBFloat16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compute_dtype: expected float32 or bfloat16, got ", DTypeName(in.compute_dtype)));
    }
    if (in.output_dtype && *in.output_dtype == DType::kBool) {
      return absl::InvalidArgumentError(
          "output_dtype: expected float32, bfloat16 or float16, got bool");
    }
    ASSIGN_OR_RETURN(std::vector<ItemMask> items,
                     BuildItemMasks(in.key_padding_mask, in.attn_mask, in.is_causal,
                                    /*batched=*/true, n, heads, l, keys));
    MaskPlan plan(items, keys, /*extra_keys=*/0, heads);

    const DType ct = in.compute_dtype;
    Tensor q_conv, k_conv, v_conv;
    auto dense = [&](const void* data, int64_t t, int64_t dim) {
      return MakeHeadsView(data, ct, n, heads, t, dim, heads * t * dim, t * dim, dim);
    };
    Tensor out(ct, {n, heads, l, dv});
    AttentionProblem problem;
    problem.q = dense(DataAs(in.q, ct, &q_conv), l, d);
    problem.k = dense(DataAs(in.k, ct, &k_conv), keys, d);
    problem.v = dense(DataAs(in.v, ct, &v_conv), keys, dv);
    problem.out = dense(out.data(), l, dv);
    problem.masks = &plan;
    problem.scale = in.scale.value_or(1.0f / std::sqrt(static_cast<float>(d)));
    RETURN_IF_ERROR(RunAttention(problem, options, cache));
    const DType out_dtype = in.output_dtype.value_or(in.q.dtype);
    return out_dtype == ct ? std::move(out) : out.ConvertTo(out_dtype);
  });
}

}  // namespace attention
