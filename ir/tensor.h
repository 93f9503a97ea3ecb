// A dense, row-major tensor: dtype, static shape and a view into shared storage.
// Storage may be owned (heap) or borrowed (a slice of a planned arena).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/dtype.h"

namespace memc {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "16x197x768", "" for scalars
std::vector<int64_t> row_major_strides(const Shape& shape);
// Element strides of `in` seen as broadcast to `out` (numpy rules, `in` right-aligned):
// 0 along dims that `in` lacks or holds as 1.
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out);

class Tensor {
 public:
  Tensor() = default;
  // Owned, zero-initialized storage.
  static Tensor zeros(DType dtype, Shape shape);
  // Borrowed storage: the caller keeps `data` alive (arena slices).
  static Tensor borrow(DType dtype, Shape shape, void* data);
  // A tensor of the same storage with another shape of equal element count.
  Tensor reshaped(Shape shape) const;
  Tensor clone() const;

  bool defined() const { return data_ != nullptr || memc::numel(shape_) == 0; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return memc::numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T>
  T* data() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }
  // Reads element i converted to double (any dtype); for tests and folding.
  double get_as_double(int64_t i) const;
  int64_t get_as_int(int64_t i) const;
  void set_from_double(int64_t i, double v);
  // Converts to another dtype (rounding to nearest even for 16-bit floats).
  Tensor cast(DType to) const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
};

}  // namespace memc
