// patch_gemm: a convolution whose stride equals its kernel (no padding, no dilation, one group)
// reads every input element exactly once, so it is a reshape of the input into patches and one
// GEMM: x [N, C, o1·k1, …] → patches [N, P, C·k1·…] → linear(patches, w [Co, C·k1·…], b)
// → [N, P, Co]. A ViT's patch embedding is the case it is for: its output goes on through
// flatten(2) and transpose(1, 2) to [N, P, Co], which is the linear's output itself, so where the
// graph spells exactly that, the transposes cancel and the linear's output is used directly.
// Elsewhere the output is transposed back to [N, Co, o1, …].
//
// On a GPU target (planner/compile.cc) this replaces im2col + a batched GEMM + a bias pass with
// one cuBLASLt GEMM whose epilogue adds the bias, and the weight's gradient is one plain GEMM
// (autodiff's linear gradient). An input that needs no gradient (the image) gets none, as before.
#pragma once
#include "passes/pass.h"

namespace memc {

class PatchGemm : public Pass {
 public:
  std::string_view name() const override { return "patch_gemm"; }
  // Statistics: rewritten (convolutions), transposes_cancelled.
  Expected<PassReport> run(Module& forward) override;
};

}  // namespace memc
