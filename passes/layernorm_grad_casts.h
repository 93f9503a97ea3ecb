// layernorm_grad_casts: the casts at a layernorm gradient's edges inside it. In bf16-mixed (or
// fp16-mixed) a block's 16-bit GEMM writes the layernorm's dy, a cast widens it to f32 for
// layernorm_grad, and dx (f32: the residual stream's gradient, which the next layernorm_grad adds
// to) is narrowed by another cast for the 16-bit GEMMs before it. The rewritten layernorm_grad
// reads the 16-bit dy itself (widening is exact), and with {dx_copy = "bf16"|"f16"} stores a
// 16-bit copy of dx beside dx, rounded as the cast rounds it (a last output). Per layernorm: two
// launches, an f32 dy and a read of dx fewer. Set for GPU targets (planner/compile.cc).
//
// Exact: the step is the same bit for bit on each backend. Memory: the f32 dy goes; the copy is
// written when dx is, not later, where the cast ran after other nodes.
#pragma once
#include "passes/pass.h"

namespace memc {

class LayernormGradCasts : public Pass {
 public:
  std::string_view name() const override { return "layernorm_grad_casts"; }
  // Statistics: widened (16-bit dys read in place of their f32 cast), narrowed (16-bit copies of
  // dx written beside it).
  Expected<PassReport> run(Module& step) override;
};

}  // namespace memc
