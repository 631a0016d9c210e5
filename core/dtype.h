// File: core/dtype.h
//
// The element types the engine reads and writes, and the conversions between
// them. Conversions are pure functions: safe from any thread.
#ifndef ATTENTION_CORE_DTYPE_H_
#define ATTENTION_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attention {

enum class DType : uint8_t { kFloat32, kBFloat16, kFloat16, kBool };

// Bytes per element: 4, 2, 2 and 1.
size_t DTypeSize(DType dtype);

// "float32", "bfloat16", "float16", "bool".
absl::string_view DTypeName(DType dtype);

// Parses a name as printed by DTypeName. InvalidArgument for anything else.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// IEEE half and bfloat16 conversions. To-16-bit rounds to nearest even; NaN
// stays NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

// Converts `count` elements of float-like type `src_type` (float32, bfloat16 or
// float16) at `src` into `dst_type` at `dst`. The buffers must not overlap
// unless the types are equal and src == dst.
void ConvertFloats(DType src_type, const void* src, DType dst_type, void* dst, size_t count);

// Reads element `i` of a float-like or bool buffer as float (bool: 0 or 1).
float LoadAsFloat(DType dtype, const void* data, size_t i);

}  // namespace attention

#endif  // ATTENTION_CORE_DTYPE_H_
