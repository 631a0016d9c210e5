// The fused kernel's first reference for a row (a "fresh" row, one with no
// reference yet: fused_score_exp.h's RebaseRow takes the block's top in
// registers) where the block is a partial panel: keys not a multiple of 16,
// so the last vector's lanes past the keys hold the zero padding's scores
// (0), which must not count. The row's real scores are all far below 0
// (-1000: 2^-1442 underflows), so a reference taken from the padding would
// leave every probability 0 and the row NaN. The row may stay fresh over
// whole panels of -inf scores first (an infinite key), under is_causal too
// (the causal mask applied in registers). L of 1 and 5 (the 1-row and 4-row
// blocks), head depths off 16, float32 and bfloat16; against a
// double-precision loop, NaN exactly where it puts it. Skipped where the CPU
// has no AVX-512.
#include <algorithm>
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

constexpr float kInf = std::numeric_limits<float>::infinity();

// Keys [0, minus_inf) score -inf; key j >= minus_inf scores -1000 - 4 (j % 3)
// (exact in bfloat16 too). Every row alike: q = (-1, 1, 0, ...).
struct Case {
  int64_t l, s, d, minus_inf;
  bool causal;
  DType compute;
};

float Score(const Case& c, int64_t j) {
  return j < c.minus_inf ? -kInf : -1000.0f - 4.0f * static_cast<float>(j % 3);
}

// softmax over the keys row i sees, in double; NaN when every one scores
// -inf (an input's infinity, not a mask: PyTorch's NaN).
std::vector<double> Reference(const Case& c, const Tensor& v) {
  std::vector<double> out(static_cast<size_t>(c.l * c.d), 0.0);
  for (int64_t i = 0; i < c.l; ++i) {
    const int64_t visible = c.causal ? std::min(i + 1, c.s) : c.s;
    double m = -INFINITY;
    for (int64_t j = 0; j < visible; ++j) m = std::max(m, double{Score(c, j)});
    double* row = out.data() + i * c.d;
    if (m == -INFINITY) {
      std::fill(row, row + c.d, std::nan(""));
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < visible; ++j) sum += std::exp(Score(c, j) - m);
    for (int64_t j = 0; j < visible; ++j) {
      const double p = std::exp(Score(c, j) - m) / sum;
      for (int64_t x = 0; x < c.d; ++x) row[x] += p * v.as<float>()[j * c.d + x];
    }
  }
  return out;
}

void Check(const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "L " << c.l << " S " << c.s << " D " << c.d << " -inf keys "
                                    << c.minus_inf << (c.causal ? " causal" : "")
                                    << (c.compute == DType::kBFloat16 ? " bf16" : " f32"));
  std::mt19937 rng(seed);
  Tensor q(DType::kFloat32, {1, 1, c.l, c.d}), k(DType::kFloat32, {1, 1, c.s, c.d});
  Tensor v = testing::RandomTensor({1, 1, c.s, c.d}, rng);
  float* qp = q.mutable_as<float>();
  for (int64_t i = 0; i < c.l; ++i) {
    qp[i * c.d] = -1.0f;
    qp[i * c.d + 1] = 1.0f;
  }
  float* kp = k.mutable_as<float>();
  for (int64_t j = 0; j < c.s; ++j) {
    if (j < c.minus_inf) {
      kp[j * c.d] = kInf;
    } else {
      kp[j * c.d + 1] = Score(c, j);
    }
    // Features q does not weigh: noise that must not change the scores.
    for (int64_t x = 2; x < c.d; ++x) kp[j * c.d + x] = static_cast<float>(x % 5) - 2.0f;
  }
  SdpaInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  in.scale = 1.0f;
  in.is_causal = c.causal;
  in.compute_dtype = c.compute;
  PrimitiveCache cache(4);
  auto out = ScaledDotProductAttention(in, cache);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->num_elements(), c.l * c.d);
  const std::vector<double> want = Reference(c, v);
  const float* got = out->as<float>();
  // float32: the 2^x polynomial (1.7e-7) and float32 sums; bfloat16: the
  // values and probabilities rounded to 8 bits.
  const double tol = c.compute == DType::kBFloat16 ? 2e-2 : 1e-5;
  for (int64_t e = 0; e < c.l * c.d; ++e) {
    if (std::isnan(want[e])) {
      ASSERT_TRUE(std::isnan(got[e])) << "row " << e / c.d << " column " << e % c.d << ": "
                                      << got[e] << ", want NaN (every score -inf)";
    } else {
      ASSERT_NEAR(got[e], want[e], tol) << "row " << e / c.d << " column " << e % c.d;
    }
  }
}

TEST(FusedFreshRowTest, APartialFirstPanelFarBelowZeroKeepsItsProbabilities) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "no AVX-512 here";
  uint32_t seed = 1;
  for (DType compute : {DType::kFloat32, DType::kBFloat16}) {
    // 1..64 keys: the row's first block is its first panel, 1 to 4 vectors
    // with a partial last one.
    for (int64_t s : {1, 5, 17, 47}) {
      for (int64_t l : {1, 5}) Check({l, s, s % 2 ? 20 : 3, 0, false, compute}, seed++);
    }
    // Whole panels of -inf first (the row stays fresh), then a partial one.
    for (int64_t s : {69, 97, 143}) {
      Check({5, s, 24, s / 64 * 64, false, compute}, seed++);
    }
    // is_causal, L = S = 69: rows 0..63 see only -inf keys (NaN); rows
    // 64..68 meet their first finite scores in the diagonal tile, keys 64..68,
    // the later ones hidden in registers.
    Check({69, 69, 16, 64, true, compute}, seed++);
  }
}

}  // namespace
}  // namespace attention
