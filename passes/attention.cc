#include "passes/attention.h"

#include "frontend/fusion.h"

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

Expected<AttentionReport> AttentionPass::run(Module& forward) const {
  AttentionReport r;
  r.bytes_before = activation_bytes(forward);
  const int before = count_attention(forward);
  make_attention_fusion()->run(forward);
  forward.eliminate_dead_nodes();
  forward.compact();
  r.substituted = count_attention(forward) - before;
  r.bytes_after = activation_bytes(forward);
  return r;
}

}  // namespace memc
