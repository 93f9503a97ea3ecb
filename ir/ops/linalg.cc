// Compute-heavy ops: batched matmul, linear, N-d convolution, fused attention.
#include "ir/attention_layout.h"
#include "ir/ops/ops.h"

namespace memc {
namespace {

// matmul(a, b) {transpose_a, transpose_b}: numpy matmul semantics (1-D operands are promoted
// and the promoted dim removed), batch dims broadcast. Transposes swap the last two dims.
Status matmul_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  Shape a = c.inputs[0].shape, b = c.inputs[1].shape;
  if (c.inputs[0].dtype != c.inputs[1].dtype) return Status::BadInput("operand dtypes differ");
  if (a.empty() || b.empty()) return Status::BadInput("operands must have rank ≥ 1");
  const bool ta = c.node.attrs.get_int("transpose_a", 0), tb = c.node.attrs.get_int("transpose_b", 0);
  const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec && ta) return Status::BadInput("transpose_a on a 1-D operand");
  if (b_vec && tb) return Status::BadInput("transpose_b on a 1-D operand");
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  if (ta) std::swap(a[a.size() - 1], a[a.size() - 2]);
  if (tb) std::swap(b[b.size() - 1], b[b.size() - 2]);
  const int64_t m = a[a.size() - 2], k = a.back(), k2 = b[b.size() - 2], n = b.back();
  if (k != k2) return Status::BadInput(str_cat("contraction dims differ: ", k, " vs ", k2));
  MEMC_ASSIGN_OR_RETURN(Shape batch, broadcast_shapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2)));
  Shape result = batch;
  if (!a_vec) result.push_back(m);
  if (!b_vec) result.push_back(n);
  out = {TensorType{c.inputs[0].dtype, result}};
  return Status::Ok();
}

int64_t matmul_flops(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  // 2·M·N·K per output matrix: out elements × 2K.
  const Shape& a = in[0].shape;
  const bool ta = node.attrs.get_int("transpose_a", 0);
  const int64_t k = a.size() == 1 ? a[0] : (ta ? a[a.size() - 2] : a.back());
  return 2 * out[0].numel() * k;
}

// matmul_bgrad(a, b) {transpose_a, transpose_b, summed}: y = op(a)·op(b) for 2-D operands, and
// s = the sum of one operand over the contraction dim k: op(a)'s rows ([M], summed = 0) or op(b)'s
// columns ([N], summed = 1). A linear layer's weight gradient and its bias gradient in one GEMM:
// dW = dyᵀ·x with db = Σ_rows dy (passes/bias_grad_gemm.h).
Status matmul_bgrad_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  if (c.inputs[0].shape.size() != 2 || c.inputs[1].shape.size() != 2) return Status::BadInput("needs 2-D operands");
  MEMC_RETURN_IF_ERROR(matmul_shape(c, out));
  const int64_t summed = c.node.attrs.get_int("summed", 0);
  if (summed != 0 && summed != 1) return Status::BadInput(str_cat("summed must be 0 or 1, got ", summed));
  const Shape& y = out[0].shape;
  out.push_back(TensorType{out[0].dtype, Shape{summed ? y[1] : y[0]}});
  return Status::Ok();
}

// matmul_acc([acc], a, b) {transpose_a, transpose_b, dtype}: y = acc + op(a)·op(b) for a 2-D b
// and a 2-D a, or an a of higher rank whose rows fold into one GEMM (transpose_a 0: a linear
// layer's input gradient, [..., K]·op(b) → [..., N]); y of acc's type: a's dtype, or f32 where a and b are 16-bit (the product is not
// rounded to 16 bits before the sum). Without acc, y = op(a)·op(b) of `dtype` (a's by default):
// a sum's first term. The GEMM adds into the accumulator (cuBLASLt's beta = 1, oneDNN's sum
// post-op), which the memory plan lets y take over where acc dies here (kOpInplaceOk): a sum of
// weight gradients over loss chunks or micro-batches without each term's own buffer
// (passes/accumulate_gemm.h).
Status matmul_acc_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  // Slot 0 may be absent (min_inputs 0 lets it), the operands' slots may not.
  if (c.present.size() != 3 || !c.present[1] || !c.present[2]) return Status::BadInput("needs three input slots: [acc], a, b");
  const bool has_acc = c.present[0];
  const std::span<const TensorType> operands = c.inputs.subspan(c.inputs.size() - 2);
  const bool ta = c.node.attrs.get_int("transpose_a", 0);
  if (operands[0].shape.size() < 2 || operands[1].shape.size() != 2 || (ta && operands[0].shape.size() != 2)) {
    return Status::BadInput("needs a 2-D b, and a 2-D a or one of higher rank without transpose_a");
  }
  const ShapeContext product{c.node, operands, c.present};
  MEMC_RETURN_IF_ERROR(matmul_shape(product, out));
  const DType low = operands[0].dtype;
  DType y = low;
  if (has_acc) {
    y = c.inputs[0].dtype;
    if (c.inputs[0].shape != out[0].shape) {
      return Status::BadInput(str_cat("the accumulator is [", shape_str(c.inputs[0].shape), "], the product [", shape_str(out[0].shape), "]"));
    }
  } else if (c.node.attrs.has("dtype")) {
    const auto parsed = parse_dtype(c.node.attrs.get_string("dtype", ""));
    if (!parsed) return Status::BadInput("attribute 'dtype' names no dtype");
    y = *parsed;
  }
  const bool widened = y == DType::kF32 && (low == DType::kBF16 || low == DType::kF16);
  if (y != low && !widened) return Status::BadInput(str_cat("the sum is ", dtype_name(y), ", not ", dtype_name(low), " or f32 over 16-bit operands"));
  out[0].dtype = y;
  return Status::Ok();
}

// linear(x, w, [b]) {transpose_w = 1}: y = x·wᵀ + b with w [N, K] (or x·w + b with w [K, N]).
Status linear_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const TensorType &x = c.inputs[0], &w = c.inputs[1];
  if (x.shape.empty() || w.shape.size() != 2) return Status::BadInput("needs x of rank ≥ 1 and a 2-D weight");
  if (x.dtype != w.dtype) return Status::BadInput("operand dtypes differ");
  const bool tw = c.node.attrs.get_int("transpose_w", 1);
  const int64_t k = tw ? w.shape[1] : w.shape[0], n = tw ? w.shape[0] : w.shape[1];
  if (x.shape.back() != k) return Status::BadInput(str_cat("input features ", x.shape.back(), " vs weight ", k));
  if (c.inputs.size() == 3) {
    const TensorType& b = c.inputs[2];
    if (b.dtype != x.dtype || !(b.shape == Shape{n} || (b.shape.size() == 2 && b.shape[1] == n && b.shape[0] == 1))) {
      return Status::BadInput(str_cat("bias must be [", n, "], got ", shape_str(b.shape)));
    }
  }
  Shape y = x.shape;
  y.back() = n;
  out = {TensorType{x.dtype, y}};
  return Status::Ok();
}

// conv(x, w, [b]) {strides, pads = [begin..., end...], dilations, group}: x [N, C, spatial...],
// w [M, C/group, kernel...].
Status conv_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const Shape &x = c.inputs[0].shape, &w = c.inputs[1].shape;
  if (x.size() < 3 || w.size() != x.size()) return Status::BadInput("needs x [N,C,...] and w of equal rank");
  const size_t sd = x.size() - 2;
  auto strides = c.node.attrs.get_ints("strides", std::vector<int64_t>(sd, 1));
  auto dilations = c.node.attrs.get_ints("dilations", std::vector<int64_t>(sd, 1));
  auto pads = c.node.attrs.get_ints("pads", std::vector<int64_t>(2 * sd, 0));
  const int64_t group = c.node.attrs.get_int("group", 1);
  if (strides.size() != sd || dilations.size() != sd || pads.size() != 2 * sd) return Status::BadInput("strides/dilations/pads rank mismatch");
  MEMC_RETURN_IF_ERROR(check_small(strides, "strides"));
  MEMC_RETURN_IF_ERROR(check_small(dilations, "dilations"));
  MEMC_RETURN_IF_ERROR(check_small(pads, "pads"));
  for (size_t i = 0; i < sd; ++i) {
    if (dilations[i] < 1) return Status::BadInput("dilations must be ≥ 1");
  }
  if (group < 1 || x[1] != w[1] * group || w[0] % group != 0) {
    return Status::BadInput(str_cat("channels ", x[1], " do not match weight ", shape_str(w), " with group ", group));
  }
  if (c.inputs.size() == 3 && c.inputs[2].shape != Shape{w[0]}) return Status::BadInput("bias must be [M]");
  Shape y = {x[0], w[0]};
  for (size_t i = 0; i < sd; ++i) {
    const int64_t extent = x[2 + i] + pads[i] + pads[sd + i] - dilations[i] * (w[2 + i] - 1) - 1;
    if (strides[i] < 1 || extent < 0) return Status::BadInput("kernel larger than padded input");
    y.push_back(extent / strides[i] + 1);
  }
  out = {TensorType{c.inputs[0].dtype, y}};
  return Status::Ok();
}

int64_t conv_flops(const Node&, std::span<const TensorType> in, std::span<const TensorType> out) {
  const Shape& w = in[1].shape;
  int64_t per_output = 2;
  for (size_t i = 1; i < w.size(); ++i) per_output *= w[i];
  return out[0].numel() * per_output;
}

// attention(q, k, v, [bias]) {scale, dropout_ratio, seed, layout}: softmax(scale·q·kᵀ + bias)·v
// per batch entry, with q [Tq, D], k [Tk, D], v [Tk, Dv] per entry, laid out as `layout` says
// (ir/attention_layout.h); bias broadcasts to [entries..., Tq, Tk]. The default layout's batch
// dims broadcast; the others' ([B, H]) must be equal.
Status attention_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  MEMC_ASSIGN_OR_RETURN(const AttentionLayout layout, attention_layout(c.node.attrs));
  MEMC_ASSIGN_OR_RETURN(const AttentionOperand q, attention_operand(layout, c.inputs[0].shape));
  MEMC_ASSIGN_OR_RETURN(const AttentionOperand k, attention_operand(layout, c.inputs[1].shape));
  MEMC_ASSIGN_OR_RETURN(const AttentionOperand v, attention_operand(layout, c.inputs[2].shape));
  if (c.inputs[1].shape.size() != c.inputs[0].shape.size() || c.inputs[2].shape.size() != c.inputs[0].shape.size()) {
    return Status::BadInput("q, k, v need equal rank ≥ 2");
  }
  if (q.e != k.e || k.t != v.t) return Status::BadInput("q/k head dims or k/v lengths differ");
  if (c.inputs[1].dtype != c.inputs[0].dtype || c.inputs[2].dtype != c.inputs[0].dtype) return Status::BadInput("q, k, v dtypes differ");
  Shape batch = q.batch;
  if (layout == AttentionLayout::kBHTD) {
    MEMC_ASSIGN_OR_RETURN(batch, broadcast_shapes(q.batch, k.batch));
    // v's batch dims broadcast too: the kernel indexes v by the output batch.
    MEMC_ASSIGN_OR_RETURN(batch, broadcast_shapes(batch, v.batch));
  } else if (k.batch != q.batch || v.batch != q.batch) {
    return Status::BadInput(str_cat("attention layout ", attention_layout_name(layout), ": q, k, v batch and head dims differ"));
  }
  if (c.inputs.size() == 4) {
    Shape scores = batch;
    scores.push_back(q.t);
    scores.push_back(k.t);
    MEMC_ASSIGN_OR_RETURN(Shape b, broadcast_shapes(scores, c.inputs[3].shape));
    if (b != scores) return Status::BadInput("bias does not broadcast to the scores");
  }
  out = {TensorType{c.inputs[0].dtype, attention_operand_shape(layout, batch, q.t, v.e)}};
  return Status::Ok();
}

int64_t attention_flops(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const AttentionLayout layout = attention_layout_of(node.attrs);
  const AttentionOperand q = attention_operand_of(layout, in[0].shape);
  const AttentionOperand k = attention_operand_of(layout, in[1].shape);
  const int64_t rows = numel(out[0].shape) / std::max<int64_t>(out[0].shape.back(), 1);  // entries × Tq
  return rows * k.t * (2 * q.e + 2 * out[0].shape.back() + 5);
}

}  // namespace

void register_linalg_ops(OpRegistry& r) {
  r.add({.name = "matmul", .min_inputs = 2, .max_inputs = 2, .flags = kOpComputeHeavy, .shape = matmul_shape,
         .flops = matmul_flops, .doc = "batched matmul {transpose_a, transpose_b}"});
  r.add({.name = "matmul_bgrad", .min_inputs = 2, .max_inputs = 2, .num_outputs = 2, .flags = kOpComputeHeavy | kOpNoGradient,
         .shape = matmul_bgrad_shape,
         .flops = [](const Node& n, std::span<const TensorType> in, std::span<const TensorType> out) {
           const int64_t k = n.attrs.get_int("transpose_a", 0) ? in[0].shape[0] : in[0].shape[1];
           return 2 * out[0].numel() * k + out[1].numel() * k;
         },
         .doc = "(a, b) → (op(a)·op(b), Σ_k of op(a) {summed = 0} or op(b) {summed = 1}) for 2-D operands {transpose_a, transpose_b}"});
  r.add({.name = "matmul_acc", .min_inputs = 0, .max_inputs = 3, .flags = kOpComputeHeavy | kOpNoGradient | kOpInplaceOk,
         .shape = matmul_acc_shape,
         .flops = [](const Node& n, std::span<const TensorType> in, std::span<const TensorType> out) {
           const TensorType& a = in[in.size() - 2];  // absent inputs are not passed
           const int64_t k = n.attrs.get_int("transpose_a", 0) ? a.shape[0] : a.shape.back();
           return 2 * out[0].numel() * k + (in.size() == 3 ? out[0].numel() : 0);
         },
         .doc = "y = [acc +] op(a)·op(b) for a 2-D b (a's rows folded) {transpose_a, transpose_b, dtype}; y f32 or a's dtype"});
  r.add({.name = "linear", .min_inputs = 2, .max_inputs = 3, .flags = kOpComputeHeavy, .shape = linear_shape,
         .flops = [](const Node& n, std::span<const TensorType> in, std::span<const TensorType> out) {
           const bool tw = n.attrs.get_int("transpose_w", 1);
           return 2 * out[0].numel() * (tw ? in[1].shape[1] : in[1].shape[0]);
         },
         .doc = "y = x·wᵀ + b {transpose_w = 1}"});
  r.add({.name = "conv", .min_inputs = 2, .max_inputs = 3, .flags = kOpComputeHeavy, .shape = conv_shape,
         .flops = conv_flops, .doc = "N-d convolution {strides, pads, dilations, group}"});
  r.add({.name = "attention", .min_inputs = 3, .max_inputs = 4, .flags = kOpComputeHeavy, .shape = attention_shape,
         .flops = attention_flops, .doc = "softmax(scale·q·kᵀ + bias)·v {scale, dropout_ratio, seed, rng_offset, layout}"});
}

}  // namespace memc
