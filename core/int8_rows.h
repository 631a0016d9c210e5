// File: core/int8_rows.h
//
// The per-row steps around an int8 matrix product (QuantizedLinear):
// quantizing a block of activation rows dynamically, and turning the int32
// accumulators back into float32 or bfloat16 outputs.
//
// Quantization is asymmetric per row, as ONNX Runtime's DynamicQuantizeLinear
// does per tensor: with lo = min(0, row) and hi = max(0, row), scale = (hi -
// lo) / 255 (1 for a row of zeros), zero point z = round(-lo / scale) in
// [0, 255] (0 is exact), and q = clamp(round(x / scale) + z, 0, 255) as u8
// (vpdpbusd multiplies u8 by s8). A row holding a NaN or an infinity gets a
// NaN scale, so that its outputs come out NaN, as the float paths make them.
//
// Dequantization: y[m][n] = (acc[m][n] - z[m] colsum[n]) scale[m] wscale[n]
// + bias[n], where colsum[n] is the sum of weight column n (the zero point's
// share of the product).
//
// Both run vectorised (AVX-512) where the CPU has it, else as plain loops
// (Scalar* below, exposed for tests). Stateless; thread-safe.
#ifndef ATTENTION_CORE_INT8_ROWS_H_
#define ATTENTION_CORE_INT8_ROWS_H_

#include <cstdint>

#include "core/dtype.h"

namespace attention {

// `rows` rows of `cols` float32 or bfloat16 values, `ld` elements apart, into
// q (rows x cols u8, dense), scale and zero_point (one per row).
void QuantizeRows(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ld, uint8_t* q,
                  float* scale, float* zero_point);

// Where DequantizeRows writes: row m of the block at y + m * ld elements of
// `dtype` (float32 or bfloat16).
struct RowsOut {
  void* y = nullptr;
  DType dtype = DType::kFloat32;
  int64_t ld = 0;
};

// `rows` rows of `cols` int32 accumulators (dense) into `out`, with the rows'
// scale and zero_point and the columns' weight scale, column sums and bias
// (null: none).
void DequantizeRows(const int32_t* acc, int64_t rows, int64_t cols, const float* scale,
                    const float* zero_point, const float* w_scale, const float* col_sum,
                    const float* bias, const RowsOut& out);

namespace int8_internal {

// The plain-loop versions (the vectorised ones round and clamp the same way;
// results agree up to the last bit of the float arithmetic).
void ScalarQuantizeRows(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ld,
                        uint8_t* q, float* scale, float* zero_point);
void ScalarDequantizeRows(const int32_t* acc, int64_t rows, int64_t cols, const float* scale,
                          const float* zero_point, const float* w_scale, const float* col_sum,
                          const float* bias, const RowsOut& out);
// The AVX-512 versions (int8_rows_avx512.cc); call only where AvxAvailable().
bool AvxAvailable();
void AvxQuantizeRows(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ld, uint8_t* q,
                     float* scale, float* zero_point);
void AvxDequantizeRows(const int32_t* acc, int64_t rows, int64_t cols, const float* scale,
                       const float* zero_point, const float* w_scale, const float* col_sum,
                       const float* bias, const RowsOut& out);

}  // namespace int8_internal
}  // namespace attention

#endif  // ATTENTION_CORE_INT8_ROWS_H_
