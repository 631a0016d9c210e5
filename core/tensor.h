// File: core/tensor.h
//
// Plain tensors: a dtype, a row-major shape and bytes. `TensorView` borrows
// memory the caller keeps alive; `Tensor` owns a 64-byte aligned buffer.
// Neither is synchronised: share a Tensor across threads only read-only.
//
// Allocation failure throws std::bad_alloc (never a null buffer); core's
// public functions catch it and return RESOURCE_EXHAUSTED, so no exception
// leaves core/.
#ifndef ATTENTION_CORE_TENSOR_H_
#define ATTENTION_CORE_TENSOR_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/memory_meter.h"

namespace attention {

using Shape = std::vector<int64_t>;

// Number of elements of `shape` (1 for a scalar).
int64_t NumElements(const Shape& shape);

// "[2, 3, 4]".
std::string ShapeToString(const Shape& shape);

// A borrowed, dense, row-major tensor. `data` must hold
// NumElements(shape) * DTypeSize(dtype) bytes for as long as the view is used.
struct TensorView {
  DType dtype = DType::kFloat32;
  Shape shape;
  const void* data = nullptr;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t dim(int64_t i) const { return shape[i]; }
  int64_t num_elements() const { return NumElements(shape); }
  size_t num_bytes() const { return static_cast<size_t>(num_elements()) * DTypeSize(dtype); }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

// An owning, dense, row-major tensor with 64-byte aligned storage. Movable,
// not copyable (copy explicitly with Clone()).
class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-filled storage for `shape` of `dtype`.
  Tensor(DType dtype, Shape shape);
  // Copies `bytes` bytes from `src` (must equal the tensor's size).
  static Tensor FromBytes(DType dtype, Shape shape, const void* src);
  // Storage for `shape` left uninitialised, for outputs written in full.
  static Tensor Uninitialized(DType dtype, Shape shape);

  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  Tensor Clone() const;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_[i]; }
  int64_t num_elements() const { return NumElements(shape_); }
  size_t num_bytes() const { return static_cast<size_t>(num_elements()) * DTypeSize(dtype_); }

  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <typename T>
  T* mutable_as() {
    return static_cast<T*>(data());
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data());
  }

  TensorView view() const { return TensorView{dtype_, shape_, data()}; }

  // Reinterprets the same bytes with another shape of equal element count.
  absl::Status Reshape(Shape shape);

  // Returns a copy converted to float-like `dtype` (this must be float-like).
  Tensor ConvertTo(DType dtype) const;

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  struct NoFill {};
  Tensor(DType dtype, Shape shape, NoFill);

  DType dtype_ = DType::kFloat32;
  Shape shape_;
  std::unique_ptr<void, Free> data_;
  MeterCharge charge_;  // num_bytes(), on the MemoryMeter.
};

// The bytes of float-like `t` in float-like `dtype`: t.data itself when it
// already has that dtype, else a converted copy placed in `*storage`.
const void* DataAs(const TensorView& t, DType dtype, Tensor* storage);

// A 64-byte aligned, uninitialised scratch buffer of `bytes` bytes.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  void* data() const { return data_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_.get());
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data_;
};

}  // namespace attention

#endif  // ATTENTION_CORE_TENSOR_H_
