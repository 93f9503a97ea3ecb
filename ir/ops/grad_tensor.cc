// Gradient rules of matmul, linear, conv, attention, reductions, normalizations and the
// data-movement ops. Notation: x = I(0), y = O(0), dy = GO(0).
#include "ir/grad.h"
#include "ir/ops/ops.h"

namespace memc {
namespace {

using Rule = Status (*)(GradBuilder&);

void set(OpRegistry& r, const char* op, Rule rule) {
  OpDef* def = r.find_mutable(op);
  MEMC_CHECK(def != nullptr, "gradient rule for unregistered op ", op);
  def->grad = rule;
}

Attrs flags(bool transpose_a, bool transpose_b) {
  return make_attrs({{"transpose_a", int64_t{transpose_a}}, {"transpose_b", int64_t{transpose_b}}});
}

// y = op(a)·op(b) with op = transpose when flagged.
//   dA = dy·op(b)ᵀ, stored transposed when ta;  dB = op(a)ᵀ·dy, stored transposed when tb.
// 1-D operands are promoted to matrices first; broadcast batch dims are summed away.
Status matmul_grad(GradBuilder& g) {
  const bool ta = g.attrs().get_int("transpose_a", 0), tb = g.attrs().get_int("transpose_b", 0);
  const Shape a_shape = g.shape(g.I(0)), b_shape = g.shape(g.I(1));
  Shape a2 = a_shape, b2 = b_shape;
  if (a2.size() == 1) a2.insert(a2.begin(), 1);
  if (b2.size() == 1) b2.push_back(1);
  ValueId a = g.reshape(g.I(0), a2), b = g.reshape(g.I(1), b2);
  Shape dy_shape = g.shape(g.GO(0));
  if (a_shape.size() == 1) dy_shape.insert(dy_shape.end() - (b_shape.size() == 1 ? 0 : 1), 1);
  if (b_shape.size() == 1) dy_shape.push_back(1);
  ValueId dy = g.reshape(g.GO(0), dy_shape);
  if (g.needs_GI(0)) {
    ValueId da = ta ? g.emit("matmul", {b, dy}, flags(tb, true)) : g.emit("matmul", {dy, b}, flags(false, !tb));
    g.set_GI(0, g.reshape(g.sum_to(da, a2), a_shape));
  }
  if (g.needs_GI(1)) {
    ValueId db = tb ? g.emit("matmul", {dy, a}, flags(true, ta)) : g.emit("matmul", {a, dy}, flags(!ta, false));
    g.set_GI(1, g.reshape(g.sum_to(db, b2), b_shape));
  }
  return Status::Ok();
}

// y = x·op(w) + b, op(w) = wᵀ when transpose_w.  dx = dy·op(w)ᵀ; dW from the flattened
// [M, K] x and [M, N] dy: dyᵀ·x (transpose_w) or xᵀ·dy; db = Σ_rows dy.
Status linear_grad(GradBuilder& g) {
  const bool tw = g.attrs().get_int("transpose_w", 1);
  const Shape& x_shape = g.shape(g.I(0));
  const Shape& dy_shape = g.shape(g.GO(0));
  if (g.needs_GI(0)) g.set_GI(0, g.emit("linear", {g.GO(0), g.I(1)}, make_attrs({{"transpose_w", int64_t{!tw}}})));
  const int64_t k = x_shape.back(), n = dy_shape.back(), m = numel(x_shape) / std::max<int64_t>(k, 1);
  ValueId dy2 = g.reshape(g.GO(0), {m, n});
  if (g.needs_GI(1)) {
    ValueId x2 = g.reshape(g.I(0), {m, k});
    g.set_GI(1, tw ? g.emit("matmul", {dy2, x2}, flags(true, false)) : g.emit("matmul", {x2, dy2}, flags(true, false)));
  }
  if (g.has_input(2) && g.needs_GI(2)) {
    ValueId db = g.emit("reduce_sum", {dy2}, make_attrs({{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}}));
    g.set_GI(2, g.reshape(db, g.shape(g.I(2))));
  }
  return Status::Ok();
}

Attrs conv_attrs(GradBuilder& g, const char* shape_key, const Shape& shape) {
  Attrs a = g.attrs();
  a.set(shape_key, shape);
  return a;
}

Status conv_grad(GradBuilder& g) {
  if (g.needs_GI(0)) g.set_GI(0, g.emit("conv_grad_input", {g.GO(0), g.I(1)}, conv_attrs(g, "input_shape", g.shape(g.I(0)))));
  if (g.needs_GI(1)) g.set_GI(1, g.emit("conv_grad_weight", {g.GO(0), g.I(0)}, conv_attrs(g, "weight_shape", g.shape(g.I(1)))));
  if (g.has_input(2) && g.needs_GI(2)) {
    std::vector<int64_t> axes = {0};
    for (size_t d = 2; d < g.shape(g.GO(0)).size(); ++d) axes.push_back(static_cast<int64_t>(d));
    g.set_GI(2, g.emit("reduce_sum", {g.GO(0)}, make_attrs({{"axes", axes}, {"keepdims", int64_t{0}}})));
  }
  return Status::Ok();
}

Status attention_grad(GradBuilder& g) {
  std::vector<ValueId> in = {g.GO(0), g.I(0), g.I(1), g.I(2)};
  const bool bias = g.has_input(3);
  if (bias) in.push_back(g.I(3));
  const bool want_dbias = bias && g.needs_GI(3);
  std::vector<ValueId> out = g.emit_n("attention_grad", in, g.attrs(), want_dbias ? 4 : 3);
  for (int i = 0; i < 3; ++i) g.set_GI(i, out[i]);
  if (want_dbias) g.set_GI(3, out[3]);
  return Status::Ok();
}

// Shape of a reduction's output with keepdims, so it broadcasts back against x.
Shape kept_shape(GradBuilder& g) {
  Shape s = g.shape(g.I(0));
  const auto axes = g.attrs().get_ints("axes");
  for (size_t d = 0; d < s.size(); ++d) {
    if (axes.empty() || std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end()) s[d] = 1;
  }
  return s;
}

ValueId broadcast_back(GradBuilder& g, ValueId v) {
  return g.emit("expand", {g.reshape(v, kept_shape(g))}, make_attrs({{"shape", g.shape(g.I(0))}}));
}

Status reduce_sum_grad(GradBuilder& g) {
  g.set_GI(0, broadcast_back(g, g.GO(0)));
  return Status::Ok();
}

Status reduce_mean_grad(GradBuilder& g) {
  const double count = static_cast<double>(g.type(g.I(0)).numel()) / static_cast<double>(std::max<int64_t>(g.type(g.O(0)).numel(), 1));
  ValueId scaled = g.emit("mul", {g.GO(0), g.scalar(1.0 / count, g.dtype(g.GO(0)))});
  g.set_GI(0, broadcast_back(g, scaled));
  return Status::Ok();
}

// The elements equal to the extreme take the gradient. Where several tie, attribute `ties` says
// how: "split" (the default) shares it evenly, as PyTorch's amax, amin and max() give; "first"
// gives it all to the first in row-major order over the reduced axes, as max(dim), min(dim) and
// adaptive max pooling give.
Status reduce_extreme_grad(GradBuilder& g) {
  const std::string ties = g.attrs().get_string("ties", "split");
  if (ties != "split" && ties != "first") return Status::BadInput(str_cat("attribute 'ties' is '", ties, "', not split or first"));
  const DType dt = g.dtype(g.GO(0));
  const ValueId zero = g.scalar(0.0, dt);
  ValueId hit = g.emit("equal", {g.I(0), broadcast_back(g, g.O(0))});
  Attrs reduce = g.attrs();  // the forward's axes and keepdims: results shaped as dy
  reduce.erase("ties");
  if (ties == "split") {
    ValueId count = g.emit("reduce_sum", {g.cast(hit, dt)}, reduce);
    g.set_GI(0, g.emit("where", {hit, broadcast_back(g, g.emit("div", {g.GO(0), count})), zero}));
    return Status::Ok();
  }
  // Each element's position over the reduced axes; the smallest position that ties wins.
  const Shape in = g.shape(g.I(0));
  const Shape out = kept_shape(g);
  Shape positions_shape(in.size(), 1);
  int64_t extent = 1;
  for (size_t d = 0; d < in.size(); ++d)
    if (out[d] == 1 && in[d] != 1) positions_shape[d] = in[d], extent *= in[d];
  if (extent > (int64_t{1} << 24)) return Status::BadInput(str_cat("ties 'first' over ", extent, " elements: more than f32 counts exactly"));
  Tensor positions = Tensor::zeros(DType::kF32, positions_shape);
  for (int64_t i = 0; i < extent; ++i) positions.set_from_double(i, static_cast<double>(i));
  const ValueId at = g.constant(std::move(positions));
  ValueId candidates = g.emit("where", {hit, at, g.scalar(static_cast<double>(extent), DType::kF32)});
  ValueId first = g.emit("equal", {at, broadcast_back(g, g.emit("reduce_min", {candidates}, reduce))});
  g.set_GI(0, g.emit("where", {first, broadcast_back(g, g.GO(0)), zero}));
  return Status::Ok();
}

// d Σx² = 2x·dy;  d ‖x‖ = x/‖x‖·dy, and 0 where ‖x‖ = 0 (PyTorch's norm subgradient: Swin v2's
// F.normalize of the zero keys of padded window tokens would otherwise give 0/0)
Status reduce_sum_square_grad(GradBuilder& g) {
  ValueId two_x = g.emit("mul", {g.I(0), g.scalar(2.0, g.dtype(g.I(0)))});
  g.set_GI(0, g.emit("mul", {two_x, broadcast_back(g, g.GO(0))}));
  return Status::Ok();
}
Status reduce_l2_grad(GradBuilder& g) {
  const DType t = g.dtype(g.O(0));
  ValueId positive = g.emit("greater", {g.O(0), g.scalar(0.0, t)});
  ValueId ratio = g.emit("where", {positive, g.emit("div", {g.GO(0), g.O(0)}), g.scalar(0.0, t)});
  g.set_GI(0, g.emit("mul", {g.I(0), broadcast_back(g, ratio)}));
  return Status::Ok();
}

// Gradients reach x and scale only through y; a loss that uses the optional mean / inv_std
// outputs would silently lose their share, so that is refused.
Status layernorm_grad(GradBuilder& g) {
  if (g.GO(1) != kNoValue || g.GO(2) != kNoValue) return Status::BadInput("no gradient through layernorm's mean/inv_std outputs");
  if (g.needs_GI(0) || g.needs_GI(1)) {
    std::vector<ValueId> d = g.emit_n("layernorm_grad", {g.GO(0), g.I(0), g.I(1)}, g.attrs(), 2);
    g.set_GI(0, d[0]);
    g.set_GI(1, g.sum_to(d[1], g.shape(g.I(1))));
  }
  if (g.has_input(2) && g.needs_GI(2)) g.set_GI(2, g.sum_to(g.GO(0), g.shape(g.I(2))));
  return Status::Ok();
}

Status transpose_grad(GradBuilder& g) {
  const auto perm = g.attrs().get_ints("perm");
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  g.set_GI(0, g.emit("transpose", {g.GO(0)}, make_attrs({{"perm", inverse}})));
  return Status::Ok();
}

Status concat_grad(GradBuilder& g) {
  const int64_t axis = g.attrs().get_int("axis", 0);
  int64_t offset = 0;
  for (int i = 0; i < g.num_inputs(); ++i) {
    const int64_t len = g.shape(g.I(i))[axis];
    if (g.needs_GI(i)) {
      g.set_GI(i, g.emit("slice", {g.GO(0)}, make_attrs({{"axes", std::vector<int64_t>{axis}}, {"starts", std::vector<int64_t>{offset}},
                                                          {"ends", std::vector<int64_t>{offset + len}}, {"steps", std::vector<int64_t>{1}}})));
    }
    offset += len;
  }
  return Status::Ok();
}

// Reflect and edge padding read every output element from one input element, dim by dim:
// y = x[s_0(o_0), …, s_n(o_n)] (pad_source_index). The gradient scatters dy back through each
// padded dim's source map, the last dim first, as a gather's gradient does (gather_grad: the
// mirrored and repeated coordinates accumulate).
Status mirrored_pad_grad(GradBuilder& g, const std::vector<int64_t>& pads, const std::string& mode) {
  const Shape x = g.shape(g.I(0));
  Shape shape = g.shape(g.GO(0));
  ValueId dy = g.GO(0);
  for (size_t d = x.size(); d-- > 0;) {
    if (pads[d] == 0 && pads[x.size() + d] == 0) continue;
    Tensor source = Tensor::zeros(DType::kI64, {shape[d]});
    for (int64_t o = 0; o < shape[d]; ++o) source.data<int64_t>()[o] = pad_source_index(o, x[d], pads[d], mode);
    shape[d] = x[d];
    dy = g.emit("gather_grad", {dy, g.constant(std::move(source))}, make_attrs({{"axis", static_cast<int64_t>(d)}, {"input_shape", shape}}));
  }
  g.set_GI(0, dy);
  return Status::Ok();
}

// Constant padding: the gradient is the interior slice. Reflect and edge: mirrored_pad_grad.
Status pad_grad(GradBuilder& g) {
  const auto pads = g.attrs().get_ints("pads");
  const Shape& x = g.shape(g.I(0));
  for (size_t d = 0; d < x.size(); ++d) {
    if (pads[d] < 0 || pads[x.size() + d] < 0) return Status::BadInput("no gradient for negative (cropping) pads");
  }
  const std::string mode = g.attrs().get_string("mode", "constant");
  if (mode != "constant") return mirrored_pad_grad(g, pads, mode);
  std::vector<int64_t> axes, starts, ends, steps;
  for (size_t d = 0; d < x.size(); ++d) {
    axes.push_back(static_cast<int64_t>(d));
    starts.push_back(pads[d]);
    ends.push_back(pads[d] + x[d]);
    steps.push_back(1);
  }
  g.set_GI(0, g.emit("slice", {g.GO(0)}, make_attrs({{"axes", axes}, {"starts", starts}, {"ends", ends}, {"steps", steps}})));
  return Status::Ok();
}

// y = tile(x, r): view dy as [r0, d0, r1, d1, ...] and sum the repeat axes.
Status tile_grad(GradBuilder& g) {
  const auto repeats = g.attrs().get_ints("repeats");
  const Shape& x = g.shape(g.I(0));
  Shape split;
  std::vector<int64_t> axes;
  for (size_t d = 0; d < x.size(); ++d) {
    axes.push_back(static_cast<int64_t>(split.size()));
    split.push_back(repeats[d]);
    split.push_back(x[d]);
  }
  ValueId summed = g.emit("reduce_sum", {g.reshape(g.GO(0), split)}, make_attrs({{"axes", axes}, {"keepdims", int64_t{0}}}));
  g.set_GI(0, g.reshape(summed, x));
  return Status::Ok();
}

}  // namespace

void register_elementwise_gradients(OpRegistry& r);

void register_gradients(OpRegistry& r) {
  register_elementwise_gradients(r);
  set(r, "matmul", matmul_grad);
  set(r, "linear", linear_grad);
  set(r, "conv", conv_grad);
  set(r, "attention", attention_grad);
  set(r, "reduce_sum", reduce_sum_grad);
  // y_i = Σ_{j ≤ i} x_j  ⇒  dx_j = Σ_{i ≥ j} dy_i: the running sum the other way.
  set(r, "cumsum", [](GradBuilder& g) {
    Attrs a = g.attrs();
    a.set("reverse", int64_t{g.attrs().get_int("reverse", 0) ? 0 : 1});
    g.set_GI(0, g.emit("cumsum", {g.GO(0)}, a));
    return Status::Ok();
  });
  set(r, "reduce_mean", reduce_mean_grad);
  set(r, "reduce_max", reduce_extreme_grad);
  set(r, "reduce_min", reduce_extreme_grad);
  set(r, "reduce_sum_square", reduce_sum_square_grad);
  set(r, "reduce_l2", reduce_l2_grad);
  set(r, "softmax", [](GradBuilder& g) {
    g.set_GI(0, g.emit("softmax_grad", {g.GO(0), g.O(0)}, g.attrs()));
    return Status::Ok();
  });
  set(r, "log_softmax", [](GradBuilder& g) {
    g.set_GI(0, g.emit("log_softmax_grad", {g.GO(0), g.O(0)}, g.attrs()));
    return Status::Ok();
  });
  set(r, "layernorm", layernorm_grad);
  set(r, "softmax_cross_entropy", [](GradBuilder& g) {
    g.set_GI(0, g.emit("softmax_cross_entropy_grad", {g.GO(0), g.I(0), g.I(1)}, g.attrs()));
    return Status::Ok();
  });
  set(r, "reshape", [](GradBuilder& g) { g.set_GI(0, g.reshape(g.GO(0), g.shape(g.I(0)))); return Status::Ok(); });
  set(r, "transpose", transpose_grad);
  set(r, "slice", [](GradBuilder& g) {
    Attrs a = g.attrs();
    a.set("input_shape", g.shape(g.I(0)));
    g.set_GI(0, g.emit("slice_grad", {g.GO(0)}, a));
    return Status::Ok();
  });
  // A strided write into zeros (Col2Im's placements): its gradient reads the slice back.
  set(r, "slice_grad", [](GradBuilder& g) {
    Attrs a;
    for (const char* key : {"axes", "starts", "ends", "steps"}) a.set(key, g.attrs().get_ints(key));
    g.set_GI(0, g.emit("slice", {g.GO(0)}, a));
    return Status::Ok();
  });
  set(r, "concat", concat_grad);
  set(r, "expand", [](GradBuilder& g) { g.set_GI(0, g.sum_to(g.GO(0), g.shape(g.I(0)))); return Status::Ok(); });
  // An embedding's lookup with a padding index (nn.Embedding(padding_idx=p), attribute
  // `padding_idx` on an axis-0 gather) gives row p no gradient: the rows of dY gathered from p
  // are left out of the scatter-add (a `where`, so a non-finite dY there is left out too).
  set(r, "gather", [](GradBuilder& g) {
    Attrs a = make_attrs({{"axis", g.attrs().get_int("axis", 0)}, {"input_shape", g.shape(g.I(0))}});
    ValueId dy = g.GO(0);
    if (const int64_t pad = g.attrs().get_int("padding_idx", -1); pad >= 0 && g.attrs().get_int("axis", 0) == 0) {
      Shape rows = g.shape(g.I(1));
      rows.resize(g.shape(dy).size(), 1);  // the index's dims, then 1 for each row's
      // An index counts from the end where negative (ONNX Gather): p − V is row p too.
      const DType index = g.dtype(g.I(1));
      const double count = static_cast<double>(g.shape(g.I(0))[0]);
      const ValueId at_p = g.emit("or", {g.emit("equal", {g.I(1), g.scalar(static_cast<double>(pad), index)}),
                                         g.emit("equal", {g.I(1), g.scalar(static_cast<double>(pad) - count, index)})});
      const ValueId padded = g.reshape(at_p, rows);
      dy = g.emit("where", {padded, g.scalar(0.0, g.dtype(dy)), dy});
    }
    g.set_GI(0, g.emit("gather_grad", {dy, g.I(1)}, a));
    return Status::Ok();
  });
  // dData = scatter-add of dY at the gathered positions (repeated indices accumulate).
  set(r, "gather_elements", [](GradBuilder& g) {
    Attrs a = make_attrs({{"axis", g.attrs().get_int("axis", 0)}, {"input_shape", g.shape(g.I(0))}});
    g.set_GI(0, g.emit("gather_elements_grad", {g.GO(0), g.I(1)}, a));
    return Status::Ok();
  });
  // The scatter-adds (a gather's gradient, and a scatter the step computes, lowered to one):
  // each added element's gradient is the output's at the place it was added to.
  set(r, "gather_grad", [](GradBuilder& g) {
    g.set_GI(0, g.emit("gather", {g.GO(0), g.I(1)}, make_attrs({{"axis", g.attrs().get_int("axis", 0)}})));
    return Status::Ok();
  });
  set(r, "gather_elements_grad", [](GradBuilder& g) {
    g.set_GI(0, g.emit("gather_elements", {g.GO(0), g.I(1)}, make_attrs({{"axis", g.attrs().get_int("axis", 0)}})));
    return Status::Ok();
  });
  // The values' gradient goes back to the elements they were taken from; the indices have none.
  set(r, "topk", [](GradBuilder& g) {
    if (g.GO(0) == kNoValue) return Status::Ok();
    Attrs a = make_attrs({{"axis", g.attrs().get_int("axis", 0)}, {"input_shape", g.shape(g.I(0))}});
    g.set_GI(0, g.emit("gather_elements_grad", {g.GO(0), g.O(1)}, a));
    return Status::Ok();
  });
  set(r, "pad", pad_grad);
  set(r, "tile", tile_grad);
}

}  // namespace memc
