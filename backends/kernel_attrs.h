// What the kernels of every backend read from a node and its context the same way (host side):
// a random op's first draw, the loss's rows, Adam's settings, and a node's operand types for the
// workspace models.
#pragma once
#include <algorithm>
#include <optional>
#include <vector>

#include "backends/backend.h"
#include "backends/kernel_math.h"
#include "ir/fused_program.h"

namespace memc {

// fused_elementwise's program, typed by the node's inputs (ir/fused_program.h).
inline Expected<FusedProgram> fused_program(const KernelContext& ctx) {
  std::vector<TensorType> inputs;
  for (const Tensor* t : ctx.inputs) inputs.push_back(TensorType{t->dtype(), t->shape()});
  return read_typed_fused_program(ctx.node.attrs, inputs);
}

// The counter of a random op's first draw: a micro-batch's copy starts at its rows in the full
// batch (attribute rng_offset, passes/microbatch.h), and a data-parallel rank at its rows in the
// global batch (batch_row_offset times the op's draws per sample, attribute rng_row_stride,
// passes/shard.h), so any split of a batch replays one device's masks.
inline uint64_t random_draw_offset(const Attrs& attrs, int64_t batch_row_offset) {
  const int64_t own = attrs.get_int("rng_offset", 0);
  const int64_t stride = attrs.get_int("rng_row_stride", 0);
  return static_cast<uint64_t>(own + batch_row_offset * stride);
}
inline uint64_t random_draw_offset(const KernelContext& ctx) { return random_draw_offset(ctx.node.attrs, ctx.batch_row_offset); }

// matmul_bgrad's sums (ir/ops/linalg.cc) as a reduce_sum: the summed operand (0: a, 1: b) and the
// axis of its stored 2-D matrix that runs along the contraction. op(a)'s rows run over k along
// a's stored rows (axis 1) unless a is transposed; op(b)'s columns along b's stored columns
// (axis 0) unless b is. Backends run their reduce_sum kernel on `reduce`.
struct BiasGradSums {
  size_t operand = 0;
  Node reduce;
  explicit BiasGradSums(const Node& node) {
    operand = node.attrs.get_int("summed", 0) ? 1 : 0;
    const bool transposed = node.attrs.get_int(operand ? "transpose_b" : "transpose_a", 0);
    reduce.op = "reduce_sum";
    reduce.attrs.set("axes", std::vector<int64_t>{(operand == 1) == transposed ? 1 : 0});
    reduce.attrs.set("keepdims", int64_t{0});
  }
};

// matmul_acc's one GEMM (ir/ops/linalg.cc): y [m, n] (+)= op(a)·op(b), b 2-D, and an a of rank
// > 2 (transpose_a 0) folded into its rows.
struct MatmulAccDims {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  MatmulAccDims(const Node& node, const Shape& a, const Shape& b)
      : ta(node.attrs.get_int("transpose_a", 0)), tb(node.attrs.get_int("transpose_b", 0)) {
    k = ta ? a[0] : a.back();
    m = ta ? a[1] : (k ? numel(a) / k : 0);
    n = tb ? b[0] : b[1];
  }
};

// The loss's rows as the kernels read them (passes/microbatch.h's LossRows writes them): which
// label marks a row that adds nothing, and what the sum is divided by
// (ir/ops/training.cc: {ignore_index}, {divisor}; by default no row is ignored and N divides).
struct CrossEntropyRows {
  std::optional<int64_t> ignore;
  double divisor;
  explicit CrossEntropyRows(const Node& node, int64_t rows)
      : divisor(node.attrs.get_float("divisor", static_cast<double>(std::max<int64_t>(rows, 1)))) {
    if (node.attrs.has("ignore_index")) ignore = node.attrs.get_int("ignore_index", -1);
  }
  bool ignored(int64_t label) const { return ignore && label == *ignore; }
};

// Adam(W)'s settings from an update node's attributes (lr and the step come per step).
inline AdamStep adam_settings(const Attrs& attrs, bool decoupled_default) {
  AdamStep a;
  a.beta1 = attrs.get_float("beta1", 0.9), a.beta2 = attrs.get_float("beta2", 0.999);
  a.eps = attrs.get_float("eps", 1e-8), a.weight_decay = attrs.get_float("weight_decay", 0.0);
  a.decoupled = attrs.get_int("decoupled", decoupled_default);
  return a;
}

// A node's input types (an absent optional input: a default TensorType) and output types.
struct NodeTypes {
  std::vector<TensorType> in, out;  // O(arity)
  NodeTypes(const Module& module, const Node& node) {
    for (ValueId v : node.inputs) in.push_back(v == kNoValue ? TensorType{} : module.value(v).type);
    for (ValueId v : node.outputs) out.push_back(module.value(v).type);
  }
};

}  // namespace memc
