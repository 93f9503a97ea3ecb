// fuse_elementwise: chains of elementwise ops as one kernel each. Every op a GPU runs is a
// launch that reads its inputs from memory and writes its output back; a chain such as the
// backward's gelu_grad → cast, or the forward's cast → add of a residual, pays that per op. This
// pass makes each such chain one fused_elementwise node (ir/fused_program.h), whose kernel reads
// the chain's inputs once, keeps the intermediates in registers and writes its result once.
// Set for GPU targets (planner/compile.cc); it runs after autodiff and the memory passes, so the
// memory plan that follows sees the step as the device runs it: the intermediates are gone from
// it, and planned = measured still holds.
//
// A producer joins its consumer's group when it is fusable (is_fusable_op: float and bool values
// in device memory), its output is an activation of the group's shape that only the group reads
// and that the step does not return, and the group stays within kFusedMaxInputs inputs and
// kFusedMaxSteps steps. Groups grow from the last node of each chain backwards; the fused node
// takes the chain's last node's place and its output's name and role. Where other nodes also
// read that output, one fusable consumer of it that reads nothing made later becomes the node's
// second result (a gradient sum and its cast for the next GEMM). A fused step computes
// exactly what its op's kernel does, rounding included, so the step is unchanged bit for bit.
#pragma once
#include "passes/pass.h"

namespace memc {

class FuseElementwise : public Pass {
 public:
  std::string_view name() const override { return "fuse_elementwise"; }
  // Statistics: groups (fused nodes made), nodes (ops they replace).
  Expected<PassReport> run(Module& step) override;
};

}  // namespace memc
