#include "passes/autodiff.h"

#include "ir/grad.h"
#include "ir/op_registry.h"

namespace memc {

namespace {

// Values that depend on some `wrt` value through differentiable ops.
std::vector<bool> forward_reach(const Module& m, const std::vector<NodeId>& order, const std::vector<ValueId>& wrt) {
  std::vector<bool> reach(m.values().size(), false);
  for (ValueId v : wrt) reach[v] = true;
  for (NodeId n : order) {
    const Node& node = m.node(n);
    const OpDef* def = node.def;
    if (def && (def->flags & kOpNoGradient)) continue;
    bool any = false;
    for (ValueId v : node.inputs) any |= v != kNoValue && reach[v];
    if (any) {
      for (ValueId v : node.outputs) reach[v] = true;
    }
  }
  return reach;
}

// Values some seed depends on.
std::vector<bool> backward_reach(const Module& m, const std::vector<NodeId>& order, const std::vector<Autodiff::Seed>& seeds) {
  std::vector<bool> reach(m.values().size(), false);
  for (const Autodiff::Seed& s : seeds) reach[s.value] = true;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node& node = m.node(*it);
    bool any = false;
    for (ValueId v : node.outputs) any |= reach[v];
    if (!any) continue;
    for (ValueId v : node.inputs) {
      if (v != kNoValue) reach[v] = true;
    }
  }
  return reach;
}

// The gradient of each value, by ValueId, as autodiff emits it (kNoValue: none yet). Gradients
// reaching a value from several uses are summed in the order they arrive.
class GradientTable {
 public:
  GradientTable(Module& module, const std::vector<Autodiff::Seed>& seeds) : m_(module), grad_(module.values().size(), kNoValue) {
    for (const Autodiff::Seed& s : seeds) accumulate(s.value, s.grad);
  }

  ValueId operator[](ValueId v) const { return grad_[v]; }

  void accumulate(ValueId v, ValueId g) {
    if (grad_[v] == kNoValue) {
      grad_[v] = g;
      return;
    }
    Expected<std::vector<ValueId>> sum = m_.add_node("add", {grad_[v], g}, {}, "grad accumulation of " + m_.value(v).name);
    MEMC_CHECK(sum.ok(), sum.status().message());
    grad_[v] = (*sum)[0];
  }

 private:
  Module& m_;
  std::vector<ValueId> grad_;
};

// Values on a path from `wrt` to a seed: the only ones whose gradients are emitted.
class ActiveValues {
 public:
  ActiveValues(const Module& m, const std::vector<NodeId>& order, const std::vector<Autodiff::Seed>& seeds, const std::vector<ValueId>& wrt)
      : from_wrt_(forward_reach(m, order, wrt)), to_seed_(backward_reach(m, order, seeds)) {}
  bool operator()(ValueId v) const { return v != kNoValue && from_wrt_[v] && to_seed_[v]; }

 private:
  std::vector<bool> from_wrt_, to_seed_;
};

// Emits the gradient rule of node `id` for the inputs that need one and adds what it returns into
// `grads`; a node with no active output or input emits nothing.
Status differentiate(Module& module, NodeId id, const ActiveValues& active, GradientTable& grads) {
  std::vector<ValueId> output_grads;
  bool any_output = false;
  for (ValueId v : module.node(id).outputs) {
    output_grads.push_back(active(v) ? grads[v] : kNoValue);
    any_output |= output_grads.back() != kNoValue;
  }
  // Most nodes of a micro-batched step have no gradient here (the micro-batches before this
  // one): they return before the copy.
  if (!any_output) return Status::Ok();
  const Node node = module.node(id);  // copy: emitting nodes may reallocate
  std::vector<bool> needs;
  bool any_input = false;
  for (ValueId v : node.inputs) {
    needs.push_back(active(v) && is_float(module.value(v).type.dtype));
    any_input |= needs.back();
  }
  if (!any_input) return Status::Ok();
  const OpDef* def = node.def;
  if (def->flags & kOpNoGradient) return Status::Ok();
  if (!def->grad) {
    return Status::BadInput(str_cat("autodiff: memc.", node.op, node.source.empty() ? "" : " (" + node.source + ")",
                                    " has no gradient rule"));
  }
  GradBuilder builder(module, node, output_grads, needs);
  MEMC_RETURN_IF_ERROR(def->grad(builder).with_context(str_cat("autodiff of memc.", node.op, ": ")));
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId g = builder.input_grads()[i];
    if (g != kNoValue) grads.accumulate(node.inputs[i], g);
  }
  return Status::Ok();
}

// A value of v's type filled with zeros: the gradient of a value that does not reach the loss.
ValueId zero_gradient(Module& module, ValueId v) {
  const TensorType& t = module.value(v).type;
  Attrs a;
  a.set("shape", t.shape);
  a.set("dtype", std::string(dtype_name(t.dtype)));
  a.set("value", 0.0);
  Expected<std::vector<ValueId>> z = module.add_node("full", {}, a, "zero gradient");
  MEMC_CHECK(z.ok(), z.status().message());
  return (*z)[0];
}

ValueId copy_of(Module& module, ValueId g) {
  Expected<std::vector<ValueId>> c = module.add_node("copy", {g}, {}, "gradient copy");
  MEMC_CHECK(c.ok(), c.status().message());
  return (*c)[0];
}

// The gradient of each `wrt` value: its own value (copied when shared or not an activation),
// an explicit zero when it does not reach the loss; named grad.<param> under mark_roles.
std::vector<ValueId> gradients_of(Module& module, const std::vector<ValueId>& wrt, const GradientTable& grads, bool mark_roles) {
  std::vector<ValueId> result;
  std::vector<bool> taken(module.values().size(), false);
  for (ValueId v : wrt) {
    ValueId g = grads[v];
    // A gradient that is shared (d(a+b)/da = d(a+b)/db) or not an activation gets its own copy,
    // so each parameter's gradient is a distinct value with its own role.
    if (g != kNoValue && (taken[g] || module.value(g).role != Role::kActivation)) g = copy_of(module, g);
    if (g == kNoValue) g = zero_gradient(module, v);  // does not reach the loss: an explicit zero
    if (mark_roles && module.value(v).role == Role::kParam) {
      module.value(g).role = Role::kGrad;
      module.rename(g, "grad." + module.value(v).name);
    }
    taken.resize(module.values().size(), false);
    taken[g] = true;
    result.push_back(g);
  }
  return result;
}

}  // namespace

Autodiff::Seed Autodiff::unit_seed(Module& module, ValueId loss) {
  // d loss / d loss = 1, of the loss's type.
  const TensorType& t = module.value(loss).type;
  Tensor one = Tensor::zeros(t.dtype, t.shape);
  for (int64_t i = 0; i < one.numel(); ++i) one.set_from_double(i, 1.0);
  return {loss, module.add_constant(std::move(one), "dloss")};
}

Expected<std::vector<ValueId>> Autodiff::run(Module& module, ValueId loss, const std::vector<ValueId>& wrt) {
  return run(module, {unit_seed(module, loss)}, wrt);
}

Expected<std::vector<ValueId>> Autodiff::run(Module& module, const std::vector<Seed>& seeds, const std::vector<ValueId>& wrt) {
  for (const Seed& s : seeds) {
    if (module.value(s.grad).type != module.value(s.value).type) {
      return Status::Internal(str_cat("autodiff: the seed of %", module.value(s.value).name, " is ", type_str(module.value(s.grad).type),
                                      ", not its type ", type_str(module.value(s.value).type)));
    }
  }
  const std::vector<NodeId> order = module.schedule();
  const ActiveValues active(module, order, seeds, wrt);
  GradientTable grads(module, seeds);
  for (auto it = order.rbegin(); it != order.rend(); ++it) MEMC_RETURN_IF_ERROR(differentiate(module, *it, active, grads));
  return gradients_of(module, wrt, grads, options_.mark_roles);
}

}  // namespace memc
