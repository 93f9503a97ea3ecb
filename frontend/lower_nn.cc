// Neural-network ONNX ops: MatMul, Gemm, Einsum, Conv, Softmax/LogSoftmax,
// LayerNormalization, Reduce*, ArgMax/ArgMin.
#include <set>

#include "frontend/lowering.h"

namespace memc {
namespace {

Status lower_matmul(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId a, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("matmul", {a, b}));
  return ctx.bind(0, y);
}

// Gemm: y = alpha·op(A)·op(B) + beta·C → matmul {transpose_a, transpose_b} [+ mul] [+ add];
// the linear fusion turns matmul+add with a weight into memc.linear.
Status lower_gemm(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId a, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.input(1));
  if (ctx.type(a).shape.size() != 2 || ctx.type(b).shape.size() != 2) return ctx.error("Gemm needs 2-D A and B");
  Attrs attrs;
  if (ctx.attr_int("transA", 0)) attrs.set("transpose_a", int64_t{1});
  if (ctx.attr_int("transB", 0)) attrs.set("transpose_b", int64_t{1});
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("matmul", {a, b}, std::move(attrs)));
  const DType dtype = ctx.type(y).dtype;
  const double alpha = ctx.attr_float("alpha", 1.0), beta = ctx.attr_float("beta", 1.0);
  if (alpha != 1.0) { MEMC_ASSIGN_OR_RETURN(y, ctx.emit("mul", {y, ctx.scalar(alpha, dtype)})); }
  if (ctx.has_input(2) && beta != 0.0) {
    MEMC_ASSIGN_OR_RETURN(ValueId c, ctx.input(2));
    if (beta != 1.0) { MEMC_ASSIGN_OR_RETURN(c, ctx.emit("mul", {c, ctx.scalar(beta, dtype)})); }
    MEMC_ASSIGN_OR_RETURN(y, ctx.emit("add", {y, c}));
  }
  return ctx.bind(0, y);
}

// Conv with explicit or auto padding (SAME_UPPER/SAME_LOWER/VALID).
Status lower_conv(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId w, ctx.input(1));
  const Shape &xs = ctx.type(x).shape, &ws = ctx.type(w).shape;
  if (xs.size() < 3 || ws.size() != xs.size()) return ctx.error("Conv needs x [N,C,...] and w of equal rank");
  const size_t sd = xs.size() - 2;
  auto strides = ctx.attr_ints("strides", std::vector<int64_t>(sd, 1));
  auto dilations = ctx.attr_ints("dilations", std::vector<int64_t>(sd, 1));
  auto pads = ctx.attr_ints("pads", std::vector<int64_t>(2 * sd, 0));
  if (strides.size() != sd || dilations.size() != sd || pads.size() != 2 * sd) return ctx.error("strides/dilations/pads rank mismatch");
  for (size_t i = 0; i < sd; ++i) {
    if (strides[i] < 1 || dilations[i] < 1 || strides[i] > (1 << 20) || dilations[i] > (1 << 20)) return ctx.error("bad stride or dilation");
  }
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  if (auto_pad == "VALID") {
    pads.assign(2 * sd, 0);
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t i = 0; i < sd; ++i) {
      const int64_t out = (xs[2 + i] + strides[i] - 1) / strides[i];
      const int64_t total = std::max<int64_t>(0, (out - 1) * strides[i] + dilations[i] * (ws[2 + i] - 1) + 1 - xs[2 + i]);
      const int64_t small = total / 2, large = total - small;
      pads[i] = auto_pad == "SAME_UPPER" ? small : large;
      pads[sd + i] = auto_pad == "SAME_UPPER" ? large : small;
    }
  } else if (auto_pad != "NOTSET") {
    return ctx.error("auto_pad '" + auto_pad + "' is unsupported");
  }
  Attrs a;
  a.set("strides", strides);
  a.set("dilations", dilations);
  a.set("pads", pads);
  a.set("group", ctx.attr_int("group", 1));
  std::vector<ValueId> inputs = {x, w};
  if (ctx.has_input(2)) {
    MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.input(2));
    inputs.push_back(b);
  }
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("conv", inputs, std::move(a)));
  return ctx.bind(0, y);
}

// Softmax/LogSoftmax. Before opset 13 the input is coerced to 2-D at `axis` (default 1).
Status lower_softmax(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const std::string op = ctx.op_type() == "Softmax" ? "softmax" : "log_softmax";
  const Shape shape = ctx.type(x).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank == 0) return ctx.error("needs rank ≥ 1");
  const bool legacy = ctx.opset() < 13;
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", legacy ? 1 : -1), rank));
  Attrs a;
  if (!legacy || axis == rank - 1) {
    a.set("axis", axis);
    MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit(op, {x}, std::move(a)));
    return ctx.bind(0, y);
  }
  const int64_t outer = numel(Shape(shape.begin(), shape.begin() + axis));
  const int64_t inner = numel(Shape(shape.begin() + axis, shape.end()));
  MEMC_ASSIGN_OR_RETURN(ValueId flat, ctx.reshape(x, {outer, inner}));
  a.set("axis", int64_t{1});
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit(op, {flat}, std::move(a)));
  MEMC_ASSIGN_OR_RETURN(y, ctx.reshape(y, shape));
  return ctx.bind(0, y);
}

Status lower_layer_norm(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId scale, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", -1), ctx.type(x).shape.size()));
  std::vector<ValueId> inputs = {x, scale};
  if (ctx.has_input(2)) {
    MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.input(2));
    inputs.push_back(b);
  }
  Attrs a;
  a.set("axis", axis);
  a.set("eps", ctx.attr_float("epsilon", 1e-5));
  int outputs = 1;
  if (ctx.has_output(2)) outputs = 3;
  else if (ctx.has_output(1)) outputs = 2;
  MEMC_ASSIGN_OR_RETURN(auto ys, ctx.emit_multi("layernorm", inputs, std::move(a), outputs));
  for (int i = 0; i < outputs; ++i) MEMC_RETURN_IF_ERROR(ctx.bind(i, ys[i]));
  return Status::Ok();
}

const std::map<std::string, std::string>& reduce_ops() {
  static const std::map<std::string, std::string> ops = {
      {"ReduceSum", "reduce_sum"},   {"ReduceMean", "reduce_mean"}, {"ReduceMax", "reduce_max"},
      {"ReduceMin", "reduce_min"},   {"ReduceProd", "reduce_prod"}, {"ReduceSumSquare", "reduce_sum_square"},
      {"ReduceL2", "reduce_l2"}};
  return ops;
}

// Reduce*: axes as attribute, or as input from opset 13 (ReduceSum) / 18 (the others).
Status lower_reduce(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const int64_t rank = static_cast<int64_t>(ctx.type(x).shape.size());
  const int since = ctx.op_type() == "ReduceSum" ? 13 : 18;
  std::vector<int64_t> axes;
  if (ctx.opset() < since) axes = ctx.attr_ints("axes");
  else if (ctx.has_input(1)) { MEMC_ASSIGN_OR_RETURN(axes, ctx.input_ints(1, "axes")); }
  if (axes.empty() && ctx.attr_int("noop_with_empty_axes", 0)) return ctx.bind(0, x);
  MEMC_ASSIGN_OR_RETURN(axes, checked_axes(ctx, axes, rank));
  std::sort(axes.begin(), axes.end());
  if (axes.empty()) {
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  Attrs a;
  a.set("axes", axes);
  a.set("keepdims", ctx.attr_int("keepdims", 1) ? int64_t{1} : int64_t{0});
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit(reduce_ops().at(ctx.op_type()), {x}, std::move(a)));
  return ctx.bind(0, y);
}

Status lower_arg(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", 0), ctx.type(x).shape.size()));
  Attrs a;
  a.set("axis", axis);
  a.set("keepdims", ctx.attr_int("keepdims", 1) ? int64_t{1} : int64_t{0});
  a.set("select_last_index", ctx.attr_int("select_last_index", 0) ? int64_t{1} : int64_t{0});
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit(ctx.op_type() == "ArgMax" ? "argmax" : "argmin", {x}, std::move(a)));
  return ctx.bind(0, y);
}

// CumSum(x, axis) {exclusive, reverse}: the axis is a known scalar.
Status lower_cumsum(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ctx.input_ints(1, "axis"));
  if (axis.size() != 1) return ctx.error("axis must be one value");
  MEMC_ASSIGN_OR_RETURN(int64_t a, checked_axis(ctx, axis[0], ctx.type(x).shape.size()));
  Attrs attrs;
  attrs.set("axis", a);
  attrs.set("exclusive", ctx.attr_int("exclusive", 0));
  attrs.set("reverse", ctx.attr_int("reverse", 0));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("cumsum", {x}, std::move(attrs)));
  return ctx.bind(0, y);
}

}  // namespace

Status lower_einsum(ImportContext& ctx);  // lower_einsum.cc

void add_nn_lowerings(LoweringTable& table) {
  table["MatMul"] = lower_matmul;
  table["Gemm"] = lower_gemm;
  table["Conv"] = lower_conv;
  table["Softmax"] = lower_softmax;
  table["LogSoftmax"] = lower_softmax;
  table["LayerNormalization"] = lower_layer_norm;
  for (const auto& [name, op] : reduce_ops()) table[name] = lower_reduce;
  table["ArgMax"] = lower_arg;
  table["ArgMin"] = lower_arg;
  table["Einsum"] = lower_einsum;
  table["CumSum"] = lower_cumsum;
}

}  // namespace memc
