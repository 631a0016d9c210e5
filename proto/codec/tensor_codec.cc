#include "proto/codec/tensor_codec.h"

#include <utility>
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include "core/checked_math.h"

namespace attention::wire {

absl::StatusOr<DType> FromProtoDType(v1::DataType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DATA_TYPE_BFLOAT16:
      return DType::kBFloat16;
    case v1::DATA_TYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DATA_TYPE_BOOL:
      return DType::kBool;
    default:
      // Masks may be bool; tensors of values may not, and say so.
      const bool mask = absl::StrContains(field, "mask") || field == "not_key";
      return absl::InvalidArgumentError(absl::StrCat(
          field,
          mask ? ": dtype must be DATA_TYPE_FLOAT32, DATA_TYPE_BFLOAT16, DATA_TYPE_FLOAT16 or "
                 "DATA_TYPE_BOOL, got "
               : ": dtype must be DATA_TYPE_FLOAT32, DATA_TYPE_BFLOAT16 or DATA_TYPE_FLOAT16, "
                 "got ",
          v1::DataType_Name(dtype).empty() ? absl::StrCat(static_cast<int>(dtype))
                                           : v1::DataType_Name(dtype)));
  }
}

v1::DataType ToProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DATA_TYPE_FLOAT32;
    case DType::kBFloat16:
      return v1::DATA_TYPE_BFLOAT16;
    case DType::kFloat16:
      return v1::DATA_TYPE_FLOAT16;
    case DType::kBool:
      return v1::DATA_TYPE_BOOL;
  }
  return v1::DATA_TYPE_UNSPECIFIED;
}

absl::StatusOr<TensorView> DecodeTensor(const v1::Tensor& tensor, absl::string_view field) {
  if (tensor.dtype() == v1::DATA_TYPE_UNSPECIFIED && tensor.shape_size() == 0 &&
      tensor.data().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": required, but the request does not set it (dtype, shape, data)"));
  }
  auto dtype = FromProtoDType(tensor.dtype(), field);
  if (!dtype.ok()) return dtype.status();
  return CheckedView(*dtype, Shape(tensor.shape().begin(), tensor.shape().end()),
                     tensor.data().data(), tensor.data().size(), field);
}

absl::StatusOr<TensorView> CheckedView(DType dtype, Shape shape, const void* data, size_t size,
                                       absl::string_view field) {
  if (shape.empty() || shape.size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected 1 to 8 dimensions, got ", shape.size()));
  }
  TensorView view;
  view.dtype = dtype;
  view.shape = std::move(shape);
  for (int64_t d : view.shape) {
    if (d < 1 || d > kMaxDim) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": every dimension must be in [1, 2^31], got shape ", ShapeToString(view.shape)));
    }
  }
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  const std::optional<int64_t> elements = CheckedProduct(view.shape, kMaxElements);
  if (!elements) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": shape ", ShapeToString(view.shape), " has more than 2^40 elements"));
  }
  const uint64_t expected = static_cast<uint64_t>(*elements) * DTypeSize(dtype);
  if (size != expected) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": data has ", size, " bytes but shape ",
                                                   ShapeToString(view.shape), " of ",
                                                   DTypeName(dtype), " needs ", expected));
  }
  view.data = data;
  return view;
}

absl::StatusOr<std::optional<TensorView>> DecodeOptionalTensor(const v1::Tensor& tensor,
                                                               absl::string_view field) {
  if (tensor.dtype() == v1::DATA_TYPE_UNSPECIFIED && tensor.shape_size() == 0 &&
      tensor.data().empty()) {
    return std::optional<TensorView>();
  }
  auto view = DecodeTensor(tensor, field);
  if (!view.ok()) return view.status();
  return std::optional<TensorView>(*view);
}

absl::StatusOr<Tensor> DecodeTensorCopy(const v1::Tensor& tensor, absl::string_view field) {
  auto view = DecodeTensor(tensor, field);
  if (!view.ok()) return view.status();
  return Tensor::FromBytes(view->dtype, view->shape, view->data);
}

void EncodeTensor(const Tensor& t, v1::Tensor* out) {
  out->set_dtype(ToProtoDType(t.dtype()));
  out->mutable_shape()->Assign(t.shape().begin(), t.shape().end());
  out->set_data(t.data(), t.num_bytes());
}

void EncodeTensorBytes(DType dtype, const Shape& shape, std::string bytes, v1::Tensor* out) {
  out->set_dtype(ToProtoDType(dtype));
  out->mutable_shape()->Assign(shape.begin(), shape.end());
  out->set_data(std::move(bytes));
}

}  // namespace attention::wire
