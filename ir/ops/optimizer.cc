// Optimizer updates as IR ops, so parameters, gradients and optimizer state are values the
// memory planner sees. Each update writes its outputs over its inputs (kOpInplaceOk): output i
// replaces the parameter or state it updates. lr and step are runtime scalars (f32 [ ]), never
// constants, so one plan serves every step of a schedule. An optional last scalar `skip`
// (loss scaling's found_inf): when it is 1 the outputs equal the inputs (a skipped step).
#include "ir/ops/ops.h"

namespace memc {
namespace {

Status check_scalars(const ShapeContext& c, size_t first) {
  for (size_t i = first; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].shape.empty() || c.inputs[i].dtype != DType::kF32) return Status::BadInput("lr, step and skip must be f32 scalars");
  }
  return Status::Ok();
}

// Inputs: tensors [0, n_tensors) share the parameter's shape; then the scalars.
ShapeFn update_shape(size_t n_tensors, size_t n_outputs) {
  return [=](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
    for (size_t i = 1; i < n_tensors; ++i) {
      if (c.inputs[i].shape != c.inputs[0].shape) {
        return Status::BadInput(str_cat("input ", i, " has shape ", shape_str(c.inputs[i].shape), ", parameter ", shape_str(c.inputs[0].shape)));
      }
    }
    MEMC_RETURN_IF_ERROR(check_scalars(c, n_tensors));
    out.clear();
    out.push_back(c.inputs[0]);                                      // new parameter
    for (size_t i = 1; i < n_outputs; ++i) out.push_back(c.inputs[1 + i]);  // new states (after the gradient)
    return Status::Ok();
  };
}

FlopsFn per_element(int flops) {
  return [flops](const Node&, std::span<const TensorType> in, std::span<const TensorType>) { return flops * in[0].numel(); };
}

}  // namespace

void register_optimizer_ops(OpRegistry& r) {
  const uint32_t flags = kOpInplaceOk | kOpNoGradient;
  r.add({.name = "sgd_update", .min_inputs = 3, .max_inputs = 4, .num_outputs = 1, .flags = flags,
         .shape = update_shape(2, 1), .flops = per_element(3),
         .doc = "(w, g, lr[, skip]) → w - lr·(g + weight_decay·w) {weight_decay}"});
  r.add({.name = "momentum_update", .min_inputs = 5, .max_inputs = 6, .num_outputs = 2, .flags = flags,
         .shape = update_shape(3, 2), .flops = per_element(6),
         .doc = "(w, g, buf, lr, step[, skip]) → (w', buf') as torch.optim.SGD {momentum, dampening, nesterov, weight_decay}"});
  r.add({.name = "adam_update", .min_inputs = 6, .max_inputs = 7, .num_outputs = 3, .flags = flags,
         .shape = update_shape(4, 3), .flops = per_element(14),
         .doc = "(w, g, m, v, lr, step[, skip]) → (w', m', v') as torch.optim.Adam/AdamW {beta1, beta2, eps, weight_decay, decoupled}"});
}

}  // namespace memc
