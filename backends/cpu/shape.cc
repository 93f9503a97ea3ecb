// Data-movement kernels: constant, reshape, transpose, slice, concat, expand, gather, pad,
// tile. They copy elements by size, so every dtype works; transpose, slice, expand and tile
// are one strided copy with different input strides.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/loops.h"
#include "ir/ops/ops.h"  // kGatherNoRow
#include "backends/cpu/parallel.h"
#include "backends/cpu/workspace.h"

namespace memc::cpu {
namespace {

// strided_copy with the output's first dim split over threads: each copies whole output rows, so
// the bytes written do not depend on the thread count.
void parallel_strided_copy(Tensor& out, const Tensor& in, const Shape& shape, const std::vector<int64_t>& in_strides,
                           int64_t in_base = 0) {
  if (shape.empty() || shape[0] < 2) {
    strided_copy(out, in, shape, in_strides, in_base);
    return;
  }
  const int64_t row = numel(shape) / shape[0];
  parallel_ranges(shape[0], std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(row, 1)), INT64_MAX,
                  [&](int64_t, int64_t begin, int64_t end) {
                    Shape part = shape;
                    part[0] = end - begin;
                    strided_copy(out, in, part, in_strides, in_base + begin * in_strides[0], begin * row);
                  });
}

Status copy_bytes(Tensor& out, const void* src) {
  if (out.nbytes()) std::memcpy(out.raw(), src, out.nbytes());
  return Status::Ok();
}

Status constant_kernel(KernelContext& ctx) {
  const Tensor* value = ctx.node.attrs.get_tensor("value");
  MEMC_CHECK(value && value->nbytes() == ctx.outputs[0]->nbytes(), "constant value does not match its output type");
  return copy_bytes(*ctx.outputs[0], value->raw());
}

// Row-major bytes do not change; reshape is a copy (the memory planner may alias it away).
Status reshape_kernel(KernelContext& ctx) { return copy_bytes(*ctx.outputs[0], ctx.inputs[0]->raw()); }

// y[i...] = x[i at perm]: output dim d walks input dim perm[d].
Status transpose_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  const auto perm = ctx.node.attrs.get_ints("perm");
  const std::vector<int64_t> x_strides = row_major_strides(x.shape());
  std::vector<int64_t> strides;
  for (int64_t p : perm) strides.push_back(x_strides[p]);
  parallel_strided_copy(*ctx.outputs[0], x, ctx.outputs[0]->shape(), strides);
  return Status::Ok();
}

// Output dim d starts at starts[d] and advances by steps[d] input elements (negative steps walk
// backwards); the shape function already fixed the counts.
Status slice_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  const auto axes = ctx.node.attrs.get_ints("axes"), starts = ctx.node.attrs.get_ints("starts"),
             steps = ctx.node.attrs.get_ints("steps");
  std::vector<int64_t> strides = row_major_strides(x.shape());
  int64_t base = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (y.shape()[axes[i]] == 0) return Status::Ok();  // empty slice: nothing to read
    base += starts[i] * strides[axes[i]];
    strides[axes[i]] *= steps[i];
  }
  parallel_strided_copy(y, x, y.shape(), strides, base);
  return Status::Ok();
}

// Per outer index (dims before axis), each input contributes one contiguous chunk.
Status concat_kernel(KernelContext& ctx) {
  Tensor& y = *ctx.outputs[0];
  const int64_t axis = ctx.node.attrs.get_int("axis", 0);
  const size_t element = dtype_size(y.dtype());
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= y.shape()[d];
  if (outer == 0) return Status::Ok();
  const size_t out_chunk = y.nbytes() / outer;
  auto* out = static_cast<char*>(y.raw());  // [outer, Σ chunk bytes]
  size_t offset = 0;
  for (const Tensor* x : ctx.inputs) {
    const size_t chunk = x->nbytes() / outer;
    const auto* in = static_cast<const char*>(x->raw());  // [outer, chunk bytes]
    for (int64_t o = 0; o < outer && chunk; ++o) std::memcpy(out + o * out_chunk + offset, in + o * chunk, chunk);
    offset += chunk;
  }
  MEMC_CHECK(offset == out_chunk, "concat chunks (", offset, " bytes) do not fill the output (", out_chunk, ", element ", element, ")");
  return Status::Ok();
}

Status expand_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  parallel_strided_copy(y, x, y.shape(), broadcast_strides(x.shape(), y.shape()));
  return Status::Ok();
}

// numpy take: data viewed as [outer, n, inner], y as [outer, I, inner]. Indices are user data
// (token ids), so a bad one is an error value, never a crash.
Status gather_kernel(KernelContext& ctx) {
  const Tensor &data = *ctx.inputs[0], &indices = *ctx.inputs[1];
  Tensor& y = *ctx.outputs[0];
  const int64_t axis = ctx.node.attrs.get_int("axis", 0);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < data.rank(); ++d) {
    if (d < axis) outer *= data.shape()[d];
    if (d > axis) inner *= data.shape()[d];
  }
  const int64_t n = data.shape()[axis], count = indices.numel();
  // Check every index before writing anything; the copy below re-reads them (no index buffer).
  for (int64_t i = 0; i < count; ++i) {
    const int64_t index = indices.get_as_int(i);
    if (index == kGatherNoRow) return Status::BadInput(str_cat("index tuple ", i, " lies outside the data's dims"));
    if (index < -n || index >= n) {
      return Status::BadInput(str_cat("gather index ", index, " out of range for dim ", n, " (axis ", axis, ")"));
    }
  }
  auto row = [&](int64_t i) {
    const int64_t index = indices.get_as_int(i);
    return index < 0 ? index + n : index;
  };
  const size_t row_bytes = static_cast<size_t>(inner) * dtype_size(data.dtype());
  const auto* src = static_cast<const char*>(data.raw());  // [outer, n, inner]
  auto* dst = static_cast<char*>(y.raw());                 // [outer, I, inner]
  for (int64_t o = 0; o < outer && row_bytes; ++o) {
    for (int64_t i = 0; i < count; ++i) std::memcpy(dst + (o * count + i) * row_bytes, src + (o * n + row(i)) * row_bytes, row_bytes);
  }
  return Status::Ok();
}

// y[i] = data[i with i_axis ← indices[i]]; indices are user data, so a bad one is an error.
Status gather_elements_kernel(KernelContext& ctx) {
  const Tensor &data = *ctx.inputs[0], &indices = *ctx.inputs[1];
  Tensor& y = *ctx.outputs[0];
  const int64_t axis = ctx.node.attrs.get_int("axis", 0);
  const int64_t count = indices.numel();
  for (int64_t i = 0; i < count; ++i) {
    if (gather_elements_offset(i, indices.shape(), data.shape(), axis, indices.get_as_int(i)) < 0) {
      return Status::BadInput(str_cat("gather_elements index ", indices.get_as_int(i), " out of range for dim ",
                                      data.shape()[axis], " (axis ", axis, ")"));
    }
  }
  dispatch_element_size(data.dtype(), [&]<typename E>() {
    const E* src = static_cast<const E*>(data.raw());  // [data shape]
    E* dst = static_cast<E*>(y.raw());                 // [indices shape]
    for (int64_t i = 0; i < count; ++i) dst[i] = src[gather_elements_offset(i, indices.shape(), data.shape(), axis, indices.get_as_int(i))];
  });
  return Status::Ok();
}

// Input coordinate read by each output coordinate along one dim; -1 where the constant fills.
// Reflect mirrors without repeating the edge (numpy "reflect"), periodically for wide pads.
void pad_source(int64_t* source, int64_t in, int64_t begin, int64_t out, const std::string& mode) {  // source: [out]
  for (int64_t o = 0; o < out; ++o) source[o] = pad_source_index(o, in, begin, mode);
}

// Every output row (all dims but the last) either lies in the constant border or reads one
// input row through the last dim's source map.
// source[d] is dim d's map [out[d]] (pad_source).
template <typename T>
void pad(T* y, const T* x, const Shape& in, const Shape& out, const std::vector<const int64_t*>& source, T value) {
  // y: [out], x: [in]
  const int64_t rank = static_cast<int64_t>(out.size());
  if (rank == 0) {
    y[0] = x[0];
    return;
  }
  const std::vector<int64_t> in_strides = row_major_strides(in);
  const int64_t width = out.back(), rows = width ? numel(out) / width : 0;
  const int64_t* last = source.back();
  std::vector<int64_t> index(rank - 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t base = 0;
    bool border = false;
    for (int64_t d = 0; d + 1 < rank; ++d) {
      const int64_t s = source[d][index[d]];
      border = border || s < 0;
      base += s * in_strides[d];
    }
    T* yr = y + r * width;
    if (border) {
      std::fill(yr, yr + width, value);
    } else {
      for (int64_t o = 0; o < width; ++o) yr[o] = last[o] < 0 ? value : x[base + last[o]];
    }
    for (int64_t d = rank - 2; d >= 0 && ++index[d] == out[d]; --d) index[d] = 0;
  }
}

Status pad_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  const auto pads = ctx.node.attrs.get_ints("pads");
  const std::string mode = ctx.node.attrs.get_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge") return Status::BadInput(str_cat("unknown pad mode '", mode, "'"));
  if (y.numel() == 0) return Status::Ok();
  const size_t rank = x.shape().size();
  Workspace ws(ctx);
  std::vector<const int64_t*> source;  // O(rank) pointers into the workspace
  for (size_t d = 0; d < rank; ++d) {
    int64_t* map = ws.take<int64_t>(y.shape()[d]);
    pad_source(map, x.shape()[d], pads[d], y.shape()[d], mode);
    source.push_back(map);
  }
  const double value = ctx.node.attrs.get_float("value", 0.0);
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    pad(y.data<T>(), x.data<T>(), x.shape(), y.shape(), source, store<T>(static_cast<C>(value)));
  });
  return Status::Ok();
}

// One source map per output dim: Σ_d out[d] int64 (not the element count).
int64_t pad_workspace(const Node&, std::span<const TensorType>, std::span<const TensorType> out) {
  if (out[0].numel() == 0) return 0;
  Workspace ws;
  for (int64_t extent : out[0].shape) ws.take<int64_t>(extent);
  return ws.used_bytes();
}

// y viewed as [r0, n0, r1, n1, ...]: the repeat dims have input stride 0.
Status tile_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  const auto repeats = ctx.node.attrs.get_ints("repeats");
  const std::vector<int64_t> x_strides = row_major_strides(x.shape());
  Shape view;
  std::vector<int64_t> strides;
  for (size_t d = 0; d < repeats.size(); ++d) {
    view.insert(view.end(), {repeats[d], x.shape()[d]});
    strides.insert(strides.end(), {0, x_strides[d]});
  }
  parallel_strided_copy(*ctx.outputs[0], x, view, strides);
  return Status::Ok();
}

}  // namespace

void register_shape_kernels(KernelTable& t) {
  t.add("constant", constant_kernel);
  t.add("reshape", reshape_kernel);
  t.add("transpose", transpose_kernel);
  t.add("slice", slice_kernel);
  t.add("concat", concat_kernel);
  t.add("expand", expand_kernel);
  t.add("gather", gather_kernel);
  t.add("gather_elements", gather_elements_kernel);
  t.add("pad", pad_kernel, pad_workspace);
  t.add("tile", tile_kernel);
}

}  // namespace memc::cpu
