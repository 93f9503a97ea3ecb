// erf-GELU: x·0.5·(1 + erf(x/√2)) in any association and operand order (also x·Φ(x) with
// Φ = 0.5·(1+erf(x/√2)), and erf(x·(1/√2))) → gelu {approximate = "none"}.
// tanh-GELU: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as the modelling code of GPT-2, GPT-Neo,
// GPT-J and Bloom writes it in its own association (HF's NewGELUActivation, FastGELUActivation,
// bloom_gelu) → gelu {approximate = "tanh"}: the ops between x and the result, scalar
// constants and mul, add, sub, div, pow and one tanh, are recognized by the function they
// compute, evaluated at sample points, not by their order.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

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
    for (NodeId id : m.schedule()) {
      if (m.node(id).dead || m.node(id).op != "tanh") continue;
      fused += try_fuse_tanh(m, id) ? 1 : 0;
    }
    log(1, str_cat("fusion gelu: ", fused, " fused"));
    return fused > 0;
  }

 private:
  // The one non-constant value the expression `v` reads through `ops` (and scalar constants),
  // or kNoValue; `nodes` collects the nodes on the way.
  // The walk stops at `stop` (the candidate x, which may itself be an add: a linear's bias).
  static ValueId single_variable(const Module& m, ValueId v, const std::set<std::string>& ops, std::set<NodeId>& nodes, ValueId stop) {
    if (constant_value(m, v)) return kNoValue;
    const Node* p = producer(m, v);
    if (v == stop || !p || !ops.count(p->op)) return v;
    nodes.insert(p->id);
    ValueId x = kNoValue;
    for (ValueId in : p->inputs) {
      if (constant_value(m, in)) continue;
      const ValueId leaf = single_variable(m, in, ops, nodes, stop);
      if (leaf == kNoValue || (x != kNoValue && leaf != x)) return kNoValue;
      x = leaf;
    }
    return x;
  }

  // `v` at x = `at`, through the nodes of single_variable (NaN where an op is not one of them).
  static double evaluate(const Module& m, ValueId v, ValueId x, double at) {
    if (v == x) return at;
    if (auto c = constant_value(m, v)) return *c;
    const Node* p = producer(m, v);
    if (!p) return NAN;
    const double a = evaluate(m, p->inputs[0], x, at);
    if (p->op == "tanh") return std::tanh(a);
    if (p->inputs.size() != 2) return NAN;
    const double b = evaluate(m, p->inputs[1], x, at);
    if (p->op == "add") return a + b;
    if (p->op == "sub") return a - b;
    if (p->op == "mul") return a * b;
    if (p->op == "div") return a / b;
    if (p->op == "pow") return std::pow(a, b);
    return NAN;
  }

  // Every node of `nodes` but `root` is read only inside `nodes` (so the fused op replaces them all).
  static bool closed(const Module& m, const Users& users, const std::set<NodeId>& nodes, NodeId root) {
    for (NodeId n : nodes) {
      if (n == root) continue;
      for (ValueId out : m.node(n).outputs) {
        if (is_output(m, out)) return false;
        for (NodeId u : users[out])
          if (!nodes.count(u)) return false;
      }
    }
    return true;
  }

  bool try_fuse_tanh(Module& m, NodeId tanh_id) {
    static const std::set<std::string> kOps = {"mul", "add", "sub", "div", "pow", "tanh"};
    const auto users = m.users();
    auto gelu = [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); };
    // The result is at most three single-reader arithmetic steps after the tanh (1 + t, then
    // the products with x and 0.5).
    ValueId v = m.node(tanh_id).outputs[0];
    for (int step = 0; step < 3; ++step) {
      const Node* next = only_reader(m, users, v);
      if (!next || !kOps.count(next->op) || next->op == "tanh") return false;
      v = next->outputs[0];
      // x: the values the arithmetic reaches, nearest first (the walk to each stops there).
      std::set<NodeId> reached;
      single_variable(m, v, kOps, reached, kNoValue);
      std::vector<ValueId> candidates;
      for (NodeId n : reached) {
        for (ValueId in : m.node(n).inputs)
          if (!constant_value(m, in) && std::find(candidates.begin(), candidates.end(), in) == candidates.end()) candidates.push_back(in);
      }
      ValueId x = kNoValue;
      std::set<NodeId> nodes;
      for (ValueId c : candidates) {
        nodes.clear();
        const TensorType& type = m.value(c).type;
        if (single_variable(m, v, kOps, nodes, c) != c || !nodes.count(tanh_id) || m.value(v).type != type || !is_float(type.dtype)) continue;
        bool same = true;
        for (double at : {-4.0, -1.7, -0.6, -0.05, 0.3, 1.1, 2.9}) {
          same = same && std::fabs(evaluate(m, v, c, at) - gelu(at)) <= 1e-6 * (1 + std::fabs(gelu(at)));
        }
        if (same && closed(m, users, nodes, next->id)) {
          x = c;
          break;
        }
      }
      if (x == kNoValue) continue;
      Attrs attrs;
      attrs.set("approximate", std::string("tanh"));
      const NodeId root_id = next->id;
      auto outs = add_before(m, root_id, "gelu", {x}, std::move(attrs), m.node(root_id).source);
      if (outs.empty()) return false;
      m.replace_all_uses(v, outs[0]);
      m.node(root_id).dead = true;
      return true;
    }
    return false;
  }

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

  static const Node* single_user(const Module& m, const Users& users, ValueId v,
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
