// update_grad_casts: a gradient's widening cast inside the optimizer update that reads it. In a
// mixed-precision step each f32 parameter's gradient comes out of its GEMM in bf16 (or f16) and
// is cast to f32 for the update, one launch and an f32 copy per parameter (99 of them in a
// ViT-B/16 step); the SGD, momentum and Adam updates read a 16-bit gradient as the cast widens
// it, exactly, so the cast goes. Set for GPU targets (planner/compile.cc).
//
// Only a cast from bf16 or f16 to f32 that only the update reads (a gradient that is also
// clipped, reduced across ranks or returned keeps its cast). The 16-bit gradient takes the f32
// one's name and role (grad.W), so the runtime and the tests find it as before.
#pragma once
#include "passes/pass.h"

namespace memc {

class UpdateGradCasts : public Pass {
 public:
  std::string_view name() const override { return "update_grad_casts"; }
  // Statistic: folded (casts read by their update instead).
  Expected<PassReport> run(Module& step) override;
};

}  // namespace memc
