#include "passes/layernorm_grad_casts.h"

#include "frontend/fusion_util.h"

namespace memc {

Expected<PassReport> LayernormGradCasts::run(Module& m) {
  int64_t widened = 0, narrowed = 0;
  for (bool again = true; again;) {
    fusion::Walk walk(m);
    for (NodeId g : m.schedule()) {
      const Node& grad = m.node(g);
      if (grad.dead || grad.op != "layernorm_grad" || grad.inputs.size() < 3 || grad.attrs.has("dx_copy")) continue;
      if (m.value(grad.inputs[1]).type.dtype != DType::kF32) continue;
      if (!walk.fresh(m, g)) {
        walk.defer();
        continue;
      }
      const Users& users = walk.users();
      // dy = cast(d16 → f32), read by this layernorm_grad alone.
      const Node* widen = fusion::producer(m, grad.inputs[0]);
      if (!fusion::is_16bit_cast(m, widen, false) || fusion::only_reader(m, users, grad.inputs[0]) != &grad) widen = nullptr;
      // A cast of dx to 16 bits (dx's other readers keep the f32 dx).
      const Node* narrow = nullptr;
      for (NodeId u : users[grad.outputs[0]]) {
        if (!narrow && fusion::is_16bit_cast(m, &m.node(u), true)) narrow = &m.node(u);
      }
      if (!widen && !narrow) continue;
      if ((widen && !walk.fresh(m, widen->id)) || (narrow && !walk.fresh(m, narrow->id))) {
        walk.defer();
        continue;
      }
      std::vector<ValueId> inputs = grad.inputs;
      if (widen) inputs[0] = widen->inputs[0];
      Attrs attrs = grad.attrs;  // copies: adding a node may move `grad`
      if (narrow) attrs.set("dx_copy", std::string(dtype_name(m.value(narrow->outputs[0]).type.dtype)));
      const NodeId widen_id = widen ? widen->id : kNoNode, narrow_id = narrow ? narrow->id : kNoNode;
      const std::string source = grad.source;
      // In g's place: every input is made before it (d16 before its cast), and the copy is then
      // made before the cast's readers.
      const std::vector<ValueId> out = fusion::add_before(m, g, "layernorm_grad", inputs, std::move(attrs), source);
      const size_t outputs = m.node(g).outputs.size();
      if (out.size() != outputs + (narrow_id != kNoNode)) return Status::Internal(str_cat("layernorm_grad_casts: could not rewrite ", source));
      for (size_t i = 0; i < outputs; ++i) fusion::take_identity(m, m.node(g).outputs[i], out[i], users[m.node(g).outputs[i]]);
      if (narrow_id != kNoNode) fusion::take_identity(m, m.node(narrow_id).outputs[0], out.back(), users[m.node(narrow_id).outputs[0]]);
      for (NodeId n : {g, widen_id, narrow_id, m.value(out[0]).producer}) {
        if (n != kNoNode) walk.touch(m, n);
      }
      m.node(g).dead = true;
      if (widen_id != kNoNode) m.node(widen_id).dead = true, ++widened;
      if (narrow_id != kNoNode) m.node(narrow_id).dead = true, ++narrowed;
    }
    again = walk.deferred();
  }
  return rewrite_report(m, {{"widened", widened}, {"narrowed", narrowed}},
                        str_cat("layernorm_grad_casts: ", widened, " 16-bit dys read in place of their f32 cast, ", narrowed,
                                " 16-bit copies of dx written beside it"));
}

}  // namespace memc
