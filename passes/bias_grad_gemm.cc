#include "passes/bias_grad_gemm.h"

#include "frontend/fusion_util.h"

namespace memc {
namespace {

// reduce_sum(v, axes = [0], keepdims = 0) of a 2-D v.
bool sums_rows(const Module& m, const Node& n) {
  return n.op == "reduce_sum" && n.inputs.size() == 1 && m.value(n.inputs[0]).type.shape.size() == 2 &&
         n.attrs.get_ints("axes") == std::vector<int64_t>{0} && n.attrs.get_int("keepdims", 1) == 0;
}

// Which operand of the 2-D matmul `g` is v with the contraction over v's rows: 0 (vᵀ·b), 1
// (a·v), or -1.
int summed_operand(const Module& m, const Node& g, ValueId v) {
  if (g.op != "matmul" || g.inputs.size() != 2 || g.inputs[0] == g.inputs[1]) return -1;
  if (m.value(g.inputs[0]).type.shape.size() != 2 || m.value(g.inputs[1]).type.shape.size() != 2) return -1;
  if (g.inputs[0] == v && g.attrs.get_int("transpose_a", 0)) return 0;
  if (g.inputs[1] == v && !g.attrs.get_int("transpose_b", 0)) return 1;
  return -1;
}

}  // namespace

Expected<PassReport> BiasGradGemm::run(Module& m) {
  int64_t fused = 0;
  for (bool again = true; again;) {
    fusion::Walk walk(m);
    const Users& users = walk.users();
    for (NodeId r : m.schedule()) {
      if (m.node(r).dead || !sums_rows(m, m.node(r))) continue;
      if (!walk.fresh(m, r)) {
        walk.defer();
        continue;
      }
      const ValueId v = m.node(r).inputs[0];
      for (NodeId g : users[v]) {
        if (m.node(g).dead) continue;
        const int summed = summed_operand(m, m.node(g), v);
        if (summed < 0 || m.value(m.node(g).outputs[0]).type.dtype != m.value(m.node(r).outputs[0]).type.dtype) continue;
        if (!walk.fresh(m, g)) {
          walk.defer();
          continue;
        }
        const NodeId at = walk.fused_place(m, g, r, m.node(g).inputs);
        if (at == kNoNode) continue;
        Attrs attrs;
        attrs.set("transpose_a", m.node(g).attrs.get_int("transpose_a", 0));
        attrs.set("transpose_b", m.node(g).attrs.get_int("transpose_b", 0));
        attrs.set("summed", int64_t{summed});
        const std::vector<ValueId> inputs = m.node(g).inputs;
        const std::vector<ValueId> out = fusion::add_before(m, at, "matmul_bgrad", inputs, std::move(attrs), m.node(g).source);
        if (out.size() != 2) return Status::Internal(str_cat("bias_grad_gemm: could not fuse ", m.node(g).source));
        const ValueId dw = m.node(g).outputs[0], db = m.node(r).outputs[0];
        if (m.value(out[0]).type != m.value(dw).type || m.value(out[1]).type != m.value(db).type) {
          return Status::Internal(str_cat("bias_grad_gemm: ", m.node(g).source, " fused as ", type_str(m.value(out[0]).type), ", ",
                                          type_str(m.value(out[1]).type)));
        }
        fusion::take_identity(m, dw, out[0], users[dw]);
        fusion::take_identity(m, db, out[1], users[db]);
        for (NodeId n : {g, r, m.value(out[0]).producer}) walk.touch(m, n);
        m.node(g).dead = true;
        m.node(r).dead = true;
        ++fused;
        break;
      }
    }
    again = walk.deferred();
  }
  return rewrite_report(m, {{"fused", fused}}, str_cat("bias_grad_gemm: ", fused, " bias gradients inside their weight-gradient GEMMs"));
}

}  // namespace memc
