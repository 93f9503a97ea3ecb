// A tensor split into its slices by gathers, as torch's MultiheadAttention exports its packed
// q/k/v projection: [T, B, 3·E] → reshape [T, B, 3, E] → unsqueeze → transpose the 3 to the
// front → squeeze → gather 0, 1 and 2 along it. Two exact rewrites, for GPU targets
// (planner/compile.cc), where each copy is a launch and the bytes it moves:
//
// GatherTransposes (forward): a gather of one slice along an axis that a transpose (and
// reshapes that only add or drop dims of size 1) moved reads the transpose's input along that
// axis instead, when the other dims keep their order, so the result is the same elements in the
// same order. The transpose goes when nothing else reads it; autodiff then writes each slice's
// gradient straight into the projection's layout.
//
// ConcatGatherGrads (training): gradients accumulated from gather_grads that each fill one slice
// of the same axis, every slice once, are those slices side by side: one concat of the
// incoming gradients, where the graph wrote n full-size tensors of zeros and added them up.
// The same values (x + 0 = x), signed zeros aside (−0 + 0 is +0; the concat keeps −0).
#pragma once
#include "passes/pass.h"

namespace memc {

class GatherTransposes : public Pass {
 public:
  std::string_view name() const override { return "gather_transposes"; }
  // Statistics: rewritten (gathers), transposes_removed.
  Expected<PassReport> run(Module& forward) override;
};

class ConcatGatherGrads : public Pass {
 public:
  std::string_view name() const override { return "concat_gather_grads"; }
  // Statistics: concats, gather_grads_removed.
  Expected<PassReport> run(Module& train) override;
};

}  // namespace memc
