// Ops that training graphs add: the loss, fills, and the fused backward ops that gradient
// rules emit where composing core ops would store more or cost more. Backward ops are marked
// kOpNoGradient: memc trains with first-order gradients and never differentiates them again.
#include "ir/attention_layout.h"
#include "ir/ops/ops.h"

namespace memc {
namespace {

Status same_as_input(const ShapeContext& c, int index, std::vector<TensorType>& out) {
  out.push_back(c.inputs[index]);
  return Status::Ok();
}

Shape shape_attr(const ShapeContext& c, const char* key) { return c.node.attrs.get_ints(key); }

}  // namespace

void register_training_ops(OpRegistry& r) {
  r.add({.name = "full", .min_inputs = 0, .max_inputs = 0,
         .flags = kOpNoGradient, .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           auto dtype = parse_dtype(c.node.attrs.get_string("dtype", "f32"));
           if (!dtype) return Status::BadInput("attribute 'dtype' names no dtype");
           MEMC_RETURN_IF_ERROR(check_shape(shape_attr(c, "shape"), "full"));
           out = {TensorType{*dtype, shape_attr(c, "shape")}};
           return Status::Ok();
         },
         .doc = "a tensor of {shape, dtype} filled with {value}"});

  // softmax_cross_entropy(logits [N, C], labels i64 [N]) → mean over N of -log softmax(logits)[label].
  // {ignore_index}: rows with that label add nothing (a sharded step's padding row); {divisor}:
  // the sum is divided by it instead of N (a rank's share of the global batch, B/devices).
  r.add({.name = "softmax_cross_entropy", .min_inputs = 2, .max_inputs = 2,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           const TensorType &logits = c.inputs[0], &labels = c.inputs[1];
           if (logits.shape.size() != 2 || !is_float(logits.dtype)) return Status::BadInput("logits must be float [N, C]");
           if (labels.dtype != DType::kI64 || labels.shape != Shape{logits.shape[0]}) {
             return Status::BadInput(str_cat("labels must be i64 [", logits.shape[0], "]"));
           }
           // f16/bf16 logits still give an f32 loss; f64 keeps f64 so gradients check in f64.
           out = {TensorType{logits.dtype == DType::kF64 ? DType::kF64 : DType::kF32, {}}};
           return Status::Ok();
         },
         .flops = [](const Node&, std::span<const TensorType> in, std::span<const TensorType>) { return 5 * in[0].numel(); },
         .doc = "mean cross-entropy of softmax(logits) against integer labels (loss in f32, f64 for f64 logits); {ignore_index} rows add "
                "nothing, and {divisor} replaces N"});
  // dlogits = dloss · (softmax(logits) - onehot(labels)) / N, zero on {ignore_index} rows ({divisor} replaces N)
  r.add({.name = "softmax_cross_entropy_grad", .min_inputs = 3, .max_inputs = 3,
         .flags = kOpNoGradient, .shape = [](const ShapeContext& c, std::vector<TensorType>& out) { return same_as_input(c, 1, out); },
         .doc = "(dloss, logits, labels) → dlogits"});

  r.add({.name = "gelu_grad", .min_inputs = 2, .max_inputs = 2, .flags = kOpElementwise | kOpNoGradient,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) { return same_as_input(c, 1, out); },
         .doc = "(dy, x) → dy·gelu'(x) {approximate}"});
  r.add({.name = "softmax_grad", .min_inputs = 2, .max_inputs = 2,
         .flags = kOpNoGradient, .shape = [](const ShapeContext& c, std::vector<TensorType>& out) { return same_as_input(c, 1, out); },
         .doc = "(dy, y) → y·(dy - Σ dy·y) along {axis}"});
  r.add({.name = "log_softmax_grad", .min_inputs = 2, .max_inputs = 2,
         .flags = kOpNoGradient, .shape = [](const ShapeContext& c, std::vector<TensorType>& out) { return same_as_input(c, 1, out); },
         .doc = "(dy, y) → dy - exp(y)·Σ dy along {axis}"});
  // Recomputes mean and inverse std from x (one pass) instead of storing them in forward. The
  // optional addend (dx's type) is added to dx as it is stored: a residual's gradient sum
  // (passes/add_layernorm.h). With {bias_grad} a third output: dbias = Σ dy over the rows, summed
  // with dscale's partials (passes/layernorm_bias_grad.h); scale then spans the normalized dims.
  r.add({.name = "layernorm_grad", .min_inputs = 3, .max_inputs = 4, .num_outputs = -1,
         .flags = kOpNoGradient, .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           const TensorType &dy = c.inputs[0], &x = c.inputs[1];
           const bool narrow_dy = x.dtype == DType::kF32 && is_16bit_float(dy.dtype);  // passes/layernorm_grad_casts.h
           if (dy.shape != x.shape || (dy.dtype != x.dtype && !narrow_dy)) {
             return Status::BadInput(str_cat("dy ", type_str(dy), " is not x's type ", type_str(x), " (nor its 16-bit form, for f32 x)"));
           }
           if (c.inputs.size() == 4 && c.inputs[3] != c.inputs[1]) {
             return Status::BadInput(str_cat("the addend ", type_str(c.inputs[3]), " is not x's type ", type_str(c.inputs[1])));
           }
           out = {c.inputs[1], c.inputs[2]};
           if (c.node.attrs.get_int("bias_grad", 0)) {
             const Shape& x = c.inputs[1].shape;
             const int64_t axis = c.node.attrs.get_int("axis", static_cast<int64_t>(x.size()) - 1);
             MEMC_RETURN_IF_ERROR(check_axes({axis}, static_cast<int64_t>(x.size()), "layernorm_grad"));
             if (c.inputs[2].shape != Shape(x.begin() + axis, x.end())) {
               return Status::BadInput(str_cat("bias_grad needs scale ", shape_str(c.inputs[2].shape), " to span the normalized dims"));
             }
             out.push_back(c.inputs[2]);
           }
           if (c.node.attrs.has("dx_copy")) {
             const std::string name = c.node.attrs.get_string("dx_copy", "");
             const std::optional<DType> copy = parse_dtype(name);
             if (x.dtype != DType::kF32 || !copy || !is_16bit_float(*copy)) {
               return Status::BadInput(str_cat("dx_copy \"", name, "\" needs f32 x ", type_str(x), " and bf16 or f16"));
             }
             out.push_back(TensorType{*copy, x.shape});
           }
           return Status::Ok();
         },
         .flops = [](const Node&, std::span<const TensorType> in, std::span<const TensorType>) { return 12 * in[1].numel(); },
         .doc = "(dy, x, scale, [addend]) → (dx [+ addend], dscale[, dbias][, dx as dx_copy]) {axis, eps, bias_grad, dx_copy}"});
  r.add({.name = "gather_grad", .min_inputs = 2, .max_inputs = 2,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           MEMC_RETURN_IF_ERROR(check_shape(shape_attr(c, "input_shape"), "input_shape"));
           out = {TensorType{c.inputs[0].dtype, shape_attr(c, "input_shape")}};
           return Status::Ok();
         },
         .doc = "(dy, indices) → scatter-add of dy into zeros of {input_shape} along {axis}"});
  r.add({.name = "gather_elements_grad", .min_inputs = 2, .max_inputs = 2,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           MEMC_RETURN_IF_ERROR(check_shape(shape_attr(c, "input_shape"), "input_shape"));
           out = {TensorType{c.inputs[0].dtype, shape_attr(c, "input_shape")}};
           return Status::Ok();
         },
         .doc = "(dy, indices) → dx = zeros({input_shape}); dx[i, axis ← indices[i]] += dy[i] {axis}"});
  r.add({.name = "slice_grad", .min_inputs = 1, .max_inputs = 1,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           MEMC_RETURN_IF_ERROR(check_shape(shape_attr(c, "input_shape"), "input_shape"));
           out = {TensorType{c.inputs[0].dtype, shape_attr(c, "input_shape")}};
           return Status::Ok();
         },
         .doc = "dy written into zeros of {input_shape} at the slice {axes, starts, ends, steps}"});
  r.add({.name = "conv_grad_input", .min_inputs = 2, .max_inputs = 2, .flags = kOpComputeHeavy | kOpNoGradient,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           MEMC_RETURN_IF_ERROR(check_shape(shape_attr(c, "input_shape"), "input_shape"));
           out = {TensorType{c.inputs[0].dtype, shape_attr(c, "input_shape")}};
           return Status::Ok();
         },
         .flops = [](const Node&, std::span<const TensorType> in, std::span<const TensorType>) {
           int64_t k = 2;
           for (size_t i = 1; i < in[1].shape.size(); ++i) k *= in[1].shape[i];
           return in[0].numel() * k;
         },
         .doc = "(dy, w) → dx of conv {input_shape, strides, pads, dilations, group}"});
  r.add({.name = "conv_grad_weight", .min_inputs = 2, .max_inputs = 2, .flags = kOpComputeHeavy | kOpNoGradient,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           MEMC_RETURN_IF_ERROR(check_shape(shape_attr(c, "weight_shape"), "weight_shape"));
           out = {TensorType{c.inputs[0].dtype, shape_attr(c, "weight_shape")}};
           return Status::Ok();
         },
         .flops = [](const Node&, std::span<const TensorType> in, std::span<const TensorType> out) {
           int64_t k = 2;
           for (size_t i = 1; i < out[0].shape.size(); ++i) k *= out[0].shape[i];
           return in[0].numel() * k;
         },
         .doc = "(dy, x) → dw of conv {weight_shape, strides, pads, dilations, group}"});
  // Recomputes the attention probabilities row by row (never the whole matrix); dropout masks
  // replay from the counter RNG. Outputs dq, dk, dv, and dbias when the node has 4 outputs.
  r.add({.name = "attention_grad", .min_inputs = 4, .max_inputs = 5, .num_outputs = -1, .flags = kOpComputeHeavy | kOpNoGradient,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           out = {c.inputs[1], c.inputs[2], c.inputs[3]};
           if (c.node.outputs.size() >= 4) {
             if (c.inputs.size() < 5) return Status::BadInput("dbias requested without a bias input");
             out.push_back(c.inputs[4]);
           }
           return Status::Ok();
         },
         .flops = [](const Node& node, std::span<const TensorType> in, std::span<const TensorType>) {
           const AttentionLayout layout = attention_layout_of(node.attrs);
           const Shape& q = in[1].shape;
           const int64_t tk = attention_operand_of(layout, in[2].shape).t;
           return 2 * (numel(q) / q.back()) * tk * (4 * q.back() + 8);
         },
         .doc = "(dy, q, k, v, [bias]) → (dq, dk, dv, [dbias]) {scale, dropout_ratio, seed}"});
}

}  // namespace memc
