#include "core/input_validation.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace attention {
namespace {

absl::Status CheckData(const TensorView& t, absl::string_view name) {
  if (t.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": no data for shape ", ShapeToString(t.shape)));
  }
  for (int64_t d : t.shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": every dimension must be positive, got ", ShapeToString(t.shape)));
    }
  }
  return absl::OkStatus();
}

std::string ExpectedShape(const Shape& expected) {
  std::string s = "[";
  for (size_t i = 0; i < expected.size(); ++i) {
    absl::StrAppend(&s, i ? ", " : "", expected[i] < 0 ? "*" : absl::StrCat(expected[i]));
  }
  return s + "]";
}

}  // namespace

absl::Status CheckShape(const TensorView& t, absl::string_view name, const Shape& expected) {
  bool ok = t.rank() == static_cast<int64_t>(expected.size());
  for (size_t i = 0; ok && i < expected.size(); ++i) {
    ok = expected[i] < 0 || expected[i] == t.shape[i];
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": expected shape ", ExpectedShape(expected), ", got ", ShapeToString(t.shape)));
  }
  return absl::OkStatus();
}

absl::Status CheckFloatTensor(const TensorView& t, absl::string_view name, int64_t rank) {
  if (t.dtype == DType::kBool) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected dtype float32, bfloat16 or float16, got bool"));
  }
  if (t.rank() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected rank ", rank, ", got shape ", ShapeToString(t.shape)));
  }
  return CheckData(t, name);
}

absl::StatusOr<std::vector<ItemMask>> BuildItemMasks(
    const std::optional<TensorView>& key_padding_mask, const std::optional<TensorView>& attn_mask,
    bool is_causal, bool batched, int64_t batch, int64_t heads, int64_t queries, int64_t keys) {
  std::vector<ItemMask> items(batch);
  for (ItemMask& m : items) {
    m.valid_queries = queries;
    m.valid_keys = keys;
    m.is_causal = is_causal;
  }
  if (key_padding_mask) {
    const TensorView& kpm = *key_padding_mask;
    RETURN_IF_ERROR(CheckData(kpm, "key_padding_mask"));
    RETURN_IF_ERROR(
        CheckShape(kpm, "key_padding_mask", batched ? Shape{batch, keys} : Shape{keys}));
    for (int64_t n = 0; n < batch; ++n) {
      items[n].key_padding = static_cast<const char*>(kpm.data) +
                             n * keys * static_cast<int64_t>(DTypeSize(kpm.dtype));
      items[n].key_padding_dtype = kpm.dtype;
    }
  }
  if (attn_mask) {
    const TensorView& am = *attn_mask;
    RETURN_IF_ERROR(CheckData(am, "attn_mask"));
    const bool per_head = am.rank() == 3;
    const Shape expected3 = {batched ? batch * heads : heads, queries, keys};
    if (!per_head) {
      if (am.rank() != 2 || am.shape != Shape{queries, keys}) {
        return absl::InvalidArgumentError(
            absl::StrCat("attn_mask: expected shape ", ShapeToString({queries, keys}), " or ",
                         ShapeToString(expected3), ", got ", ShapeToString(am.shape)));
      }
    } else {
      RETURN_IF_ERROR(CheckShape(am, "attn_mask", expected3));
    }
    const int64_t item_stride = per_head ? heads * queries * keys : 0;
    for (int64_t n = 0; n < batch; ++n) {
      items[n].attn_mask = static_cast<const char*>(am.data) +
                           n * item_stride * static_cast<int64_t>(DTypeSize(am.dtype));
      items[n].attn_mask_dtype = am.dtype;
      items[n].attn_mask_per_head = per_head;
    }
  }
  return items;
}

}  // namespace attention
