#include "core/dtype.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace attention {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kBool:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kBool}) {
    if (name == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "': expected one of float32, bfloat16, float16, bool"));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal half: normalise into a float32 normal.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return BitsToFloat(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | mant << 13);
  }
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | mant << 13);
  return BitsToFloat(sign | (exp + 127 - 15) << 23 | mant << 13);
}

uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN.
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // Overflow to inf.
  if (abs < 0x38800000u) {  // Subnormal or zero in half.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // value = mant * 2^(exp - 150); half ulp = 2^-24.
    uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float BFloat16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBFloat16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN.
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float LoadAsFloat(DType dtype, const void* data, size_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBool:
      return static_cast<const uint8_t*>(data)[i] != 0 ? 1.0f : 0.0f;
  }
  return 0.0f;
}

void ConvertFloats(DType src_type, const void* src, DType dst_type, void* dst, size_t count) {
  if (src_type == dst_type) {
    if (src != dst) std::memcpy(dst, src, count * DTypeSize(src_type));
    return;
  }
  const int64_t n = static_cast<int64_t>(count);
  // Large inputs and weights: use every core. (Read only by the OpenMP
  // clauses, which a compiler without OpenMP code generation drops.)
  [[maybe_unused]] const bool parallel = n > (1 << 15);
  if (dst_type == DType::kFloat32) {
    float* out = static_cast<float*>(dst);
    const uint16_t* in = static_cast<const uint16_t*>(src);
    if (src_type == DType::kBFloat16) {
#pragma omp parallel for simd if (parallel)
      for (int64_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
    } else {
#pragma omp parallel for if (parallel)
      for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
    }
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(dst);
  if (src_type == DType::kFloat32) {
    const float* in = static_cast<const float*>(src);
    if (dst_type == DType::kBFloat16) {
#pragma omp parallel for simd if (parallel)
      for (int64_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(in[i]);
    } else {
#pragma omp parallel for if (parallel)
      for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
    }
    return;
  }
  // Between the two 16-bit types: through float.
  const uint16_t* in = static_cast<const uint16_t*>(src);
#pragma omp parallel for if (parallel)
  for (int64_t i = 0; i < n; ++i) {
    const float f = src_type == DType::kBFloat16 ? BFloat16ToFloat(in[i]) : HalfToFloat(in[i]);
    out[i] = dst_type == DType::kBFloat16 ? FloatToBFloat16(f) : FloatToHalf(f);
  }
}

}  // namespace attention
