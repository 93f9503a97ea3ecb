// add_layernorm: a residual add and the layernorm that reads it as one row kernel, and a
// layernorm gradient with the add of the residual's gradient that follows it. Set for GPU
// targets (planner/compile.cc), where each pair was two launches and a round trip through memory.
//
// Forward: s = add(x, r) normalized by layernorm(s, scale, [bias]) becomes
// add_layernorm(x, r, scale, [bias]) → (s, y). Where the add's operand is a cast that only the
// add reads (bf16-mixed widens each block's output before the residual add), the cast joins:
// the kernel rounds r as the cast did. Where y (f32) is read only by a cast to bf16 or f16 (the
// next GEMM's input), that cast joins too: y is stored in 16 bits, rounded as the cast rounded
// it, and the f32 y is never written. The sum stays an output: the next residual add and the
// layernorm's gradient read it.
//
// Backward: (dx, dscale) = layernorm_grad(dy, x, scale) whose dx only an add(dx, d) reads
// becomes layernorm_grad(dy, x, scale, d) → (dx + d, dscale).
//
// Both compute and round as the two ops' kernels do, so the step is the same bit for bit on each
// backend. Memory: the same outputs, fewer intermediates; the sum may take its first operand's
// buffer as the add's output did (the pass puts first an operand that nothing else reads).
#pragma once
#include "passes/pass.h"

namespace memc {

class AddLayernorm : public Pass {
 public:
  std::string_view name() const override { return "add_layernorm"; }
  // Statistics: forward (residual adds inside their layernorm), backward (gradient adds inside
  // their layernorm_grad).
  Expected<PassReport> run(Module& step) override;
};

}  // namespace memc
