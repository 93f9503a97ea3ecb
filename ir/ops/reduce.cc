// Reductions and normalizations: reduce_*, arg_max/min, softmax, log_softmax, layernorm.
#include "ir/ops/ops.h"

namespace memc {
namespace {

Shape reduced_shape(const Shape& in, const std::vector<int64_t>& axes, bool keepdims) {
  Shape out;
  for (int64_t i = 0; i < static_cast<int64_t>(in.size()); ++i) {
    const bool reduced = axes.empty() || std::find(axes.begin(), axes.end(), i) != axes.end();
    if (!reduced) out.push_back(in[i]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

Status reduce_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const auto axes = c.node.attrs.get_ints("axes");
  MEMC_RETURN_IF_ERROR(check_axes(axes, static_cast<int64_t>(c.inputs[0].shape.size()), "reduction"));
  out = {TensorType{c.inputs[0].dtype, reduced_shape(c.inputs[0].shape, axes, c.node.attrs.get_int("keepdims", 1))}};
  return Status::Ok();
}

Status arg_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const int64_t axis = c.node.attrs.get_int("axis", 0);
  MEMC_RETURN_IF_ERROR(check_axes({axis}, static_cast<int64_t>(c.inputs[0].shape.size()), "arg"));
  out = {TensorType{DType::kI64, reduced_shape(c.inputs[0].shape, {axis}, c.node.attrs.get_int("keepdims", 1))}};
  return Status::Ok();
}

// topk(x) {axis, k, largest} → (values, indices): x's shape with k along axis; indices i64.
Status topk_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const int64_t axis = c.node.attrs.get_int("axis", 0), k = c.node.attrs.get_int("k", 1);
  MEMC_RETURN_IF_ERROR(check_axes({axis}, static_cast<int64_t>(c.inputs[0].shape.size()), "topk"));
  if (k < 1 || k > c.inputs[0].shape[axis]) return Status::BadInput(str_cat("k = ", k, " outside [1, ", c.inputs[0].shape[axis], "]"));
  Shape shape = c.inputs[0].shape;
  shape[axis] = k;
  out = {TensorType{c.inputs[0].dtype, shape}, TensorType{DType::kI64, shape}};
  return Status::Ok();
}

Status softmax_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  if (!is_float(c.inputs[0].dtype)) return Status::BadInput("needs a float input");
  // The default axis is the last one (axes are non-negative in the IR).
  const int64_t rank = static_cast<int64_t>(c.inputs[0].shape.size());
  MEMC_RETURN_IF_ERROR(check_axes({c.node.attrs.get_int("axis", rank - 1)}, rank, "softmax"));
  out = {c.inputs[0]};
  return Status::Ok();
}

// layernorm(x, scale, [bias]) {axis, eps}: normalizes over dims axis..rank-1; scale and bias
// broadcast against those dims. Optional outputs 1, 2: mean and inverse std (f32, keepdims).
Status layernorm_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const Shape& x = c.inputs[0].shape;
  const int64_t axis = c.node.attrs.get_int("axis", static_cast<int64_t>(x.size()) - 1);  // default: last dim
  MEMC_RETURN_IF_ERROR(check_axes({axis}, static_cast<int64_t>(x.size()), "layernorm"));
  const Shape normalized(x.begin() + axis, x.end());
  for (size_t i = 1; i < c.inputs.size(); ++i) {
    MEMC_ASSIGN_OR_RETURN(Shape b, broadcast_shapes(normalized, c.inputs[i].shape));
    if (b != normalized) return Status::BadInput(str_cat("scale/bias ", shape_str(c.inputs[i].shape), " do not fit normalized dims ", shape_str(normalized)));
    if (c.inputs[i].dtype != c.inputs[0].dtype) return Status::BadInput("scale/bias dtype differs from x");
  }
  out = {c.inputs[0]};
  Shape stats = x;
  for (size_t i = axis; i < stats.size(); ++i) stats[i] = 1;
  for (size_t i = 1; i < c.node.outputs.size() && i < 3; ++i) out.push_back(TensorType{DType::kF32, stats});
  return Status::Ok();
}

// add_layernorm(x, r, scale, [bias]) {axis, eps} → (x + r, layernorm(x + r, scale, bias)): a
// residual add and the layernorm that reads it (passes/add_layernorm.h). r has x's shape and
// is f32, bf16 or f16, rounded to x's dtype as a cast would round it; the sum is x's dtype, and y
// is too unless {y_dtype} names another (the cast a 16-bit GEMM's input takes, joined).
Status add_layernorm_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const TensorType &x = c.inputs[0], &r = c.inputs[1];
  auto narrow_float = [](DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; };
  if (!narrow_float(x.dtype)) return Status::BadInput(str_cat("x is ", dtype_name(x.dtype), ", not f32, bf16 or f16"));
  if (!narrow_float(r.dtype) || r.shape != x.shape) {
    return Status::BadInput(str_cat("the residual ", type_str(r), " is not an f32, bf16 or f16 tensor of x's shape ", shape_str(x.shape)));
  }
  std::vector<TensorType> normalized = {x};
  normalized.insert(normalized.end(), c.inputs.begin() + 2, c.inputs.end());
  const std::vector<bool> present(normalized.size(), true);
  Node layernorm = c.node;
  layernorm.outputs.resize(1);
  MEMC_RETURN_IF_ERROR(layernorm_shape(ShapeContext{layernorm, normalized, present}, out));
  out = {x, out[0]};
  if (c.node.attrs.has("y_dtype")) {  // y stored narrower, as a cast of the layernorm's output would round it
    const std::optional<DType> y = parse_dtype(c.node.attrs.get_string("y_dtype", ""));
    if (!y || !narrow_float(*y)) return Status::BadInput("y_dtype must be f32, bf16 or f16");
    out[1].dtype = *y;
  }
  return Status::Ok();
}

}  // namespace

void register_reduce_ops(OpRegistry& r) {
  const char* reductions[] = {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_sum_square", "reduce_l2"};
  for (const char* name : reductions) {
    r.add({.name = name, .min_inputs = 1, .max_inputs = 1, .flags = kOpReduction, .shape = reduce_shape,
           .flops = [](const Node&, std::span<const TensorType> in, std::span<const TensorType>) { return in[0].numel(); },
           .doc = "reduction over {axes} (empty: all) {keepdims}"});
  }
  for (const char* name : {"argmax", "argmin"}) {
    r.add({.name = name, .min_inputs = 1, .max_inputs = 1, .flags = kOpReduction | kOpNoGradient, .shape = arg_shape,
           .doc = "index of the extreme along {axis} {keepdims, select_last_index}"});
  }
  r.add({.name = "topk", .min_inputs = 1, .max_inputs = 1, .num_outputs = 2, .flags = kOpNone, .shape = topk_shape,
         .flops = [](const Node& n, std::span<const TensorType> in, std::span<const TensorType>) { return in[0].numel() * std::min<int64_t>(n.attrs.get_int("k", 1), 64); },
         .doc = "the k largest (smallest unless {largest}) along {axis}, in order, and their indices; ties and NaN (the largest) as torch.topk"});
  for (const char* name : {"softmax", "log_softmax"}) {
    r.add({.name = name, .min_inputs = 1, .max_inputs = 1, .flags = kOpNone, .shape = softmax_shape,
           .flops = [](const Node&, std::span<const TensorType> in, std::span<const TensorType>) { return 5 * in[0].numel(); },
           .doc = "normalized exponential along {axis}"});
  }
  r.add({.name = "cumsum", .min_inputs = 1, .max_inputs = 1, .flags = kOpNone,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           MEMC_RETURN_IF_ERROR(check_axes({c.node.attrs.get_int("axis", 0)}, static_cast<int64_t>(c.inputs[0].shape.size()), "cumsum"));
           out = {c.inputs[0]};
           return Status::Ok();
         },
         .doc = "running sum along {axis} {exclusive, reverse}"});
  r.add({.name = "layernorm", .min_inputs = 2, .max_inputs = 3, .num_outputs = -1, .flags = kOpNone,
         .shape = layernorm_shape,
         .flops = [](const Node&, std::span<const TensorType> in, std::span<const TensorType>) { return 8 * in[0].numel(); },
         .doc = "(x - mean)/√(var + eps)·scale + bias over dims {axis}..end {eps}"});
  r.add({.name = "add_layernorm", .min_inputs = 3, .max_inputs = 4, .num_outputs = 2, .flags = kOpNoGradient | kOpInplaceOk,
         .shape = add_layernorm_shape,
         .flops = [](const Node&, std::span<const TensorType> in, std::span<const TensorType>) { return 9 * in[0].numel(); },
         .doc = "(x, r, scale, [bias]) → (s = x + r, layernorm(s) stored as {y_dtype}) over dims {axis}..end {eps}; the sum may take "
                "x's buffer"});
}

}  // namespace memc
