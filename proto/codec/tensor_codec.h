// File: proto/codec/tensor_codec.h
//
// The wire codec: conversion between the API's attention.v1.Tensor and the
// core's tensors, shared by the server and the clients (neither reaches into
// the other).
// Decoding borrows the message's bytes (no copy): the message must outlive
// the view. Pure functions, safe from any thread.
#ifndef ATTENTION_PROTO_CODEC_TENSOR_CODEC_H_
#define ATTENTION_PROTO_CODEC_TENSOR_CODEC_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/v1/attention.pb.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace attention::wire {

// DATA_TYPE_FLOAT32 -> kFloat32, ...; InvalidArgument naming `field` for
// DATA_TYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> FromProtoDType(v1::DataType dtype, absl::string_view field);
v1::DataType ToProtoDType(DType dtype);

// A view of `tensor`. InvalidArgument naming `field` when its dtype is
// missing, a dimension is < 1, the rank is over 8, or the data length is not
// product(shape) * sizeof(dtype).
absl::StatusOr<TensorView> DecodeTensor(const v1::Tensor& tensor, absl::string_view field);

// A view of `size` bytes at `data` as a tensor of `dtype` and `shape`, for
// any wire format: INVALID_ARGUMENT naming `field` unless the shape has 1 to
// 8 dimensions, each in [1, 2^31], at most 2^40 elements, and `size` is its
// byte count.
absl::StatusOr<TensorView> CheckedView(DType dtype, Shape shape, const void* data, size_t size,
                                       absl::string_view field);

// As DecodeTensor, but an absent tensor (no dtype, shape or data) is nullopt.
absl::StatusOr<std::optional<TensorView>> DecodeOptionalTensor(const v1::Tensor& tensor,
                                                               absl::string_view field);

// A copy of `tensor` in its own dtype; errors as DecodeTensor.
absl::StatusOr<Tensor> DecodeTensorCopy(const v1::Tensor& tensor, absl::string_view field);

// Writes `t` into `out` (dtype, shape, bytes).
void EncodeTensor(const Tensor& t, v1::Tensor* out);

// Writes a tensor already laid out as wire bytes into `out`, moving `bytes`
// (product(shape) elements of `dtype`) in without a copy.
void EncodeTensorBytes(DType dtype, const Shape& shape, std::string bytes, v1::Tensor* out);

}  // namespace attention::wire

#endif  // ATTENTION_PROTO_CODEC_TENSOR_CODEC_H_
