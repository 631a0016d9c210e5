#include "core/attention_mask.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace attention {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(MaskPlanTest, ChoosesTheCheapestMode) {
  std::vector<ItemMask> items(2);
  for (auto& m : items) m.valid_queries = m.valid_keys = 4;
  EXPECT_EQ(MaskPlan(items, 4, 0, 2).mode(), MaskMode::kNone);
  items[1].valid_keys = 3;  // Batch padding alone needs a key mask.
  EXPECT_EQ(MaskPlan(items, 4, 0, 2).mode(), MaskMode::kKeyOnly);
  items[0].is_causal = true;
  EXPECT_EQ(MaskPlan(items, 4, 0, 2).mode(), MaskMode::kShared);
  float per_head[2 * 4 * 4] = {};
  items[0].attn_mask = per_head;
  items[0].attn_mask_dtype = DType::kFloat32;
  items[0].attn_mask_per_head = true;
  MaskPlan plan(items, 4, 0, 2);
  EXPECT_EQ(plan.mode(), MaskMode::kPerHead);
  EXPECT_EQ(plan.mask_heads(), 2);
}

TEST(MaskPlanTest, KeyRowsCombinePaddingAndAppendedKeys) {
  uint8_t kpm[3] = {0, 1, 0};
  std::vector<ItemMask> items(2);
  items[0].valid_queries = 2;
  items[0].valid_keys = 3;
  items[0].key_padding = kpm;
  items[1].valid_queries = 2;
  items[1].valid_keys = 1;
  MaskPlan plan(items, /*keys=*/4, /*extra_keys=*/1, /*num_heads=*/1);
  ASSERT_EQ(plan.mode(), MaskMode::kKeyOnly);
  EXPECT_EQ(plan.total_keys(), 5);
  const float* r = plan.key_rows();
  const float expected[10] = {0, -kInf, 0, -kInf, 0, 0, -kInf, -kInf, -kInf, 0};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(r[i], expected[i]) << i;
  EXPECT_FALSE(plan.item_fully_masked(0));
  EXPECT_FALSE(plan.item_fully_masked(1));  // The appended key stays attendable.
}

TEST(MaskPlanTest, BuildRowsAddsFloatBoolAndCausalMasks) {
  float kpm[3] = {0.5f, 0.0f, -1.0f};
  uint8_t am[2 * 3 * 3] = {0, 0, 1, 0, 0, 0, 1, 1, 1,  // Head 0; its row 2 is all masked.
                           0, 1, 0, 0, 0, 0, 0, 0, 0};
  std::vector<ItemMask> items(1);
  items[0].valid_queries = 3;
  items[0].valid_keys = 3;
  items[0].key_padding = kpm;
  items[0].key_padding_dtype = DType::kFloat32;
  items[0].attn_mask = am;
  items[0].attn_mask_dtype = DType::kBool;
  items[0].attn_mask_per_head = true;
  items[0].is_causal = true;
  MaskPlan plan(items, 3, 0, 2);
  float rows[2 * 2 * 3];
  uint8_t full[4];
  plan.BuildRows(/*item0=*/0, /*n_items=*/1, /*row0=*/1, /*rows=*/2, rows, full);
  // Head 0, query 1: causal hides key 2.  Head 0, query 2: all hidden.
  const float h0[6] = {0.5f, 0.0f, -kInf, -kInf, -kInf, -kInf};
  // Head 1, query 1: causal hides key 2.  Head 1, query 2: kpm only.
  const float h1[6] = {0.5f, 0.0f, -kInf, 0.5f, 0.0f, -1.0f};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(rows[i], h0[i]) << i;
    EXPECT_EQ(rows[6 + i], h1[i]) << i;
  }
  EXPECT_EQ(full[0], 0);
  EXPECT_EQ(full[1], 1);
  EXPECT_EQ(full[2], 0);
  EXPECT_EQ(full[3], 0);
}

// NaN is not -inf: a mask entry that is NaN (or a NaN key padding under a
// bool mask: 2.x sums the masks, NaN + -inf = NaN) keeps the row unmasked, so
// its scores come out NaN as in PyTorch (tests/golden/nan_positions.py).
TEST(MaskPlanTest, NanEntriesStayNanAndDoNotMaskTheRow) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float kpm[3] = {nan, 0.0f, nan};
  float am[4 * 3] = {nan,   nan,   nan,    // Every entry NaN.
                     -kInf, nan,   -kInf,  // Masked but for a NaN.
                     -kInf, -kInf, -kInf,  // Fully masked (but for kpm's NaN at 0 and 2).
                     0.0f,  0.0f,  0.0f};
  uint8_t am_bool[4 * 3] = {1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (bool bool_mask : {false, true}) {
    SCOPED_TRACE(bool_mask ? "bool attn_mask" : "float attn_mask");
    std::vector<ItemMask> items(2);
    for (ItemMask& m : items) {
      m.valid_queries = 4;
      m.valid_keys = 3;
      m.attn_mask = bool_mask ? static_cast<const void*>(am_bool) : am;
      m.attn_mask_dtype = bool_mask ? DType::kBool : DType::kFloat32;
    }
    items[0].key_padding = kpm;  // Item 1 has no key padding.
    items[0].key_padding_dtype = DType::kFloat32;
    MaskPlan plan(items, 3, 0, 1);
    float rows[2 * 4 * 3];
    uint8_t full[2 * 4];
    plan.BuildRows(0, 2, 0, 4, rows, full);
    if (bool_mask) {
      // Item 0 row 0: kpm NaN + -inf stays NaN at keys 0 and 2.
      EXPECT_TRUE(std::isnan(rows[0]));
      EXPECT_EQ(rows[1], -kInf);
      EXPECT_TRUE(std::isnan(rows[2]));
      const uint8_t expected[8] = {0, 0, 0, 0, 1, 0, 0, 0};
      for (int i = 0; i < 8; ++i) EXPECT_EQ(full[i], expected[i]) << i;
      continue;
    }
    const uint8_t expected[8] = {0, 0, 0, 0, 0, 0, 1, 0};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(full[i], expected[i]) << i;
    for (int j = 0; j < 3; ++j) EXPECT_TRUE(std::isnan(rows[12 + j])) << j;
  }
}

}  // namespace
}  // namespace attention
