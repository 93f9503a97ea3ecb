// bias_grad_gemm: a linear layer's bias gradient inside its weight-gradient GEMM. Autodiff
// writes dW = matmul(dyᵀ, x) (or matmul(xᵀ, dy) for a [K, N] weight) and db = reduce_sum(dy, 0)
// as two nodes that each read dy whole; this pass makes them one matmul_bgrad, whose cuBLASLt
// epilogue (BGRADB/BGRADA) sums dy over the GEMM's k while the GEMM reads it. Set for GPU
// targets (planner/compile.cc). Memory is unchanged: the same two outputs, the same input.
//
// The fused node takes the earlier node's place where its inputs are ready there, else the later
// node's where nothing reads the earlier one's output before it; other pairs stay apart.
#pragma once
#include "passes/pass.h"

namespace memc {

class BiasGradGemm : public Pass {
 public:
  std::string_view name() const override { return "bias_grad_gemm"; }
  // Statistic: fused (pairs of weight-gradient matmul and bias-gradient reduce_sum).
  Expected<PassReport> run(Module& step) override;
};

}  // namespace memc
