#include "core/dtype.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace attention {
namespace {

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kBool}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_FALSE(ParseDType("float64").ok());
}

TEST(DTypeTest, HalfKnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                      // Rounds to +inf.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);         // Smallest subnormal.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)), 0x0000);         // Below half of it.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // Tie to even.
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_FLOAT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_FLOAT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(HalfToFloat(0xfc00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, HalfRoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(DTypeTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // Tie, even stays.
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // Tie, odd rounds up.
  EXPECT_FLOAT_EQ(BFloat16ToFloat(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

TEST(DTypeTest, ConvertFloatsBetweenAllTypes) {
  const float src[4] = {0.5f, -1.25f, 3.0f, 1024.0f};  // Exact in every type.
  for (DType a : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (DType b : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      uint8_t mid[16], out[16];
      ConvertFloats(DType::kFloat32, src, a, mid, 4);
      ConvertFloats(a, mid, b, out, 4);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(LoadAsFloat(b, out, i), src[i]);
    }
  }
}

}  // namespace
}  // namespace attention
