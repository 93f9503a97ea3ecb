// layernorm_bias_grad: a layernorm's bias gradient inside its layernorm_grad. Autodiff writes
// dbias = reduce_sum(dy over the rows) beside layernorm_grad(dy, x, scale), which reads the same
// dy to sum dscale = Σ dy·x̂ as per-block partials and one final reduction in a fixed order; the
// fused node sums dy in the same pass and order ({bias_grad}: a third output), so dy is read
// once and a launch goes. Set for GPU targets (planner/compile.cc). Not bit for bit the
// reduce_sum's order: within rounding, deterministic run to run.
#pragma once
#include "passes/pass.h"

namespace memc {

class LayernormBiasGrad : public Pass {
 public:
  std::string_view name() const override { return "layernorm_bias_grad"; }
  // Statistic: fused (bias gradients inside their layernorm_grad).
  Expected<PassReport> run(Module& step) override;
};

}  // namespace memc
