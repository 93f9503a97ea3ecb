// Pooling, per-channel normalization and the DFT over static shapes: AveragePool, MaxPool,
// InstanceNormalization (the form both exporters write for GroupNorm) and BatchNormalization
// with running statistics, each lowered to ops that already have kernels and gradients, so
// training through them needs nothing new:
// - AveragePool is separable: on each pooled axis, a product with a constant [out, in] matrix
//   whose row o holds 1/count at the inputs window o reads (as Resize's lowering does).
// - MaxPool pads with the lowest value, takes one strided slice per kernel tap and folds them
//   with max in the kernel's row-major order; max sends a tie's gradient to its first operand,
//   so the first maximum in the window gets it, as in PyTorch.
// - InstanceNormalization is a layernorm over each (sample, channel)'s spatial extent with unit
//   weights, then the per-channel scale and bias.
// - BatchNormalization normalizes with its running statistics (as a module in eval() does):
//   (x − mean)/√(var + ε) · scale + B. A module exported in train() normalizes with the batch's
//   statistics, and its running statistics become buffers that each step updates as PyTorch
//   does; the evaluation forward (ImportOptions::running_statistics) reads them.
// - DFT is, like AveragePool, a product with constant matrices along its axis.
#include <algorithm>
#include <cmath>
#include <limits>

#include "frontend/lowering.h"
#include "frontend/param_audit.h"

namespace memc {
namespace {

// The value MaxPool pads with: below every element of the dtype.
double lowest(DType dtype) {
  switch (dtype) {
    case DType::kI64: return static_cast<double>(std::numeric_limits<int64_t>::min());
    case DType::kI32: return std::numeric_limits<int32_t>::min();
    case DType::kU8:
    case DType::kBool: return 0;
    default: return -std::numeric_limits<double>::infinity();
  }
}

// The windows of a pooling node along each spatial axis (ONNX's pooling attributes).
struct PoolWindows {
  std::vector<int64_t> kernel, strides, dilations, pads, out;  // pads: begins, then ends
  int64_t span(size_t i) const { return (kernel[i] - 1) * dilations[i] + 1; }
};

Expected<PoolWindows> pool_windows(ImportContext& ctx, const Shape& xs) {
  const size_t sd = xs.size() - 2;
  PoolWindows w;
  w.kernel = ctx.attr_ints("kernel_shape");
  w.strides = ctx.attr_ints("strides", std::vector<int64_t>(sd, 1));
  w.dilations = ctx.attr_ints("dilations", std::vector<int64_t>(sd, 1));
  w.pads = ctx.attr_ints("pads", std::vector<int64_t>(2 * sd, 0));
  if (w.kernel.size() != sd) return Status::BadInput(str_cat("kernel_shape needs ", sd, " values for a ", xs.size(), "-D input"));
  if (w.strides.size() != sd || w.dilations.size() != sd || w.pads.size() != 2 * sd) {
    return Status::BadInput("kernel_shape/strides/dilations/pads rank mismatch");
  }
  for (size_t i = 0; i < sd; ++i) {
    if (w.kernel[i] < 1 || w.strides[i] < 1 || w.dilations[i] < 1 || w.kernel[i] > (1 << 16) || w.strides[i] > (1 << 20) ||
        w.dilations[i] > (1 << 20) || w.pads[i] < 0 || w.pads[sd + i] < 0 || w.pads[i] > (1 << 20) || w.pads[sd + i] > (1 << 20)) {
      return Status::BadInput("bad kernel_shape, stride, dilation or pad");
    }
  }
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  const bool ceil_mode = ctx.attr_int("ceil_mode", 0) != 0;
  w.out.resize(sd);
  for (size_t i = 0; i < sd; ++i) {
    const int64_t in = xs[2 + i], s = w.strides[i];
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      w.out[i] = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (w.out[i] - 1) * s + w.span(i) - in), small = total / 2;
      w.pads[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      w.pads[sd + i] = total - w.pads[i];
      continue;
    }
    if (auto_pad == "VALID") {
      w.pads[i] = w.pads[sd + i] = 0;
    } else if (auto_pad != "NOTSET") {
      return Status::BadInput("auto_pad '" + auto_pad + "' is unsupported");
    }
    // In ceil mode a window may overhang the input's end, even a window wider than the input
    // (EfficientNet's pooler: AvgPool2d(hidden_dim, ceil_mode=True) over a 1×1 map).
    const int64_t room = in + w.pads[i] + w.pads[sd + i] - w.span(i);
    w.out[i] = (ceil_mode ? (room >= 0 ? (room + s - 1) / s : -(-room / s)) : room >= 0 ? room / s : -1) + 1;
    if (w.out[i] < 1) return Status::BadInput(str_cat("the window (", w.span(i), ") is larger than the padded input on spatial axis ", i));
    // A ceil-mode window must start inside the input or its leading pad (PyTorch's rule).
    if (ceil_mode && (w.out[i] - 1) * s >= in + w.pads[i]) --w.out[i];
  }
  return w;
}

// The spatial axis `i` of an AveragePool as a constant [out, in] matrix: row o holds 1/count at
// the inputs its window reads, count being the taps inside the input, or inside the input and
// its explicit pads under count_include_pad.
Tensor average_matrix(const PoolWindows& w, size_t i, int64_t in, bool include_pad, DType dtype) {
  const size_t sd = w.kernel.size();
  const int64_t out = w.out[i];
  Tensor m = Tensor::zeros(DType::kF64, {out, in});
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = o * w.strides[i] - w.pads[i];
    std::vector<int64_t> inside;
    int64_t padded = 0;
    for (int64_t t = 0; t < w.kernel[i]; ++t) {
      const int64_t p = start + t * w.dilations[i];
      if (p >= 0 && p < in) inside.push_back(p);
      if (p >= -w.pads[i] && p < in + w.pads[sd + i]) ++padded;
    }
    const int64_t count = include_pad ? padded : static_cast<int64_t>(inside.size());
    for (int64_t p : inside) m.set_from_double(o * in + p, 1.0 / static_cast<double>(count));
  }
  return m.cast(dtype);
}

// y with axis `axis` replaced by m · (that axis): m is [out, in].
Expected<ValueId> product_on_axis(ImportContext& ctx, ValueId y, int64_t axis, ValueId m) {
  const int64_t rank = static_cast<int64_t>(ctx.type(y).shape.size());
  if (axis == rank - 2) return ctx.emit("matmul", {m, y});
  std::vector<int64_t> perm(rank);
  for (int64_t d = 0; d < rank; ++d) perm[d] = d;
  std::swap(perm[axis], perm[rank - 1]);
  if (axis != rank - 1) { MEMC_ASSIGN_OR_RETURN(y, ctx.transpose(y, perm)); }
  Attrs a;
  a.set("transpose_b", int64_t{1});
  MEMC_ASSIGN_OR_RETURN(y, ctx.emit("matmul", {y, m}, std::move(a)));
  if (axis != rank - 1) { MEMC_ASSIGN_OR_RETURN(y, ctx.transpose(y, perm)); }
  return y;
}

Status lower_average_pool(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape xs = ctx.type(x).shape;
  const DType dtype = ctx.type(x).dtype;
  if (xs.size() < 3 || !is_float(dtype)) return ctx.error("needs a float x [N, C, spatial...]");
  auto w = pool_windows(ctx, xs);
  if (!w.ok()) return ctx.error(w.status().message());
  const bool include_pad = ctx.attr_int("count_include_pad", 0) != 0;
  ValueId y = x;
  for (size_t i = 0; i < w->kernel.size(); ++i) {
    const ValueId m = ctx.constant(average_matrix(*w, i, xs[2 + i], include_pad, dtype), "pool_weights");
    MEMC_ASSIGN_OR_RETURN(y, product_on_axis(ctx, y, static_cast<int64_t>(2 + i), m));
  }
  return ctx.bind(0, y);
}

Status lower_max_pool(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape xs = ctx.type(x).shape;
  const DType dtype = ctx.type(x).dtype;
  if (xs.size() < 3) return ctx.error("needs x [N, C, spatial...]");
  if (ctx.has_output(1)) return ctx.error("MaxPool's Indices output is unsupported");
  auto w = pool_windows(ctx, xs);
  if (!w.ok()) return ctx.error(w.status().message());
  const size_t sd = w->kernel.size(), rank = xs.size();
  // Pad so that every window lies inside: the explicit pads, and more at the end in ceil mode.
  std::vector<int64_t> pads(2 * rank, 0);
  bool padded = false;
  for (size_t i = 0; i < sd; ++i) {
    pads[2 + i] = w->pads[i];
    pads[rank + 2 + i] = std::max<int64_t>(0, (w->out[i] - 1) * w->strides[i] + w->span(i) - w->pads[i] - xs[2 + i]);
    padded = padded || pads[2 + i] || pads[rank + 2 + i];
  }
  ValueId source = x;
  if (padded) {
    Attrs a;
    a.set("pads", pads);
    a.set("mode", std::string("constant"));
    a.set("value", lowest(dtype));
    MEMC_ASSIGN_OR_RETURN(source, ctx.emit("pad", {x}, std::move(a)));
  }
  std::vector<int64_t> axes(sd), tap(sd, 0);
  for (size_t i = 0; i < sd; ++i) axes[i] = static_cast<int64_t>(2 + i);
  ValueId y = kNoValue;
  for (;;) {  // every tap of the kernel, row-major
    std::vector<int64_t> starts(sd), ends(sd);
    for (size_t i = 0; i < sd; ++i) {
      starts[i] = tap[i] * w->dilations[i];
      ends[i] = starts[i] + (w->out[i] - 1) * w->strides[i] + 1;
    }
    Attrs a;
    a.set("axes", axes);
    a.set("starts", starts);
    a.set("ends", ends);
    a.set("steps", w->strides);
    MEMC_ASSIGN_OR_RETURN(ValueId taken, ctx.emit("slice", {source}, std::move(a)));
    if (y == kNoValue) {
      y = taken;
    } else {
      MEMC_ASSIGN_OR_RETURN(y, ctx.emit("max", {y, taken}));
    }
    size_t i = sd;
    while (i > 0 && ++tap[i - 1] == w->kernel[i - 1]) tap[--i] = 0;
    if (i == 0) break;
  }
  return ctx.bind(0, y);
}

Status lower_instance_norm(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId scale, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(ValueId bias, ctx.input(2));
  const Shape xs = ctx.type(x).shape;
  const DType dtype = ctx.type(x).dtype;
  if (xs.size() < 3 || !is_float(dtype)) return ctx.error("needs a float x [N, C, spatial...]");
  const int64_t n = xs[0], c = xs[1], spatial = numel(Shape(xs.begin() + 2, xs.end()));
  for (ValueId v : {scale, bias}) {
    if (ctx.type(v).shape != Shape{c}) return ctx.error(str_cat("scale and B must be [", c, "]"));
  }
  MEMC_ASSIGN_OR_RETURN(ValueId flat, ctx.reshape(x, {n, c, spatial}));
  Tensor ones = Tensor::zeros(dtype, {spatial});
  for (int64_t i = 0; i < spatial; ++i) ones.set_from_double(i, 1.0);
  Attrs a;
  a.set("axis", int64_t{2});
  a.set("eps", ctx.attr_float("epsilon", 1e-5));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("layernorm", {flat, ctx.constant(std::move(ones), "instance_norm_ones")}, std::move(a)));
  MEMC_ASSIGN_OR_RETURN(ValueId s, ctx.reshape(scale, {c, 1}));
  MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.reshape(bias, {c, 1}));
  MEMC_ASSIGN_OR_RETURN(y, ctx.emit("mul", {y, s}));
  MEMC_ASSIGN_OR_RETURN(y, ctx.emit("add", {y, b}));
  MEMC_ASSIGN_OR_RETURN(y, ctx.reshape(y, xs));
  return ctx.bind(0, y);
}

// What the dynamo exporter's FX node says a BatchNormalization was: torch.export writes a
// module in train() as _native_batch_norm_legit_functional (batch statistics, running stats
// updated) and in eval() as _native_batch_norm_legit_no_training; the ONNX node it makes for
// the first has no training_mode, so only this metadata tells them apart.
bool fx_batch_statistics(const onnx::NodeProto& node) {
  const std::string op = fx_target(node);
  return op.find("batch_norm") != std::string::npos && op.find("no_training") == std::string::npos;
}

bool uses_batch_statistics(const onnx::NodeProto& node) {
  for (const auto& a : node.attribute()) {
    if (a.name() == "training_mode" && a.i() != 0) return true;
  }
  for (int i : {1, 2}) {
    if (i < node.output_size() && !node.output(i).empty()) return true;
  }
  return fx_batch_statistics(node);
}

// ONNX's momentum: the running statistics' weight in their update (PyTorch's 1 − momentum).
double onnx_momentum(const onnx::NodeProto& node) {
  for (const auto& a : node.attribute()) {
    if (a.name() == "momentum") return a.f();
  }
  return 0.9;
}

// How many ranks share x's statistics: the import's ranks where x's first axis is the rank's
// slice of the batch (a BatchNorm over activations), else 1 (BiT standardizes weights with it).
int64_t statistics_ranks(const ImportContext& ctx, ValueId x) {
  return ctx.options().ranks > 1 && ctx.type(x).shape[0] == ctx.options().batch ? ctx.options().ranks : 1;
}

// The mean over every axis but the channels ([1, C, 1, ...]), over all ranks' slices.
Expected<ValueId> channel_mean(ImportContext& ctx, ValueId x) {
  const int64_t rank = static_cast<int64_t>(ctx.type(x).shape.size()), ranks = statistics_ranks(ctx, x);
  std::vector<int64_t> axes = {0};
  for (int64_t d = 2; d < rank; ++d) axes.push_back(d);
  Attrs a;
  a.set("axes", axes);
  a.set("keepdims", int64_t{1});
  MEMC_ASSIGN_OR_RETURN(ValueId mean, ctx.emit("reduce_mean", {x}, std::move(a)));
  if (ranks == 1) return mean;
  Attrs sum;
  sum.set("ranks", ranks);
  sum.set("reduce", std::string("sum"));
  MEMC_ASSIGN_OR_RETURN(mean, ctx.emit("all_reduce", {mean}, std::move(sum)));
  return ctx.emit("mul", {mean, ctx.scalar(1.0 / static_cast<double>(ranks), ctx.type(mean).dtype)});
}

// x's statistics over every axis but the channels ([1, C, 1, ...]): mean, and the biased variance.
Expected<std::pair<ValueId, ValueId>> batch_statistics(ImportContext& ctx, ValueId x) {
  MEMC_ASSIGN_OR_RETURN(ValueId mean, channel_mean(ctx, x));
  MEMC_ASSIGN_OR_RETURN(ValueId d, ctx.emit("sub", {x, mean}));
  MEMC_ASSIGN_OR_RETURN(ValueId sq, ctx.emit("mul", {d, d}));
  MEMC_ASSIGN_OR_RETURN(ValueId var, channel_mean(ctx, sq));
  return std::make_pair(mean, var);
}

// running · momentum + batch · (1 − momentum) · correction, the batch's [1, C, 1, ...] statistic
// taken as the running one's [C] and dtype.
Expected<ValueId> running_update(ImportContext& ctx, ValueId running, ValueId batch, double momentum, double correction) {
  const TensorType t = ctx.type(running);  // a copy: emitting grows the module's values
  MEMC_ASSIGN_OR_RETURN(ValueId b, ctx.reshape(batch, t.shape));
  if (ctx.type(b).dtype != t.dtype) { MEMC_ASSIGN_OR_RETURN(b, ctx.cast(b, t.dtype)); }
  MEMC_ASSIGN_OR_RETURN(b, ctx.emit("mul", {b, ctx.scalar((1.0 - momentum) * correction, t.dtype)}));
  MEMC_ASSIGN_OR_RETURN(ValueId kept, ctx.emit("mul", {running, ctx.scalar(momentum, t.dtype)}));
  return ctx.emit("add", {kept, b});
}

// Normalizes with the batch's statistics and computes the running statistics' next values:
// ONNX's outputs 1 and 2, and, where they are the model's initializers (buffers), their updates
// after each step, as PyTorch updates a module in train(). PyTorch's running variance takes the
// batch's unbiased variance, ONNX's the biased one. Statistics given as graph inputs only yield
// the outputs; other computed ones cannot be updated and are refused.
Expected<std::pair<ValueId, ValueId>> update_running_statistics(ImportContext& ctx, ValueId x, ValueId running_mean, ValueId running_var) {
  const Role mean_role = ctx.module().value(running_mean).role, var_role = ctx.module().value(running_var).role;
  const bool buffers = mean_role == Role::kBuffer && var_role == Role::kBuffer;
  if (!buffers && (mean_role != Role::kInput || var_role != Role::kInput)) {
    return ctx.error(str_cat("the running statistics ('", ctx.node().input(3), "', '", ctx.node().input(4),
                             "') of a BatchNorm in train() mode are neither initializers memc can update nor graph inputs"));
  }
  const Shape xs = ctx.type(x).shape;
  const int64_t count = numel(xs) / xs[1] * statistics_ranks(ctx, x);  // values per channel, all ranks'
  MEMC_ASSIGN_OR_RETURN(auto stats, batch_statistics(ctx, x));
  const double correction = ctx.pytorch_export() && count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  const double momentum = onnx_momentum(ctx.node());
  MEMC_ASSIGN_OR_RETURN(ValueId next_mean, running_update(ctx, running_mean, stats.first, momentum, 1.0));
  MEMC_ASSIGN_OR_RETURN(ValueId next_var, running_update(ctx, running_var, stats.second, momentum, correction));
  if (ctx.has_output(1)) { MEMC_RETURN_IF_ERROR(ctx.bind(1, next_mean)); }
  if (ctx.has_output(2)) { MEMC_RETURN_IF_ERROR(ctx.bind(2, next_var)); }
  if (buffers) {
    ctx.add_update(running_mean, next_mean);
    ctx.add_update(running_var, next_var);
  }
  return stats;
}

// BatchNormalization with the running statistics (a module in eval(), or the evaluation forward
// of one in train(): ImportOptions::running_statistics) or the batch's: where the running ones
// never change (ONNX's momentum 1, PyTorch's 0, or none: F.batch_norm(training=True) without
// running statistics, as BiT standardizes its convolutions' weights), or updated as PyTorch
// updates them.
Status lower_batch_norm(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape xs = ctx.type(x).shape;
  const DType dtype = ctx.type(x).dtype;
  if (xs.size() < 2 || !is_float(dtype)) return ctx.error("needs a float x [N, C, ...]");
  const bool updates = updates_running_statistics(ctx.node());
  const bool batch = uses_batch_statistics(ctx.node()) && !(updates && ctx.options().running_statistics);
  const int64_t c = xs[1];
  Shape per_channel(xs.size() - 1, 1);  // [C, 1, ...]: broadcast over the spatial axes
  per_channel[0] = c;
  std::vector<ValueId> raw(4), v(4);
  for (int i = 0; i < 4; ++i) {
    MEMC_ASSIGN_OR_RETURN(raw[i], ctx.input(i + 1));
    if (ctx.type(raw[i]).shape != Shape{c}) return ctx.error(str_cat("scale, B, mean and var must be [", c, "]"));
    v[i] = raw[i];
    if (i < 2 || !batch) {
      if (ctx.type(v[i]).dtype != dtype) { MEMC_ASSIGN_OR_RETURN(v[i], ctx.cast(v[i], dtype)); }
      MEMC_ASSIGN_OR_RETURN(v[i], ctx.reshape(v[i], per_channel));
    }
  }
  ValueId scale = v[0], bias = v[1], mean = v[2], var = v[3];
  if (batch && updates) {
    MEMC_ASSIGN_OR_RETURN(std::tie(mean, var), update_running_statistics(ctx, x, raw[2], raw[3]));
  } else {
    for (int i : {1, 2}) {  // the running statistics' outputs: unchanged (momentum 1, or evaluation)
      if (ctx.has_output(i)) { MEMC_RETURN_IF_ERROR(ctx.bind(i, raw[i + 1])); }
    }
    if (batch) { MEMC_ASSIGN_OR_RETURN(std::tie(mean, var), batch_statistics(ctx, x)); }
  }
  MEMC_ASSIGN_OR_RETURN(ValueId k, ctx.emit("add", {var, ctx.scalar(ctx.attr_float("epsilon", 1e-5), dtype)}));
  MEMC_ASSIGN_OR_RETURN(k, ctx.emit("rsqrt", {k}));
  MEMC_ASSIGN_OR_RETURN(k, ctx.emit("mul", {scale, k}));  // per channel, before it meets x
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("sub", {x, mean}));
  MEMC_ASSIGN_OR_RETURN(y, ctx.emit("mul", {y, k}));
  MEMC_ASSIGN_OR_RETURN(y, ctx.emit("add", {y, bias}));
  return ctx.bind(0, y);
}

// The DFT along one axis as constant [M, N] cosine and sine matrices (M = N/2 + 1 when
// onesided): with θ = 2πkn/N and s = −1 (+1 inverse), X = (C·re − s·S·im) + i(C·im + s·S·re),
// scaled by 1/N when inverse. Real input has a last dim of 1, complex of 2 (re, im); the output
// is complex. FNet mixes tokens with the real part of two such transforms.
Status lower_dft(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape xs = ctx.type(x).shape;
  const DType dtype = ctx.type(x).dtype;
  const int64_t rank = static_cast<int64_t>(xs.size());
  if (rank < 2 || (xs.back() != 1 && xs.back() != 2) || !is_float(dtype)) return ctx.error("needs float input [..., 1 or 2]");
  int64_t axis = ctx.opset() >= 20 ? -2 : ctx.attr_int("axis", 1);
  if (ctx.opset() >= 20 && ctx.has_input(2)) {
    MEMC_ASSIGN_OR_RETURN(std::vector<int64_t> a, ctx.input_ints(2, "axis"));
    if (a.size() != 1) return ctx.error("axis must be one value");
    axis = a[0];
  }
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank - 1) return ctx.error(str_cat("axis ", axis, " is not a signal axis of a rank-", rank, " input"));
  const int64_t n = xs[axis];
  if (ctx.has_input(1)) {
    MEMC_ASSIGN_OR_RETURN(std::vector<int64_t> len, ctx.input_ints(1, "dft_length"));
    if (len.size() != 1 || len[0] != n) return ctx.error(str_cat("dft_length other than the axis' ", n, " (padding or truncating) is unsupported"));
  }
  const bool inverse = ctx.attr_int("inverse", 0) != 0, onesided = ctx.attr_int("onesided", 0) != 0;
  const int64_t m = onesided ? n / 2 + 1 : n;
  const double sign = inverse ? 1.0 : -1.0, scale = inverse ? 1.0 / static_cast<double>(n) : 1.0;
  Tensor c = Tensor::zeros(DType::kF64, {m, n}), sn = Tensor::zeros(DType::kF64, {m, n}), neg_sn = Tensor::zeros(DType::kF64, {m, n});
  for (int64_t k = 0; k < m; ++k) {
    for (int64_t j = 0; j < n; ++j) {
      const double theta = 2.0 * M_PI * static_cast<double>((k * j) % n) / static_cast<double>(n);
      c.set_from_double(k * n + j, scale * std::cos(theta));
      sn.set_from_double(k * n + j, scale * sign * std::sin(theta));
      neg_sn.set_from_double(k * n + j, -scale * sign * std::sin(theta));
    }
  }
  const ValueId cos_m = ctx.constant(c.cast(dtype), "dft_cos"), sin_m = ctx.constant(sn.cast(dtype), "dft_sin");
  const ValueId neg_sin_m = ctx.constant(neg_sn.cast(dtype), "dft_neg_sin");
  Shape part = xs;
  part.pop_back();
  auto component = [&](int64_t i) -> Expected<ValueId> {
    Attrs a;
    a.set("axes", std::vector<int64_t>{rank - 1});
    a.set("starts", std::vector<int64_t>{i});
    a.set("ends", std::vector<int64_t>{i + 1});
    a.set("steps", std::vector<int64_t>{1});
    MEMC_ASSIGN_OR_RETURN(ValueId v, ctx.emit("slice", {x}, std::move(a)));
    return ctx.reshape(v, part);
  };
  MEMC_ASSIGN_OR_RETURN(ValueId re, component(0));
  MEMC_ASSIGN_OR_RETURN(ValueId out_re, product_on_axis(ctx, re, axis, cos_m));
  MEMC_ASSIGN_OR_RETURN(ValueId out_im, product_on_axis(ctx, re, axis, sin_m));
  if (xs.back() == 2) {
    MEMC_ASSIGN_OR_RETURN(ValueId im, component(1));
    MEMC_ASSIGN_OR_RETURN(ValueId re_from_im, product_on_axis(ctx, im, axis, neg_sin_m));
    MEMC_ASSIGN_OR_RETURN(ValueId im_from_im, product_on_axis(ctx, im, axis, cos_m));
    MEMC_ASSIGN_OR_RETURN(out_re, ctx.emit("add", {out_re, re_from_im}));
    MEMC_ASSIGN_OR_RETURN(out_im, ctx.emit("add", {out_im, im_from_im}));
  }
  Shape one = ctx.type(out_re).shape;
  one.push_back(1);
  MEMC_ASSIGN_OR_RETURN(out_re, ctx.reshape(out_re, one));
  MEMC_ASSIGN_OR_RETURN(out_im, ctx.reshape(out_im, one));
  Attrs a;
  a.set("axis", rank - 1);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("concat", {out_re, out_im}, std::move(a)));
  return ctx.bind(0, y);
}

}  // namespace

bool updates_running_statistics(const onnx::NodeProto& node) {
  return node.op_type() == "BatchNormalization" && uses_batch_statistics(node) && onnx_momentum(node) != 1.0;
}

void add_pool_lowerings(LoweringTable& table) {
  table["AveragePool"] = lower_average_pool;
  table["MaxPool"] = lower_max_pool;
  table["InstanceNormalization"] = lower_instance_norm;
  table["BatchNormalization"] = lower_batch_norm;
  table["DFT"] = lower_dft;
}

}  // namespace memc
