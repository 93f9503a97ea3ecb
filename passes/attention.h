// The attention memory pass: substitutes memc's memory-efficient attention op for the scaled
// MatMul→Softmax→MatMul pattern an exporter writes (with or without an additive mask and
// dropout on the probabilities; frontend/fuse_attention.cc does the matching). The op is tiled
// with an online softmax (backends/cpu/attention.cc): the [.., Tq, Tk] score and probability
// matrices are never stored, forward or backward, and dropout masks are replayed from the
// counter RNG. Exact up to summation order. Attention written otherwise (BigBird's
// block-sparse gathers) is left as it is, keeping its sparsity.
#pragma once
#include <string>
#include <string_view>

#include "ir/graph.h"
#include "passes/pass.h"

namespace memc {

// Which attention kernel a plan uses: memc's tiled one (this pass) or the exported
// MatMul→Softmax→MatMul as it stands.
enum class AttentionKernel { kTiled, kNaive };
// "tiled" | "naive"; anything else is bad input.
Expected<AttentionKernel> parse_attention_kernel(std::string_view name);
std::string_view attention_kernel_name(AttentionKernel kernel);

struct AttentionReport {
  int substituted = 0;         // patterns replaced by the attention op
  int64_t bytes_before = 0;    // Σ bytes of the forward's activations before
  int64_t bytes_after = 0;     // ... and after (the score/probability matrices are gone)
  int transposes_removed = 0;  // layouts: transposes around attention now read or written in place
};

// Which layouts attention may be laid out in (ir/attention_layout.h): none, the sequence-first
// tbhd only, or bthd too. The planner chooses per target and precision (planner/compile.cc).
enum class AttentionLayouts { kNone, kSequenceFirst, kAll };

// With `layouts`, attention then reads q, k and v in the layout the projections wrote them
// (ir/attention_layout.h) and writes its output in the one the transposes after it lead to.
class AttentionPass : public Pass {
 public:
  explicit AttentionPass(AttentionLayouts layouts = AttentionLayouts::kNone) : layouts_(layouts) {}
  std::string_view name() const override { return "attention"; }
  // Statistics: substituted, activation_bytes_before, activation_bytes_after, and with layouts
  // transposes_removed.
  Expected<PassReport> run(Module& forward) override;

 private:
  AttentionLayouts layouts_;
};

// Rewrites every default-layout attention whose q, k and v come through transposes (and
// reshapes) from tensors holding them densely as [B, T, H, E] or [T, B, H, E]: it reads those
// tensors instead, and writes its output so the transposes after it become reshapes; where they
// do not, one transpose restores [B, H, T, E]. `layouts` kSequenceFirst leaves [B, T, H, E]
// sources alone. Returns the transposes removed.
int lay_out_attention(Module& forward, AttentionLayouts layouts = AttentionLayouts::kAll);

}  // namespace memc
