#include "passes/narrow_transposes.h"

#include "frontend/fusion_util.h"

namespace memc {
namespace {

// Puts op0 on `input`, then op1 on its result, before node `at`; the result takes `replaced`'s
// place and the `dead` nodes go. False where a node cannot be made (nothing changed then but an
// unused node).
bool swap_pair(Module& m, NodeId at, ValueId input, const Node& op0, const Node& op1, ValueId replaced, std::initializer_list<NodeId> dead) {
  const std::string source = m.node(at).source;
  const std::vector<ValueId> x = fusion::add_before(m, at, op0.op, {input}, op0.attrs, source);
  if (x.size() != 1) return false;
  const std::vector<ValueId> y = fusion::add_before(m, at, op1.op, {x[0]}, op1.attrs, source);
  if (y.size() != 1 || m.value(y[0]).type != m.value(replaced).type) return false;
  fusion::take_identity(m, replaced, y[0]);
  for (NodeId n : dead) m.node(n).dead = true;
  return true;
}

}  // namespace

Expected<PassReport> NarrowTransposes::run(Module& m) {
  int64_t narrowed = 0, widened = 0;
  for (NodeId t : m.schedule()) {
    const Node& transpose = m.node(t);
    if (transpose.dead || transpose.op != "transpose" || transpose.inputs.size() != 1) continue;
    const Users users = m.users();
    const Node* after = fusion::only_reader(m, users, transpose.outputs[0]);
    if (fusion::is_16bit_cast(m, after, true)) {  // transpose → narrowing cast: the cast first
      const Node cast = *after, moved = transpose;  // copies: adding nodes may move them
      narrowed += swap_pair(m, t, moved.inputs[0], cast, moved, cast.outputs[0], {t, cast.id});
      continue;
    }
    const Node* before = fusion::producer(m, transpose.inputs[0]);
    if (fusion::is_16bit_cast(m, before, false) && fusion::only_reader(m, users, transpose.inputs[0]) == &transpose) {  // widening cast → transpose
      const Node cast = *before, moved = transpose;
      widened += swap_pair(m, t, cast.inputs[0], moved, cast, moved.outputs[0], {t, cast.id});
    }
  }
  return rewrite_report(m, {{"narrowed", narrowed}, {"widened", widened}},
                        str_cat("narrow_transposes: ", narrowed, " casts to 16 bits before their transpose, ", widened,
                                " casts from 16 bits after theirs"));
}

}  // namespace memc
