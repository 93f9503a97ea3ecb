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

// Inputs: tensors [0, n_tensors) share the parameter's shape; then the scalars. The gradient
// (input 1) has the parameter's dtype, or is bf16 or f16 for an f32 parameter (read as a cast
// widens it: passes/update_grad_casts.h).
ShapeFn update_shape(size_t n_tensors, size_t n_outputs) {
  return [=](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
    const DType w = c.inputs[0].dtype, g = c.inputs[1].dtype;
    if (g != w && !(w == DType::kF32 && (g == DType::kBF16 || g == DType::kF16))) {
      return Status::BadInput(str_cat("gradient dtype ", dtype_name(g), " for a ", dtype_name(w), " parameter (", dtype_name(w),
                                      ", or bf16/f16 for f32)"));
    }
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

// adam8bit_update(w, g, m_codes u8, m_absmax f32 [blocks], v_codes u8, v_absmax f32 [blocks], lr, step[, skip])
Status adam8bit_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const int64_t block = c.node.attrs.get_int("block", 2048);
  if (block <= 0) return Status::BadInput("block must be positive");
  const int64_t n = c.inputs[0].numel(), blocks = (n + block - 1) / block;
  if (c.inputs[1].shape != c.inputs[0].shape) return Status::BadInput("gradient shape differs from the parameter's");
  for (int i : {2, 4}) {
    if (c.inputs[i].dtype != DType::kU8 || c.inputs[i].numel() != n) return Status::BadInput("moment codes must be u8 with the parameter's size");
  }
  for (int i : {3, 5}) {
    if (c.inputs[i].dtype != DType::kF32 || c.inputs[i].shape != Shape{blocks}) {
      return Status::BadInput(str_cat("block maxima must be f32 [", blocks, "]"));
    }
  }
  MEMC_RETURN_IF_ERROR(check_scalars(c, 6));
  out = {c.inputs[0], c.inputs[2], c.inputs[3], c.inputs[4], c.inputs[5]};
  return Status::Ok();
}

// adafactor_update(w, g, r, c, lr, step[, skip]) {factored = 1}: r [..., rows], c [..., cols];
// adafactor_update(w, g, v, lr, step[, skip]) {factored = 0}: v like w.
Status adafactor_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const bool factored = c.node.attrs.get_int("factored", 0);
  const Shape& w = c.inputs[0].shape;
  if (c.inputs[1].shape != w) return Status::BadInput("gradient shape differs from the parameter's");
  if (factored) {
    if (w.size() < 2) return Status::BadInput("a factored second moment needs a parameter of rank ≥ 2");
    Shape rows(w.begin(), w.end() - 1), cols(w.begin(), w.end() - 2);
    cols.push_back(w.back());
    if (c.inputs[2].shape != rows || c.inputs[3].shape != cols) return Status::BadInput("row/column factors do not match the parameter");
    MEMC_RETURN_IF_ERROR(check_scalars(c, 4));
    out = {c.inputs[0], c.inputs[2], c.inputs[3]};
  } else {
    if (c.inputs[2].shape != w) return Status::BadInput("second moment shape differs from the parameter's");
    MEMC_RETURN_IF_ERROR(check_scalars(c, 3));
    out = {c.inputs[0], c.inputs[2]};
  }
  return Status::Ok();
}

}  // namespace

void register_optimizer_ops(OpRegistry& r) {
  const uint32_t flags = kOpInplaceOk | kOpNoGradient | kOpOptimizerUpdate;
  r.add({.name = "sgd_update", .min_inputs = 3, .max_inputs = 4, .num_outputs = 1, .flags = flags,
         .shape = update_shape(2, 1), .flops = per_element(3),
         .doc = "(w, g, lr[, skip]) → w - lr·(g + weight_decay·w) {weight_decay}"});
  r.add({.name = "momentum_update", .min_inputs = 5, .max_inputs = 6, .num_outputs = 2, .flags = flags,
         .shape = update_shape(3, 2), .flops = per_element(6),
         .doc = "(w, g, buf, lr, step[, skip]) → (w', buf') as torch.optim.SGD {momentum, dampening, nesterov, weight_decay}"});
  r.add({.name = "adam_update", .min_inputs = 6, .max_inputs = 7, .num_outputs = 3, .flags = flags,
         .shape = update_shape(4, 3), .flops = per_element(14),
         .doc = "(w, g, m, v, lr, step[, skip]) → (w', m', v') as torch.optim.Adam/AdamW {beta1, beta2, eps, weight_decay, decoupled}"});
  // adam8bit's FLOPs count the work its time is worth: decoding, updating and encoding two
  // moments per element (encoding: a table lookup and a step or two among the 256 codes,
  // backends/kernel_math.h QuantIndex), 360 FLOPs at the CPU profile's rate for such ops
  // (bench/journal/2026.md §34, §57: the search it replaced took 560; 30 arithmetic ones had it
  // at a twentieth of its measured time).
  r.add({.name = "adam8bit_update", .min_inputs = 8, .max_inputs = 9, .num_outputs = 5, .flags = flags, .shape = adam8bit_shape,
         .flops = per_element(360),
         .doc = "(w, g, m codes u8, m block absmax, v codes u8, v block absmax, lr, step[, skip]) → AdamW with block-wise "
                "dynamically quantized 8-bit moments {beta1, beta2, eps, weight_decay, decoupled, block}"});
  r.add({.name = "adafactor_update", .min_inputs = 5, .max_inputs = 7, .num_outputs = -1, .flags = flags, .shape = adafactor_shape,
         .flops = per_element(12),
         .doc = "(w, g, r, c | v, lr, step[, skip]) → Adafactor without first moment: factored second moment for rank ≥ 2 "
                "{factored, decay_rate, eps1, clip_threshold, weight_decay}"});
}

}  // namespace memc
