// Idiom fusions run on the lowered IR: small rewrites that replace an exporter's spelled-out
// formula by one core op. Each is a class with name() and run(Module&) -> changed; new
// nodes are scheduled where the matched root was, and the replaced nodes are left for
// dead-node elimination (run_fusions does it after all of them).
//
// Order: gelu and layernorm first (they shrink the elementwise chains), then linear, then
// attention (which looks through the scale, mask add, softmax and dropout).
#pragma once
#include <memory>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace memc {

class FusionPass {
 public:
  virtual ~FusionPass() = default;
  virtual std::string_view name() const = 0;
  // Returns whether the module changed.
  virtual bool run(Module& module) = 0;
};

std::unique_ptr<FusionPass> make_gelu_fusion();       // x·0.5·(1+erf(x/√2)) → gelu
std::unique_ptr<FusionPass> make_layernorm_fusion();  // ReduceMean form → layernorm
std::unique_ptr<FusionPass> make_linear_fusion();     // [Transpose(W)+]MatMul[+Add] → linear
std::unique_ptr<FusionPass> make_attention_fusion();  // QKᵀ·scale [+bias] → softmax [→ dropout] → ·V

// Every fusion in order, then dead-node elimination and compaction. Returns nodes fused.
// `attention` false leaves attention to the attention memory pass (passes/attention.h).
int run_fusions(Module& module, bool attention = true);

}  // namespace memc
