#include "passes/layernorm_bias_grad.h"

#include "frontend/fusion_util.h"

namespace memc {
namespace {

// reduce_sum of `dy` over every dim before `axis`, keepdims 0, to `type`.
bool sums_rows(const Module& m, const Node& n, ValueId dy, int64_t axis, const TensorType& type) {
  if (n.dead || n.op != "reduce_sum" || n.inputs.size() != 1 || n.inputs[0] != dy || n.attrs.get_int("keepdims", 1) != 0) return false;
  std::vector<int64_t> rows(static_cast<size_t>(axis));
  for (int64_t i = 0; i < axis; ++i) rows[static_cast<size_t>(i)] = i;
  return n.attrs.get_ints("axes") == rows && m.value(n.outputs[0]).type == type;
}

}  // namespace

Expected<PassReport> LayernormBiasGrad::run(Module& m) {
  int64_t fused = 0;
  for (bool again = true; again;) {
    fusion::Walk walk(m);
    for (NodeId g : m.schedule()) {
      const Node& grad = m.node(g);
      if (grad.dead || grad.op != "layernorm_grad" || grad.outputs.size() != 2) continue;
      const ValueId dy = grad.inputs[0];
      const Shape& x = m.value(grad.inputs[1]).type.shape;
      const int64_t axis = grad.attrs.get_int("axis", static_cast<int64_t>(x.size()) - 1);
      const TensorType& scale = m.value(grad.inputs[2]).type;
      if (axis < 1 || scale.shape != Shape(x.begin() + axis, x.end())) continue;
      if (!walk.fresh(m, g)) {
        walk.defer();
        continue;
      }
      const Users& users = walk.users();
      NodeId sum = kNoNode;
      for (NodeId u : users[dy]) {
        if (sums_rows(m, m.node(u), dy, axis, scale)) sum = u;
      }
      if (sum == kNoNode) continue;
      if (!walk.fresh(m, sum)) {
        walk.defer();
        continue;
      }
      const std::vector<ValueId> inputs = grad.inputs;
      const NodeId at = walk.fused_place(m, g, sum, inputs);
      if (at == kNoNode) continue;
      Attrs attrs = grad.attrs;  // copies: adding a node may move `grad`
      attrs.set("bias_grad", int64_t{1});
      const std::string source = grad.source;
      const std::vector<ValueId> out = fusion::add_before(m, at, "layernorm_grad", inputs, std::move(attrs), source);
      if (out.size() != 3) return Status::Internal(str_cat("layernorm_bias_grad: could not fuse ", source));
      fusion::take_identity(m, m.node(g).outputs[0], out[0], users[m.node(g).outputs[0]]);
      fusion::take_identity(m, m.node(g).outputs[1], out[1], users[m.node(g).outputs[1]]);
      fusion::take_identity(m, m.node(sum).outputs[0], out[2], users[m.node(sum).outputs[0]]);
      for (NodeId n : {g, sum, m.value(out[0]).producer}) walk.touch(m, n);
      m.node(g).dead = m.node(sum).dead = true;
      ++fused;
    }
    again = walk.deferred();
  }
  return rewrite_report(m, {{"fused", fused}}, str_cat("layernorm_bias_grad: ", fused, " bias gradients inside their layernorm_grad"));
}

}  // namespace memc
