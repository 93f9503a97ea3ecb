// Data-movement ops: constant, reshape, transpose, slice, concat, expand, gather, pad, tile.
// Attributes hold fully resolved static values (the frontend folds ONNX's dynamic forms).
#include <algorithm>

#include "ir/ops/ops.h"

namespace memc {
namespace {

constexpr auto kNoFlops = [](const Node&, std::span<const TensorType>, std::span<const TensorType>) {
  return int64_t{0};
};

Status reshape_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const Shape shape = c.node.attrs.get_ints("shape");
  MEMC_RETURN_IF_ERROR(check_shape(shape, "reshape"));
  if (numel(shape) != c.inputs[0].numel()) {
    return Status::BadInput(str_cat("cannot reshape ", shape_str(c.inputs[0].shape), " to ", shape_str(shape)));
  }
  out = {TensorType{c.inputs[0].dtype, shape}};
  return Status::Ok();
}

Status transpose_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const auto perm = c.node.attrs.get_ints("perm");
  const Shape& x = c.inputs[0].shape;
  if (perm.size() != x.size()) return Status::BadInput("perm length differs from rank");
  MEMC_RETURN_IF_ERROR(check_axes(perm, static_cast<int64_t>(x.size()), "perm"));
  Shape y;
  for (int64_t p : perm) y.push_back(x[p]);
  out = {TensorType{c.inputs[0].dtype, y}};
  return Status::Ok();
}

// Number of indices start, start+step, ... strictly before end.
int64_t slice_count(int64_t start, int64_t end, int64_t step) {
  if (step > 0) return end > start ? (end - start + step - 1) / step : 0;
  return start > end ? (start - end - step - 1) / (-step) : 0;
}

// slice {axes, starts, ends, steps}: starts within [0, dim) (or count 0); ends exclusive,
// -1 allowed with a negative step to run through index 0.
Status slice_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const auto axes = c.node.attrs.get_ints("axes"), starts = c.node.attrs.get_ints("starts"),
             ends = c.node.attrs.get_ints("ends"), steps = c.node.attrs.get_ints("steps");
  Shape y = c.inputs[0].shape;
  if (starts.size() != axes.size() || ends.size() != axes.size() || steps.size() != axes.size()) {
    return Status::BadInput("axes/starts/ends/steps lengths differ");
  }
  MEMC_RETURN_IF_ERROR(check_small(starts, "starts"));
  MEMC_RETURN_IF_ERROR(check_small(ends, "ends"));
  MEMC_RETURN_IF_ERROR(check_small(steps, "steps"));
  MEMC_RETURN_IF_ERROR(check_axes(axes, static_cast<int64_t>(y.size()), "slice"));
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t dim = y[axes[i]];
    if (steps[i] == 0) return Status::BadInput("slice step is 0");
    const int64_t n = slice_count(starts[i], ends[i], steps[i]);
    if (n > 0 && (starts[i] < 0 || starts[i] >= dim || ends[i] < -1 || ends[i] > dim)) {
      return Status::BadInput(str_cat("slice [", starts[i], ":", ends[i], ":", steps[i], "] outside dim ", dim));
    }
    y[axes[i]] = n;
  }
  out = {TensorType{c.inputs[0].dtype, y}};
  return Status::Ok();
}

Status concat_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const int64_t axis = c.node.attrs.get_int("axis", 0);
  Shape y = c.inputs[0].shape;
  MEMC_RETURN_IF_ERROR(check_axes({axis}, static_cast<int64_t>(y.size()), "concat"));
  for (size_t i = 1; i < c.inputs.size(); ++i) {
    const Shape& s = c.inputs[i].shape;
    if (c.inputs[i].dtype != c.inputs[0].dtype || s.size() != y.size()) return Status::BadInput("operands differ in dtype or rank");
    for (size_t d = 0; d < s.size(); ++d) {
      if (static_cast<int64_t>(d) != axis && s[d] != y[d]) return Status::BadInput(str_cat("operand ", i, " has shape ", shape_str(s)));
    }
    y[axis] += s[axis];
  }
  out = {TensorType{c.inputs[0].dtype, y}};
  return Status::Ok();
}

Status expand_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const Shape target = c.node.attrs.get_ints("shape");
  MEMC_RETURN_IF_ERROR(check_shape(target, "expand"));
  MEMC_ASSIGN_OR_RETURN(Shape b, broadcast_shapes(c.inputs[0].shape, target));
  if (b != target) return Status::BadInput(str_cat("cannot expand ", shape_str(c.inputs[0].shape), " to ", shape_str(target)));
  out = {TensorType{c.inputs[0].dtype, target}};
  return Status::Ok();
}

// gather(data, indices) {axis}: y = data[..., indices, ...] (numpy take); negative indices wrap.
Status gather_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const int64_t axis = c.node.attrs.get_int("axis", 0);
  const Shape &d = c.inputs[0].shape, &idx = c.inputs[1].shape;
  MEMC_RETURN_IF_ERROR(check_axes({axis}, static_cast<int64_t>(d.size()), "gather"));
  if (c.inputs[1].dtype != DType::kI64 && c.inputs[1].dtype != DType::kI32) return Status::BadInput("indices must be i64 or i32");
  Shape y(d.begin(), d.begin() + axis);
  y.insert(y.end(), idx.begin(), idx.end());
  y.insert(y.end(), d.begin() + axis + 1, d.end());
  out = {TensorType{c.inputs[0].dtype, y}};
  return Status::Ok();
}

// gather_elements(data, indices) {axis}: y[i] = data[i with i_axis ← indices[i]] (torch.gather);
// indices has data's rank and, off the axis, dims no larger than data's.
Status gather_elements_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const int64_t axis = c.node.attrs.get_int("axis", 0);
  const Shape &d = c.inputs[0].shape, &idx = c.inputs[1].shape;
  MEMC_RETURN_IF_ERROR(check_axes({axis}, static_cast<int64_t>(d.size()), "gather_elements"));
  if (c.inputs[1].dtype != DType::kI64 && c.inputs[1].dtype != DType::kI32) return Status::BadInput("indices must be i64 or i32");
  if (idx.size() != d.size()) return Status::BadInput("indices and data differ in rank");
  for (size_t i = 0; i < d.size(); ++i) {
    if (static_cast<int64_t>(i) != axis && idx[i] > d[i]) {
      return Status::BadInput(str_cat("indices ", shape_str(idx), " exceed data ", shape_str(d), " off the axis"));
    }
  }
  out = {TensorType{c.inputs[0].dtype, idx}};
  return Status::Ok();
}

}  // namespace

int64_t pad_source_index(int64_t o, int64_t in, int64_t begin, std::string_view mode) {
  int64_t i = o - begin;
  if (i >= 0 && i < in) return i;
  if (in == 0 || mode == "constant") return -1;
  if (mode == "edge") return std::clamp<int64_t>(i, 0, in - 1);
  if (in == 1) return 0;
  const int64_t period = 2 * (in - 1);
  i = ((i % period) + period) % period;
  return i >= in ? period - i : i;
}

namespace {

// pad {pads = [begin..., end...], mode = "constant"|"reflect"|"edge", value}.
Status pad_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const auto pads = c.node.attrs.get_ints("pads");
  Shape y = c.inputs[0].shape;
  if (pads.size() != 2 * y.size()) return Status::BadInput("pads must hold 2·rank values");
  MEMC_RETURN_IF_ERROR(check_small(pads, "pads"));
  for (size_t i = 0; i < y.size(); ++i) {
    y[i] += pads[i] + pads[y.size() + i];
    if (y[i] < 0) return Status::BadInput("negative padded size");
  }
  MEMC_RETURN_IF_ERROR(check_shape(y, "pad result"));
  out = {TensorType{c.inputs[0].dtype, y}};
  return Status::Ok();
}

Status tile_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const auto repeats = c.node.attrs.get_ints("repeats");
  Shape y = c.inputs[0].shape;
  if (repeats.size() != y.size()) return Status::BadInput("repeats length differs from rank");
  for (size_t i = 0; i < y.size(); ++i) {
    if (repeats[i] < 0 || repeats[i] > kMaxDim) return Status::BadInput("repeat outside [0, 2^40]");
    if (repeats[i] != 0 && y[i] > kMaxDim / repeats[i]) return Status::BadInput("tiled dim exceeds 2^40");
    y[i] *= repeats[i];
  }
  MEMC_RETURN_IF_ERROR(check_shape(y, "tile result"));
  out = {TensorType{c.inputs[0].dtype, y}};
  return Status::Ok();
}

}  // namespace

void register_shape_ops(OpRegistry& r) {
  r.add({.name = "constant", .min_inputs = 0, .max_inputs = 0, .flags = kOpNoGradient,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           const Tensor* t = c.node.attrs.get_tensor("value");
           if (!t) return Status::BadInput("needs a tensor attribute 'value'");
           out = {TensorType{t->dtype(), t->shape()}};
           return Status::Ok();
         },
         .flops = kNoFlops, .doc = "a literal {value}"});
  r.add({.name = "reshape", .min_inputs = 1, .max_inputs = 1, .flags = kOpView, .shape = reshape_shape,
         .flops = kNoFlops, .doc = "same bytes, new {shape}"});
  r.add({.name = "transpose", .min_inputs = 1, .max_inputs = 1, .shape = transpose_shape, .flops = kNoFlops,
         .doc = "permutes dims {perm}"});
  r.add({.name = "slice", .min_inputs = 1, .max_inputs = 1, .flags = kOpPartialRead, .shape = slice_shape, .flops = kNoFlops,
         .doc = "strided slice {axes, starts, ends, steps}"});
  r.add({.name = "concat", .min_inputs = 1, .max_inputs = -1, .shape = concat_shape, .flops = kNoFlops,
         .doc = "joins along {axis}"});
  r.add({.name = "expand", .min_inputs = 1, .max_inputs = 1, .shape = expand_shape, .flops = kNoFlops,
         .doc = "broadcasts to {shape}"});
  r.add({.name = "gather", .min_inputs = 2, .max_inputs = 2, .flags = kOpPartialRead, .shape = gather_shape, .flops = kNoFlops,
         .doc = "numpy take along {axis} (embedding lookup)"});
  r.add({.name = "gather_elements", .min_inputs = 2, .max_inputs = 2, .flags = kOpPartialRead, .shape = gather_elements_shape,
         .flops = kNoFlops, .doc = "torch.gather: y[i] = data[i, axis ← indices[i]] {axis}"});
  r.add({.name = "pad", .min_inputs = 1, .max_inputs = 1, .shape = pad_shape, .flops = kNoFlops,
         .doc = "pads {pads, mode, value}"});
  r.add({.name = "tile", .min_inputs = 1, .max_inputs = 1, .shape = tile_shape, .flops = kNoFlops,
         .doc = "repeats {repeats}"});
}

}  // namespace memc
