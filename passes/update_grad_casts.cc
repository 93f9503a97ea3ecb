#include "passes/update_grad_casts.h"

#include "frontend/fusion_util.h"

namespace memc {
namespace {

bool reads_any_gradient(const Node& n) { return n.op == "sgd_update" || n.op == "momentum_update" || n.op == "adam_update"; }

// The widening cast (bf16/f16 → f32) whose result only `update` reads, as its gradient.
const Node* widening_cast(const Module& m, const Users& users, const Node& update) {
  const ValueId g = update.inputs[1];
  const Node* cast = fusion::producer(m, g);
  if (!fusion::is_16bit_cast(m, cast, false)) return nullptr;
  return fusion::only_reader(m, users, g) == &update ? cast : nullptr;
}

}  // namespace

Expected<PassReport> UpdateGradCasts::run(Module& m) {
  int64_t folded = 0;
  const Users users = m.users();
  for (NodeId n : m.schedule()) {
    const Node& update = m.node(n);
    if (update.dead || !reads_any_gradient(update) || update.inputs.size() < 2) continue;
    const Node* cast = widening_cast(m, users, update);
    if (!cast) continue;
    const NodeId cast_id = cast->id;
    const ValueId wide = update.inputs[1], narrow = cast->inputs[0];
    // The update now reads the 16-bit gradient, which takes the f32 one's name and role (grad.W); an
    // argument keeps its own, by which it is fed.
    if (m.value(narrow).producer != kNoNode) fusion::take_identity(m, wide, narrow);
    else m.replace_all_uses(wide, narrow);
    m.node(cast_id).dead = true;
    ++folded;
  }
  return rewrite_report(m, {{"folded", folded}}, str_cat("update_grad_casts: ", folded, " gradient casts read by their update instead"));
}

}  // namespace memc
