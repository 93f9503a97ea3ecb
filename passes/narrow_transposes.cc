#include "passes/narrow_transposes.h"

#include "frontend/fusion_util.h"

namespace memc {
namespace {

// Puts op0 on `input`, then op1 on its result, before node `at`; the result takes `replaced`'s
// place and the `dead` nodes go. False where a node cannot be made (nothing changed then but an
// unused node).
bool swap_pair(Module& m, fusion::Walk& walk, NodeId at, ValueId input, const Node& op0, const Node& op1, ValueId replaced,
               std::initializer_list<NodeId> dead) {
  const std::string source = m.node(at).source;
  const std::vector<ValueId> x = fusion::add_before(m, at, op0.op, {input}, op0.attrs, source);
  if (x.size() != 1) return false;
  walk.touch(m, m.value(x[0]).producer);
  const std::vector<ValueId> y = fusion::add_before(m, at, op1.op, {x[0]}, op1.attrs, source);
  if (y.size() != 1 || m.value(y[0]).type != m.value(replaced).type) return false;
  walk.touch(m, m.value(y[0]).producer);
  fusion::take_identity(m, replaced, y[0], walk.users()[replaced]);
  for (NodeId n : dead) walk.touch(m, n), m.node(n).dead = true;
  return true;
}

}  // namespace

Expected<PassReport> NarrowTransposes::run(Module& m) {
  int64_t narrowed = 0, widened = 0;
  for (bool again = true; again;) {
    fusion::Walk walk(m);
    for (NodeId t : m.schedule()) {
      const Node& transpose = m.node(t);
      if (transpose.dead || transpose.op != "transpose" || transpose.inputs.size() != 1) continue;
      if (!walk.fresh(m, t)) {
        walk.defer();
        continue;
      }
      const Users& users = walk.users();
      const Node* after = fusion::only_reader(m, users, transpose.outputs[0]);
      const Node* before = fusion::producer(m, transpose.inputs[0]);
      const Node* cast = fusion::is_16bit_cast(m, after, true) ? after : fusion::is_16bit_cast(m, before, false) ? before : nullptr;
      if (cast && !walk.fresh(m, cast->id)) {
        walk.defer();
        continue;
      }
      if (cast && cast == after) {  // transpose → narrowing cast: the cast first
        const Node moved_cast = *after, moved = transpose;  // copies: adding nodes may move them
        narrowed += swap_pair(m, walk, t, moved.inputs[0], moved_cast, moved, moved_cast.outputs[0], {t, moved_cast.id});
      } else if (cast && fusion::only_reader(m, users, transpose.inputs[0]) == &transpose) {  // widening cast → transpose
        const Node moved_cast = *before, moved = transpose;
        widened += swap_pair(m, walk, t, moved_cast.inputs[0], moved, moved_cast, moved.outputs[0], {t, moved_cast.id});
      }
    }
    again = walk.deferred();
  }
  return rewrite_report(m, {{"narrowed", narrowed}, {"widened", widened}},
                        str_cat("narrow_transposes: ", narrowed, " casts to 16 bits before their transpose, ", widened,
                                " casts from 16 bits after theirs"));
}

}  // namespace memc
