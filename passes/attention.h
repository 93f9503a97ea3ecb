// The attention memory pass: substitutes memc's memory-efficient attention op for the scaled
// MatMul→Softmax→MatMul pattern an exporter writes (with or without an additive mask and
// dropout on the probabilities; frontend/fuse_attention.cc does the matching). The op is tiled
// with an online softmax (backends/cpu/attention.cc): the [.., Tq, Tk] score and probability
// matrices are never stored, forward or backward, and dropout masks are replayed from the
// counter RNG. Exact up to summation order. Attention written otherwise (BigBird's
// block-sparse gathers) is left as it is, keeping its sparsity.
#pragma once
#include <string>

#include "ir/graph.h"

namespace memc {

struct AttentionReport {
  int substituted = 0;         // patterns replaced by the attention op
  int64_t bytes_before = 0;    // Σ bytes of the forward's activations before
  int64_t bytes_after = 0;     // ... and after (the score/probability matrices are gone)
};

class AttentionPass {
 public:
  std::string name() const { return "attention"; }
  Expected<AttentionReport> run(Module& forward) const;
};

}  // namespace memc
