// Neural-network ONNX ops: MatMul, Gemm, Einsum, Conv, Softmax/LogSoftmax,
// LayerNormalization, Reduce*, ArgMax/ArgMin, GlobalAveragePool/GlobalMaxPool, Resize.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "frontend/lowering.h"
#include "frontend/param_audit.h"

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

// The reductions built from others: ReduceL1 = Σ|x|, ReduceLogSum = log Σx, ReduceLogSumExp =
// log Σ exp(x − m) + m with m the max over the axes (kept for the sum, then dropped as asked).
using ReduceComposition = Expected<ValueId> (*)(ImportContext&, ValueId, const Attrs&);
const std::map<std::string, ReduceComposition>& reduce_compositions() {
  static const std::map<std::string, ReduceComposition> ops = {
      {"ReduceL1",
       [](ImportContext& ctx, ValueId x, const Attrs& a) -> Expected<ValueId> {
         MEMC_ASSIGN_OR_RETURN(ValueId abs, ctx.emit("abs", {x}));
         return ctx.emit("reduce_sum", {abs}, a);
       }},
      {"ReduceLogSum",
       [](ImportContext& ctx, ValueId x, const Attrs& a) -> Expected<ValueId> {
         MEMC_ASSIGN_OR_RETURN(ValueId sum, ctx.emit("reduce_sum", {x}, a));
         return ctx.emit("log", {sum});
       }},
      {"ReduceLogSumExp",
       [](ImportContext& ctx, ValueId x, const Attrs& a) -> Expected<ValueId> {
         Attrs kept = a;
         kept.set("keepdims", int64_t{1});
         MEMC_ASSIGN_OR_RETURN(ValueId m, ctx.emit("reduce_max", {x}, kept));
         MEMC_ASSIGN_OR_RETURN(ValueId e, ctx.emit("sub", {x, m}));
         MEMC_ASSIGN_OR_RETURN(e, ctx.emit("exp", {e}));
         MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("reduce_sum", {e}, kept));
         MEMC_ASSIGN_OR_RETURN(y, ctx.emit("log", {y}));
         MEMC_ASSIGN_OR_RETURN(y, ctx.emit("add", {y, m}));
         if (a.get_int("keepdims", 1)) return y;
         Shape squeezed;
         const auto axes = a.get_ints("axes");
         const Shape& shape = ctx.type(x).shape;
         for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
           if (std::find(axes.begin(), axes.end(), d) == axes.end()) squeezed.push_back(shape[d]);
         return ctx.reshape(y, squeezed);
       }},
  };
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
  if (auto composed = reduce_compositions().find(ctx.op_type()); composed != reduce_compositions().end()) {
    MEMC_ASSIGN_OR_RETURN(ValueId y, composed->second(ctx, x, a));
    return ctx.bind(0, y);
  }
  if (ctx.op_type() == "ReduceMax" || ctx.op_type() == "ReduceMin") {
    // Tied extremes share the gradient (amax, amin) unless the dynamo exporter's FX node says the
    // module took one value with its index (max(dim), adaptive max pooling): then the first wins.
    const std::string target = fx_target(ctx.node());
    const bool indexed = target.rfind("max.dim", 0) == 0 || target.rfind("min.dim", 0) == 0 ||
                         target.rfind("adaptive_max_pool", 0) == 0 || target.rfind("max_pool", 0) == 0;
    a.set("ties", std::string(indexed ? "first" : "split"));
  }
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

// TopK(x, k) {axis, largest, sorted}: memc's topk, always in order (what `sorted` asks, and
// torch.topk's and torch.sort's order: NaN the largest, ties to the lower index); values of any
// dtype (JetMoE sorts its tokens' expert ids). The values' gradient goes back to where they were
// taken (a scatter-add); k must be known at import.
Status lower_top_k(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape xs = ctx.type(x).shape;
  MEMC_ASSIGN_OR_RETURN(std::vector<int64_t> ks, ctx.input_ints(1, "K"));
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", -1), xs.size()));
  if (ks.size() != 1 || ks[0] < 1 || ks[0] > xs[axis]) return ctx.error(str_cat("K must be one value in [1, ", xs[axis], "]"));
  Attrs a;
  a.set("axis", axis);
  a.set("k", ks[0]);
  a.set("largest", ctx.attr_int("largest", 1) != 0 ? int64_t{1} : int64_t{0});
  MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> out, ctx.emit_multi("topk", {x}, std::move(a), 2));
  MEMC_RETURN_IF_ERROR(ctx.bind(0, out[0]));
  return ctx.bind(1, out[1]);
}

// OneHot(indices, depth, values) {axis}: where(indices == position, on, off), the positions
// 0..depth-1 along the new axis; negative indices count from the end, as ONNX says. depth and
// values are known at import (TorchScript's one_hot of a MoE router's choices).
Status lower_one_hot(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId indices, ctx.input(0));
  const Tensor* depths = ctx.input_constant(1);  // any numeric type, as ONNX allows
  const Tensor* values = ctx.input_constant(2);
  if (depths == nullptr || depths->numel() != 1) return ctx.error("depth must be one value known at import");
  const int64_t depth = static_cast<int64_t>(depths->get_as_double(0));
  if (depth < 1 || depth > (int64_t{1} << 24)) return ctx.error(str_cat("depth ", depth, " is out of range"));
  if (is_float(ctx.type(indices).dtype)) { MEMC_ASSIGN_OR_RETURN(indices, ctx.cast(indices, DType::kI64)); }
  Shape shape = ctx.type(indices).shape;
  const int64_t rank = static_cast<int64_t>(shape.size()) + 1;
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", -1), rank));
  shape.insert(shape.begin() + axis, 1);
  MEMC_ASSIGN_OR_RETURN(indices, ctx.reshape(indices, shape));
  const DType idx = ctx.type(indices).dtype;
  MEMC_ASSIGN_OR_RETURN(ValueId negative, ctx.emit("less", {indices, ctx.scalar(0, idx)}));
  MEMC_ASSIGN_OR_RETURN(ValueId wrapped, ctx.emit("add", {indices, ctx.scalar(static_cast<double>(depth), idx)}));
  MEMC_ASSIGN_OR_RETURN(indices, ctx.emit("where", {negative, wrapped, indices}));
  Shape along(rank, 1);
  along[axis] = depth;
  Tensor positions = Tensor::zeros(idx, along);
  for (int64_t i = 0; i < depth; ++i) positions.set_from_double(i, static_cast<double>(i));
  MEMC_ASSIGN_OR_RETURN(ValueId hit, ctx.emit("equal", {indices, ctx.constant(std::move(positions), "one_hot_positions")}));
  MEMC_ASSIGN_OR_RETURN(ValueId pair, ctx.input(2));
  if (ctx.type(pair).numel() != 2) return ctx.error("values must be an [off, on] pair");
  ValueId off, on;
  if (values != nullptr) {
    off = ctx.scalar(values->get_as_double(0), values->dtype());
    on = ctx.scalar(values->get_as_double(1), values->dtype());
  } else {  // fed at run time: each a slice
    MEMC_ASSIGN_OR_RETURN(pair, ctx.reshape(pair, {2}));
    for (int64_t i : {0, 1}) {
      Attrs a;
      a.set("axes", std::vector<int64_t>{0});
      a.set("starts", std::vector<int64_t>{i});
      a.set("ends", std::vector<int64_t>{i + 1});
      a.set("steps", std::vector<int64_t>{1});
      MEMC_ASSIGN_OR_RETURN(ValueId one, ctx.emit("slice", {pair}, std::move(a)));
      MEMC_ASSIGN_OR_RETURN((i ? on : off), ctx.reshape(one, {}));
    }
  }
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("where", {hit, on, off}));
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

// GlobalAveragePool / GlobalMaxPool: the mean or max over every spatial axis, kept as size 1.
Status lower_global_pool(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const int64_t rank = static_cast<int64_t>(ctx.type(x).shape.size());
  if (rank < 3) return ctx.error("needs x [N, C, spatial...]");
  std::vector<int64_t> axes;
  for (int64_t d = 2; d < rank; ++d) axes.push_back(d);
  Attrs a;
  a.set("axes", axes);
  a.set("keepdims", int64_t{1});
  if (ctx.op_type() == "GlobalMaxPool") a.set("ties", std::string("first"));  // a max pool's: the first maximum
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit(ctx.op_type() == "GlobalAveragePool" ? "reduce_mean" : "reduce_max", {x}, std::move(a)));
  return ctx.bind(0, y);
}

// One resized axis as a constant [out, in] matrix: row o holds the weights of the input
// positions that output o reads (ONNX Resize's coordinate transform, then the mode's taps;
// taps beyond the edge read the edge, or are dropped and the rest renormalized under
// exclude_outside).
struct ResizeAxis {
  std::string mode, transform, nearest;
  double cubic_a = -0.75;
  bool exclude_outside = false;
};

Expected<Tensor> resize_matrix(const ResizeAxis& r, int64_t in, int64_t out, double scale, DType dtype) {
  Tensor m = Tensor::zeros(DType::kF64, {out, in});
  double* w = m.data<double>();
  for (int64_t o = 0; o < out; ++o) {
    double x;
    if (r.transform == "half_pixel") x = (o + 0.5) / scale - 0.5;
    else if (r.transform == "pytorch_half_pixel") x = out > 1 ? (o + 0.5) / scale - 0.5 : 0.0;
    else if (r.transform == "align_corners") x = in * scale != 1.0 ? o * double(in - 1) / (in * scale - 1.0) : 0.0;  // the unrounded length, as ONNX's reference
    else if (r.transform == "asymmetric") x = o / scale;
    else if (r.transform == "tf_half_pixel_for_nn") x = (o + 0.5) / scale;
    else return Status::BadInput(str_cat("coordinate_transformation_mode '", r.transform, "' is unsupported"));
    double* row = w + o * in;
    auto clamp = [&](int64_t i) { return std::clamp<int64_t>(i, 0, in - 1); };
    if (r.mode == "nearest") {
      int64_t i;
      if (r.nearest == "round_prefer_floor") i = static_cast<int64_t>(std::ceil(x - 0.5));
      else if (r.nearest == "round_prefer_ceil") i = static_cast<int64_t>(std::floor(x + 0.5));
      else if (r.nearest == "floor") i = static_cast<int64_t>(std::floor(x));
      else if (r.nearest == "ceil") i = static_cast<int64_t>(std::ceil(x));
      else return Status::BadInput(str_cat("nearest_mode '", r.nearest, "' is unsupported"));
      row[clamp(i)] = 1.0;
    } else if (r.mode == "linear") {
      const double lo = std::floor(x), t = x - lo;
      row[clamp(static_cast<int64_t>(lo))] += 1.0 - t;
      row[clamp(static_cast<int64_t>(lo) + 1)] += t;
    } else if (r.mode == "cubic") {
      const double lo = std::floor(x), t = x - lo, a = r.cubic_a;
      auto k = [a](double d) {  // Keys' cubic convolution kernel
        d = std::abs(d);
        if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
        if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
        return 0.0;
      };
      double kept = 0;
      for (int64_t j = -1; j <= 2; ++j) {
        const int64_t i = static_cast<int64_t>(lo) + j;
        const double c = k(t - j);
        if (r.exclude_outside && (i < 0 || i >= in)) continue;
        row[clamp(i)] += c;
        kept += c;
      }
      if (r.exclude_outside && kept != 0)
        for (int64_t i = 0; i < in; ++i) row[i] /= kept;
    } else {
      return Status::BadInput(str_cat("mode '", r.mode, "' is unsupported"));
    }
  }
  return m.cast(dtype);
}

// Resize over static shapes. An axis whose size and scale stay 1:1 is untouched (every mode and
// transform but crop-and-resize maps it onto itself); each resized axis, which must be one of
// the last two, is a product with a constant interpolation matrix, so its gradient is the
// transposed product. A relative position table interpolated to its own size (BEiT's) imports
// as a copy.
Status lower_resize(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape in = ctx.type(x).shape;
  const DType dtype = ctx.type(x).dtype;
  const int64_t rank = static_cast<int64_t>(in.size());
  ResizeAxis r{ctx.attr_string("mode", "nearest"), ctx.attr_string("coordinate_transformation_mode", "half_pixel"),
               ctx.attr_string("nearest_mode", "round_prefer_floor"), ctx.attr_float("cubic_coeff_a", -0.75),
               ctx.attr_int("exclude_outside", 0) != 0};
  if (ctx.opset() < 11) r.transform = "asymmetric";
  if (!is_float(dtype)) return ctx.error("resizes floating-point tensors only");
  if (ctx.attr_int("antialias", 0)) return ctx.error("antialias is unsupported");
  if (ctx.has_attr("axes")) return ctx.error("the axes attribute is unsupported");
  if (ctx.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch") return ctx.error("keep_aspect_ratio_policy other than stretch is unsupported");
  if (r.transform == "tf_crop_and_resize") return ctx.error("coordinate_transformation_mode 'tf_crop_and_resize' is unsupported");
  const int scales_at = ctx.opset() < 11 ? 1 : 2, sizes_at = 3;
  std::vector<double> scales(rank, 1.0);
  Shape out = in;
  if (ctx.has_input(sizes_at)) {
    MEMC_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, ctx.input_ints(sizes_at, "sizes"));
    if (static_cast<int64_t>(sizes.size()) != rank) return ctx.error(str_cat("sizes has ", sizes.size(), " values for rank ", rank));
    for (int64_t d = 0; d < rank; ++d) {
      if (sizes[d] < 1) return ctx.error(str_cat("size ", sizes[d], " < 1"));
      out[d] = sizes[d];
      scales[d] = double(out[d]) / double(in[d]);
    }
  } else if (ctx.has_input(scales_at)) {
    const Tensor* t = ctx.input_constant(scales_at);
    if (!t) return ctx.error("scales depend on runtime data; memc needs them static");
    if (t->numel() != rank) return ctx.error(str_cat("scales has ", t->numel(), " values for rank ", rank));
    for (int64_t d = 0; d < rank; ++d) {
      scales[d] = t->get_as_double(d);
      if (!(scales[d] > 0)) return ctx.error(str_cat("scale ", scales[d], " is not positive"));
      out[d] = static_cast<int64_t>(std::floor(in[d] * scales[d]));
      if (out[d] < 1) return ctx.error(str_cat("scale ", scales[d], " leaves axis ", d, " empty"));
    }
  } else {
    return ctx.error("needs scales or sizes");
  }
  ValueId y = x;
  for (int64_t d = 0; d < rank; ++d) {
    if (out[d] == in[d] && scales[d] == 1.0) continue;
    if (d < rank - 2) return ctx.error(str_cat("resizing axis ", d, " (not one of the last two) is unsupported"));
    auto m = resize_matrix(r, in[d], out[d], scales[d], dtype);
    if (!m.ok()) return ctx.error(m.status().message());
    const ValueId weights = ctx.constant(std::move(*m), "resize_weights");
    if (d == rank - 1) {  // y · mᵀ
      Attrs a;
      a.set("transpose_b", int64_t{1});
      MEMC_ASSIGN_OR_RETURN(y, ctx.emit("matmul", {y, weights}, std::move(a)));
    } else {  // m · y, m broadcast over the leading axes
      MEMC_ASSIGN_OR_RETURN(y, ctx.emit("matmul", {weights, y}));
    }
  }
  if (y == x) { MEMC_ASSIGN_OR_RETURN(y, ctx.emit("copy", {x})); }
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
  for (const auto& [name, op] : reduce_compositions()) table[name] = lower_reduce;
  table["ArgMax"] = lower_arg;
  table["ArgMin"] = lower_arg;
  table["Einsum"] = lower_einsum;
  table["CumSum"] = lower_cumsum;
  table["TopK"] = lower_top_k;
  table["OneHot"] = lower_one_hot;
  table["GlobalAveragePool"] = lower_global_pool;
  table["GlobalMaxPool"] = lower_global_pool;
  table["Resize"] = lower_resize;
}

}  // namespace memc
