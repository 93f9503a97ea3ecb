// Loop helpers shared by the CPU kernels: broadcast strides, one row-major walk over several
// strided operands (elementwise ops, transpose, slice, expand, tile, reductions all use it),
// byte-wise strided copies, and the dropout keep test.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/kernel_attrs.h"

namespace memc::cpu {

// Σ a[i]·b[i] (b = nullptr: Σ a[i]) in 16 interleaved partial sums combined in a fixed order:
// GCC vectorizes the lanes, where one running sum is a serial chain (a float reduction it may not
// reorder). The result depends only on the data and n, never on alignment or threads.
template <typename C>
C interleaved_dot(const C* a, const C* b, int64_t n) {
  constexpr int kParts = 16;
  C part[kParts] = {};
  int64_t i = 0;
  for (; i + kParts <= n; i += kParts) {
    if (b) {
      for (int k = 0; k < kParts; ++k) part[k] += a[i + k] * b[i + k];
    } else {
      for (int k = 0; k < kParts; ++k) part[k] += a[i + k];
    }
  }
  C total = 0;
  for (int k = 0; k < kParts; ++k) total += part[k];
  for (; i < n; ++i) total += b ? a[i] * b[i] : a[i];
  return total;
}

// broadcast_strides: ir/tensor.h.

// Element offset of the `linear`-th row-major position of `shape` under `strides`.
inline int64_t strided_offset(int64_t linear, const Shape& shape, const std::vector<int64_t>& strides) {
  int64_t offset = 0;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    offset += (linear % shape[d]) * strides[d];
    linear /= shape[d];
  }
  return offset;
}

// Walks `shape` row-major with N operands; operand k's element offset advances by strides[k][d]
// along dim d, starting at base[k]. Unit dims are dropped and adjacent dims that every operand
// crosses contiguously are merged, so same-shape contiguous operands become one run and
// row(offsets, length, inner_strides) sees the longest innermost runs possible.
template <size_t N, typename RowFn>
void for_each_row(const Shape& shape, const std::array<std::vector<int64_t>, N>& strides, RowFn&& row,
                  std::array<int64_t, N> base = {}) {
  Shape dims;
  std::array<std::vector<int64_t>, N> merged;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    bool contiguous = !dims.empty();
    for (size_t k = 0; k < N && contiguous; ++k) contiguous = merged[k].back() == strides[k][d] * shape[d];
    if (contiguous) {
      dims.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) merged[k].back() = strides[k][d];
    } else {
      dims.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) merged[k].push_back(strides[k][d]);
    }
  }
  std::array<int64_t, N> inner{};
  if (dims.empty()) {
    row(base, int64_t{1}, inner);
    return;
  }
  const int outer_rank = static_cast<int>(dims.size()) - 1;
  for (size_t k = 0; k < N; ++k) inner[k] = merged[k].back();
  std::vector<int64_t> index(outer_rank, 0);
  std::array<int64_t, N> offsets = base;
  while (true) {
    row(offsets, dims.back(), inner);
    int d = outer_rank - 1;
    for (; d >= 0; --d) {
      for (size_t k = 0; k < N; ++k) offsets[k] += merged[k][d];
      if (++index[d] < dims[d]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= merged[k][d] * dims[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// Unsigned integer of a given byte width: data movement ops copy elements by size, not dtype.
template <size_t Bytes>
struct ElementBits;
template <> struct ElementBits<1> { using type = uint8_t; };
template <> struct ElementBits<2> { using type = uint16_t; };
template <> struct ElementBits<4> { using type = uint32_t; };
template <> struct ElementBits<8> { using type = uint64_t; };

// Calls fn.template operator()<E>() with E an unsigned type as wide as one element of `t`.
template <typename Fn>
decltype(auto) dispatch_element_size(DType t, Fn&& fn) {
  switch (dtype_size(t)) {
    case 1: return fn.template operator()<uint8_t>();
    case 2: return fn.template operator()<uint16_t>();
    case 4: return fn.template operator()<uint32_t>();
    default: return fn.template operator()<uint64_t>();
  }
}

// out[out_base + i] = in[in_base + Σ index_d·in_strides_d] over `shape` row-major; `out` is
// contiguous. Transpose, slice, expand and tile are this copy with different strides.
inline void strided_copy(Tensor& out, const Tensor& in, const Shape& shape, const std::vector<int64_t>& in_strides,
                         int64_t in_base = 0, int64_t out_base = 0) {
  dispatch_element_size(in.dtype(), [&]<typename E>() {
    E* y = static_cast<E*>(out.raw());               // [numel(shape)]
    const E* x = static_cast<const E*>(in.raw());    // strided view
    for_each_row<2>(shape, {row_major_strides(shape), in_strides}, [&](const std::array<int64_t, 2>& off, int64_t n,
                                                                        const std::array<int64_t, 2>& st) {
      if (st[1] == 1) {
        std::memcpy(y + off[0], x + off[1], static_cast<size_t>(n) * sizeof(E));
      } else {
        for (int64_t i = 0; i < n; ++i) y[off[0] + i] = x[off[1] + i * st[1]];
      }
    }, {out_base, in_base});
  });
}

// dropout_stream and dropout_threshold: backends/kernel_math.h; random_draw_offset:
// backends/kernel_attrs.h (both shared with CUDA).

// Offset into data [row-major `data_shape`] of output element `i` of gather_elements /
// scatter target of its gradient: i's coordinates over `index_shape`, with the axis coordinate
// replaced by the index (negative wraps). -1 when the index is out of range.
inline int64_t gather_elements_offset(int64_t i, const Shape& index_shape, const Shape& data_shape, int64_t axis,
                               int64_t index) {
  const int64_t dim = data_shape[axis];
  if (index < -dim || index >= dim) return -1;
  if (index < 0) index += dim;
  int64_t offset = 0, stride = 1;
  for (int64_t d = static_cast<int64_t>(index_shape.size()) - 1; d >= 0; --d) {
    const int64_t coord = i % index_shape[d];
    i /= index_shape[d];
    offset += (d == axis ? index : coord) * stride;
    stride *= data_shape[d];
  }
  return offset;
}

// "memc.op: dtype x not supported" for dispatch branches an op does not implement.
inline Status unsupported_dtype(const KernelContext& ctx, DType t) {
  return Status::BadInput(str_cat("CPU kernel memc.", ctx.node.op, " does not support ", dtype_name(t)));
}

// Calls fn.template operator()<T>() for the float storage types; other dtypes are unsupported.
template <typename Fn>
inline Status dispatch_float(const KernelContext& ctx, DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: fn.template operator()<float>(); return Status::Ok();
    case DType::kF64: fn.template operator()<double>(); return Status::Ok();
    case DType::kF16: fn.template operator()<f16_t>(); return Status::Ok();
    case DType::kBF16: fn.template operator()<bf16_t>(); return Status::Ok();
    default: return unsupported_dtype(ctx, t);
  }
}

// Compile-time dtype classes used by `if constexpr` in dispatch lambdas.
template <typename T>
constexpr bool kIsFloatStorage = std::is_floating_point_v<T> || std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>;
template <typename T>
constexpr bool kIsNumeric = !std::is_same_v<T, bool>;

}  // namespace memc::cpu
