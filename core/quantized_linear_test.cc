// int8 projections: the per-row quantization steps (vectorised against the
// plain loops, zero exact, non-finite rows NaN) and QuantizedLinear against
// a float32 product, with the error bounded by the quantization steps.
#include "core/quantized_linear.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attention {
namespace {

std::vector<float> Normal(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Int8RowsTest, VectorisedStepsMatchThePlainLoops) {
  if (!int8_internal::AvxAvailable()) GTEST_SKIP() << "no AVX-512 here: the loops run";
  std::mt19937 rng(1);
  for (int64_t cols : {1, 16, 37, 100}) {
    const int64_t rows = 5, ld = cols + 3;
    std::vector<float> x = Normal(rows * ld, rng);
    for (int64_t k = 0; k < cols; ++k) x[k] = std::abs(x[k]);  // A row with no negatives.
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = FloatToBFloat16(x[i]);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const void* src = dtype == DType::kFloat32 ? static_cast<const void*>(x.data()) : xb.data();
      std::vector<uint8_t> q1(rows * cols), q2(rows * cols);
      std::vector<float> s1(rows), s2(rows), z1(rows), z2(rows);
      int8_internal::ScalarQuantizeRows(src, dtype, rows, cols, ld, q1.data(), s1.data(),
                                        z1.data());
      int8_internal::AvxQuantizeRows(src, dtype, rows, cols, ld, q2.data(), s2.data(), z2.data());
      EXPECT_EQ(q1, q2) << cols;
      EXPECT_EQ(s1, s2) << cols;
      EXPECT_EQ(z1, z2) << cols;
      EXPECT_EQ(z1[0], 0.0f);  // The row with no negatives starts at 0.

      const int64_t out_cols = cols + 5;
      std::vector<int32_t> acc(rows * out_cols);
      std::uniform_int_distribution<int32_t> a(-100000, 100000);
      for (int32_t& v : acc) v = a(rng);
      std::vector<float> ws = Normal(out_cols, rng), cs = Normal(out_cols, rng, 100.0f),
                         bias = Normal(out_cols, rng);
      for (DType out_dtype : {DType::kFloat32, DType::kBFloat16}) {
        std::vector<float> y1(rows * out_cols), y2(rows * out_cols);
        const RowsOut o1{y1.data(), out_dtype, out_cols}, o2{y2.data(), out_dtype, out_cols};
        int8_internal::ScalarDequantizeRows(acc.data(), rows, out_cols, s1.data(), z1.data(),
                                            ws.data(), cs.data(), bias.data(), o1);
        int8_internal::AvxDequantizeRows(acc.data(), rows, out_cols, s1.data(), z1.data(),
                                         ws.data(), cs.data(), bias.data(), o2);
        EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), rows * out_cols * DTypeSize(out_dtype)))
            << cols;
      }
    }
  }
}

TEST(Int8RowsTest, ZeroIsExactAndANonFiniteRowGivesNaN) {
  const int64_t cols = 20;
  std::vector<float> x(3 * cols, 0.0f);
  x[3] = -2.0f;
  x[4] = 3.0f;
  x[cols + 7] = std::numeric_limits<float>::infinity();
  x[2 * cols + 1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> q(3 * cols);
  std::vector<float> scale(3), zero(3);
  QuantizeRows(x.data(), DType::kFloat32, 3, cols, cols, q.data(), scale.data(), zero.data());
  EXPECT_FLOAT_EQ(scale[0], 5.0f / 255);
  EXPECT_EQ(q[0], zero[0]);  // 0 maps to the zero point exactly...
  EXPECT_EQ(q[3], 0);        // ... the minimum to 0 and the maximum to 255.
  EXPECT_EQ(q[4], 255);
  EXPECT_TRUE(std::isnan(scale[1]));
  EXPECT_TRUE(std::isnan(scale[2]));
  // Dequantized: a zero product gives the bias; the non-finite rows NaN.
  std::vector<int32_t> acc(3 * 2, 0);
  const float w_scale[2] = {0.5f, 0.25f}, col_sum[2] = {0.0f, 0.0f}, bias[2] = {1.0f, -1.0f};
  std::vector<float> y(3 * 2);
  DequantizeRows(acc.data(), 3, 2, scale.data(), zero.data(), w_scale, col_sum, bias,
                 RowsOut{y.data(), DType::kFloat32, 2});
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -1.0f);
  for (int i = 2; i < 6; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
}

// y = x W^T + b against float32, for shapes whose rows span several int32
// blocks (out = 2048: 512 rows per block) and whose widths are not multiples
// of the vectors. Each output's error is at most the sum over its row of half
// a step of x times |w| plus half a step of w times |x| (and their product),
// checked here with that bound.
TEST(QuantizedLinearTest, MatchesFloatWithinTheQuantizationSteps) {
  std::mt19937 rng(3);
  struct Shape {
    int64_t rows, in, out;
  };
  for (Shape sh : {Shape{7, 37, 21}, Shape{600, 64, 2048}}) {
    std::vector<float> w_t = Normal(sh.in * sh.out, rng, 0.1f), bias = Normal(sh.out, rng);
    std::vector<float> x = Normal(sh.rows * sh.in, rng);
    auto q = QuantizedLinear::Create(w_t.data(), sh.in, sh.out, bias.data());
    ASSERT_TRUE(q.ok()) << q.status();
    PrimitiveCache cache(8);
    std::vector<float> y(sh.rows * sh.out);
    ASSERT_TRUE((*q)->Run(x.data(), DType::kFloat32, sh.rows, sh.in,
                          RowsOut{y.data(), DType::kFloat32, sh.out}, cache)
                    .ok());
    const std::vector<float>& ws = (*q)->weight_scales();
    double worst = 0;
    for (int64_t m = 0; m < sh.rows; ++m) {
      float lo = 0, hi = 0;
      for (int64_t k = 0; k < sh.in; ++k) {
        lo = std::min(lo, x[m * sh.in + k]);
        hi = std::max(hi, x[m * sh.in + k]);
      }
      const double x_step = (hi - lo) / 255.0;
      for (int64_t n = 0; n < sh.out; ++n) {
        double ref = bias[n], bound = 1e-4;
        for (int64_t k = 0; k < sh.in; ++k) {
          const double xv = x[m * sh.in + k], wv = w_t[k * sh.out + n];
          ref += xv * wv;
          bound += 0.5 * x_step * std::abs(wv) + 0.5 * ws[n] * std::abs(xv) + 0.25 * x_step * ws[n];
        }
        const double err = std::abs(y[m * sh.out + n] - ref);
        ASSERT_LE(err, bound) << "row " << m << " column " << n;
        worst = std::max(worst, err / bound);
      }
    }
    EXPECT_GT(worst, 0.0);  // Quantized: not bit-exact float.
  }
}

}  // namespace
}  // namespace attention
