// The fused AVX-512 attention kernel against the double-precision reference
// and against the oneDNN-primitive path (KernelOptions::allow_fused = false):
// shapes that are not multiples of the tiles, L != S, every mask kind,
// fully masked rows, appended keys, causal with batch padding, head depths
// 8 to 128, bfloat16, and several threads at once. Skipped where the CPU has
// no AVX-512 (the fallback path is what runs there, and every other test
// covers it).
#include "core/fused_attention.h"

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/mha_engine.h"
#include "core/sdpa.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using testing::RandomMask;
using testing::RandomTensor;

enum class Mask { kNone, kBool, kFloat };

struct FusedCase {
  int64_t depth = 32, heads = 2, batch = 2, queries = 70, keys = 300;
  bool cross = true, bias_kv = false, zero_attn = false, causal = false, bf16 = false;
  Mask key_padding = Mask::kNone, attn = Mask::kNone;
  bool attn_3d = false;
  std::string Name() const {
    return absl::StrCat(
        "D", depth, " H", heads, " N", batch, " L", queries, " S", keys, cross ? " cross" : " self",
        bias_kv ? " kv" : "", zero_attn ? " z" : "", causal ? " causal" : "", bf16 ? " bf16" : "",
        " kpm", static_cast<int>(key_padding), " am", static_cast<int>(attn), attn_3d ? "3d" : "");
  }
};

// Runs `c` on both paths and checks the fused one against the reference
// (float32: 1e-5 relative + 1e-6 absolute; bfloat16 against the primitive
// path at 2e-2).
void Check(const FusedCase& c, uint32_t seed) {
  SCOPED_TRACE(c.Name());
  std::mt19937 rng(seed);
  MhaSpec spec = testing::SelfAttentionSpec(c.depth * c.heads, c.heads);
  spec.add_bias_kv = c.bias_kv;
  spec.add_zero_attn = c.zero_attn;
  if (c.bf16) spec.compute_dtype = DType::kBFloat16;
  auto model = MhaModel::Random(spec, seed);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions fused_options, plain_options;
  plain_options.kernel.allow_fused = false;
  auto fused = MhaEngine::Create(*model, fused_options);
  auto plain = MhaEngine::Create(*model, plain_options);
  ASSERT_TRUE(fused.ok() && plain.ok());

  const int64_t e = spec.embed_dim, keys = c.cross ? c.keys : c.queries;
  Tensor q = RandomTensor({c.batch, c.queries, e}, rng);
  Tensor k = RandomTensor({c.batch, keys, e}, rng);
  Tensor v = RandomTensor({c.batch, keys, e}, rng);
  const Shape am_shape =
      c.attn_3d ? Shape{c.batch * c.heads, c.queries, keys} : Shape{c.queries, keys};
  Tensor kpm = c.key_padding == Mask::kBool ? RandomMask({c.batch, keys}, rng, 0.3)
                                            : RandomTensor({c.batch, keys}, rng, 2.0f);
  Tensor am = c.attn == Mask::kBool ? RandomMask(am_shape, rng, 0.3) : RandomTensor(am_shape, rng);
  if (c.key_padding == Mask::kBool) {  // Item 0 has every key masked.
    for (int64_t j = 0; j < keys; ++j) kpm.mutable_as<uint8_t>()[j] = 1;
  }
  MhaInputs in;
  in.query = q.view();
  if (c.cross) {
    in.key = k.view();
    in.value = v.view();
  }
  if (c.key_padding != Mask::kNone) in.key_padding_mask = kpm.view();
  if (c.attn != Mask::kNone) in.attn_mask = am.view();
  in.is_causal = c.causal;

  auto got = (*fused)->Forward(in);
  auto want = (*plain)->Forward(in);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  const float* g = got->output.as<float>();
  if (c.bf16) {
    for (int64_t i = 0; i < got->output.num_elements(); ++i) {
      ASSERT_NEAR(g[i], want->output.as<float>()[i], 2e-2) << "element " << i;
    }
    return;
  }
  const testing::Reference ref = testing::ReferenceMha(**model, in);
  EXPECT_LE(testing::MaxExcess(g, ref.output, 1e-5), 1e-6);
}

TEST(FusedAttentionTest, MatchesTheReferenceAcrossShapesAndMasks) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here: the primitive path runs";
  uint32_t seed = 1;
  for (Mask kpm : {Mask::kNone, Mask::kBool, Mask::kFloat}) {
    for (Mask am : {Mask::kNone, Mask::kBool, Mask::kFloat}) {
      for (bool attn_3d : {false, true}) {
        if (am == Mask::kNone && attn_3d) continue;
        for (bool causal : {false, true}) {
          FusedCase c;
          c.key_padding = kpm;
          c.attn = am;
          c.attn_3d = attn_3d;
          c.causal = causal;
          c.cross = seed % 2 == 0;  // Self-attention: L = S = 70.
          Check(c, seed++);
        }
      }
    }
  }
}

TEST(FusedAttentionTest, HeadDepthsAppendedKeysAndOddLengths) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here: the primitive path runs";
  uint32_t seed = 100;
  for (int64_t depth : {8, 16, 32, 64, 80, 128}) {
    FusedCase c;
    c.depth = depth;
    c.queries = 1 + static_cast<int64_t>(seed % 97);
    c.keys = 513 + depth;  // Crosses two key tiles with a tail.
    c.bias_kv = depth % 32 == 0;
    c.zero_attn = depth != 64;
    c.key_padding = Mask::kBool;
    c.causal = depth >= 64;
    Check(c, seed++);
  }
}

// is_causal with no other mask: the tiles the causal mask cuts (the diagonal
// ones) run through the fused score kernel with the mask applied in
// registers. Lengths around the 64-row task and 4-row block sizes (remainder
// rows, a partial last vector of keys), cross-attention both ways, and
// bfloat16.
TEST(FusedAttentionTest, CausalTilesInTheScoreKernel) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here: the primitive path runs";
  uint32_t seed = 300;
  for (int64_t queries : {1, 5, 63, 64, 65, 130, 257}) {
    for (int64_t depth : {32, 64}) {
      FusedCase c;
      c.depth = depth;
      c.heads = 2;
      c.batch = 1;
      c.queries = queries;
      c.cross = false;
      c.causal = true;
      Check(c, seed++);
    }
  }
  for (auto [queries, keys] : {std::pair<int64_t, int64_t>{70, 300}, {300, 70}, {129, 131}}) {
    FusedCase c;
    c.queries = queries;
    c.keys = keys;
    c.cross = true;
    c.causal = true;
    Check(c, seed++);
  }
  for (int64_t queries : {65, 200}) {
    FusedCase c;
    c.bf16 = true;
    c.queries = queries;
    c.cross = false;
    c.causal = true;
    Check(c, seed++);
  }
}

// is_causal with bias_kv and add_zero_attn and no other mask: the diagonal
// tiles run through the fused score kernel while the appended keys (never
// causally hidden) follow in a tile of their own; self-attention and cross
// with L != S both ways, float32 and bfloat16.
TEST(FusedAttentionTest, CausalDiagonalTilesWithAppendedKeys) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here: the primitive path runs";
  uint32_t seed = 700;
  for (bool bf16 : {false, true}) {
    for (auto [queries, keys, cross] : {std::tuple<int64_t, int64_t, bool>{65, 65, false},
                                        {130, 130, false},
                                        {70, 3, true},
                                        {5, 300, true}}) {
      for (int appended : {1, 2, 3}) {  // bias_kv, zero_attn, both.
        FusedCase c;
        c.bf16 = bf16;
        c.queries = queries;
        c.keys = keys;
        c.cross = cross;
        c.causal = true;
        c.bias_kv = appended & 1;
        c.zero_attn = appended & 2;
        Check(c, seed++);
      }
    }
  }
}

TEST(FusedAttentionTest, BFloat16MatchesThePrimitivePath) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here: the primitive path runs";
  FusedCase c;
  c.bf16 = true;
  c.attn = Mask::kFloat;
  c.key_padding = Mask::kBool;
  Check(c, 200);
  c.causal = true;
  c.cross = false;
  Check(c, 201);
}

TEST(FusedAttentionTest, CausalBatchWithPaddingEqualsSoloRuns) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here: the primitive path runs";
  // Items of lengths 300 and 90 padded to 300, causal: the fused kernel skips
  // the short item's padded key tiles and the tiles above the diagonal.
  std::mt19937 rng(7);
  auto model = MhaModel::Random(testing::SelfAttentionSpec(64, 2), 7);
  auto engine = MhaEngine::Create(*model);
  ASSERT_TRUE(engine.ok());
  const int64_t lengths[2] = {300, 90}, padded = 300, e = 64;
  Tensor batch(DType::kFloat32, {2, padded, e});
  std::vector<Tensor> solo;
  std::vector<ItemMask> items(2);
  for (int i = 0; i < 2; ++i) {
    solo.push_back(RandomTensor({1, lengths[i], e}, rng));
    std::memcpy(batch.mutable_as<float>() + i * padded * e, solo[i].data(), solo[i].num_bytes());
    items[i].valid_queries = items[i].valid_keys = lengths[i];
    items[i].is_causal = true;
  }
  std::vector<float> output(2 * padded * e);
  ASSERT_TRUE(
      (*engine)
          ->ForwardBatch(batch.view(), std::nullopt, std::nullopt, items, output.data(), nullptr)
          .ok());
  for (int i = 0; i < 2; ++i) {
    MhaInputs in;
    in.query = solo[i].view();
    in.is_causal = true;
    auto alone = (*engine)->Forward(in);
    ASSERT_TRUE(alone.ok());
    for (int64_t j = 0; j < lengths[i] * e; ++j) {
      ASSERT_NEAR(output[i * padded * e + j], alone->output.as<float>()[j], 1e-5) << i << " " << j;
    }
  }
}

// Scores that jump by about 9 (log2 units) from one 64-key panel to the next
// (every other panel) make the unmasked tiles move their rows' reference in
// the middle of a tile and rescale what they wrote (fused_score_exp.h); the
// rows whose scores fall there never do. float32 (both paths) against a double
// loop, bfloat16 against the primitive path.
TEST(FusedAttentionTest, ScoresRisingAcrossTheKeysMoveTheReference) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here: the primitive path runs";
  std::mt19937 rng(11);
  const int64_t h = 2, l = 9, keys = 700, d = 16;
  Tensor q = RandomTensor({1, h, l, d}, rng, 0.1f), k = RandomTensor({1, h, keys, d}, rng, 0.1f),
         v = RandomTensor({1, h, keys, d}, rng);
  for (int64_t hh = 0; hh < h; ++hh) {
    for (int64_t i = 0; i < l; ++i) q.mutable_as<float>()[(hh * l + i) * d] = i % 2 ? 1.0f : -1.0f;
    for (int64_t j = 0; j < keys; ++j)
      k.mutable_as<float>()[(hh * keys + j) * d] = j % 128 < 64 ? 0.0f : 25.0f;
  }
  std::vector<double> expected(h * l * d, 0.0);
  for (int64_t hh = 0; hh < h; ++hh) {
    for (int64_t i = 0; i < l; ++i) {
      std::vector<double> p(keys);
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < keys; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < d; ++c) {
          acc +=
              double{q.as<float>()[(hh * l + i) * d + c]} * k.as<float>()[(hh * keys + j) * d + c];
        }
        m = std::max(m, p[j] = acc / std::sqrt(double(d)));
      }
      for (double& x : p) sum += (x = std::exp(x - m));
      for (int64_t j = 0; j < keys; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          expected[(hh * l + i) * d + c] += p[j] / sum * v.as<float>()[(hh * keys + j) * d + c];
        }
      }
    }
  }
  PrimitiveCache cache(16);
  SdpaInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  KernelOptions primitives;
  primitives.allow_fused = false;
  auto fused = ScaledDotProductAttention(in, cache);
  auto reference_path = ScaledDotProductAttention(in, cache, primitives);
  ASSERT_TRUE(fused.ok() && reference_path.ok()) << fused.status();
  EXPECT_LE(testing::MaxExcess(fused->as<float>(), expected, 1e-5), 1e-6);
  EXPECT_LE(testing::MaxExcess(reference_path->as<float>(), expected, 1e-5), 1e-6);

  in.compute_dtype = DType::kBFloat16;
  auto bf16 = ScaledDotProductAttention(in, cache);
  auto plain = ScaledDotProductAttention(in, cache, primitives);
  ASSERT_TRUE(bf16.ok() && plain.ok());
  for (int64_t i = 0; i < h * l * d; ++i) {
    ASSERT_NEAR(bf16->as<float>()[i], plain->as<float>()[i], 2e-2) << i;
  }
}

TEST(FusedAttentionTest, SeveralThreadsAtOnce) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here: the primitive path runs";
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 3; ++i) {
        FusedCase c;
        c.queries = 20 + 13 * t;
        c.keys = 100 + 37 * i;
        c.key_padding = Mask::kFloat;
        c.causal = (t + i) % 2 == 0;
        Check(c, static_cast<uint32_t>(300 + 10 * t + i));
      }
    });
  }
  for (auto& th : threads) th.join();
}

}  // namespace
// The fused kernel's 64-key panels are not taken where their padding would
// dominate: 8000 items over 1 key (524 MB of panels for 2 MB of keys) go to
// the primitive path; the demo shape and long sequences stay fused.
TEST(FusedAttentionTest, PaddingDecidesTheFit) {
  EXPECT_EQ(FusedKeyPanelBytes(8000 * 8, 32, 1, 1), int64_t{8000} * 8 * 32 * 64 * 4);
  EXPECT_FALSE(FusedAttentionFits(8000 * 8, 32, 1, 1));
  EXPECT_TRUE(FusedAttentionFits(8, 32, 32, 32));         // 1x32x256, H=8: 64 KiB.
  EXPECT_TRUE(FusedAttentionFits(8, 32, 4096, 4096));     // Long: no padding to speak of.
  EXPECT_TRUE(FusedAttentionFits(8 * 16, 32, 100, 101));  // 3 panels for 101 keys: < 2x.
}

}  // namespace attention
