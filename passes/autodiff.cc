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

// Values the loss depends on.
std::vector<bool> backward_reach(const Module& m, const std::vector<NodeId>& order, ValueId loss) {
  std::vector<bool> reach(m.values().size(), false);
  reach[loss] = true;
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

}  // namespace

Expected<std::vector<ValueId>> Autodiff::run(Module& module, ValueId loss, const std::vector<ValueId>& wrt) {
  const std::vector<NodeId> order = module.schedule();
  const std::vector<bool> from_wrt = forward_reach(module, order, wrt);
  const std::vector<bool> to_loss = backward_reach(module, order, loss);
  auto active = [&](ValueId v) { return v != kNoValue && from_wrt[v] && to_loss[v]; };

  std::vector<ValueId> grad(module.values().size(), kNoValue);
  auto accumulate = [&](ValueId v, ValueId g) {
    if (grad[v] == kNoValue) {
      grad[v] = g;
      return;
    }
    Expected<std::vector<ValueId>> sum = module.add_node("add", {grad[v], g}, {}, "grad accumulation of " + module.value(v).name);
    MEMC_CHECK(sum.ok(), sum.status().message());
    grad[v] = (*sum)[0];
  };

  {
    const TensorType& t = module.value(loss).type;
    Tensor one = Tensor::zeros(t.dtype, t.shape);
    for (int64_t i = 0; i < one.numel(); ++i) one.set_from_double(i, 1.0);
    grad[loss] = module.add_constant(std::move(one), "dloss");
  }

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node node = module.node(*it);  // copy: emitting nodes may reallocate
    std::vector<ValueId> output_grads;
    bool any_output = false;
    for (ValueId v : node.outputs) {
      output_grads.push_back(active(v) ? grad[v] : kNoValue);
      any_output |= output_grads.back() != kNoValue;
    }
    if (!any_output) continue;
    std::vector<bool> needs;
    bool any_input = false;
    for (ValueId v : node.inputs) {
      needs.push_back(active(v) && is_float(module.value(v).type.dtype));
      any_input |= needs.back();
    }
    if (!any_input) continue;
    const OpDef* def = node.def;
    if (def->flags & kOpNoGradient) continue;
    if (!def->grad) {
      return Status::BadInput(str_cat("autodiff: memc.", node.op, node.source.empty() ? "" : " (" + node.source + ")",
                                      " has no gradient rule"));
    }
    GradBuilder builder(module, node, output_grads, needs);
    MEMC_RETURN_IF_ERROR(def->grad(builder).with_context(str_cat("autodiff of memc.", node.op, ": ")));
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId g = builder.input_grads()[i];
      if (g != kNoValue) accumulate(node.inputs[i], g);
    }
  }

  std::vector<ValueId> result;
  std::vector<bool> taken(module.values().size(), false);
  for (ValueId v : wrt) {
    ValueId g = grad[v];
    // A gradient that is shared (d(a+b)/da = d(a+b)/db) or not an activation gets its own copy,
    // so each parameter's gradient is a distinct value with its own role.
    if (g != kNoValue && (taken[g] || module.value(g).role != Role::kActivation)) {
      Expected<std::vector<ValueId>> c = module.add_node("copy", {g}, {}, "gradient copy");
      MEMC_CHECK(c.ok(), c.status().message());
      g = (*c)[0];
    }
    if (g == kNoValue) {  // does not reach the loss: an explicit zero gradient
      const TensorType& t = module.value(v).type;
      Attrs a;
      a.set("shape", t.shape);
      a.set("dtype", std::string(dtype_name(t.dtype)));
      a.set("value", 0.0);
      Expected<std::vector<ValueId>> z = module.add_node("full", {}, a, "zero gradient");
      MEMC_CHECK(z.ok(), z.status().message());
      g = (*z)[0];
    }
    if (options_.mark_roles && module.value(v).role == Role::kParam) {
      module.value(g).role = Role::kGrad;
      module.rename(g, "grad." + module.value(v).name);
    }
    taken.resize(module.values().size(), false);
    taken[g] = true;
    result.push_back(g);
  }
  return result;
}

}  // namespace memc
