// File: core/input_validation.h
//
// Checks of caller tensors against PyTorch's shapes and dtypes, shared by the
// MHA and SDPA entry points. Every failure is InvalidArgument naming the
// tensor with the expected and the actual shape or dtype.
#ifndef ATTENTION_CORE_INPUT_VALIDATION_H_
#define ATTENTION_CORE_INPUT_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/attention_mask.h"
#include "core/tensor.h"

namespace attention {

// `t` has a float dtype (float32, bfloat16, float16), rank `rank`, positive
// dims, and data for its bytes.
absl::Status CheckFloatTensor(const TensorView& t, absl::string_view name, int64_t rank);

// Checks the dims of `t` against `expected` (-1 = any) and returns an error
// that prints both shapes.
absl::Status CheckShape(const TensorView& t, absl::string_view name, const Shape& expected);

// Validates key_padding_mask ((N, S), or (S) when unbatched) and attn_mask
// ((L, S) or (N*H, L, S); (H, L, S) when unbatched), bool or float, and
// returns the per-item masks that refer to them (borrowed: the views must
// outlive the result).
absl::StatusOr<std::vector<ItemMask>> BuildItemMasks(
    const std::optional<TensorView>& key_padding_mask, const std::optional<TensorView>& attn_mask,
    bool is_causal, bool batched, int64_t batch, int64_t heads, int64_t queries, int64_t keys);

}  // namespace attention

#endif  // ATTENTION_CORE_INPUT_VALIDATION_H_
