#include "ir/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "support/status.h"

namespace memc {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s;
}

std::vector<int64_t> row_major_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  const std::vector<int64_t> own = row_major_strides(in);
  const size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) strides[lead + d] = in[d] == 1 ? 0 : own[d];
  return strides;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  const size_t bytes = std::max<size_t>(t.nbytes(), 1);
  // 64-byte alignment suits SIMD kernels and BLAS.
  const size_t padded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, padded);
  if (!p) throw std::bad_alloc();  // as operator new would: the CLI and the Python package report it in one line
  std::memset(p, 0, padded);
  t.owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::borrow(DType dtype, Shape shape, void* data) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  MEMC_CHECK(memc::numel(shape) == numel(), "reshape ", shape_str(shape_), " to ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = zeros(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

double Tensor::get_as_double(int64_t i) const {
  return dispatch_dtype(dtype_, [&]<typename T>() -> double {
    return static_cast<double>(load<T>(data<T>()[i]));
  });
}

int64_t Tensor::get_as_int(int64_t i) const {
  return dispatch_dtype(dtype_, [&]<typename T>() -> int64_t {
    return static_cast<int64_t>(load<T>(data<T>()[i]));
  });
}

void Tensor::set_from_double(int64_t i, double v) {
  dispatch_dtype(dtype_, [&]<typename T>() {
    using C = typename Compute<T>::type;
    data<T>()[i] = store<T, C>(static_cast<C>(v));
  });
}

Tensor Tensor::cast(DType to) const {
  Tensor out = zeros(to, shape_);
  const int64_t n = numel();
  dispatch_dtype(dtype_, [&]<typename S>() {
    dispatch_dtype(to, [&]<typename D>() {
      using C = typename Compute<D>::type;
      const S* src = data<S>();
      D* dst = out.data<D>();
      for (int64_t i = 0; i < n; ++i) dst[i] = store<D, C>(static_cast<C>(load<S>(src[i])));
    });
  });
  return out;
}

}  // namespace memc
