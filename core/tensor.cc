#include "core/tensor.h"

#include <cstring>
#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attention {
namespace {

// Never returns null: a failed allocation throws std::bad_alloc, which core's
// public functions turn into RESOURCE_EXHAUSTED (see status_macros.h).
void* AlignedAlloc(size_t bytes) {
  if (bytes > std::numeric_limits<size_t>::max() - 63) throw std::bad_alloc();
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

Tensor::Tensor(DType dtype, Shape shape)
    : dtype_(dtype),
      shape_(std::move(shape)),
      data_(AlignedAlloc(num_bytes())),
      charge_(static_cast<int64_t>(num_bytes())) {
  std::memset(data_.get(), 0, num_bytes());
}

Tensor::Tensor(DType dtype, Shape shape, NoFill)
    : dtype_(dtype),
      shape_(std::move(shape)),
      data_(AlignedAlloc(num_bytes())),
      charge_(static_cast<int64_t>(num_bytes())) {}

Tensor Tensor::Uninitialized(DType dtype, Shape shape) {
  return Tensor(dtype, std::move(shape), NoFill{});
}

Tensor Tensor::FromBytes(DType dtype, Shape shape, const void* src) {
  Tensor t(dtype, std::move(shape), NoFill{});
  if (t.num_bytes() > 0) std::memcpy(t.data(), src, t.num_bytes());
  return t;
}

Tensor Tensor::Clone() const { return FromBytes(dtype_, shape_, data()); }

absl::Status Tensor::Reshape(Shape shape) {
  if (NumElements(shape) != num_elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reshape ", ShapeToString(shape_), " into ", ShapeToString(shape)));
  }
  shape_ = std::move(shape);
  return absl::OkStatus();
}

Tensor Tensor::ConvertTo(DType dtype) const {
  Tensor out = Uninitialized(dtype, shape_);  // Written in full below.
  ConvertFloats(dtype_, data(), dtype, out.data(), static_cast<size_t>(num_elements()));
  return out;
}

const void* DataAs(const TensorView& t, DType dtype, Tensor* storage) {
  if (t.dtype == dtype) return t.data;
  *storage = Tensor(dtype, t.shape);
  ConvertFloats(t.dtype, t.data, dtype, storage->data(), static_cast<size_t>(t.num_elements()));
  return storage->data();
}

AlignedBuffer::AlignedBuffer(size_t bytes) : data_(AlignedAlloc(bytes)) {}

}  // namespace attention
