// The fused kernel's is_causal diagonal tiles (the causal mask applied in
// registers of the fused score kernel, scores accumulated onto -m[r]) where
// they meet the rest: score magnitudes that swing by 1e4 inside one tile,
// NaN and infinity in Q, K and V (NaN where the primitive path puts it),
// bfloat16, lengths off the 4-row, 16-key and 64-row sizes, cross-attention
// with L != S (top-left alignment). Against a double-precision loop and the
// oneDNN-primitive path (KernelOptions::allow_fused = false). Skipped where
// the CPU has no AVX-512.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/fused_attention.h"
#include "core/sdpa.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using testing::RandomTensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// softmax(scale q k^T + causal) v per (head, row) in double; a row that sees
// no key gets zeros (the engine's fully masked rule).
std::vector<double> CausalReference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    double scale) {
  const int64_t h = q.dim(1), l = q.dim(2), s = k.dim(2), d = q.dim(3);
  std::vector<double> out(static_cast<size_t>(h * l * d), 0.0);
  for (int64_t hh = 0; hh < h; ++hh) {
    for (int64_t i = 0; i < l; ++i) {
      const int64_t visible = std::min(i + 1, s);
      if (visible <= 0) continue;
      std::vector<double> p(static_cast<size_t>(visible));
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < visible; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < d; ++c) {
          acc += double{q.as<float>()[(hh * l + i) * d + c]} * k.as<float>()[(hh * s + j) * d + c];
        }
        p[j] = acc * scale;
        m = std::max(m, p[j]);
      }
      for (double& x : p) sum += (x = std::exp(x - m));
      for (int64_t j = 0; j < visible; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          out[(hh * l + i) * d + c] += p[j] / sum * v.as<float>()[(hh * s + j) * d + c];
        }
      }
    }
  }
  return out;
}

struct Paths {
  Tensor fused, plain;
};

Paths RunBoth(const SdpaInputs& in) {
  PrimitiveCache cache(16);
  KernelOptions primitives;
  primitives.allow_fused = false;
  auto fused = ScaledDotProductAttention(in, cache);
  auto plain = ScaledDotProductAttention(in, cache, primitives);
  EXPECT_TRUE(fused.ok()) << fused.status();
  EXPECT_TRUE(plain.ok()) << plain.status();
  if (!fused.ok() || !plain.ok()) return {};
  return {std::move(*fused), std::move(*plain)};
}

// Scores whose first feature alone is large: q_i[0] = +-1, k_j[0] in
// [-1e4, 1e4], so that inside one diagonal tile a row's scores swing between
// -1e4 and +1e4 (in both orders: rising keys move the reference many times in
// a block, falling ones underflow). The other features are small, so the
// rows near the top are not one-hot. float32: the fused path against the
// double loop at 1e-4 relative + 1e-5 absolute (a score of 1e4 carries a
// float32 rounding of 1e-3, so exact agreement is not expected; both paths
// are held to the same bound).
TEST(FusedCausalNumericsTest, ScoreSwingsOfTenThousandInsideADiagonalTile) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here";
  for (int64_t l : {5, 63, 64, 65, 131}) {
    for (int pattern = 0; pattern < 3; ++pattern) {
      SCOPED_TRACE(::testing::Message() << "L " << l << " pattern " << pattern);
      std::mt19937 rng(static_cast<uint32_t>(l * 10 + pattern));
      const int64_t h = 2, d = 16;
      Tensor q = RandomTensor({1, h, l, d}, rng, 0.3f), k = RandomTensor({1, h, l, d}, rng, 0.3f),
             v = RandomTensor({1, h, l, d}, rng);
      for (int64_t hh = 0; hh < h; ++hh) {
        for (int64_t i = 0; i < l; ++i)
          q.mutable_as<float>()[(hh * l + i) * d] = i % 3 ? 1.0f : -1.0f;
        for (int64_t j = 0; j < l; ++j) {
          float b = 0;
          if (pattern == 0)
            b = -1e4f + 2e4f * static_cast<float>(j) / static_cast<float>(l);  // Rising.
          if (pattern == 1)
            b = 1e4f - 2e4f * static_cast<float>(j) / static_cast<float>(l);         // Falling.
          if (pattern == 2) b = (j % 2 ? 1e4f : -1e4f) + static_cast<float>(j % 7);  // Zigzag.
          k.mutable_as<float>()[(hh * l + j) * d] = b;
        }
      }
      SdpaInputs in;
      in.q = q.view();
      in.k = k.view();
      in.v = v.view();
      in.is_causal = true;
      in.scale = 1.0f;
      Paths out = RunBoth(in);
      ASSERT_EQ(out.fused.num_elements(), h * l * d);
      const std::vector<double> want = CausalReference(q, k, v, 1.0);
      // The zigzag's close scores near 1e4 differ by a few units: their
      // float32 rounding (1e4 * 2^-24 per operation, amplified by exp) moves
      // the weights by about 1e-3 on both paths.
      const double atol = pattern == 2 ? 5e-3 : 1e-5;
      EXPECT_LE(testing::MaxExcess(out.plain.as<float>(), want, 1e-4), atol) << "primitive path";
      EXPECT_LE(testing::MaxExcess(out.fused.as<float>(), want, 1e-4), atol) << "fused path";
    }
  }
}

// Cross-attention under is_causal with L != S, top-left aligned (row i sees
// keys j <= i; rows past S see every key), lengths off the block sizes.
TEST(FusedCausalNumericsTest, CrossLengthsTopLeftAligned) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here";
  uint32_t seed = 40;
  for (auto [l, s] : {std::pair<int64_t, int64_t>{1, 300},
                      {3, 17},
                      {17, 3},
                      {66, 65},
                      {65, 66},
                      {129, 257},
                      {257, 129},
                      {200, 1}}) {
    SCOPED_TRACE(::testing::Message() << "L " << l << " S " << s);
    std::mt19937 rng(seed++);
    const int64_t h = 3, d = 24;
    Tensor q = RandomTensor({1, h, l, d}, rng), k = RandomTensor({1, h, s, d}, rng),
           v = RandomTensor({1, h, s, d}, rng);
    SdpaInputs in;
    in.q = q.view();
    in.k = k.view();
    in.v = v.view();
    in.is_causal = true;
    Paths out = RunBoth(in);
    ASSERT_EQ(out.fused.num_elements(), h * l * d);
    const std::vector<double> want = CausalReference(q, k, v, 1.0 / std::sqrt(double(d)));
    EXPECT_LE(testing::MaxExcess(out.fused.as<float>(), want, 1e-5), 1e-6);
    EXPECT_LE(testing::MaxExcess(out.plain.as<float>(), want, 1e-5), 1e-6);
  }
}

// NaN and infinity in Q, K or V at rows before, on and after the diagonal:
// the fused path's NaN positions are the primitive path's, element by
// element, and its finite values agree at 1e-5 (float32) or 2e-2 (bfloat16).
TEST(FusedCausalNumericsTest, NonFiniteInputsLikeThePrimitivePath) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here";
  const int64_t h = 2, l = 130, d = 32;
  struct Poke {
    int which;  // 0 q, 1 k, 2 v.
    int64_t row, col;
    float value;
  };
  const std::vector<std::vector<Poke>> cases = {
      {{1, 70, 3, kNaN}},
      {{2, 70, 0, kNaN}},
      {{1, 129, 5, kInf}},
      {{2, 3, 1, kInf}},
      {{0, 66, 2, kNaN}},
      {{0, 66, 2, kInf}},
      {{1, 64, 0, -kInf}},
      {{2, 127, 31, -kInf}},
      {{1, 0, 0, kInf}, {0, 0, 0, 1.0f}},  // Row 0's one score +inf: NaN.
      {{0, 129, 0, -kInf}},
      {{1, 65, 0, kNaN}, {2, 10, 0, kInf}},
  };
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      SCOPED_TRACE(::testing::Message()
                   << "case " << ci << " bf16 " << (dtype == DType::kBFloat16));
      std::mt19937 rng(static_cast<uint32_t>(500 + ci));
      Tensor t[3] = {RandomTensor({1, h, l, d}, rng), RandomTensor({1, h, l, d}, rng),
                     RandomTensor({1, h, l, d}, rng)};
      for (const Poke& p : cases[ci]) {
        for (int64_t hh = 0; hh < h; ++hh)
          t[p.which].mutable_as<float>()[(hh * l + p.row) * d + p.col] = p.value;
      }
      SdpaInputs in;
      in.q = t[0].view();
      in.k = t[1].view();
      in.v = t[2].view();
      in.is_causal = true;
      in.compute_dtype = dtype;
      Paths out = RunBoth(in);
      ASSERT_EQ(out.fused.num_elements(), out.plain.num_elements());
      const float* f = out.fused.as<float>();
      const float* g = out.plain.as<float>();
      for (int64_t i = 0; i < out.fused.num_elements(); ++i) {
        ASSERT_EQ(std::isnan(f[i]), std::isnan(g[i]))
            << "element " << i << " (row " << (i / d) % l << "): fused " << f[i] << " primitives "
            << g[i];
        if (!std::isnan(f[i]) && f[i] != g[i]) {
          ASSERT_NEAR(f[i], g[i], dtype == DType::kFloat32 ? 1e-5 : 2e-2) << "element " << i;
        }
      }
    }
  }
}

// bfloat16 with score swings inside the diagonal tile: the fused path
// against the primitive path (2e-2).
TEST(FusedCausalNumericsTest, BFloat16ScoreSwings) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here";
  for (int64_t l : {7, 64, 100}) {
    std::mt19937 rng(static_cast<uint32_t>(l));
    const int64_t h = 2, d = 32;
    Tensor q = RandomTensor({1, h, l, d}, rng, 0.3f), k = RandomTensor({1, h, l, d}, rng, 0.3f),
           v = RandomTensor({1, h, l, d}, rng);
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t i = 0; i < l; ++i) q.mutable_as<float>()[(hh * l + i) * d] = 1.0f;
      for (int64_t j = 0; j < l; ++j)
        k.mutable_as<float>()[(hh * l + j) * d] = j % 2 ? 1e3f : -1e3f + j;
    }
    SdpaInputs in;
    in.q = q.view();
    in.k = k.view();
    in.v = v.view();
    in.is_causal = true;
    in.scale = 0.01f;
    in.compute_dtype = DType::kBFloat16;
    Paths out = RunBoth(in);
    ASSERT_EQ(out.fused.num_elements(), h * l * d);
    for (int64_t i = 0; i < h * l * d; ++i) {
      ASSERT_NEAR(out.fused.as<float>()[i], out.plain.as<float>()[i], 2e-2)
          << "L " << l << " " << i;
    }
  }
}

// A row whose every visible score is -inf because of an infinite input (not
// a mask) is NaN on both paths, as in PyTorch 1.13's softmax; the fused
// kernel used to give it zeros (the fully-masked rule). A row the masks hide
// wholly keeps the zeros on both paths, infinite input or not: row 0 under a
// bool attn_mask that hides its one key, and under a key padding mask. bf16
// compute follows the same rule.
TEST(FusedCausalNumericsTest, RowOfMinusInfScoresFromInputsIsNaNAndAMaskedOneIsZero) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here";
  const int64_t h = 1, l = 2, s = 1, d = 16;
  for (DType compute : {DType::kFloat32, DType::kBFloat16}) {
    for (int masked_by = 0; masked_by < 3; ++masked_by) {  // none, attn_mask, key padding
      for (bool causal : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "bf16 " << (compute == DType::kBFloat16)
                                          << " masked_by " << masked_by << " causal " << causal);
        std::mt19937 rng(1);
        Tensor q = RandomTensor({1, h, l, d}, rng), k = RandomTensor({1, h, s, d}, rng),
               v = RandomTensor({1, h, s, d}, rng);
        q.mutable_as<float>()[0] = -1.0f;  // Row 0's one score: -inf.
        k.mutable_as<float>()[0] = kInf;
        Tensor attn(DType::kBool, {l, s});  // Row 0 hidden, row 1 not.
        attn.mutable_as<uint8_t>()[0] = 1;
        Tensor kpm(DType::kBool, {1, s});  // Every key hidden.
        kpm.mutable_as<uint8_t>()[0] = 1;
        SdpaInputs in;
        in.q = q.view();
        in.k = k.view();
        in.v = v.view();
        in.is_causal = causal;
        in.compute_dtype = compute;
        if (masked_by == 1) in.attn_mask = attn.view();
        if (masked_by == 2) in.key_padding_mask = kpm.view();
        Paths out = RunBoth(in);
        ASSERT_EQ(out.fused.num_elements(), h * l * d);
        for (int64_t c = 0; c < d; ++c) {
          const float plain = out.plain.as<float>()[c], fused = out.fused.as<float>()[c];
          if (masked_by == 0) {
            EXPECT_TRUE(std::isnan(plain)) << "primitive path, column " << c << ": " << plain;
            EXPECT_TRUE(std::isnan(fused)) << "fused path, column " << c << ": " << fused;
          } else {
            EXPECT_EQ(plain, 0.0f) << "primitive path, column " << c;
            EXPECT_EQ(fused, 0.0f) << "fused path, column " << c;
          }
        }
        // Row 1 (its score is +inf, or hidden by the key padding mask):
        // whatever the primitive path gives, the fused one gives too.
        for (int64_t c = d; c < 2 * d; ++c) {
          const float plain = out.plain.as<float>()[c], fused = out.fused.as<float>()[c];
          EXPECT_TRUE((std::isnan(plain) && std::isnan(fused)) || plain == fused)
              << "row 1 column " << c - d << ": primitive " << plain << ", fused " << fused;
        }
      }
    }
  }
}

// A row whose first key block scores all -inf (an infinite key) and whose
// later keys score finite but far below 0 (-200, under 2^-126 against a
// reference of 0): the fused kernel used to fix the reference at 0 after the
// -inf block, so the later probabilities underflowed to 0 and the row came
// out zeros (then NaN). PyTorch and the primitive path give the mean of
// those keys' values. Without masks and under is_causal (row 127, its -inf
// block unmasked, the rest in the diagonal tile), float32 and bfloat16.
TEST(FusedCausalNumericsTest, FiniteScoresFarBelowAnAllMinusInfBlockAreKept) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here";
  for (DType compute : {DType::kFloat32, DType::kBFloat16}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "bf16 " << (compute == DType::kBFloat16) << " causal " << causal);
      const int64_t l = causal ? 128 : 1, s = 128, d = 16;
      std::mt19937 rng(3);
      Tensor q(DType::kFloat32, {1, 1, l, d}), k(DType::kFloat32, {1, 1, s, d});
      Tensor v = RandomTensor({1, 1, s, d}, rng);
      float* qp = q.mutable_as<float>();
      for (int64_t i = 0; i < l; ++i) {
        qp[i * d] = -1.0f;
        qp[i * d + 1] = 1.0f;
      }
      float* kp = k.mutable_as<float>();
      for (int64_t j = 0; j < s; ++j) {
        if (j < 64) {
          kp[j * d] = kInf;  // Score -inf.
        } else {
          kp[j * d + 1] = -200.0f;  // Score -200.
        }
      }
      SdpaInputs in;
      in.q = q.view();
      in.k = k.view();
      in.v = v.view();
      in.scale = 1.0f;
      in.is_causal = causal;
      in.compute_dtype = compute;
      Paths out = RunBoth(in);
      ASSERT_EQ(out.fused.num_elements(), l * d);
      // The last row sees keys 64..127 at -200 each: the mean of their values.
      const int64_t row = l - 1;
      for (int64_t c = 0; c < d; ++c) {
        double mean = 0;
        for (int64_t j = 64; j < s; ++j) mean += v.as<float>()[j * d + c] / 64.0;
        const double tol = compute == DType::kBFloat16 ? 2e-2 : 1e-5;
        EXPECT_NEAR(out.plain.as<float>()[row * d + c], mean, tol) << "primitive, column " << c;
        EXPECT_NEAR(out.fused.as<float>()[row * d + c], mean, tol) << "fused, column " << c;
      }
    }
  }
}

// is_causal, key 0 hidden by the key padding mask: row 0 is wholly masked.
// Its query is +inf in feature 0, so its score is -inf on keys 0..63
// (k[0] = -1) and +inf on key 64 (k[0] = 1), which the causal mask makes
// +inf + -inf = NaN: PyTorch and the primitive path give NaN. The fused
// kernel skipped the key tiles after row 0's own (they are all hidden) and
// gave zeros; a non-finite query row now computes every key tile, as a
// non-finite key or value already did.
TEST(FusedCausalNumericsTest, AnInfiniteQueryReachesTheCausallyHiddenKeysOfAMaskedRow) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here";
  const int64_t l = 65, s = 65, d = 16;
  std::mt19937 rng(4);
  Tensor q = RandomTensor({1, 1, l, d}, rng), k(DType::kFloat32, {1, 1, s, d});
  Tensor v = RandomTensor({1, 1, s, d}, rng);
  q.mutable_as<float>()[0] = kInf;
  for (int64_t j = 0; j < s; ++j) k.mutable_as<float>()[j * d] = j < 64 ? -1.0f : 1.0f;
  Tensor kpm(DType::kBool, {1, s});
  kpm.mutable_as<uint8_t>()[0] = 1;
  SdpaInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  in.key_padding_mask = kpm.view();
  in.is_causal = true;
  Paths out = RunBoth(in);
  ASSERT_EQ(out.fused.num_elements(), l * d);
  for (int64_t c = 0; c < d; ++c) {
    EXPECT_TRUE(std::isnan(out.plain.as<float>()[c])) << "primitive, column " << c;
    EXPECT_TRUE(std::isnan(out.fused.as<float>()[c])) << "fused, column " << c;
  }
  // The other rows: the two paths agree (float32 tolerance).
  for (int64_t x = d; x < l * d; ++x) {
    const float a = out.plain.as<float>()[x], b = out.fused.as<float>()[x];
    if (std::isnan(a) || std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a) && std::isnan(b)) << "element " << x;
    } else {
      EXPECT_NEAR(a, b, 1e-5) << "element " << x;
    }
  }
}

}  // namespace
}  // namespace attention
