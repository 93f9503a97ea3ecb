// LayerNorm written out (torch < 17 exports, TF-style code): with d = x - mean(x),
//   d / sqrt(mean(d^2) + eps) [· scale] [+ bias]   → layernorm(x, scale, [bias]) {axis, eps}
// over trailing axes. A missing scale becomes a constant of ones.
#include "frontend/fusion.h"
#include "frontend/fusion_util.h"
#include "support/log.h"

namespace memc {
namespace {

using namespace fusion;

class LayerNormFusion : public FusionPass {
 public:
  std::string_view name() const override { return "layernorm"; }
  bool run(Module& m) override {
    int fused = 0;
    for (NodeId id : m.schedule()) {
      if (m.node(id).dead || m.node(id).op != "sub") continue;
      fused += try_fuse(m, id) ? 1 : 0;
    }
    log(1, str_cat("fusion layernorm: ", fused, " fused"));
    return fused > 0;
  }

 private:
  // Axis k when `axes` is exactly k..rank-1.
  static int64_t trailing_axis(const std::vector<int64_t>& axes, int64_t rank) {
    if (axes.empty()) return -1;
    for (size_t i = 0; i < axes.size(); ++i) {
      if (axes[i] != rank - static_cast<int64_t>(axes.size()) + static_cast<int64_t>(i)) return -1;
    }
    return axes.front();
  }

  static const Node* only_user(const Module& m, const Users& users, ValueId v,
                               const std::string& op) {
    for (NodeId u : users[v]) {
      if (m.node(u).op == op) return &m.node(u);
    }
    return nullptr;
  }

  bool try_fuse(Module& m, NodeId sub_id) {
    const Node& sub = m.node(sub_id);
    const ValueId x = sub.inputs[0], d = sub.outputs[0];
    const Node* mean = producer_if(m, sub.inputs[1], "reduce_mean");
    if (!mean || mean->inputs[0] != x || !mean->attrs.get_int("keepdims", 1)) return false;
    const int64_t rank = static_cast<int64_t>(m.value(x).type.shape.size());
    const auto axes = mean->attrs.get_ints("axes");
    const int64_t axis = trailing_axis(axes, rank);
    if (axis < 0 || !is_float(m.value(x).type.dtype)) return false;
    const auto users = m.users();
    // Variance: mean(d^2) via pow(d, 2) or d·d.
    const Node* square = only_user(m, users, d, "pow");
    if (square && !(square->inputs[0] == d && is_constant_near(m, square->inputs[1], 2.0))) square = nullptr;
    if (!square) {
      square = only_user(m, users, d, "mul");
      if (square && !(square->inputs[0] == d && square->inputs[1] == d)) square = nullptr;
    }
    if (!square || users[square->outputs[0]].size() != 1) return false;
    const Node* var = &m.node(users[square->outputs[0]][0]);
    if (var->op != "reduce_mean" || var->attrs.get_ints("axes") != axes || !var->attrs.get_int("keepdims", 1)) return false;
    if (users[var->outputs[0]].size() != 1) return false;
    const Node* add_eps = &m.node(users[var->outputs[0]][0]);
    if (add_eps->op != "add") return false;
    const auto eps = constant_value(m, other_operand(*add_eps, var->outputs[0]));
    if (!eps || *eps < 0 || *eps > 1) return false;
    if (users[add_eps->outputs[0]].size() != 1) return false;
    const Node* sqrt = &m.node(users[add_eps->outputs[0]][0]);
    if (sqrt->op != "sqrt" || users[sqrt->outputs[0]].size() != 1) return false;
    const Node* div = &m.node(users[sqrt->outputs[0]][0]);
    if (div->op != "div" || div->inputs[0] != d || div->inputs[1] != sqrt->outputs[0]) return false;
    // Optional scale and bias, each broadcasting over the normalized dims only.
    const Shape& xs = m.value(x).type.shape;
    const Shape normalized(xs.begin() + axis, xs.end());
    auto fits = [&](ValueId v) {
      const Shape& s = m.value(v).type.shape;
      return s.size() <= normalized.size() && m.value(v).type.dtype == m.value(x).type.dtype;
    };
    const Node* root = div;
    ValueId scale = kNoValue, bias = kNoValue;
    if (users[div->outputs[0]].size() == 1 && m.node(users[div->outputs[0]][0]).op == "mul") {
      const Node* mul = &m.node(users[div->outputs[0]][0]);
      scale = other_operand(*mul, div->outputs[0]);
      if (scale != kNoValue && fits(scale)) root = mul;
      else scale = kNoValue;
    }
    if (scale != kNoValue && users[root->outputs[0]].size() == 1 && m.node(users[root->outputs[0]][0]).op == "add") {
      const Node* add = &m.node(users[root->outputs[0]][0]);
      bias = other_operand(*add, root->outputs[0]);
      if (bias != kNoValue && fits(bias)) root = add;
      else bias = kNoValue;
    }
    const NodeId root_id = root->id;
    const ValueId old_out = root->outputs[0];
    if (m.value(old_out).type != m.value(x).type) return false;
    if (scale == kNoValue) {
      Tensor ones = Tensor::zeros(m.value(x).type.dtype, normalized);
      for (int64_t i = 0; i < ones.numel(); ++i) ones.set_from_double(i, 1.0);
      scale = m.add_constant(std::move(ones), "ln_ones");
      std::vector<NodeId> order;
      const NodeId cst = m.value(scale).producer;
      for (NodeId n : m.schedule()) {
        if (n == cst) continue;
        if (n == root_id) order.push_back(cst);
        order.push_back(n);
      }
      m.set_schedule(order);
    }
    std::vector<ValueId> inputs = {x, scale};
    if (bias != kNoValue) inputs.push_back(bias);
    Attrs attrs;
    attrs.set("axis", axis);
    attrs.set("eps", *eps);
    auto outs = add_before(m, root_id, "layernorm", inputs, std::move(attrs), m.node(root_id).source);
    if (outs.empty()) return false;
    m.replace_all_uses(old_out, outs[0]);
    m.node(root_id).dead = true;
    return true;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_layernorm_fusion() { return std::make_unique<LayerNormFusion>(); }

}  // namespace memc
