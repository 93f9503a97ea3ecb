// Elementwise ONNX ops: unary math, broadcasting binary and variadic ops, comparisons,
// logic, Where, Cast/CastLike, Clip, Dropout, Identity.
#include <limits>

#include "frontend/lowering.h"
#include "frontend/onnx_tensor.h"
#include "frontend/param_audit.h"

namespace memc {
namespace {

const std::map<std::string, std::string>& unary_ops() {
  static const std::map<std::string, std::string> ops = {
      {"Abs", "abs"},   {"Neg", "neg"},     {"Sign", "sign"},   {"Exp", "exp"},         {"Log", "log"},
      {"Sqrt", "sqrt"}, {"Tanh", "tanh"},   {"Sigmoid", "sigmoid"}, {"Relu", "relu"},   {"Erf", "erf"},
      {"Floor", "floor"}, {"Ceil", "ceil"}, {"Round", "round"}, {"Sin", "sin"},         {"Cos", "cos"},
      {"Asin", "asin"}, {"Acos", "acos"}, {"Atan", "atan"}, {"Softplus", "softplus"}, {"Reciprocal", "reciprocal"}, {"Not", "not"}};
  return ops;
}

const std::map<std::string, std::string>& binary_ops() {
  static const std::map<std::string, std::string> ops = {
      {"Add", "add"}, {"Sub", "sub"}, {"Mul", "mul"}, {"Div", "div"}, {"Pow", "pow"}, {"Mod", "mod"},
      {"Equal", "equal"}, {"Less", "less"}, {"LessOrEqual", "less_equal"}, {"Greater", "greater"},
      {"GreaterOrEqual", "greater_equal"}, {"And", "and"}, {"Or", "or"}, {"Xor", "xor"},
      {"Max", "max"}, {"Min", "min"}, {"Sum", "add"}, {"Mean", "add"}};
  return ops;
}

Status lower_unary(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit(unary_ops().at(ctx.op_type()), {x}));
  return ctx.bind(0, y);
}

// torch.maximum / minimum (ONNX Max, Min) give each side half the gradient where they tie.
void split_ties(const std::string& op, Attrs& attrs) {
  if (op == "max" || op == "min") attrs.set("ties", std::string("split"));
}

Status lower_binary(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId a, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.input(1));
  const std::string& op = binary_ops().at(ctx.op_type());
  // Pow allows an exponent of another dtype: cast it to the base's.
  if (op == "pow") { MEMC_ASSIGN_OR_RETURN(b, ctx.cast(b, ctx.type(a).dtype)); }
  Attrs attrs;
  if (op == "mod") {
    const int64_t fmod = ctx.attr_int("fmod", 0);
    if (!fmod && is_float(ctx.type(a).dtype)) return ctx.error("Mod of floats needs fmod = 1");
    attrs.set("fmod", fmod);
  }
  split_ties(op, attrs);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit(op, {a, b}, std::move(attrs)));
  return ctx.bind(0, y);
}

// Sum, Mean, Max, Min take one or more inputs.
Status lower_variadic(ImportContext& ctx) {
  if (ctx.num_inputs() == 2) return lower_binary(ctx);
  if (ctx.num_inputs() < 1) return ctx.error("needs at least one input");
  MEMC_ASSIGN_OR_RETURN(ValueId acc, ctx.input(0));
  const std::string& op = binary_ops().at(ctx.op_type());
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    MEMC_ASSIGN_OR_RETURN(ValueId next, ctx.input(i));
    Attrs attrs;
    split_ties(op, attrs);
    MEMC_ASSIGN_OR_RETURN(acc, ctx.emit(op, {acc, next}, std::move(attrs)));
  }
  if (ctx.op_type() == "Mean" && ctx.num_inputs() > 1) {
    if (!is_float(ctx.type(acc).dtype)) return ctx.error("Mean needs float inputs");
    MEMC_ASSIGN_OR_RETURN(acc, ctx.emit("div", {acc, ctx.scalar(ctx.num_inputs(), ctx.type(acc).dtype)}));
  }
  if (ctx.num_inputs() == 1 && ctx.module().value(acc).producer == kNoNode) {
    MEMC_ASSIGN_OR_RETURN(acc, ctx.emit("copy", {acc}));
  }
  return ctx.bind(0, acc);
}

Status lower_mean(ImportContext& ctx) {
  if (ctx.num_inputs() != 2) return lower_variadic(ctx);
  MEMC_ASSIGN_OR_RETURN(ValueId a, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(ValueId s, ctx.emit("add", {a, b}));
  if (!is_float(ctx.type(s).dtype)) return ctx.error("Mean needs float inputs");
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("div", {s, ctx.scalar(2, ctx.type(s).dtype)}));
  return ctx.bind(0, y);
}

Status lower_identity(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  return ctx.bind(0, x);
}

Status lower_leaky_relu(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  Attrs a;
  a.set("alpha", ctx.attr_float("alpha", 0.01));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("leaky_relu", {x}, std::move(a)));
  return ctx.bind(0, y);
}

// max(x, lo) or min(x, hi) of a clip. At the boundary the input gets no gradient, as PyTorch's
// clamp, hardtanh, relu6, hardsigmoid and hardswish give: the bound takes the tie. A clamp to
// tensor bounds (its FX node: clamp.Tensor, clamp_min.Tensor) splits the tie, as PyTorch's does.
Expected<ValueId> clip_bound(ImportContext& ctx, const char* op, ValueId x, ValueId bound) {
  const std::string target = fx_target(ctx.node());
  const bool tensor_bounds = target.rfind("clamp", 0) == 0 && target.find(".Tensor") != std::string::npos;
  Attrs a;
  a.set("ties", std::string(tensor_bounds ? "split" : "second"));
  return ctx.emit(op, {x, bound}, std::move(a));
}

// HardSigmoid: max(0, min(1, alpha·x + beta)); HardSwish: x · HardSigmoid(x) at alpha 1/6,
// beta 1/2 (PyTorch's hardswish). Built from mul, add and the clip's max and min, whose
// gradients pass where the clip is inactive, boundaries excluded.
Status lower_hard_sigmoid(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const DType dtype = ctx.type(x).dtype;
  if (!is_float(dtype)) return ctx.error("needs a float input");
  const bool swish = ctx.op_type() == "HardSwish";
  const double alpha = swish ? 1.0 / 6 : ctx.attr_float("alpha", 0.2), beta = swish ? 0.5 : ctx.attr_float("beta", 0.5);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("mul", {x, ctx.scalar(alpha, dtype)}));
  MEMC_ASSIGN_OR_RETURN(y, ctx.emit("add", {y, ctx.scalar(beta, dtype)}));
  MEMC_ASSIGN_OR_RETURN(y, clip_bound(ctx, "max", y, ctx.scalar(0.0, dtype)));
  MEMC_ASSIGN_OR_RETURN(y, clip_bound(ctx, "min", y, ctx.scalar(1.0, dtype)));
  if (swish) { MEMC_ASSIGN_OR_RETURN(y, ctx.emit("mul", {x, y})); }
  return ctx.bind(0, y);
}

Status lower_gelu(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const std::string approximate = ctx.attr_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh") return ctx.error("approximate must be 'none' or 'tanh'");
  Attrs a;
  a.set("approximate", approximate);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("gelu", {x}, std::move(a)));
  return ctx.bind(0, y);
}

Status lower_where(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId c, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId a, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.input(2));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("where", {c, a, b}));
  return ctx.bind(0, y);
}

// IsNaN(x) = not(x == x); IsInf(x) = (x == +inf) or (x == -inf), per detect_positive /
// detect_negative. Both exact with the existing comparisons; integer inputs are never NaN/inf.
Status lower_is_nan_inf(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const DType dtype = ctx.type(x).dtype;
  if (!is_float(dtype)) return ctx.error("needs a floating-point input");
  if (ctx.op_type() == "IsNaN") {
    MEMC_ASSIGN_OR_RETURN(ValueId same, ctx.emit("equal", {x, x}));
    MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("not", {same}));
    return ctx.bind(0, y);
  }
  const double inf = std::numeric_limits<double>::infinity();
  const bool positive = ctx.attr_int("detect_positive", 1), negative = ctx.attr_int("detect_negative", 1);
  MEMC_ASSIGN_OR_RETURN(ValueId pos, ctx.emit("equal", {x, ctx.scalar(inf, dtype)}));
  MEMC_ASSIGN_OR_RETURN(ValueId neg, ctx.emit("equal", {x, ctx.scalar(-inf, dtype)}));
  ValueId y = pos;
  if (positive && negative) {
    MEMC_ASSIGN_OR_RETURN(y, ctx.emit("or", {pos, neg}));
  } else if (negative) {
    y = neg;
  } else if (!positive) {
    MEMC_ASSIGN_OR_RETURN(y, ctx.emit("and", {pos, neg}));  // neither: all false
  }
  return ctx.bind(0, y);
}

Status lower_cast(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  DType to;
  if (ctx.op_type() == "CastLike") {
    MEMC_ASSIGN_OR_RETURN(ValueId like, ctx.input(1));
    to = ctx.type(like).dtype;
  } else {
    if (!ctx.has_attr("to")) return ctx.error("missing attribute 'to'");
    auto dtype = dtype_from_onnx(static_cast<int>(ctx.attr_int("to", 0)));
    if (!dtype.ok()) return ctx.error(dtype.status().message());
    to = *dtype;
  }
  if (ctx.type(x).dtype == to) return ctx.bind(0, x);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.cast(x, to));
  return ctx.bind(0, y);
}

// Clip: bounds as attributes before opset 11, as optional inputs from 11.
Status lower_clip(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.input(0));
  const DType dtype = ctx.type(y).dtype;
  ValueId lo = kNoValue, hi = kNoValue;
  if (ctx.opset() < 11) {
    if (ctx.has_attr("min")) lo = ctx.scalar(ctx.attr_float("min", 0), dtype);
    if (ctx.has_attr("max")) hi = ctx.scalar(ctx.attr_float("max", 0), dtype);
  } else {
    if (ctx.has_input(1)) { MEMC_ASSIGN_OR_RETURN(lo, ctx.input(1)); }
    if (ctx.has_input(2)) { MEMC_ASSIGN_OR_RETURN(hi, ctx.input(2)); }
  }
  for (ValueId bound : {lo, hi}) {
    if (bound != kNoValue && !ctx.type(bound).shape.empty() && ctx.type(bound).numel() != 1) {
      return ctx.error("min/max must be scalars");
    }
  }
  if (lo != kNoValue) { MEMC_ASSIGN_OR_RETURN(lo, ctx.reshape(lo, {})); }
  if (hi != kNoValue) { MEMC_ASSIGN_OR_RETURN(hi, ctx.reshape(hi, {})); }
  if (lo != kNoValue) { MEMC_ASSIGN_OR_RETURN(y, clip_bound(ctx, "max", y, lo)); }
  if (hi != kNoValue) { MEMC_ASSIGN_OR_RETURN(y, clip_bound(ctx, "min", y, hi)); }
  if (lo == kNoValue && hi == kNoValue) { MEMC_ASSIGN_OR_RETURN(y, ctx.emit("copy", {y})); }
  return ctx.bind(0, y);
}

// Dropout: ratio attribute before 12, optional inputs (ratio, training_mode) from 12. A
// constant-false training_mode means inference: identity (mask all true). A missing one means
// inference too, except in a training-mode export (ImportContext::training_export), where torch
// writes SDPA's attention dropout without it: that dropout trains, as in PyTorch.
Status lower_dropout(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  double ratio = 0.5;
  bool training = ctx.opset() < 12 || ctx.training_export();  // before 12 the node itself says "dropout here"
  if (ctx.opset() < 12) {
    ratio = ctx.attr_float("ratio", 0.5);
    if (ctx.attr_int("is_test", 0)) training = false;
  } else {
    if (ctx.has_input(1)) { MEMC_ASSIGN_OR_RETURN(ratio, ctx.input_scalar(1, "ratio")); }
    if (ctx.has_input(2)) {
      const Tensor* mode = ctx.input_constant(2);
      if (!mode) return ctx.error("training_mode depends on runtime data; memc needs it static");
      if (mode->numel() != 1) return ctx.error("training_mode must be a scalar");
      training = mode->get_as_int(0) != 0;
    }
  }
  if (!(ratio >= 0.0 && ratio < 1.0)) return ctx.error(str_cat("ratio ", ratio, " not in [0, 1)"));
  const bool want_mask = ctx.has_output(1);
  if (!training || ratio == 0.0) {
    MEMC_RETURN_IF_ERROR(ctx.bind(0, x));
    if (want_mask) {  // all true
      MEMC_ASSIGN_OR_RETURN(ValueId all_true, ctx.ones(ctx.type(x).shape, DType::kBool));
      MEMC_RETURN_IF_ERROR(ctx.bind(1, all_true));
    }
    return Status::Ok();
  }
  Attrs a;
  a.set("ratio", ratio);
  a.set("seed", static_cast<int64_t>(ctx.node_index()));
  MEMC_ASSIGN_OR_RETURN(auto outs, ctx.emit_multi("dropout", {x}, std::move(a), want_mask ? 2 : 1));
  MEMC_RETURN_IF_ERROR(ctx.bind(0, outs[0]));
  if (want_mask) MEMC_RETURN_IF_ERROR(ctx.bind(1, outs[1]));
  return Status::Ok();
}

// Bernoulli of a probability p known at import, the same for every element (stochastic depth's
// keep probability; frontend/onnx_graph_prep.h): p · dropout(ones) with ratio 1 − p, so training
// draws 1 with probability p and 0 otherwise from the dropout's counter RNG (seeded by the node,
// micro-batches and ranks drawing their rows' counters), and evaluation, where dropout is the
// identity, takes the expectation p: x/p · p, the identity stochastic depth is in eval().
Status lower_bernoulli(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId probabilities, ctx.input(0));
  const Tensor* p = ctx.input_constant(0);
  if (!p || p->numel() == 0) {
    return ctx.error("its probabilities depend on runtime data: memc draws Bernoulli masks whose probability is known at import (stochastic depth)");
  }
  const double keep = p->get_as_double(0);
  for (int64_t i = 1; i < p->numel(); ++i) {
    if (p->get_as_double(i) != keep) return ctx.error("its probabilities differ between elements: memc draws masks of one probability (stochastic depth)");
  }
  if (!(keep > 0.0 && keep <= 1.0)) return ctx.error(str_cat("probability ", keep, " not in (0, 1]"));
  MEMC_ASSIGN_OR_RETURN(const DType dtype, ctx.attr_dtype("dtype", ctx.type(probabilities).dtype));
  if (!is_float(dtype)) return ctx.error(str_cat("memc draws float Bernoulli masks, not ", dtype_name(dtype)));
  MEMC_ASSIGN_OR_RETURN(ValueId mask, ctx.ones(ctx.type(probabilities).shape, dtype));
  if (keep < 1.0) {
    Attrs a;
    a.set("ratio", 1.0 - keep);
    a.set("seed", static_cast<int64_t>(ctx.node_index()));
    MEMC_ASSIGN_OR_RETURN(mask, ctx.emit("dropout", {mask}, std::move(a)));
    MEMC_ASSIGN_OR_RETURN(mask, ctx.emit("mul", {mask, ctx.scalar(keep, dtype)}));
  }
  return ctx.bind(0, mask);
}

}  // namespace

void add_elementwise_lowerings(LoweringTable& table) {
  for (const auto& [name, op] : unary_ops()) table[name] = lower_unary;
  for (const auto& [name, op] : binary_ops()) table[name] = lower_binary;
  for (const char* name : {"Sum", "Max", "Min"}) table[name] = lower_variadic;
  table["Mean"] = lower_mean;
  table["Identity"] = lower_identity;
  table["LeakyRelu"] = lower_leaky_relu;
  table["Gelu"] = lower_gelu;
  table["HardSigmoid"] = lower_hard_sigmoid;
  table["HardSwish"] = lower_hard_sigmoid;
  table["Where"] = lower_where;
  table["IsNaN"] = lower_is_nan_inf;
  table["IsInf"] = lower_is_nan_inf;
  table["Cast"] = lower_cast;
  table["CastLike"] = lower_cast;
  table["Clip"] = lower_clip;
  table["Dropout"] = lower_dropout;
  table["Bernoulli"] = lower_bernoulli;
}

}  // namespace memc
