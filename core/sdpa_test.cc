#include "core/sdpa.h"

#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fixture/test_util.h"

namespace attention {
namespace {

using ::attention::testing::MaxExcess;
using ::attention::testing::RandomMask;
using ::attention::testing::RandomTensor;
using ::attention::testing::StatusIs;
using ::testing::HasSubstr;

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

TEST(SdpaTest, MatchesNaiveLoop) {
  std::mt19937 rng(41);
  const int64_t n = 2, h = 3, l = 5, s = 7, d = 8;
  Tensor q = RandomTensor({n, h, l, d}, rng), k = RandomTensor({n, h, s, d}, rng),
         v = RandomTensor({n, h, s, d}, rng);
  Tensor kpm = RandomMask({n, s}, rng, 0.3);
  Tensor am = RandomTensor({n * h, l, s}, rng);
  PrimitiveCache cache(16);
  SdpaInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  in.key_padding_mask = kpm.view();
  in.attn_mask = am.view();
  in.is_causal = true;
  auto out = ScaledDotProductAttention(in, cache);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->shape(), (Shape{n, h, l, d}));
  std::vector<double> expected(n * h * l * d, 0.0);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t i = 0; i < l; ++i) {
        std::vector<double> p(s);
        double m = -INFINITY;
        for (int64_t j = 0; j < s; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < d; ++c)
            acc += q.as<float>()[((b * h + hh) * l + i) * d + c] *
                   k.as<float>()[((b * h + hh) * s + j) * d + c];
          acc = acc / std::sqrt(8.0) + am.as<float>()[((b * h + hh) * l + i) * s + j];
          if (kpm.as<uint8_t>()[b * s + j] || j > i) acc = -INFINITY;
          p[j] = acc;
          m = std::max(m, acc);
        }
        if (m == -INFINITY) continue;
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - m));
        for (int64_t j = 0; j < s; ++j)
          for (int64_t c = 0; c < d; ++c)
            expected[((b * h + hh) * l + i) * d + c] +=
                p[j] / sum * v.as<float>()[((b * h + hh) * s + j) * d + c];
      }
    }
  }
  EXPECT_LE(MaxExcess(out->as<float>(), expected, kRtol), kAtol);
  SdpaInputs bad = in;
  bad.v = q.view();  // Keys and values of different lengths.
  EXPECT_THAT(ScaledDotProductAttention(bad, cache),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("v: expected shape")));
}

}  // namespace
}  // namespace attention
