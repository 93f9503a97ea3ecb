// erf-GELU: x·0.5·(1 + erf(x/√2)) in any association and operand order (also x·Φ(x) with
// Φ = 0.5·(1+erf(x/√2)), and erf(x·(1/√2))) → gelu {approximate = "none"}.
#include <cmath>

#include "frontend/fusion.h"
#include "frontend/fusion_util.h"
#include "support/log.h"

namespace memc {
namespace {

using namespace fusion;

class GeluFusion : public FusionPass {
 public:
  std::string_view name() const override { return "gelu"; }
  bool run(Module& m) override {
    int fused = 0;
    for (NodeId id : m.schedule()) {
      if (m.node(id).dead || m.node(id).op != "erf") continue;
      fused += try_fuse(m, id) ? 1 : 0;
    }
    log(1, str_cat("fusion gelu: ", fused, " fused"));
    return fused > 0;
  }

 private:
  // x for erf(x/√2) or erf(x·(1/√2)).
  static ValueId erf_argument(const Module& m, const Node& erf) {
    const Node* scale = producer(m, erf.inputs[0]);
    if (!scale || scale->inputs.size() != 2) return kNoValue;
    if (scale->op == "div" && is_constant_near(m, scale->inputs[1], std::sqrt(2.0))) return scale->inputs[0];
    if (scale->op == "mul") {
      if (is_constant_near(m, scale->inputs[1], 1 / std::sqrt(2.0))) return scale->inputs[0];
      if (is_constant_near(m, scale->inputs[0], 1 / std::sqrt(2.0))) return scale->inputs[1];
    }
    return kNoValue;
  }

  static const Node* single_user(const Module& m, const std::vector<std::vector<NodeId>>& users, ValueId v,
                                 const std::string& op) {
    if (users[v].size() != 1) return nullptr;
    const Node& n = m.node(users[v][0]);
    return n.op == op ? &n : nullptr;
  }

  bool try_fuse(Module& m, NodeId erf_id) {
    const Node& erf = m.node(erf_id);
    const ValueId x = erf_argument(m, erf);
    if (x == kNoValue) return false;
    const auto users = m.users();
    const Node* plus = single_user(m, users, erf.outputs[0], "add");
    if (!plus || !is_constant_near(m, other_operand(*plus, erf.outputs[0]), 1.0)) return false;
    const ValueId p = plus->outputs[0];  // 1 + erf(x/√2)
    const Node* m1 = single_user(m, users, p, "mul");
    if (!m1) return false;
    const ValueId other = other_operand(*m1, p);
    const Node* root = nullptr;
    if (other == x) {  // (x·p)·0.5
      root = single_user(m, users, m1->outputs[0], "mul");
      if (root && !is_constant_near(m, other_operand(*root, m1->outputs[0]), 0.5)) root = nullptr;
    } else if (is_constant_near(m, other, 0.5)) {  // (p·0.5)·x
      root = single_user(m, users, m1->outputs[0], "mul");
      if (root && other_operand(*root, m1->outputs[0]) != x) root = nullptr;
    } else if (const Node* half = producer_if(m, other, "mul")) {  // p·(x·0.5)
      const ValueId h = other_operand(*half, x);
      if (h != kNoValue && is_constant_near(m, h, 0.5)) root = m1;
    }
    if (!root) return false;
    if (m.value(root->outputs[0]).type != m.value(x).type) return false;
    Attrs attrs;
    attrs.set("approximate", std::string("none"));
    const NodeId root_id = root->id;
    const ValueId old_out = root->outputs[0];
    auto outs = add_before(m, root_id, "gelu", {x}, std::move(attrs), m.node(root_id).source);
    if (outs.empty()) return false;
    m.replace_all_uses(old_out, outs[0]);
    m.node(root_id).dead = true;
    return true;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_gelu_fusion() { return std::make_unique<GeluFusion>(); }

}  // namespace memc
