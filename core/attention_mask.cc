#include "core/attention_mask.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace attention {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// True when every entry is -inf. NaN is not -inf: a row with a NaN mask
// entry is not masked, its scores are NaN (as in PyTorch).
bool AllMasked(const float* row, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if (row[j] != kNegInf) return false;
  }
  return true;
}

// dst[j] += mask[j] for j < n, with bool true -> -inf (added, so that a NaN
// from another mask stays NaN, as PyTorch 2.x sums the masks).
void AddMaskRow(DType dtype, const void* mask, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kBool: {
      const uint8_t* m = static_cast<const uint8_t*>(mask);
      for (int64_t j = 0; j < n; ++j) dst[j] += m[j] ? kNegInf : 0.0f;
      return;
    }
    case DType::kFloat32: {
      const float* m = static_cast<const float*>(mask);
      for (int64_t j = 0; j < n; ++j) dst[j] += m[j];
      return;
    }
    default:
      for (int64_t j = 0; j < n; ++j) dst[j] += LoadAsFloat(dtype, mask, j);
  }
}

}  // namespace

MaskPlan::MaskPlan(const std::vector<ItemMask>& items, int64_t keys, int64_t extra_keys,
                   int64_t num_heads)
    : items_(items), keys_(keys), total_keys_(keys + extra_keys), num_heads_(num_heads) {
  bool any_key = false, any_rows = false, any_per_head = false;
  for (const ItemMask& m : items) {
    any_key |= m.key_padding != nullptr || m.valid_keys < keys;
    any_rows |= m.attn_mask != nullptr || m.is_causal;
    any_per_head |= m.attn_mask != nullptr && m.attn_mask_per_head;
  }
  mode_ = any_per_head ? MaskMode::kPerHead
          : any_rows   ? MaskMode::kShared
          : any_key    ? MaskMode::kKeyOnly
                       : MaskMode::kNone;
  if (mode_ == MaskMode::kNone) return;

  const int64_t n_items = static_cast<int64_t>(items.size());
  key_rows_.assign(n_items * total_keys_, 0.0f);
  item_fully_masked_.assign(n_items, 0);
  for (int64_t n = 0; n < n_items; ++n) {
    const ItemMask& m = items[n];
    float* row = key_rows_.data() + n * total_keys_;
    if (m.key_padding != nullptr) AddMaskRow(m.key_padding_dtype, m.key_padding, m.valid_keys, row);
    std::fill(row + m.valid_keys, row + keys_, kNegInf);
    item_fully_masked_[n] = AllMasked(row, total_keys_);
  }
}

void MaskPlan::BuildRows(int64_t item0, int64_t n_items, int64_t row0, int64_t rows, float* dst,
                         uint8_t* fully_masked) const {
  const int64_t heads = mask_heads();
  const int64_t total = n_items * heads * rows;
#pragma omp parallel for schedule(static) if (total * total_keys_ > (1 << 16))
  for (int64_t idx = 0; idx < total; ++idx) {
    float* row = dst + idx * total_keys_;
    BuildRow(item0 + idx / (heads * rows), idx / rows % heads, row0 + idx % rows, row);
    fully_masked[idx] = AllMasked(row, total_keys_);
  }
}

bool MaskPlan::RowFullyMasked(int64_t n, int64_t h, int64_t i) const {
  switch (mode_) {
    case MaskMode::kNone:
      return false;
    case MaskMode::kKeyOnly:
      return item_fully_masked(n);
    default: {
      // Every key padded settles it without building the row (an item whose
      // keys are all padded asks for each of its rows).
      if (item_fully_masked(n)) return true;
      thread_local std::vector<float> row;
      row.resize(static_cast<size_t>(total_keys_));
      BuildRow(n, mode_ == MaskMode::kPerHead ? h : 0, i, row.data());
      return AllMasked(row.data(), total_keys_);
    }
  }
}

void MaskPlan::BuildRow(int64_t n, int64_t h, int64_t i, float* row) const {
  const ItemMask& m = items_[n];
  std::memcpy(row, key_rows_.data() + n * total_keys_, total_keys_ * sizeof(float));
  if (i >= m.valid_queries) return;  // Padded query rows only need finite garbage.
  if (m.attn_mask != nullptr) {
    const int64_t plane = m.valid_queries * m.valid_keys;
    const int64_t offset = (m.attn_mask_per_head ? h * plane : 0) + i * m.valid_keys;
    const char* base = static_cast<const char*>(m.attn_mask) +
                       offset * static_cast<int64_t>(DTypeSize(m.attn_mask_dtype));
    AddMaskRow(m.attn_mask_dtype, base, m.valid_keys, row);
  }
  if (m.is_causal) {
    for (int64_t j = i + 1; j < m.valid_keys; ++j) row[j] = kNegInf;
  }
}

}  // namespace attention
