// Gradient rules of the elementwise ops. Notation: x = I(0), y = O(0), dy = GO(0).
#include "ir/grad.h"
#include "ir/ops/ops.h"

namespace memc {
namespace {

using Rule = Status (*)(GradBuilder&);

ValueId mul(GradBuilder& g, ValueId a, ValueId b) { return g.emit("mul", {a, b}); }
ValueId scalar_like(GradBuilder& g, double v, ValueId like) { return g.scalar(v, g.dtype(like)); }

// For y = f(x): dx = dy · f'(x), with f'(x) built by `derivative`.
template <typename Fn>
Status unary(GradBuilder& g, Fn&& derivative) {
  g.set_GI(0, mul(g, g.GO(0), derivative()));
  return Status::Ok();
}

Status binary_broadcast(GradBuilder& g, ValueId da, ValueId db) {
  if (da != kNoValue) g.set_GI(0, g.sum_to(da, g.shape(g.I(0))));
  if (db != kNoValue) g.set_GI(1, g.sum_to(db, g.shape(g.I(1))));
  return Status::Ok();
}

// 1 − x², the radicand of arcsin's and arccos's derivatives.
ValueId one_minus_square(GradBuilder& g, ValueId x) { return g.emit("sub", {scalar_like(g, 1.0, x), mul(g, x, x)}); }

void set(OpRegistry& r, const char* op, Rule rule) {
  OpDef* def = r.find_mutable(op);
  MEMC_CHECK(def != nullptr, "gradient rule for unregistered op ", op);
  def->grad = rule;
}

}  // namespace

void register_elementwise_gradients(OpRegistry& r) {
  // A streamed parameter's gradient (passes/shard.h) stays on the device; the offload pass
  // stages it to the host for the update.
  set(r, "copy_to_device", [](GradBuilder& g) { g.set_GI(0, g.GO(0)); return Status::Ok(); });
  set(r, "neg", [](GradBuilder& g) { g.set_GI(0, g.emit("neg", {g.GO(0)})); return Status::Ok(); });
  set(r, "abs", [](GradBuilder& g) { return unary(g, [&] { return g.emit("sign", {g.I(0)}); }); });
  // Piecewise-constant functions: zero gradient almost everywhere (no input gradient emitted).
  for (const char* op : {"sign", "floor", "ceil", "round"}) set(r, op, [](GradBuilder&) { return Status::Ok(); });
  set(r, "exp", [](GradBuilder& g) { return unary(g, [&] { return g.O(0); }); });  // dx = dy·y
  set(r, "log", [](GradBuilder& g) { g.set_GI(0, g.emit("div", {g.GO(0), g.I(0)})); return Status::Ok(); });
  // dx = dy·0.5/y
  set(r, "sqrt", [](GradBuilder& g) {
    g.set_GI(0, g.emit("div", {mul(g, g.GO(0), scalar_like(g, 0.5, g.GO(0))), g.O(0)}));
    return Status::Ok();
  });
  // dx = dy·(-0.5)·y³
  set(r, "rsqrt", [](GradBuilder& g) {
    return unary(g, [&] { return mul(g, scalar_like(g, -0.5, g.O(0)), mul(g, g.O(0), mul(g, g.O(0), g.O(0)))); });
  });
  // dx = -dy·y²
  set(r, "reciprocal", [](GradBuilder& g) {
    return unary(g, [&] { return g.emit("neg", {mul(g, g.O(0), g.O(0))}); });
  });
  // dx = dy·(1 - y²)
  set(r, "tanh", [](GradBuilder& g) {
    return unary(g, [&] { return g.emit("sub", {scalar_like(g, 1.0, g.O(0)), mul(g, g.O(0), g.O(0))}); });
  });
  // dx = dy·y·(1 - y)
  set(r, "sigmoid", [](GradBuilder& g) {
    return unary(g, [&] { return mul(g, g.O(0), g.emit("sub", {scalar_like(g, 1.0, g.O(0)), g.O(0)})); });
  });
  // dx = x > 0 ? dy : 0
  set(r, "relu", [](GradBuilder& g) {
    ValueId positive = g.emit("greater", {g.I(0), scalar_like(g, 0.0, g.I(0))});
    g.set_GI(0, g.emit("where", {positive, g.GO(0), scalar_like(g, 0.0, g.GO(0))}));
    return Status::Ok();
  });
  // dx = x > 0 ? dy : alpha·dy (PyTorch's leaky_relu_backward: at exactly 0, the slope)
  set(r, "leaky_relu", [](GradBuilder& g) {
    ValueId positive = g.emit("greater", {g.I(0), scalar_like(g, 0.0, g.I(0))});
    ValueId scaled = mul(g, g.GO(0), scalar_like(g, g.attrs().get_float("alpha", 0.01), g.GO(0)));
    g.set_GI(0, g.emit("where", {positive, g.GO(0), scaled}));
    return Status::Ok();
  });
  // dx = dy·(2/√π)·e^(−x²)
  set(r, "erf", [](GradBuilder& g) {
    return unary(g, [&] {
      ValueId e = g.emit("exp", {g.emit("neg", {mul(g, g.I(0), g.I(0))})});
      return mul(g, e, scalar_like(g, 1.1283791670955126, e));
    });
  });
  set(r, "gelu", [](GradBuilder& g) {
    g.set_GI(0, g.emit("gelu_grad", {g.GO(0), g.I(0)}, g.attrs()));
    return Status::Ok();
  });
  set(r, "sin", [](GradBuilder& g) { return unary(g, [&] { return g.emit("cos", {g.I(0)}); }); });
  set(r, "cos", [](GradBuilder& g) { return unary(g, [&] { return g.emit("neg", {g.emit("sin", {g.I(0)})}); }); });
  set(r, "softplus", [](GradBuilder& g) { return unary(g, [&] { return g.emit("sigmoid", {g.I(0)}); }); });
  // d arcsin = 1/√(1 − x²), d arccos = −1/√(1 − x²), d arctan = 1/(1 + x²)
  set(r, "asin", [](GradBuilder& g) { return unary(g, [&] { return g.emit("rsqrt", {one_minus_square(g, g.I(0))}); }); });
  set(r, "acos", [](GradBuilder& g) {
    return unary(g, [&] { return g.emit("neg", {g.emit("rsqrt", {one_minus_square(g, g.I(0))})}); });
  });
  set(r, "atan", [](GradBuilder& g) {
    return unary(g, [&] { return g.emit("reciprocal", {g.emit("add", {scalar_like(g, 1.0, g.I(0)), mul(g, g.I(0), g.I(0))})}); });
  });

  set(r, "add", [](GradBuilder& g) { return binary_broadcast(g, g.GO(0), g.GO(0)); });
  set(r, "sub", [](GradBuilder& g) {
    return binary_broadcast(g, g.GO(0), g.needs_GI(1) ? g.emit("neg", {g.GO(0)}) : kNoValue);
  });
  // da = dy·b, db = dy·a
  set(r, "mul", [](GradBuilder& g) {
    return binary_broadcast(g, g.needs_GI(0) ? mul(g, g.GO(0), g.I(1)) : kNoValue,
                            g.needs_GI(1) ? mul(g, g.GO(0), g.I(0)) : kNoValue);
  });
  // da = dy/b, db = -dy·y/b
  set(r, "div", [](GradBuilder& g) {
    ValueId da = g.needs_GI(0) ? g.emit("div", {g.GO(0), g.I(1)}) : kNoValue;
    ValueId db = g.needs_GI(1) ? g.emit("neg", {g.emit("div", {mul(g, g.GO(0), g.O(0)), g.I(1)})}) : kNoValue;
    return binary_broadcast(g, da, db);
  });
  // da = dy·b·a^(b−1), db = dy·y·ln a
  set(r, "pow", [](GradBuilder& g) {
    ValueId da = kNoValue, db = kNoValue;
    if (g.needs_GI(0)) {
      ValueId bm1 = g.emit("sub", {g.I(1), scalar_like(g, 1.0, g.I(1))});
      da = mul(g, g.GO(0), mul(g, g.I(1), g.emit("pow", {g.I(0), bm1})));
    }
    if (g.needs_GI(1)) db = mul(g, g.GO(0), mul(g, g.O(0), g.emit("log", {g.I(0)})));
    return binary_broadcast(g, da, db);
  });
  // The winner takes the gradient. Where the operands tie, attribute `ties` says who takes it:
  // "first" (the default: max pooling's first tap), "second" (a clip's bound, so the clipped
  // input gets none at its boundary, as PyTorch's clamp, hardtanh and relu6 give) or "split"
  // (half each, as PyTorch's maximum and minimum give).
  for (const char* op : {"max", "min"}) {
    set(r, op, [](GradBuilder& g) {
      const bool is_max = g.node().op == "max";
      const std::string ties = g.attrs().get_string("ties", "first");
      if (ties != "first" && ties != "second" && ties != "split") {
        return Status::BadInput(str_cat("attribute 'ties' is '", ties, "', not first, second or split"));
      }
      const char* cmp = ties == "first" ? (is_max ? "greater_equal" : "less_equal") : (is_max ? "greater" : "less");
      ValueId first = g.emit(cmp, {g.I(0), g.I(1)});
      ValueId zero = scalar_like(g, 0.0, g.GO(0));
      ValueId dy = g.GO(0);
      if (ties == "split") {
        ValueId tied = g.emit("equal", {g.I(0), g.I(1)});
        ValueId half = mul(g, dy, scalar_like(g, 0.5, dy));
        ValueId da = g.emit("where", {first, dy, g.emit("where", {tied, half, zero})});
        return binary_broadcast(g, g.needs_GI(0) ? da : kNoValue, g.needs_GI(1) ? g.emit("sub", {dy, da}) : kNoValue);
      }
      return binary_broadcast(g, g.needs_GI(0) ? g.emit("where", {first, dy, zero}) : kNoValue,
                              g.needs_GI(1) ? g.emit("where", {first, zero, dy}) : kNoValue);
    });
  }
  set(r, "mod", [](GradBuilder& g) {
    if (g.needs_GI(1)) return Status::BadInput("no gradient with respect to the divisor of mod");
    return binary_broadcast(g, g.GO(0), kNoValue);
  });
  set(r, "where", [](GradBuilder& g) {
    ValueId zero = scalar_like(g, 0.0, g.GO(0));
    ValueId da = g.needs_GI(1) ? g.emit("where", {g.I(0), g.GO(0), zero}) : kNoValue;
    ValueId db = g.needs_GI(2) ? g.emit("where", {g.I(0), zero, g.GO(0)}) : kNoValue;
    if (da != kNoValue) g.set_GI(1, g.sum_to(da, g.shape(g.I(1))));
    if (db != kNoValue) g.set_GI(2, g.sum_to(db, g.shape(g.I(2))));
    return Status::Ok();
  });
  set(r, "cast", [](GradBuilder& g) {
    if (is_float(g.dtype(g.I(0)))) g.set_GI(0, g.cast(g.GO(0), g.dtype(g.I(0))));
    return Status::Ok();
  });
  set(r, "copy", [](GradBuilder& g) { g.set_GI(0, g.GO(0)); return Status::Ok(); });
  // The mask is replayed from the counter RNG: same seed attribute, same step, same mask.
  set(r, "dropout", [](GradBuilder& g) {
    g.set_GI(0, g.emit("dropout", {g.GO(0)}, g.attrs()));
    return Status::Ok();
  });
}

}  // namespace memc
