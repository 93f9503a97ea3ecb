// accumulate_gemm: a gradient summed over loss chunks, micro-batches or a value's uses is added
// by its GEMM. Autodiff, the loss chunks and the micro-batches write each term as its own
// product and an add: sum' = add(sum, cast?(P)), P a matmul by a 2-D weight or a bias-free linear
// (a weight's gradient over chunks, micro-batches or tied uses; an activation's gradient where
// several linear layers read it: q, k and v, a gated MLP's gate and up), so the product (and
// under a mixed precision its 16-bit copy and the f32 cast of it) is a buffer beside the running
// sum. Where the sum exists when the product is computed, this pass makes the term one
// matmul_acc(sum, a, b) in the product's place (not where the sum comes later: the GEMM would
// then wait for it, holding its operands, such as a tied head's dlogits until the embedding's
// gradient), a GEMM that adds into the sum (cuBLASLt's beta = 1, oneDNN's sum post-op). Under a mixed precision the first
// term of a sum within one micro-batch (the loss chunks'), when the next is one, becomes a
// matmul_acc without an accumulator that writes the f32 product itself, with no 16-bit copy and
// no cast: the sum is then the only buffer of the weight's size (bench/journal/2026.md §62). A
// sum over micro-batches keeps its start: its first term waits a whole micro-batch for the next,
// and its 16-bit product is the cheaper form to hold meanwhile (ViT-tiny, 2 micro-batches:
// 402,176 B unfused, 416,192 B with the start fused, since the schedule then holds the product's
// operands instead).
//
// Numerics: over 16-bit operands the product is summed in f32 and added to the f32 sum without
// being rounded to 16 bits first (PyTorch autocast rounds each term's dW to bf16), so a term is
// more exact, not equal. Every target; a plan is correct without it (--disable-pass).
#pragma once
#include "passes/pass.h"

namespace memc {

class AccumulateGemm : public Pass {
 public:
  std::string_view name() const override { return "accumulate_gemm"; }
  // Statistics: terms (adds of a product into a sum, now GEMMs adding into it), starts (first
  // terms' 16-bit products and their casts, now one GEMM writing f32).
  Expected<PassReport> run(Module& step) override;
};

}  // namespace memc
