// File: core/attention_mask.h
//
// Masks in PyTorch's meaning, kept per batch item so that items of different
// lengths and options can share one executed batch without touching each
// other's result. An item's masks are turned into one additive float mask
// (bool true -> -inf added, float added, so that NaN stays NaN as in PyTorch
// 2.x; causal -> -inf in place of the others, batch padding -> -inf, appended
// bias_kv / zero_attn keys -> 0) one block of query rows at a time, so the
// full (L, S) mask per head is never built.
//
// Thread-compatible: MaskPlan is read-only after construction.
#ifndef ATTENTION_CORE_ATTENTION_MASK_H_
#define ATTENTION_CORE_ATTENTION_MASK_H_

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace attention {

// The masks of one batch item, borrowed from the caller. Its own sequence is
// `valid_queries` x `valid_keys`; rows and keys beyond are batch padding.
struct ItemMask {
  int64_t valid_queries = 0;  // L_i, 1..L.
  int64_t valid_keys = 0;     // S_i, 1..S (not counting appended keys).
  // Optional (S_i): bool (true = ignore this key) or float (added).
  const void* key_padding = nullptr;
  DType key_padding_dtype = DType::kBool;
  // Optional (L_i, S_i), or (H, L_i, S_i) when attn_mask_per_head: bool
  // (true = not allowed) or float (added).
  const void* attn_mask = nullptr;
  DType attn_mask_dtype = DType::kBool;
  bool attn_mask_per_head = false;
  // Key j is allowed for query i only when j <= i (top-left aligned).
  bool is_causal = false;
};

// How the additive mask of a batch is shaped, from cheapest to dearest.
enum class MaskMode {
  kNone,     // Nothing is masked anywhere: no mask post-op.
  kKeyOnly,  // (N, 1, 1, S'): key padding only, broadcast over heads and rows.
  kShared,   // (N, 1, rows, S'): same for every head.
  kPerHead,  // (N, H, rows, S').
};

// The mask layout of one batch, and the per-item additive key rows.
class MaskPlan {
 public:
  // `items` has one entry per batch item. `keys` is S (padded, before the
  // `extra_keys` appended ones); `num_heads` is H.
  MaskPlan(const std::vector<ItemMask>& items, int64_t keys, int64_t extra_keys, int64_t num_heads);

  MaskMode mode() const { return mode_; }
  // Batch item `n`'s own masks and lengths.
  const ItemMask& item(int64_t n) const { return items_[n]; }
  // S, the padded key length before the appended keys.
  int64_t keys() const { return keys_; }
  // Heads dimension of the mask: H for kPerHead, else 1.
  int64_t mask_heads() const { return mode_ == MaskMode::kPerHead ? num_heads_ : 1; }
  int64_t total_keys() const { return total_keys_; }

  // kKeyOnly: the (N, S') additive mask, and whether each item has every key
  // masked.
  const float* key_rows() const { return key_rows_.data(); }
  bool item_fully_masked(int64_t n) const { return item_fully_masked_[n] != 0; }

  // kShared / kPerHead: writes rows [row0, row0 + rows) of the additive mask
  // of items [item0, item0 + n_items) into `dst` laid out
  // (n_items, mask_heads(), rows, S'), and sets
  // fully_masked[(n * mask_heads() + h) * rows + r] to 1 where every key of
  // that row is masked, i.e. -inf (else 0; a NaN entry is not masked), n
  // counted from item0.
  void BuildRows(int64_t item0, int64_t n_items, int64_t row0, int64_t rows, float* dst,
                 uint8_t* fully_masked) const;

  // Whether the masks alone hide every key (appended ones included) from
  // row `i` of item `n`, head `h`: the rule by which such a row's output is
  // zeros rather than PyTorch's NaN. False in kNone mode. Builds the one row
  // (O(S')): meant for the rare rows whose scores are all -inf.
  bool RowFullyMasked(int64_t n, int64_t h, int64_t i) const;

 private:
  // Row `i` of item `n`'s additive mask for mask head `h` (S' values).
  void BuildRow(int64_t n, int64_t h, int64_t i, float* row) const;

  const std::vector<ItemMask>& items_;
  const int64_t keys_;
  const int64_t total_keys_;
  const int64_t num_heads_;
  MaskMode mode_ = MaskMode::kNone;
  std::vector<float> key_rows_;             // (N, S')
  std::vector<uint8_t> item_fully_masked_;  // (N)
};

}  // namespace attention

#endif  // ATTENTION_CORE_ATTENTION_MASK_H_
