#include "passes/attention.h"

#include "frontend/fusion.h"
#include "support/size.h"

namespace memc {
namespace {

int64_t activation_bytes(const Module& m) {
  int64_t total = 0;
  for (NodeId n : m.schedule()) {
    for (ValueId v : m.node(n).outputs) total += m.value(v).role == Role::kActivation ? m.value(v).type.bytes() : 0;
  }
  return total;
}

int count_attention(const Module& m) {
  int n = 0;
  for (NodeId id : m.schedule()) n += m.node(id).op == "attention";
  return n;
}

}  // namespace

Expected<AttentionKernel> parse_attention_kernel(std::string_view name) {
  if (name == "tiled") return AttentionKernel::kTiled;
  if (name == "naive") return AttentionKernel::kNaive;
  return Status::BadInput(str_cat("--attention '", name, "': tiled (memory-efficient, the default) or naive"));
}

std::string_view attention_kernel_name(AttentionKernel kernel) { return kernel == AttentionKernel::kTiled ? "tiled" : "naive"; }

Expected<PassReport> AttentionPass::run(Module& forward) {
  AttentionReport r;
  r.bytes_before = activation_bytes(forward);
  const int before = count_attention(forward);
  make_attention_fusion()->run(forward);
  forward.eliminate_dead_nodes();
  forward.compact();
  r.substituted = count_attention(forward) - before;
  r.bytes_after = activation_bytes(forward);
  PassReport report;
  report.changed = r.substituted != 0;
  report.set("substituted", r.substituted);
  report.set("activation_bytes_before", r.bytes_before);
  report.set("activation_bytes_after", r.bytes_after);
  report.lines.push_back(str_cat("attention: ", r.substituted, " MatMul→Softmax→MatMul patterns → tiled attention; forward activations ",
                                 format_size(r.bytes_before), " → ", format_size(r.bytes_after)));
  return report;
}

}  // namespace memc
