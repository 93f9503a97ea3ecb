// Which op runs which CUDA kernel, and how much scratch each one plans: one table over a runner
// R (backends/cuda/ops.h), instantiated with the device runner by backends/cuda/kernels.cu and
// with a host runner by tests/cuda/ops_host_test.cc.
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/collective_kernels.h"
#include "backends/cuda/ops.h"
#include "backends/cuda/ops_conv_attention.h"

namespace memc::cuda::ops {

template <class R, Status (*F)(KernelContext&, R&)>
Status as_kernel(KernelContext& ctx) {
  R run(ctx);
  return F(ctx, run);
}
template <class R, UnaryOp op>
Status unary(KernelContext& ctx, R& run) { return unary_op(ctx, run, op); }
template <class R, BinaryOp op>
Status binary(KernelContext& ctx, R& run) { return binary_op(ctx, run, op); }
template <class R, CompareOp op>
Status compare(KernelContext& ctx, R& run) { return compare_op(ctx, run, op); }
template <class R, ReduceOp op>
Status reduce(KernelContext& ctx, R& run) { return reduce_op(ctx, run, op); }
template <class R, bool is_max>
Status arg_extreme(KernelContext& ctx, R& run) { return arg_extreme_op(ctx, run, is_max); }

// The collective ops' copies (a group of one, shard_block, a done not in place) on the runner.
template <class R>
struct RunnerCopy {
  R run;
  explicit RunnerCopy(const KernelContext& ctx) : run(ctx) {}
  Status operator()(void* dst, const void* src, int64_t bytes) { return run.copy(dst, src, bytes); }
};

template <class R>
const std::vector<std::pair<std::string, Kernel>>& kernel_table() {
  static const std::vector<std::pair<std::string, Kernel>> table = [] {
    std::vector<std::pair<std::string, Kernel>> t = {
        {"reshape", as_kernel<R, copy_op<R>>}, {"copy", as_kernel<R, copy_op<R>>},
        {"copy_to_host", as_kernel<R, copy_op<R>>}, {"copy_to_device", as_kernel<R, copy_op<R>>},
        {"copy_to_host_start", as_kernel<R, copy_start_op<R>>}, {"copy_to_device_start", as_kernel<R, copy_start_op<R>>},
        {"copy_to_host_done", as_kernel<R, copy_done_op<R>>}, {"copy_to_device_done", as_kernel<R, copy_done_op<R>>},
        {"constant", as_kernel<R, constant_op<R>>}, {"full", as_kernel<R, full_op<R>>},
        {"transpose", as_kernel<R, transpose_op<R>>}, {"slice", as_kernel<R, slice_op<R>>},
        {"expand", as_kernel<R, expand_op<R>>}, {"concat", as_kernel<R, concat_op<R>>},
        {"gather", as_kernel<R, gather_op<R>>}, {"gather_grad", as_kernel<R, gather_grad_op<R>>},
        {"gather_elements", as_kernel<R, gather_elements_op<R>>}, {"gather_elements_grad", as_kernel<R, gather_elements_grad_op<R>>},
        {"slice_grad", as_kernel<R, slice_grad_op<R>>}, {"cumsum", as_kernel<R, cumsum_op<R>>},
        {"softmax", as_kernel<R, line_op<SoftmaxLine, R>>}, {"softmax_grad", as_kernel<R, line_grad_op<SoftmaxGradLine, R>>},
        {"log_softmax", as_kernel<R, line_op<LogSoftmaxLine, R>>},
        {"log_softmax_grad", as_kernel<R, line_grad_op<LogSoftmaxGradLine, R>>},
        {"argmax", as_kernel<R, arg_extreme<R, true>>}, {"argmin", as_kernel<R, arg_extreme<R, false>>},
        {"topk", as_kernel<R, topk_op<R>>},
        {"cast", as_kernel<R, cast_op<R>>}, {"dropout", as_kernel<R, dropout_op<R>>},
        {"neg", as_kernel<R, unary<R, UnaryOp::kNeg>>}, {"abs", as_kernel<R, unary<R, UnaryOp::kAbs>>},
        {"exp", as_kernel<R, unary<R, UnaryOp::kExp>>}, {"log", as_kernel<R, unary<R, UnaryOp::kLog>>},
        {"sqrt", as_kernel<R, unary<R, UnaryOp::kSqrt>>}, {"rsqrt", as_kernel<R, unary<R, UnaryOp::kRsqrt>>},
        {"reciprocal", as_kernel<R, unary<R, UnaryOp::kReciprocal>>}, {"tanh", as_kernel<R, unary<R, UnaryOp::kTanh>>},
        {"sigmoid", as_kernel<R, unary<R, UnaryOp::kSigmoid>>}, {"relu", as_kernel<R, unary<R, UnaryOp::kRelu>>},
        {"erf", as_kernel<R, unary<R, UnaryOp::kErf>>}, {"gelu", as_kernel<R, unary<R, UnaryOp::kGelu>>},
        {"floor", as_kernel<R, unary<R, UnaryOp::kFloor>>}, {"ceil", as_kernel<R, unary<R, UnaryOp::kCeil>>},
        {"round", as_kernel<R, unary<R, UnaryOp::kRound>>}, {"sin", as_kernel<R, unary<R, UnaryOp::kSin>>},
        {"cos", as_kernel<R, unary<R, UnaryOp::kCos>>}, {"asin", as_kernel<R, unary<R, UnaryOp::kAsin>>},
        {"acos", as_kernel<R, unary<R, UnaryOp::kAcos>>}, {"atan", as_kernel<R, unary<R, UnaryOp::kAtan>>}, {"softplus", as_kernel<R, unary<R, UnaryOp::kSoftplus>>},
        {"sign", as_kernel<R, unary<R, UnaryOp::kSign>>}, {"leaky_relu", as_kernel<R, unary<R, UnaryOp::kLeakyRelu>>},
        {"gelu_grad", as_kernel<R, gelu_grad_op<R>>}, {"fused_elementwise", as_kernel<R, fused_elementwise_op<R>>},
        {"add", as_kernel<R, binary<R, BinaryOp::kAdd>>}, {"sub", as_kernel<R, binary<R, BinaryOp::kSub>>},
        {"mul", as_kernel<R, binary<R, BinaryOp::kMul>>}, {"div", as_kernel<R, binary<R, BinaryOp::kDiv>>},
        {"pow", as_kernel<R, binary<R, BinaryOp::kPow>>}, {"max", as_kernel<R, binary<R, BinaryOp::kMax>>},
        {"min", as_kernel<R, binary<R, BinaryOp::kMin>>}, {"mod", as_kernel<R, binary<R, BinaryOp::kMod>>},
        {"tile", as_kernel<R, tile_op<R>>}, {"pad", as_kernel<R, pad_op<R>>},
        {"equal", as_kernel<R, compare<R, CompareOp::kEqual>>}, {"less", as_kernel<R, compare<R, CompareOp::kLess>>},
        {"less_equal", as_kernel<R, compare<R, CompareOp::kLessEqual>>}, {"greater", as_kernel<R, compare<R, CompareOp::kGreater>>},
        {"greater_equal", as_kernel<R, compare<R, CompareOp::kGreaterEqual>>}, {"and", as_kernel<R, compare<R, CompareOp::kAnd>>},
        {"or", as_kernel<R, compare<R, CompareOp::kOr>>}, {"xor", as_kernel<R, compare<R, CompareOp::kXor>>},
        {"not", as_kernel<R, not_op<R>>}, {"where", as_kernel<R, where_op<R>>},
        {"reduce_sum", as_kernel<R, reduce<R, ReduceOp::kSum>>}, {"reduce_mean", as_kernel<R, reduce<R, ReduceOp::kMean>>},
        {"reduce_max", as_kernel<R, reduce<R, ReduceOp::kMax>>}, {"reduce_min", as_kernel<R, reduce<R, ReduceOp::kMin>>},
        {"reduce_prod", as_kernel<R, reduce<R, ReduceOp::kProd>>}, {"reduce_sum_square", as_kernel<R, reduce<R, ReduceOp::kSumSquare>>},
        {"reduce_l2", as_kernel<R, reduce<R, ReduceOp::kL2>>},
        {"layernorm", as_kernel<R, layernorm_op<R>>}, {"add_layernorm", as_kernel<R, add_layernorm_op<R>>},
        {"layernorm_grad", as_kernel<R, layernorm_grad_op<R>>},
        {"softmax_cross_entropy", as_kernel<R, cross_entropy_op<R>>},
        {"softmax_cross_entropy_grad", as_kernel<R, cross_entropy_grad_op<R>>},
        {"sgd_update", as_kernel<R, sgd_op<R>>}, {"momentum_update", as_kernel<R, momentum_op<R>>},
        {"adam_update", as_kernel<R, adam_op<R>>}, {"adam8bit_update", as_kernel<R, adam8bit_op<R>>},
        {"adafactor_update", as_kernel<R, adafactor_op<R>>}, {"split_flat", as_kernel<R, split_flat_op<R>>},
        {"linear", as_kernel<R, linear_op<R>>}, {"matmul", as_kernel<R, matmul_op<R>>},
        {"matmul_bgrad", as_kernel<R, matmul_bgrad_op<R>>}, {"matmul_acc", as_kernel<R, matmul_acc_op<R>>},
        {"conv", as_kernel<R, conv_op<R>>}, {"conv_grad_weight", as_kernel<R, conv_grad_weight_op<R>>},
        {"attention", as_kernel<R, attention_op<R>>}, {"attention_grad", as_kernel<R, attention_grad_op<R>>},
    };
    // Collectives on GPU ranks: the rank's NCCL communicator on device buffers
    // (backends/collective_kernels.h).
    collective::register_kernels<RunnerCopy<R>>([&](const char* op, Kernel kernel) { t.emplace_back(op, kernel); });
    return t;
  }();
  return table;
}

template <class R>
const Kernel* find_kernel(std::string_view op) {
  for (const auto& [name, kernel] : kernel_table<R>()) {
    if (name == op) return &kernel;
  }
  return nullptr;
}

// Fused multi-tensor updates (ops::fused_updates): consecutive nodes of one update op in one
// launch (per dtype, per parameter-size chunk); consecutive casts likewise (ops::fused_casts).
template <class R, class Bodies>
Status as_group_kernel(std::span<KernelContext> nodes) {
  if (nodes.empty()) return Status::Ok();
  R run(nodes[0]);
  return fused_updates<R, Bodies>(nodes, run);
}

template <class R>
Status as_cast_group(std::span<KernelContext> nodes) {
  if (nodes.empty()) return Status::Ok();
  R run(nodes[0]);
  return fused_casts<R>(nodes, run);
}

template <class R>
GroupKernel find_group_kernel(std::string_view op) {
  if (op == "cast") return as_cast_group<R>;
  if (op == "adam_update") return as_group_kernel<R, AdamBodies>;
  if (op == "sgd_update") return as_group_kernel<R, SgdBodies>;
  if (op == "momentum_update") return as_group_kernel<R, MomentumBodies>;
  return nullptr;
}

// The run state that leads the CUDA workspace (Backend::run_state_bytes): the step, for kernels
// replayed from a captured graph. Every node's planned workspace includes it.
constexpr int64_t kRunStateBytes = 256;

// The scratch a node's CUDA kernel takes (the pieces it carves, in order), with `gemm_bytes` of
// cuBLASLt workspace for GEMM ops. `in` and `out` are the node's types (absent inputs default).
inline int64_t kernel_scratch_bytes(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out, int64_t gemm_bytes) {
  const std::string& op = node.op;
  if (op == "matmul" || op == "linear" || op == "matmul_bgrad" || op == "matmul_acc") return gemm_bytes;
  if (op == "conv" || op == "conv_grad_weight") {
    const bool grad = op == "conv_grad_weight";
    const ConvShape s(node, grad ? in[1].shape : in[0].shape, grad ? out[0].shape : in[1].shape, grad ? in[0].shape : out[0].shape);
    return conv_scratch(s, in[0].dtype, grad) + gemm_bytes;
  }
  if (op == "attention") return attention_scratch(in[0], in[1], gemm_bytes, attention_layout_of(node.attrs));
  if (op == "attention_grad") {  // whichever path may run: memc's row kernel, the GEMM path (f32) or cuDNN (16-bit)
    const int64_t rows = numel(in[0].shape) / std::max<int64_t>(in[0].shape.back(), 1);  // dy: query rows × Dv, any layout
    const bool dbias = out.size() >= 4;
    const int64_t by_gemm = dbias ? 0 : gemm_attention_scratch(in[1], in[2], 2, gemm_bytes, attention_layout_of(node.attrs));
    return std::max({attention_grad_scratch(rows, dbias ? out[3].numel() : 0), attention_grad_cudnn_scratch(in[1], in[3], gemm_bytes), by_gemm});
  }
  if (op == "layernorm_grad") {
    const Shape& x = in[1].shape;
    const int64_t axis = node.attrs.get_int("axis", static_cast<int64_t>(x.size()) - 1);
    const int64_t h = numel(Shape(x.begin() + axis, x.end()));
    return layernorm_grad_scratch(h ? numel(x) / h : 0, h, out[1].numel(), node.attrs.get_int("bias_grad", 0) != 0);
  }
  if (op == "gather_grad" || op == "gather_elements_grad") return out[0].dtype == DType::kF32 ? 0 : scratch_piece(out[0].numel() * 4);
  if (op == "softmax_cross_entropy") return scratch_piece(in[0].shape[0] * 8);
  if (op == "adam8bit_update") return adam8bit_scratch();
  if (op == "adafactor_update") return adafactor_scratch(in[0].shape, node.attrs.get_int("factored", 0));
  return 0;
}

// A node's planned CUDA workspace: the run state, then its kernel's scratch.
inline int64_t workspace_bytes(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out, int64_t gemm_bytes) {
  return kRunStateBytes + kernel_scratch_bytes(node, in, out, gemm_bytes);
}

}  // namespace memc::cuda::ops
