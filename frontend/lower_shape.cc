// Shape and data-movement ONNX ops. Their shape operands (Reshape's shape, Slice's starts…)
// must be known at import: with static input shapes the exporters' shape subgraphs fold.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "frontend/fold.h"
#include "frontend/onnx_tensor.h"
#include "frontend/param_audit.h"
#include "frontend/lowering.h"
#include "ir/ops/ops.h"  // kGatherNoRow

namespace memc {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 40;

Status lower_constant(ImportContext& ctx) {
  Tensor value;
  if (const auto* a = ctx.attr("value")) {
    auto t = tensor_from_proto(a->t(), "");
    if (!t.ok()) return ctx.error(t.status().message());
    value = std::move(*t);
  } else if (const auto* f = ctx.attr("value_float")) {
    value = Tensor::zeros(DType::kF32, {});
    value.set_from_double(0, f->f());
  } else if (const auto* fs = ctx.attr("value_floats")) {
    value = Tensor::zeros(DType::kF32, {fs->floats_size()});
    for (int i = 0; i < fs->floats_size(); ++i) value.set_from_double(i, fs->floats(i));
  } else if (const auto* i1 = ctx.attr("value_int")) {
    value = Tensor::zeros(DType::kI64, {});
    value.data<int64_t>()[0] = i1->i();
  } else if (const auto* is = ctx.attr("value_ints")) {
    value = Tensor::zeros(DType::kI64, {is->ints_size()});
    for (int i = 0; i < is->ints_size(); ++i) value.data<int64_t>()[i] = is->ints(i);
  } else {
    return ctx.error("Constant needs value, value_float(s) or value_int(s) (sparse and string values are unsupported)");
  }
  return ctx.bind(0, ctx.constant(std::move(value), ctx.has_output(0) ? ctx.node().output(0) : "cst"));
}

Tensor int_vector(const std::vector<int64_t>& values) {
  Tensor t = Tensor::zeros(DType::kI64, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  return t;
}

// Shape {start, end} (opset 15) → a constant: every shape is static here.
Status lower_shape(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape& s = ctx.type(x).shape;
  const int64_t rank = static_cast<int64_t>(s.size());
  int64_t start = ctx.attr_int("start", 0), end = ctx.attr_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, start, rank);
  return ctx.bind(0, ctx.constant(int_vector(Shape(s.begin() + start, s.begin() + end))));
}

Status lower_size(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  Tensor t = Tensor::zeros(DType::kI64, {});
  t.data<int64_t>()[0] = ctx.type(x).numel();
  return ctx.bind(0, ctx.constant(std::move(t)));
}

Expected<Shape> checked_shape(const ImportContext& ctx, const std::vector<int64_t>& dims) {
  int64_t count = 1;
  for (int64_t d : dims) {
    if (d < 0 || d > kMaxDim) return ctx.error(str_cat("bad dim ", d));
    if (d > 0 && count > kMaxDim / d) return ctx.error("shape has more than 2^40 elements");
    count *= d;
  }
  return Shape(dims);
}

// EyeLike(x) {dtype, k}: ones on the k-th diagonal of x's 2-D shape, a constant (XLNet's
// torch.eye mask through TorchScript).
Status lower_eye_like(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape shape = ctx.type(x).shape;
  if (shape.size() != 2) return ctx.error("needs a 2-D input");
  MEMC_ASSIGN_OR_RETURN(const DType dtype, ctx.attr_dtype("dtype", ctx.type(x).dtype));
  if (numel(shape) > kMaxFoldElements) return ctx.error("too large to fold");
  const int64_t k = ctx.attr_int("k", 0);
  Tensor eye = Tensor::zeros(dtype, shape);
  for (int64_t r = 0; r < shape[0]; ++r)
    if (r + k >= 0 && r + k < shape[1]) eye.set_from_double(r * shape[1] + r + k, 1.0);
  return ctx.bind(0, ctx.constant(std::move(eye)));
}

// Trilu(x, [k]) {upper}: x where column − row ≥ k (upper) or ≤ k (lower) over its last two
// dims, zero elsewhere (torch.triu / tril: Qwen3-Next's gated DeltaNet). A where on a constant
// mask of those two dims, so the gradient passes where x does; k must be known at import.
Status lower_trilu(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape shape = ctx.type(x).shape;
  if (shape.size() < 2) return ctx.error("needs an input of rank ≥ 2");
  int64_t k = 0;
  if (ctx.has_input(1)) {
    MEMC_ASSIGN_OR_RETURN(std::vector<int64_t> ks, ctx.input_ints(1, "k"));
    if (ks.size() != 1) return ctx.error("k must hold one value");
    k = ks[0];
  }
  const bool upper = ctx.attr_int("upper", 1) != 0;
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  if (rows * cols > kMaxFoldElements) return ctx.error("too large to fold");
  Tensor keep = Tensor::zeros(DType::kBool, {rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) keep.set_from_double(r * cols + c, upper ? c - r >= k : c - r <= k);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("where", {ctx.constant(std::move(keep), "trilu_mask"), x, ctx.scalar(0.0, ctx.type(x).dtype)}));
  return ctx.bind(0, y);
}

Status lower_constant_of_shape(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(auto dims, ctx.input_ints(0, "shape"));
  MEMC_ASSIGN_OR_RETURN(Shape shape, checked_shape(ctx, dims));
  Tensor fill = Tensor::zeros(DType::kF32, {});
  if (const auto* a = ctx.attr("value")) {
    auto t = tensor_from_proto(a->t(), "");
    if (!t.ok()) return ctx.error(t.status().message());
    if (t->numel() != 1) return ctx.error("value must hold one element");
    fill = std::move(*t);
  }
  if (numel(shape) > kMaxFoldElements) return ctx.error(str_cat("ConstantOfShape of ", numel(shape), " elements is too large"));
  Tensor out = Tensor::zeros(fill.dtype(), shape);
  const size_t size = dtype_size(fill.dtype());
  for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(static_cast<char*>(out.raw()) + i * size, fill.raw(), size);
  return ctx.bind(0, ctx.constant(std::move(out)));
}

// Reshape: 0 copies the input dim (unless allowzero), -1 is inferred.
Status lower_reshape(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  std::vector<int64_t> dims;
  if (ctx.opset() < 5) dims = ctx.attr_ints("shape");
  else { MEMC_ASSIGN_OR_RETURN(dims, ctx.input_ints(1, "Reshape target shape")); }
  const Shape& in = ctx.type(x).shape;
  const bool allowzero = ctx.attr_int("allowzero", 0) != 0;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0 && !allowzero) {
      if (i >= in.size()) return ctx.error("0 in the target shape has no input dim to copy");
      dims[i] = in[i];
    }
    if (dims[i] == -1) {
      if (infer >= 0) return ctx.error("more than one -1 in the target shape");
      infer = static_cast<int>(i);
      continue;
    }
    if (dims[i] < 0 || dims[i] > kMaxDim) return ctx.error(str_cat("bad target dim ", dims[i]));
    if (dims[i] > 0 && known > kMaxDim / dims[i]) return ctx.error("target shape too large");
    known *= dims[i];
  }
  const int64_t total = ctx.type(x).numel();
  if (infer >= 0) {
    if (known == 0 || total % known != 0) return ctx.error(str_cat("cannot reshape ", shape_str(in), " to ", shape_str(dims)));
    dims[infer] = total / known;
  }
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.reshape(x, dims));
  return ctx.bind(0, y);
}

Status lower_flatten(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape& in = ctx.type(x).shape;
  int64_t axis = ctx.attr_int("axis", 1);
  if (axis < 0) axis += static_cast<int64_t>(in.size());
  if (axis < 0 || axis > static_cast<int64_t>(in.size())) return ctx.error(str_cat("axis ", axis, " out of range"));
  const int64_t outer = numel(Shape(in.begin(), in.begin() + axis));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.reshape(x, {outer, outer ? ctx.type(x).numel() / outer : 0}));
  return ctx.bind(0, y);
}

// Squeeze/Unsqueeze axes: attribute before 13, input from 13.
Expected<std::vector<int64_t>> axes_operand(ImportContext& ctx, int input_index, int since) {
  if (ctx.opset() < since) return ctx.attr_ints("axes");
  if (!ctx.has_input(input_index)) return std::vector<int64_t>{};
  return ctx.input_ints(input_index, "axes");
}

Status lower_squeeze(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape& in = ctx.type(x).shape;
  MEMC_ASSIGN_OR_RETURN(auto axes, axes_operand(ctx, 1, 13));
  MEMC_ASSIGN_OR_RETURN(axes, checked_axes(ctx, axes, static_cast<int64_t>(in.size())));
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d) {
    const bool listed = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (listed && in[d] != 1) return ctx.error(str_cat("cannot squeeze dim ", d, " of size ", in[d]));
    if (listed || (axes.empty() && in[d] == 1)) continue;
    out.push_back(in[d]);
  }
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.reshape(x, out));
  return ctx.bind(0, y);
}

Status lower_unsqueeze(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape& in = ctx.type(x).shape;
  MEMC_ASSIGN_OR_RETURN(auto axes, axes_operand(ctx, 1, 13));
  const int64_t rank = static_cast<int64_t>(in.size() + axes.size());
  MEMC_ASSIGN_OR_RETURN(axes, checked_axes(ctx, axes, rank));
  Shape out;
  size_t next = 0;
  for (int64_t d = 0; d < rank; ++d) {
    if (std::find(axes.begin(), axes.end(), d) != axes.end()) out.push_back(1);
    else if (next < in.size()) out.push_back(in[next++]);
  }
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.reshape(x, out));
  return ctx.bind(0, y);
}

Status lower_transpose(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const int64_t rank = static_cast<int64_t>(ctx.type(x).shape.size());
  std::vector<int64_t> perm = ctx.attr_ints("perm");
  if (perm.empty()) {
    for (int64_t d = rank - 1; d >= 0; --d) perm.push_back(d);
  }
  if (static_cast<int64_t>(perm.size()) != rank) return ctx.error("perm length differs from rank");
  MEMC_ASSIGN_OR_RETURN(perm, checked_axes(ctx, perm, rank));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.transpose(x, perm));
  if (y == x) { MEMC_ASSIGN_OR_RETURN(y, ctx.emit("copy", {x})); }
  return ctx.bind(0, y);
}

Status lower_concat(ImportContext& ctx) {
  std::vector<ValueId> inputs;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    MEMC_ASSIGN_OR_RETURN(ValueId v, ctx.input(i));
    inputs.push_back(v);
  }
  if (inputs.empty()) return ctx.error("needs at least one input");
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", 0), ctx.type(inputs[0]).shape.size()));
  Attrs a;
  a.set("axis", axis);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("concat", inputs, std::move(a)));
  return ctx.bind(0, y);
}

Status lower_gather(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId data, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId indices, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", 0), ctx.type(data).shape.size()));
  if (const Tensor* idx = ctx.constant_of(indices)) {
    const int64_t dim = ctx.type(data).shape[axis];
    for (int64_t i = 0; i < idx->numel(); ++i) {
      const int64_t j = idx->get_as_int(i);
      if (j < -dim || j >= dim) return ctx.error(str_cat("index ", j, " outside dim ", dim));
    }
  }
  Attrs a;
  a.set("axis", axis);
  // nn.Embedding(padding_idx=p): row p gets no gradient from the lookup (ir/ops/grad_tensor.cc).
  // An ONNX Gather has no such thing: the dynamo exporter's metadata names p; without metadata
  // (TorchScript), the table's one row of zeros is taken for it (Importer::find_padding_rows).
  const int64_t pad = node_metadata(ctx.node(), "pkg.torch.onnx.fx_node").empty() ? ctx.padding_row(ctx.node().input(0))
                                                                                  : embedding_padding_index(ctx.node());
  if (axis == 0 && pad >= 0 && pad < ctx.type(data).shape[0]) a.set("padding_idx", pad);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("gather", {data, indices}, std::move(a)));
  return ctx.bind(0, y);
}

// GatherElements (torch.gather): y has the indices' shape; known indices are checked here.
Status lower_gather_elements(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId data, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId indices, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", 0), ctx.type(data).shape.size()));
  if (const Tensor* idx = ctx.constant_of(indices)) {
    const int64_t dim = ctx.type(data).shape[axis];
    for (int64_t i = 0; i < idx->numel(); ++i) {
      const int64_t j = idx->get_as_int(i);
      if (j < -dim || j >= dim) return ctx.error(str_cat("index ", j, " outside dim ", dim));
    }
  }
  Attrs a;
  a.set("axis", axis);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("gather_elements", {data, indices}, std::move(a)));
  return ctx.bind(0, y);
}

// GatherND's flat row index computed in the graph, for indices known only at run time (a
// sequence classifier picking each row's last token: indices [B, 2] = (b, length - 1)):
// Σ_j wrap(idx[..., j])·stride_j in int64. A tuple with any component outside its dim gets
// kGatherNoRow, which the gather refuses at run time, instead of aliasing another row.
Expected<ValueId> runtime_gather_nd_rows(ImportContext& ctx, ValueId indices, const Shape& ds, int64_t k) {
  const int64_t last = static_cast<int64_t>(ctx.type(indices).shape.size()) - 1;
  if (ctx.type(indices).dtype != DType::kI64) {
    MEMC_ASSIGN_OR_RETURN(indices, ctx.cast(indices, DType::kI64));
  }
  ValueId linear = kNoValue, bad = kNoValue;
  int64_t stride = 1;
  for (int64_t j = k - 1; j >= 0; --j) {
    Attrs at_j;
    at_j.set("axis", last);
    MEMC_ASSIGN_OR_RETURN(ValueId i, ctx.emit("gather", {indices, ctx.scalar(static_cast<double>(j), DType::kI64)}, std::move(at_j)));
    MEMC_ASSIGN_OR_RETURN(ValueId negative, ctx.emit("less", {i, ctx.scalar(0, DType::kI64)}));
    MEMC_ASSIGN_OR_RETURN(ValueId shifted, ctx.emit("add", {i, ctx.scalar(static_cast<double>(ds[j]), DType::kI64)}));
    MEMC_ASSIGN_OR_RETURN(i, ctx.emit("where", {negative, shifted, i}));
    MEMC_ASSIGN_OR_RETURN(ValueId below, ctx.emit("less", {i, ctx.scalar(0, DType::kI64)}));
    MEMC_ASSIGN_OR_RETURN(ValueId inside, ctx.emit("less", {i, ctx.scalar(static_cast<double>(ds[j]), DType::kI64)}));
    MEMC_ASSIGN_OR_RETURN(ValueId above, ctx.emit("not", {inside}));
    MEMC_ASSIGN_OR_RETURN(ValueId out_of_range, ctx.emit("or", {below, above}));
    if (bad == kNoValue) {
      bad = out_of_range;
    } else {
      MEMC_ASSIGN_OR_RETURN(bad, ctx.emit("or", {bad, out_of_range}));
    }
    if (stride != 1) {
      MEMC_ASSIGN_OR_RETURN(i, ctx.emit("mul", {i, ctx.scalar(static_cast<double>(stride), DType::kI64)}));
    }
    if (linear == kNoValue) {
      linear = i;
    } else {
      MEMC_ASSIGN_OR_RETURN(linear, ctx.emit("add", {linear, i}));
    }
    stride *= ds[j];
  }
  Tensor invalid = Tensor::zeros(DType::kI64, {});
  invalid.data<int64_t>()[0] = kGatherNoRow;
  return ctx.emit("where", {bad, ctx.constant(std::move(invalid), "gather_nd_invalid"), linear});
}

// GatherND is a gather on the data flattened over the indexed dims: y = reshape(data,
// [Π d_0..d_{k-1}, rest])[Σ_j idx[..., j]·stride_j]. Known indices (what exporters mostly write:
// index grids from the traced shape) fold to a constant row list; runtime ones are computed in
// the graph (runtime_gather_nd_rows). batch_dims > 0 is unsupported.
// The row of each index tuple (indices [..., k], known at import) in the data flattened over
// its first k dims: [is[:-1]] (GatherND, ScatterND).
Expected<Tensor> index_tuple_rows(const ImportContext& ctx, const Tensor& idx, const Shape& is, const Shape& ds) {
  const int64_t k = is.back();
  Tensor rows = Tensor::zeros(DType::kI64, Shape(is.begin(), is.end() - 1));
  for (int64_t t = 0; t < rows.numel(); ++t) {
    int64_t offset = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t i = idx.get_as_int(t * k + j);
      if (i < -ds[j] || i >= ds[j]) return ctx.error(str_cat("index ", i, " outside dim ", ds[j]));
      if (i < 0) i += ds[j];
      offset = offset * ds[j] + i;
    }
    rows.data<int64_t>()[t] = offset;
  }
  return rows;
}

Status lower_gather_nd(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId data, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId indices, ctx.input(1));
  if (ctx.attr_int("batch_dims", 0) != 0) return ctx.error("batch_dims > 0 is unsupported");
  // Copies: emitting nodes below grows the module's value table (and may move constants).
  const Shape ds = ctx.type(data).shape, is = ctx.type(indices).shape;
  if (is.empty()) return ctx.error("indices must have rank ≥ 1");
  if (!is_integer(ctx.type(indices).dtype)) return ctx.error("indices must be integers");
  const int64_t k = is.back();
  if (k < 1 || k > static_cast<int64_t>(ds.size())) return ctx.error(str_cat("index depth ", k, " outside [1, ", ds.size(), "]"));
  // The row of each index tuple in the data flattened over its first k dims: [is[:-1]].
  ValueId linear = kNoValue;
  if (const Tensor* idx = ctx.constant_of(indices)) {
    MEMC_ASSIGN_OR_RETURN(Tensor rows, index_tuple_rows(ctx, *idx, is, ds));
    linear = ctx.constant(std::move(rows), "gather_nd_index");
  } else {
    MEMC_ASSIGN_OR_RETURN(linear, runtime_gather_nd_rows(ctx, indices, ds, k));
  }
  Shape flat = {1};
  for (int64_t j = 0; j < k; ++j) flat[0] *= ds[j];
  flat.insert(flat.end(), ds.begin() + k, ds.end());
  MEMC_ASSIGN_OR_RETURN(ValueId rows, ctx.reshape(data, flat));
  Attrs a;
  a.set("axis", int64_t{0});
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("gather", {rows, linear}, std::move(a)));  // [is[:-1], ds[k:]]
  return ctx.bind(0, y);
}

// A scatter with indices known at import: y (data's shape) gathers its rows from
// concat(updates as [U, rest...], data as [D, rest...]) by `source` [D], where row r names update
// u as u, or data row r as U + r. The gradient is the gather's: each update gets the rows it
// landed in, data the rest.
Status scatter_by_gather(ImportContext& ctx, ValueId updates, const Shape& update_rows, ValueId data, const Shape& data_rows,
                         Tensor source) {
  const Shape shape = ctx.type(data).shape;
  MEMC_ASSIGN_OR_RETURN(ValueId u, ctx.reshape(updates, update_rows));
  MEMC_ASSIGN_OR_RETURN(ValueId d, ctx.reshape(data, data_rows));
  Attrs c;
  c.set("axis", int64_t{0});
  MEMC_ASSIGN_OR_RETURN(ValueId both, ctx.emit("concat", {u, d}, std::move(c)));
  Attrs g;
  g.set("axis", int64_t{0});
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("gather", {both, ctx.constant(std::move(source), "scatter_rows")}, std::move(g)));
  MEMC_ASSIGN_OR_RETURN(y, ctx.reshape(y, shape));
  return ctx.bind(0, y);
}

// A scatter the step computes: one whose indices depend on runtime data (an MoE router's mask
// of its top-k experts, torch.scatter(zeros, 1, topk.indices, 1.0)), or one that adds
// (index_add_, scatter_add_). `sum_into(v)` scatter-adds v (the updates' shape) into zeros of the
// data's shape with the gather's gradient kernel, which adds duplicates in order. Reduction
// 'add' adds that sum to the data; 'none' writes into each element that some update lands on
// the mean of the updates landing there, which is the update itself where one lands (ONNX
// leaves duplicates undefined; exporters write distinct indices). Data and updates keep their
// gradients: the data's where no update landed (everywhere for 'add'), each update's the
// output's gradient gathered at its place (over the count where several landed).
Status scatter_by_adding(ImportContext& ctx, ValueId data, ValueId updates, const std::string& reduction,
                         const std::function<Expected<ValueId>(ValueId)>& sum_into) {
  const DType dtype = ctx.type(data).dtype;
  if (!is_float(dtype)) return ctx.error(str_cat("a scatter into ", dtype_name(dtype), " data with runtime indices or reduction 'add': memc scatters float data so"));
  MEMC_ASSIGN_OR_RETURN(ValueId summed, sum_into(updates));
  if (reduction == "add") {
    MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("add", {data, summed}));
    return ctx.bind(0, y);
  }
  MEMC_ASSIGN_OR_RETURN(ValueId ones, ctx.ones(ctx.type(updates).shape, dtype));
  MEMC_ASSIGN_OR_RETURN(ValueId count, sum_into(ones));
  MEMC_ASSIGN_OR_RETURN(ValueId hit, ctx.emit("greater", {count, ctx.scalar(0.0, dtype)}));
  MEMC_ASSIGN_OR_RETURN(ValueId divisor, ctx.emit("max", {count, ctx.scalar(1.0, dtype)}));
  MEMC_ASSIGN_OR_RETURN(ValueId mean, ctx.emit("div", {summed, divisor}));
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("where", {hit, mean, data}));
  return ctx.bind(0, y);
}

Expected<std::string> scatter_reduction(const ImportContext& ctx) {
  std::string reduction = ctx.attr_string("reduction", "none");
  if (reduction != "none" && reduction != "add") return ctx.error("reduction '" + reduction + "' is unsupported (memc lowers 'none' and 'add')");
  return reduction;
}

// ScatterND(data, indices, updates): y's rows (data flattened over the first k dims) are the
// data's but where an index tuple names them. With indices known at import and no reduction,
// they are gathered from [updates rows; data rows], the last update of a row winning as in the
// spec's serial order; otherwise see scatter_by_adding. Both data and updates keep their
// gradients.
Status lower_scatter_nd(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId data, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId indices, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(ValueId updates, ctx.input(2));
  MEMC_ASSIGN_OR_RETURN(const std::string reduction, scatter_reduction(ctx));
  const Shape ds = ctx.type(data).shape, is = ctx.type(indices).shape, us = ctx.type(updates).shape;
  if (is.empty()) return ctx.error("indices must have rank ≥ 1");
  if (ctx.type(updates).dtype != ctx.type(data).dtype) return ctx.error("updates and data differ in dtype");
  const int64_t k = is.back();
  if (k < 1 || k > static_cast<int64_t>(ds.size())) return ctx.error(str_cat("index depth ", k, " outside [1, ", ds.size(), "]"));
  Shape want(is.begin(), is.end() - 1);
  want.insert(want.end(), ds.begin() + k, ds.end());
  if (us != want) return ctx.error(str_cat("updates [", shape_str(us), "] should be [", shape_str(want), "]"));
  int64_t rows = 1;
  for (int64_t j = 0; j < k; ++j) rows *= ds[j];
  const int64_t count = numel(Shape(is.begin(), is.end() - 1));
  Shape slice(ds.begin() + k, ds.end());
  Shape flat_u = {count}, flat_d = {rows};
  flat_u.insert(flat_u.end(), slice.begin(), slice.end());
  flat_d.insert(flat_d.end(), slice.begin(), slice.end());
  const Tensor* idx = ctx.constant_of(indices);
  if (idx && reduction == "none") {
    MEMC_ASSIGN_OR_RETURN(Tensor targets, index_tuple_rows(ctx, *idx, is, ds));
    Tensor source = Tensor::zeros(DType::kI64, {rows});
    int64_t* from = source.data<int64_t>();
    for (int64_t r = 0; r < rows; ++r) from[r] = count + r;
    for (int64_t t = 0; t < count; ++t) from[targets.data<int64_t>()[t]] = t;
    return scatter_by_gather(ctx, updates, flat_u, data, flat_d, std::move(source));
  }
  ValueId linear = kNoValue;  // each update's row: [count]
  if (idx) {
    MEMC_ASSIGN_OR_RETURN(Tensor targets, index_tuple_rows(ctx, *idx, is, ds));
    linear = ctx.constant(targets.reshaped({count}), "scatter_nd_index");
  } else {
    MEMC_ASSIGN_OR_RETURN(linear, runtime_gather_nd_rows(ctx, indices, ds, k));
    MEMC_ASSIGN_OR_RETURN(linear, ctx.reshape(linear, {count}));
  }
  return scatter_by_adding(ctx, data, updates, reduction, [&](ValueId v) -> Expected<ValueId> {
    MEMC_ASSIGN_OR_RETURN(ValueId u, ctx.reshape(v, flat_u));
    Attrs a;
    a.set("axis", int64_t{0});
    a.set("input_shape", flat_d);
    MEMC_ASSIGN_OR_RETURN(ValueId sum, ctx.emit("gather_grad", {u, linear}, std::move(a)));
    return ctx.reshape(sum, ds);
  });
}

// ScatterElements(data, indices, updates) {axis}. With indices known at import and no
// reduction (the dynamo exporter's select_scatter: BART's shift_tokens_right writing the start
// token into column 0), as ScatterND: every element of y is gathered from concat(updates, data),
// by a static map that names an update where one lands and the data element elsewhere.
// Otherwise see scatter_by_adding.
Status lower_scatter_elements(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId data, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(ValueId indices, ctx.input(1));
  MEMC_ASSIGN_OR_RETURN(ValueId updates, ctx.input(2));
  MEMC_ASSIGN_OR_RETURN(const std::string reduction, scatter_reduction(ctx));
  const Shape ds = ctx.type(data).shape, is = ctx.type(indices).shape;
  if (ctx.type(updates).shape != is) return ctx.error("updates and indices differ in shape");
  if (ctx.type(updates).dtype != ctx.type(data).dtype) return ctx.error("updates and data differ in dtype");
  if (is.size() != ds.size()) return ctx.error("indices and data differ in rank");
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", 0), ds.size()));
  for (size_t d = 0; d < is.size(); ++d)
    if (static_cast<int64_t>(d) != axis && is[d] > ds[d]) return ctx.error("indices are larger than data off the scatter axis");
  const Tensor* idx = ctx.constant_of(indices);
  if (idx) {
    for (int64_t t = 0; t < idx->numel(); ++t)
      if (const int64_t c = idx->get_as_int(t); c < -ds[axis] || c >= ds[axis]) return ctx.error(str_cat("index ", c, " outside dim ", ds[axis]));
  }
  if (!idx || reduction != "none") {
    return scatter_by_adding(ctx, data, updates, reduction, [&](ValueId v) -> Expected<ValueId> {
      Attrs a;
      a.set("axis", axis);
      a.set("input_shape", ds);
      return ctx.emit("gather_elements_grad", {v, indices}, std::move(a));
    });
  }
  const int64_t count = numel(is), total = numel(ds);
  Tensor source = Tensor::zeros(DType::kI64, {total});
  int64_t* from = source.data<int64_t>();
  for (int64_t r = 0; r < total; ++r) from[r] = count + r;
  std::vector<int64_t> at(is.size(), 0);  // the update's coordinates, row-major
  for (int64_t t = 0; t < count; ++t) {
    int64_t target = 0;
    for (size_t d = 0; d < is.size(); ++d) {
      int64_t c = at[d];
      if (static_cast<int64_t>(d) == axis) {
        c = idx->get_as_int(t);
        if (c < 0) c += ds[d];
      }
      target = target * ds[d] + c;
    }
    from[target] = t;
    for (size_t d = is.size(); d-- > 0;) {
      if (++at[d] < is[d]) break;
      at[d] = 0;
    }
  }
  return scatter_by_gather(ctx, updates, {count}, data, {total}, std::move(source));
}

// ONNX slice bounds → the IR's normalized {start, end} for one axis.
void normalize_slice(int64_t dim, int64_t step, int64_t& start, int64_t& end) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    if (end <= start) start = end = 0;
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    if (start <= end || dim == 0) start = end = 0;
  }
}

Status lower_slice(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape& in = ctx.type(x).shape;
  const int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset() < 10) {
    starts = ctx.attr_ints("starts");
    ends = ctx.attr_ints("ends");
    axes = ctx.attr_ints("axes");
  } else {
    MEMC_ASSIGN_OR_RETURN(starts, ctx.input_ints(1, "starts"));
    MEMC_ASSIGN_OR_RETURN(ends, ctx.input_ints(2, "ends"));
    if (ctx.has_input(3)) { MEMC_ASSIGN_OR_RETURN(axes, ctx.input_ints(3, "axes")); }
    if (ctx.has_input(4)) { MEMC_ASSIGN_OR_RETURN(steps, ctx.input_ints(4, "steps")); }
  }
  if (axes.empty()) {
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) {
    return ctx.error("starts/ends/axes/steps lengths differ");
  }
  MEMC_ASSIGN_OR_RETURN(axes, checked_axes(ctx, axes, rank));
  for (size_t i = 0; i < axes.size(); ++i) {
    if (steps[i] == 0) return ctx.error("slice step is 0");
    steps[i] = std::clamp<int64_t>(steps[i], -kMaxDim, kMaxDim);
    normalize_slice(in[axes[i]], steps[i], starts[i], ends[i]);
  }
  Attrs a;
  a.set("axes", axes);
  a.set("starts", starts);
  a.set("ends", ends);
  a.set("steps", steps);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("slice", {x}, std::move(a)));
  return ctx.bind(0, y);
}

// Split → one slice per output. Sizes: attribute before 13, input from 13; else equal
// parts (num_outputs attribute from 18, or the number of outputs).
Status lower_split(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape& in = ctx.type(x).shape;
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", 0), in.size()));
  std::vector<int64_t> sizes;
  if (ctx.opset() < 13) sizes = ctx.attr_ints("split");
  else if (ctx.has_input(1)) { MEMC_ASSIGN_OR_RETURN(sizes, ctx.input_ints(1, "split")); }
  const int64_t dim = in[axis];
  const int64_t parts = ctx.num_outputs();
  if (parts < 1) return ctx.error("needs at least one output");
  if (sizes.empty()) {
    const int64_t chunk = (dim + parts - 1) / parts;  // opset 18: the last part may be smaller
    for (int64_t i = 0; i < parts; ++i) sizes.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
  }
  if (static_cast<int64_t>(sizes.size()) != parts) return ctx.error("split sizes do not match the outputs");
  int64_t offset = 0;
  for (int64_t i = 0; i < parts; ++i) {
    if (sizes[i] < 0 || sizes[i] > dim - offset) return ctx.error(str_cat("split sizes exceed dim ", dim));
    Attrs a;
    a.set("axes", std::vector<int64_t>{axis});
    a.set("starts", std::vector<int64_t>{sizes[i] ? offset : 0});
    a.set("ends", std::vector<int64_t>{sizes[i] ? offset + sizes[i] : 0});
    a.set("steps", std::vector<int64_t>{1});
    MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("slice", {x}, std::move(a)));
    MEMC_RETURN_IF_ERROR(ctx.bind(static_cast<int>(i), y));
    offset += sizes[i];
  }
  if (offset != dim) return ctx.error(str_cat("split sizes sum to ", offset, ", dim is ", dim));
  return Status::Ok();
}

// SplitToSequence(x[, split]) → a sequence of slices along `axis`: chunks of `split` (a scalar:
// the last may be shorter) or the sizes it lists; without it, pieces of 1, squeezed unless
// keepdims. Only SequenceAt at a known position may read the sequence (as torch's exporters
// write tensor.split / chunk without the optimizer): the items are plain tensors.
Status lower_split_to_sequence(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const Shape in = ctx.type(x).shape;
  MEMC_ASSIGN_OR_RETURN(int64_t axis, checked_axis(ctx, ctx.attr_int("axis", 0), in.size()));
  const int64_t dim = in[axis];
  std::vector<int64_t> sizes;
  const bool given = ctx.has_input(1);
  if (given) {
    const Tensor* split = ctx.input_constant(1);
    if (split == nullptr) return ctx.error("split sizes computed at run time are not supported");
    MEMC_ASSIGN_OR_RETURN(std::vector<int64_t> listed, ctx.input_ints(1, "split"));
    if (split->rank() == 0) {
      if (listed.size() != 1 || listed[0] < 1) return ctx.error("split chunk must be at least 1");
      for (int64_t offset = 0; offset < dim; offset += listed[0]) sizes.push_back(std::min(listed[0], dim - offset));
    } else {
      sizes = listed;
    }
  } else {
    sizes.assign(static_cast<size_t>(dim), 1);
  }
  const bool squeeze = !given && ctx.attr_int("keepdims", 1) == 0;
  std::vector<ValueId> items;
  int64_t offset = 0;
  for (const int64_t size : sizes) {
    if (size < 0 || size > dim - offset) return ctx.error(str_cat("split sizes exceed dim ", dim));
    Attrs a;
    a.set("axes", std::vector<int64_t>{axis});
    a.set("starts", std::vector<int64_t>{offset});
    a.set("ends", std::vector<int64_t>{offset + size});
    a.set("steps", std::vector<int64_t>{1});
    MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("slice", {x}, std::move(a)));
    if (squeeze) {
      Shape out = in;
      out.erase(out.begin() + axis);
      MEMC_ASSIGN_OR_RETURN(y, ctx.reshape(y, out));
    }
    items.push_back(y);
    offset += size;
  }
  if (offset != dim) return ctx.error(str_cat("split sizes sum to ", offset, ", dim is ", dim));
  if (ctx.has_output(0)) ctx.define_sequence(ctx.node().output(0), std::move(items));
  return Status::Ok();
}

// SequenceAt(sequence, position): the item, where the sequence is SplitToSequence's and the
// position is known at import (negative counts from the end).
Status lower_sequence_at(ImportContext& ctx) {
  const std::vector<ValueId>* items = ctx.has_input(0) ? ctx.sequence(ctx.node().input(0)) : nullptr;
  if (items == nullptr) return ctx.error(str_cat("input '", ctx.has_input(0) ? ctx.node().input(0) : "", "' is not a sequence from SplitToSequence"));
  if (ctx.input_constant(1) == nullptr) return ctx.error("a position computed at run time is not supported");
  MEMC_ASSIGN_OR_RETURN(std::vector<int64_t> position, ctx.input_ints(1, "position"));
  const auto n = static_cast<int64_t>(items->size());
  const int64_t at = position.size() == 1 && position[0] < 0 ? position[0] + n : (position.empty() ? -1 : position[0]);
  if (position.size() != 1 || at < 0 || at >= n) return ctx.error(str_cat("position is outside the sequence of ", n));
  return ctx.bind(0, (*items)[static_cast<size_t>(at)]);
}

Status lower_expand(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(auto dims, ctx.input_ints(1, "Expand shape"));
  Shape in = ctx.type(x).shape;
  const size_t rank = std::max(in.size(), dims.size());
  Shape target(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t a = i + in.size() >= rank ? in[i + in.size() - rank] : 1;
    const int64_t b = i + dims.size() >= rank ? dims[i + dims.size() - rank] : 1;
    if (a != b && a != 1 && b != 1) return ctx.error(str_cat("cannot expand ", shape_str(in), " to ", shape_str(dims)));
    target[i] = a == 1 ? b : a;
  }
  MEMC_ASSIGN_OR_RETURN(target, checked_shape(ctx, target));
  MEMC_ASSIGN_OR_RETURN(ValueId xr, ctx.reshape(x, [&] {
                          Shape padded(rank - in.size(), 1);
                          padded.insert(padded.end(), in.begin(), in.end());
                          return padded;
                        }()));
  ValueId y = xr;
  if (target != ctx.type(xr).shape) {
    Attrs a;
    a.set("shape", std::vector<int64_t>(target));
    MEMC_ASSIGN_OR_RETURN(y, ctx.emit("expand", {xr}, std::move(a)));
  } else if (y == x) {
    MEMC_ASSIGN_OR_RETURN(y, ctx.emit("copy", {x}));
  }
  return ctx.bind(0, y);
}

// Col2Im (F.fold), 2-D. Blocks that tile the image (stride = block, no padding or dilation) are a
// reshape and a transpose. Otherwise (overlapping blocks, padding, dilation) each block offset
// (ki, kj) is scattered onto the padded canvas at rows ki·dh + a·sh and columns kj·dw + b·sw
// (slice_grad, a strided write into zeros), the kh·kw placements are summed (overlaps add, as
// fold's do), and the padding is cut away. The gradient of each step is defined, so the whole is.
Expected<ValueId> fold_by_placements(ImportContext& ctx, ValueId x, const std::vector<int64_t>& image, const std::vector<int64_t>& block,
                                     const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                     const std::vector<int64_t>& dilations) {
  const Shape xs = ctx.type(x).shape;
  const int64_t kh = block[0], kw = block[1];
  const int64_t ph = image[0] + pads[0] + pads[2], pw = image[1] + pads[1] + pads[3];
  const int64_t lh = (ph - dilations[0] * (kh - 1) - 1) / strides[0] + 1, lw = (pw - dilations[1] * (kw - 1) - 1) / strides[1] + 1;
  if (lh <= 0 || lw <= 0 || xs[1] % (kh * kw) != 0 || xs[2] != lh * lw) {
    return ctx.error(str_cat("input ", shape_str(xs), " does not hold ", std::max<int64_t>(lh, 0) * std::max<int64_t>(lw, 0), " blocks of ", kh,
                             "x", kw, " for image ", shape_str(image)));
  }
  const int64_t n = xs[0], c = xs[1] / (kh * kw);
  MEMC_ASSIGN_OR_RETURN(const ValueId blocks, ctx.reshape(x, {n, c, kh, kw, lh, lw}));
  auto slice_attrs = [](std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> steps) {
    Attrs a;
    a.set("axes", std::vector<int64_t>{2, 3}), a.set("starts", std::move(starts)), a.set("ends", std::move(ends)), a.set("steps", std::move(steps));
    return a;
  };
  ValueId sum = kNoValue;
  for (int64_t ki = 0; ki < kh; ++ki) {
    for (int64_t kj = 0; kj < kw; ++kj) {
      MEMC_ASSIGN_OR_RETURN(ValueId part, ctx.emit("slice", {blocks}, slice_attrs({ki, kj}, {ki + 1, kj + 1}, {1, 1})));
      MEMC_ASSIGN_OR_RETURN(part, ctx.reshape(part, {n, c, lh, lw}));
      const int64_t top = ki * dilations[0], left = kj * dilations[1];
      Attrs place = slice_attrs({top, left}, {top + (lh - 1) * strides[0] + 1, left + (lw - 1) * strides[1] + 1}, {strides[0], strides[1]});
      place.set("input_shape", Shape{n, c, ph, pw});
      MEMC_ASSIGN_OR_RETURN(part, ctx.emit("slice_grad", {part}, std::move(place)));
      if (sum == kNoValue) {
        sum = part;
      } else {
        MEMC_ASSIGN_OR_RETURN(sum, ctx.emit("add", {sum, part}));
      }
    }
  }
  return ctx.emit("slice", {sum}, slice_attrs({pads[0], pads[1]}, {pads[0] + image[0], pads[1] + image[1]}, {1, 1}));
}

Status lower_col2im(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(auto image, ctx.input_ints(1, "image_shape"));
  MEMC_ASSIGN_OR_RETURN(auto block, ctx.input_ints(2, "block_shape"));
  const Shape xs = ctx.type(x).shape;
  if (image.size() != 2 || block.size() != 2 || xs.size() != 3) return ctx.error("needs 2-D image and block shapes and input [N, C·kh·kw, L]");
  const auto strides = ctx.attr_ints("strides", {1, 1}), pads = ctx.attr_ints("pads", {0, 0, 0, 0}), dilations = ctx.attr_ints("dilations", {1, 1});
  if (strides.size() != 2 || pads.size() != 4 || dilations.size() != 2 || block[0] <= 0 || block[1] <= 0 || image[0] <= 0 || image[1] <= 0 ||
      std::any_of(strides.begin(), strides.end(), [](int64_t v) { return v <= 0; }) ||
      std::any_of(dilations.begin(), dilations.end(), [](int64_t v) { return v <= 0; }) ||
      std::any_of(pads.begin(), pads.end(), [](int64_t v) { return v < 0; })) {
    return ctx.error(str_cat("Col2Im of blocks ", shape_str(block), " with strides ", shape_str(strides), ", pads ", shape_str(pads),
                             " and dilations ", shape_str(dilations), " into ", shape_str(image), ": needs positive sizes, strides and dilations"));
  }
  const bool tiles = strides == block && std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; }) &&
                     std::all_of(dilations.begin(), dilations.end(), [](int64_t d) { return d == 1; }) && image[0] % block[0] == 0 &&
                     image[1] % block[1] == 0;
  if (!tiles) {
    MEMC_ASSIGN_OR_RETURN(const ValueId y, fold_by_placements(ctx, x, image, block, strides, pads, dilations));
    return ctx.bind(0, y);
  }
  const int64_t kh = block[0], kw = block[1], hb = image[0] / kh, wb = image[1] / kw;
  if (xs[1] % (kh * kw) != 0 || xs[2] != hb * wb) {
    return ctx.error(str_cat("input ", shape_str(xs), " does not hold ", hb * wb, " blocks of ", kh, "x", kw));
  }
  const int64_t n = xs[0], c = xs[1] / (kh * kw);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.reshape(x, {n, c, kh, kw, hb, wb}));
  MEMC_ASSIGN_OR_RETURN(y, ctx.transpose(y, {0, 1, 4, 2, 5, 3}));
  MEMC_ASSIGN_OR_RETURN(y, ctx.reshape(y, {n, c, image[0], image[1]}));
  return ctx.bind(0, y);
}

Status lower_tile(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  MEMC_ASSIGN_OR_RETURN(auto repeats, ctx.input_ints(1, "repeats"));
  Shape out = ctx.type(x).shape;
  if (repeats.size() != out.size()) return ctx.error("repeats length differs from rank");
  for (size_t i = 0; i < out.size(); ++i) {
    if (repeats[i] < 0 || repeats[i] > kMaxDim) return ctx.error("bad repeat");
    out[i] *= repeats[i];
  }
  MEMC_RETURN_IF_ERROR(checked_shape(ctx, out).status());
  Attrs a;
  a.set("repeats", repeats);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("tile", {x}, std::move(a)));
  return ctx.bind(0, y);
}

// Pad: pads/value attributes before 11; inputs pads, constant_value, axes (18) from 11.
Status lower_pad(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId x, ctx.input(0));
  const int64_t rank = static_cast<int64_t>(ctx.type(x).shape.size());
  std::vector<int64_t> pads;
  double value = 0;
  if (ctx.opset() < 11) {
    pads = ctx.attr_ints("pads");
    value = ctx.attr_float("value", 0);
  } else {
    MEMC_ASSIGN_OR_RETURN(pads, ctx.input_ints(1, "pads"));
    if (ctx.has_input(2)) { MEMC_ASSIGN_OR_RETURN(value, ctx.input_scalar(2, "constant_value")); }
    if (ctx.has_input(3)) {
      MEMC_ASSIGN_OR_RETURN(auto axes, ctx.input_ints(3, "axes"));
      MEMC_ASSIGN_OR_RETURN(axes, checked_axes(ctx, axes, rank));
      if (pads.size() != 2 * axes.size()) return ctx.error("pads must hold 2·len(axes) values");
      std::vector<int64_t> full(2 * rank, 0);
      for (size_t i = 0; i < axes.size(); ++i) {
        full[axes[i]] = pads[i];
        full[rank + axes[i]] = pads[axes.size() + i];
      }
      pads = full;
    }
  }
  if (static_cast<int64_t>(pads.size()) != 2 * rank) return ctx.error("pads must hold 2·rank values");
  for (int64_t& p : pads) {
    if (p < -kMaxDim || p > kMaxDim) return ctx.error("bad pad");
  }
  const std::string mode = ctx.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge") return ctx.error("mode '" + mode + "' is unsupported");
  Attrs a;
  a.set("pads", pads);
  a.set("mode", mode);
  a.set("value", value);
  MEMC_ASSIGN_OR_RETURN(ValueId y, ctx.emit("pad", {x}, std::move(a)));
  return ctx.bind(0, y);
}

// Range is folded: its operands are scalars fixed at import.
Status lower_range(ImportContext& ctx) {
  MEMC_ASSIGN_OR_RETURN(ValueId start_v, ctx.input(0));
  const DType dtype = ctx.type(start_v).dtype;
  MEMC_ASSIGN_OR_RETURN(double start, ctx.input_scalar(0, "start"));
  MEMC_ASSIGN_OR_RETURN(double limit, ctx.input_scalar(1, "limit"));
  MEMC_ASSIGN_OR_RETURN(double delta, ctx.input_scalar(2, "delta"));
  if (delta == 0 || !std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta)) return ctx.error("bad range");
  const double count_f = std::max(0.0, std::ceil((limit - start) / delta));
  if (count_f > static_cast<double>(kMaxFoldElements)) return ctx.error("range too long");
  const int64_t count = static_cast<int64_t>(count_f);
  Tensor t = Tensor::zeros(dtype, {count});
  for (int64_t i = 0; i < count; ++i) t.set_from_double(i, start + static_cast<double>(i) * delta);
  return ctx.bind(0, ctx.constant(std::move(t)));
}

}  // namespace

void add_shape_lowerings(LoweringTable& table) {
  table["Constant"] = lower_constant;
  table["Shape"] = lower_shape;
  table["Size"] = lower_size;
  table["ConstantOfShape"] = lower_constant_of_shape;
  table["EyeLike"] = lower_eye_like;
  table["Reshape"] = lower_reshape;
  table["Flatten"] = lower_flatten;
  table["Squeeze"] = lower_squeeze;
  table["Unsqueeze"] = lower_unsqueeze;
  table["Transpose"] = lower_transpose;
  table["Concat"] = lower_concat;
  table["Gather"] = lower_gather;
  table["GatherElements"] = lower_gather_elements;
  table["GatherND"] = lower_gather_nd;
  table["ScatterND"] = lower_scatter_nd;
  table["ScatterElements"] = lower_scatter_elements;
  table["Slice"] = lower_slice;
  table["Split"] = lower_split;
  table["SplitToSequence"] = lower_split_to_sequence;
  table["SequenceAt"] = lower_sequence_at;
  table["Expand"] = lower_expand;
  table["Tile"] = lower_tile;
  table["Trilu"] = lower_trilu;
  table["Col2Im"] = lower_col2im;
  table["Pad"] = lower_pad;
  table["Range"] = lower_range;
}

}  // namespace memc
