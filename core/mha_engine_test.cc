#include "core/mha_engine.h"

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::MaxExcess;
using ::attention::testing::RandomMask;
using ::attention::testing::RandomTensor;
using ::attention::testing::ReferenceMha;
using ::attention::testing::StatusIs;
using ::testing::HasSubstr;

// float32 against the double reference: 1e-5 relative plus 1e-6 absolute.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

enum class MaskKind { kNone, kBool, kFloat };

struct Case {
  MhaSpec spec;
  int64_t batch = 2, queries = 5, keys = 5;
  bool batched = true, cross = false;
  MaskKind key_padding = MaskKind::kNone;
  MaskKind attn = MaskKind::kNone;
  bool attn_3d = false, is_causal = false, need_weights = false, average = true;
  int64_t score_block_bytes = 8 << 20;

  std::string Name() const {
    return absl::StrCat(
        "E", spec.embed_dim, "H", spec.num_heads, "k", spec.kdim, "v", spec.vdim,
        spec.bias ? "b" : "", spec.add_bias_kv ? "kv" : "", spec.add_zero_attn ? "z" : "", " N",
        batch, "L", queries, "S", keys, batched ? "" : " unbatched", cross ? " cross" : "", " kpm",
        static_cast<int>(key_padding), " am", static_cast<int>(attn), attn_3d ? "3d" : "",
        is_causal ? " causal" : "", need_weights ? (average ? " w-avg" : " w-heads") : "", " block",
        score_block_bytes);
  }
};

// Owns the tensors of one case and checks the engine against the reference.
void RunCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.Name());
  std::mt19937 rng(seed);
  auto model = MhaModel::Random(c.spec, seed);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions options;
  options.kernel.score_block_bytes = c.score_block_bytes;
  auto engine = MhaEngine::Create(*model, options);
  ASSERT_TRUE(engine.ok()) << engine.status();

  const int64_t e = c.spec.embed_dim, h = c.spec.num_heads;
  auto shape = [&](int64_t t, int64_t f) { return c.batched ? Shape{c.batch, t, f} : Shape{t, f}; };
  const bool cross = c.cross || !c.spec.packed_in_proj();
  const int64_t keys = cross ? c.keys : c.queries;
  Tensor q = RandomTensor(shape(c.queries, e), rng);
  Tensor k = RandomTensor(shape(keys, c.spec.kdim), rng);
  Tensor v = RandomTensor(shape(keys, c.spec.vdim), rng);
  const Shape kpm_shape = c.batched ? Shape{c.batch, keys} : Shape{keys};
  const int64_t planes = c.batched ? c.batch * h : h;
  const Shape am_shape = c.attn_3d ? Shape{planes, c.queries, keys} : Shape{c.queries, keys};
  Tensor kpm = c.key_padding == MaskKind::kBool ? RandomMask(kpm_shape, rng, 0.3)
                                                : RandomTensor(kpm_shape, rng, 2.0f);
  Tensor am = c.attn == MaskKind::kBool ? RandomMask(am_shape, rng, 0.3)
                                        : RandomTensor(am_shape, rng, 2.0f);

  MhaInputs in;
  in.query = q.view();
  if (cross) {
    in.key = k.view();
    in.value = v.view();
  }
  if (c.key_padding != MaskKind::kNone) in.key_padding_mask = kpm.view();
  if (c.attn != MaskKind::kNone) in.attn_mask = am.view();
  in.is_causal = c.is_causal;
  in.need_weights = c.need_weights;
  in.average_attn_weights = c.average;

  auto out = (*engine)->Forward(in);
  ASSERT_TRUE(out.ok()) << out.status();
  testing::Reference ref = ReferenceMha(**model, in);
  EXPECT_EQ(out->output.shape(), q.shape());
  EXPECT_LE(MaxExcess(out->output.as<float>(), ref.output, kRtol), kAtol);
  if (!c.need_weights) {
    EXPECT_FALSE(out->attn_weights.has_value());
    return;
  }
  ASSERT_TRUE(out->attn_weights.has_value());
  const int64_t total = keys + c.spec.extra_keys();
  const int64_t n = c.batched ? c.batch : 1;
  std::vector<double> expected = ref.weights;
  Shape wshape = {h, c.queries, total};
  if (c.average) {
    wshape = {c.queries, total};
    expected.assign(n * c.queries * total, 0.0);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t i = 0; i < c.queries * total; ++i)
          expected[b * c.queries * total + i] +=
              ref.weights[(b * h + hh) * c.queries * total + i] / h;
  }
  if (c.batched) wshape.insert(wshape.begin(), c.batch);
  EXPECT_EQ(out->attn_weights->shape(), wshape);
  EXPECT_LE(MaxExcess(out->attn_weights->as<float>(), expected, kRtol), kAtol);
}

TEST(MhaEngineTest, MatchesReferenceAcrossOptions) {
  uint32_t seed = 1;
  for (MaskKind kpm : {MaskKind::kNone, MaskKind::kBool, MaskKind::kFloat}) {
    for (MaskKind am : {MaskKind::kNone, MaskKind::kBool, MaskKind::kFloat}) {
      for (bool attn_3d : {false, true}) {
        if (am == MaskKind::kNone && attn_3d) continue;
        for (bool causal : {false, true}) {
          Case c;
          c.spec = testing::SelfAttentionSpec(32, 4);
          c.key_padding = kpm;
          c.attn = am;
          c.attn_3d = attn_3d;
          c.is_causal = causal;
          c.need_weights = (seed % 3) != 0;
          c.average = (seed % 2) == 0;
          RunCase(c, seed++);
        }
      }
    }
  }
}

TEST(MhaEngineTest, MatchesReferenceForLayerVariants) {
  uint32_t seed = 100;
  for (bool bias : {true, false}) {
    for (bool bias_kv : {false, true}) {
      for (bool zero_attn : {false, true}) {
        for (int64_t kdim : {16, 24}) {
          Case c;
          c.spec = testing::SelfAttentionSpec(16, 2);
          c.spec.bias = bias;
          c.spec.add_bias_kv = bias_kv;
          c.spec.add_zero_attn = zero_attn;
          c.spec.kdim = kdim;
          c.spec.vdim = kdim == 16 ? 16 : 20;
          c.keys = 7;
          c.queries = 4;
          c.cross = true;
          c.key_padding = MaskKind::kBool;
          c.attn = MaskKind::kFloat;
          c.is_causal = seed % 2 == 0;
          c.need_weights = true;
          c.average = seed % 4 < 2;
          RunCase(c, seed++);
        }
      }
    }
  }
}

TEST(MhaEngineTest, MatchesReferenceForShapesAndHeads) {
  uint32_t seed = 200;
  for (int64_t heads : {1, 2, 4, 8}) {
    for (bool batched : {true, false}) {
      Case c;
      c.spec = testing::SelfAttentionSpec(64, heads);
      c.batched = batched;
      c.batch = 3;
      c.queries = 9;
      c.keys = 6;
      c.cross = heads % 2 == 0;
      c.key_padding = MaskKind::kBool;
      c.attn = MaskKind::kBool;
      c.attn_3d = heads > 2;
      c.need_weights = true;
      c.average = !batched;
      RunCase(c, seed++);
    }
  }
}

TEST(MhaEngineTest, SmallScoreBlocksGiveTheSameResult) {
  uint32_t seed = 300;
  for (MaskKind am : {MaskKind::kNone, MaskKind::kBool}) {
    for (bool attn_3d : {false, true}) {
      for (int64_t block : {1, 600, 5000}) {
        Case c;
        c.spec = testing::SelfAttentionSpec(32, 4);
        c.queries = 37;
        c.attn = am;
        c.attn_3d = attn_3d && am != MaskKind::kNone;
        c.key_padding = MaskKind::kBool;
        c.is_causal = attn_3d;
        c.need_weights = block == 600;
        c.average = false;
        c.score_block_bytes = block;  // From one query row per block up.
        RunCase(c, seed++);
      }
    }
  }
}

TEST(MhaEngineTest, ItemChunksWhenOneRowOfEveryItemExceedsTheBudget) {
  // One query row of one item is 4 heads x 37 keys x 4 bytes = 592 bytes; a
  // 1300-byte budget holds two items' rows, so 5 items go as 2 + 2 + 1, each
  // with its own masks and weights.
  uint32_t seed = 400;
  for (MaskKind am : {MaskKind::kNone, MaskKind::kBool}) {
    for (bool average : {false, true}) {
      Case c;
      c.spec = testing::SelfAttentionSpec(32, 4);
      c.batch = 5;
      c.queries = 3;
      c.keys = 37;
      c.cross = true;
      c.attn = am;
      c.attn_3d = am != MaskKind::kNone;
      c.key_padding = MaskKind::kBool;
      c.is_causal = am == MaskKind::kNone;
      c.need_weights = true;
      c.average = average;
      c.score_block_bytes = 1300;
      RunCase(c, seed++);
    }
  }
}

TEST(MhaEngineTest, FullyMaskedRowsGiveZeroWeightsAndBiasOutput) {
  auto model = MhaModel::Random(testing::SelfAttentionSpec(16, 2), 5);
  ASSERT_TRUE(model.ok());
  auto engine = MhaEngine::Create(*model);
  ASSERT_TRUE(engine.ok());
  std::mt19937 rng(5);
  Tensor q = RandomTensor({2, 3, 16}, rng);
  Tensor kpm(DType::kBool, {2, 3});
  for (int j = 0; j < 3; ++j) kpm.mutable_as<uint8_t>()[j] = 1;  // Item 0: every key ignored.
  Tensor am(DType::kBool, {3, 3});
  for (int j = 0; j < 3; ++j) am.mutable_as<uint8_t>()[1 * 3 + j] = 1;  // Row 1: nothing allowed.
  for (bool with_attn_mask : {false, true}) {
    MhaInputs in;
    in.query = q.view();
    in.key_padding_mask = kpm.view();
    if (with_attn_mask) in.attn_mask = am.view();
    in.need_weights = true;
    auto out = (*engine)->Forward(in);
    ASSERT_TRUE(out.ok()) << out.status();
    const float* o = out->output.as<float>();
    const float* w = out->attn_weights->as<float>();
    const float* bias = (*model)->weights().out_bias.as<float>();
    for (int64_t i = 0; i < out->output.num_elements(); ++i) ASSERT_FALSE(std::isnan(o[i]));
    for (int i = 0; i < 3; ++i) {
      for (int c = 0; c < 16; ++c) EXPECT_FLOAT_EQ(o[i * 16 + c], bias[c]) << "item 0 row " << i;
      for (int j = 0; j < 3; ++j) EXPECT_EQ(w[i * 3 + j], 0.0f);
    }
    if (with_attn_mask) {  // Item 1's row 1 is fully masked too; its other rows are not.
      for (int c = 0; c < 16; ++c) EXPECT_FLOAT_EQ(o[(3 + 1) * 16 + c], bias[c]);
      EXPECT_NEAR(w[9 + 0] + w[9 + 1] + w[9 + 2], 1.0f, 1e-6);
    }
  }
}

TEST(MhaEngineTest, HalfAndBFloat16InputsAndOutputs) {
  auto model = MhaModel::Random(testing::SelfAttentionSpec(32, 4), 9);
  ASSERT_TRUE(model.ok());
  auto engine = MhaEngine::Create(*model);
  ASSERT_TRUE(engine.ok());
  std::mt19937 rng(9);
  Tensor q32 = RandomTensor({2, 6, 32}, rng);
  for (DType in_type : {DType::kFloat16, DType::kBFloat16}) {
    Tensor q = q32.ConvertTo(in_type);
    MhaInputs in;
    in.query = q.view();
    in.need_weights = true;
    auto out = (*engine)->Forward(in);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->output.dtype(), in_type);  // Defaults to the query's dtype.
    EXPECT_EQ(out->attn_weights->dtype(), in_type);
    // The reference sees the same rounded inputs; the output's rounding bounds the error.
    testing::Reference ref = ReferenceMha(**model, in);
    Tensor got = out->output.ConvertTo(DType::kFloat32);
    const double tol = in_type == DType::kFloat16 ? 2e-3 : 1e-2;
    EXPECT_LE(MaxExcess(got.as<float>(), ref.output, tol), 1e-3);
    in.output_dtype = DType::kFloat32;
    auto out32 = (*engine)->Forward(in);
    ASSERT_TRUE(out32.ok());
    EXPECT_EQ(out32->output.dtype(), DType::kFloat32);
    EXPECT_LE(MaxExcess(out32->output.as<float>(), ref.output, kRtol), kAtol);
  }
}

TEST(MhaEngineTest, BFloat16ComputeIsWithinTolerance) {
  MhaSpec spec = testing::SelfAttentionSpec(64, 4);
  spec.compute_dtype = DType::kBFloat16;
  for (bool need_weights : {false, true}) {
    auto model = MhaModel::Random(spec, 11);
    ASSERT_TRUE(model.ok());
    auto engine = MhaEngine::Create(*model);
    ASSERT_TRUE(engine.ok());
    std::mt19937 rng(11);
    Tensor q = RandomTensor({2, 16, 64}, rng);
    Tensor kpm = RandomMask({2, 16}, rng, 0.25);
    MhaInputs in;
    in.query = q.view();
    in.key_padding_mask = kpm.view();
    in.is_causal = true;
    in.need_weights = need_weights;
    auto out = (*engine)->Forward(in);
    ASSERT_TRUE(out.ok()) << out.status();
    testing::Reference ref = ReferenceMha(**model, in);
    EXPECT_LE(MaxExcess(out->output.as<float>(), ref.output, 2e-2), 2e-2);
  }
}

TEST(MhaEngineTest, ForwardBatchWithPaddingEqualsSoloRuns) {
  // Items of different lengths and masks padded into one batch give what each
  // gives alone: the guarantee the server's batcher builds on.
  MhaSpec spec = testing::SelfAttentionSpec(32, 4);
  spec.add_bias_kv = true;
  spec.add_zero_attn = true;
  auto model = MhaModel::Random(spec, 21);
  ASSERT_TRUE(model.ok());
  auto engine = MhaEngine::Create(*model);
  ASSERT_TRUE(engine.ok());
  std::mt19937 rng(21);
  const std::vector<int64_t> lengths = {3, 7, 5};
  const int64_t max_len = 7, e = 32, h = 4, total = max_len + 2;
  std::vector<Tensor> queries, kpms, masks;
  Tensor padded(DType::kFloat32, {3, max_len, e});
  std::vector<ItemMask> items(3);
  for (int64_t n = 0; n < 3; ++n) {
    const int64_t len = lengths[n];
    queries.push_back(RandomTensor({1, len, e}, rng));
    kpms.push_back(RandomMask({1, len}, rng, 0.2));
    masks.push_back(RandomTensor({h, len, len}, rng, 1.0f));
    std::memcpy(padded.mutable_as<float>() + n * max_len * e, queries[n].data(),
                queries[n].num_bytes());
    items[n].valid_queries = items[n].valid_keys = len;
    items[n].key_padding = kpms[n].data();
    items[n].key_padding_dtype = DType::kBool;
    items[n].attn_mask = masks[n].data();
    items[n].attn_mask_dtype = DType::kFloat32;
    items[n].attn_mask_per_head = true;
    items[n].is_causal = n == 1;
  }
  std::vector<float> output(3 * max_len * e), weights(3 * h * max_len * total);
  ASSERT_TRUE((*engine)
                  ->ForwardBatch(padded.view(), std::nullopt, std::nullopt, items, output.data(),
                                 weights.data())
                  .ok());
  for (int64_t n = 0; n < 3; ++n) {
    const int64_t len = lengths[n];
    MhaInputs in;
    in.query = queries[n].view();
    in.key_padding_mask = kpms[n].view();
    in.attn_mask = masks[n].view();
    in.is_causal = n == 1;
    in.need_weights = true;
    in.average_attn_weights = false;
    auto solo = (*engine)->Forward(in);
    ASSERT_TRUE(solo.ok()) << solo.status();
    for (int64_t i = 0; i < len * e; ++i) {
      ASSERT_NEAR(output[n * max_len * e + i], solo->output.as<float>()[i], 1e-6) << n;
    }
    // Weights: the item's own keys, then the two appended ones at the end.
    const float* sw = solo->attn_weights->as<float>();
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t i = 0; i < len; ++i) {
        const float* row = &weights[((n * h + hh) * max_len + i) * total];
        const float* solo_row = sw + (hh * len + i) * (len + 2);
        for (int64_t j = 0; j < len; ++j) ASSERT_NEAR(row[j], solo_row[j], 1e-6);
        for (int64_t j = len; j < max_len; ++j) ASSERT_EQ(row[j], 0.0f);  // Padding.
        ASSERT_NEAR(row[max_len], solo_row[len], 1e-6);
        ASSERT_NEAR(row[max_len + 1], solo_row[len + 1], 1e-6);
      }
    }
  }
}

TEST(MhaEngineTest, ConcurrentCallsWithDifferentShapes) {
  auto model = MhaModel::Random(testing::SelfAttentionSpec(32, 4), 31);
  ASSERT_TRUE(model.ok());
  auto engine = MhaEngine::Create(*model);
  ASSERT_TRUE(engine.ok());
  constexpr int kThreads = 6, kIterations = 15;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      for (int it = 0; it < kIterations; ++it) {
        const int64_t len = 1 + (t * 7 + it * 3) % 13;
        Tensor q = RandomTensor({1 + t % 3, len, 32}, rng);
        Tensor kpm = RandomMask({1 + t % 3, len}, rng, 0.3);
        MhaInputs in;
        in.query = q.view();
        in.key_padding_mask = kpm.view();
        in.is_causal = it % 2 == 0;
        in.need_weights = t % 2 == 0;
        auto out = (*engine)->Forward(in);
        if (!out.ok() ||
            MaxExcess(out->output.as<float>(), ReferenceMha(**model, in).output, kRtol) > kAtol) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_GT((*engine)->cache().hits(), 0u);
}

}  // namespace
}  // namespace attention
