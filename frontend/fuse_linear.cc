// Linear layers: matmul(x, W) with a 2-D weight W (a param, or Transpose(W) of one, or
// transpose_b as Gemm lowers it) [+ bias of shape [N] or [1, N]] → linear(x, W, [b])
// {transpose_w}. Gemm lowers to matmul{transpose_b}+add, so it ends here too.
#include "frontend/fusion.h"
#include "frontend/fusion_util.h"
#include "support/log.h"

namespace memc {
namespace {

using namespace fusion;

bool is_weight(const Module& m, ValueId v) {
  const Value& value = m.value(v);
  return value.type.shape.size() == 2 && (value.role == Role::kParam || value.role == Role::kConstant);
}

class LinearFusion : public FusionPass {
 public:
  std::string_view name() const override { return "linear"; }
  bool run(Module& m) override {
    int fused = 0;
    for (NodeId id : m.schedule()) {
      if (m.node(id).dead || m.node(id).op != "matmul") continue;
      fused += try_fuse(m, id) ? 1 : 0;
    }
    log(1, str_cat("fusion linear: ", fused, " fused"));
    return fused > 0;
  }

 private:
  bool try_fuse(Module& m, NodeId mm_id) {
    const Node& mm = m.node(mm_id);
    if (mm.attrs.get_int("transpose_a", 0)) return false;
    const ValueId x = mm.inputs[0];
    ValueId w = mm.inputs[1];
    int64_t transpose_w = mm.attrs.get_int("transpose_b", 0);
    if (!transpose_w) {
      const Node* t = producer_if(m, w, "transpose");
      if (t && t->attrs.get_ints("perm") == std::vector<int64_t>{1, 0} && is_weight(m, t->inputs[0])) {
        w = t->inputs[0];
        transpose_w = 1;
      }
    }
    if (!is_weight(m, w) || m.value(x).type.shape.size() < 2) return false;
    const Shape& ws = m.value(w).type.shape;
    const int64_t n = transpose_w ? ws[0] : ws[1];
    // Optional bias: the matmul's only user adds a [N] or [1, N] tensor.
    const auto users = m.users();
    NodeId root_id = mm_id;
    ValueId bias = kNoValue;
    if (users[mm.outputs[0]].size() == 1) {
      const Node& add = m.node(users[mm.outputs[0]][0]);
      const ValueId b = add.op == "add" ? other_operand(add, mm.outputs[0]) : kNoValue;
      if (b != kNoValue && b != mm.outputs[0]) {
        const Value& bv = m.value(b);
        const bool shape_ok = bv.type.shape == Shape{n} || bv.type.shape == Shape{1, n};
        if (shape_ok && (bv.role == Role::kParam || bv.role == Role::kConstant) &&
            m.value(add.outputs[0]).type == m.value(mm.outputs[0]).type) {
          bias = b;
          root_id = add.id;
        }
      }
    }
    std::vector<ValueId> inputs = {x, w};
    if (bias != kNoValue) inputs.push_back(bias);
    Attrs attrs;
    attrs.set("transpose_w", transpose_w);
    const ValueId old_out = m.node(root_id).outputs[0];
    auto outs = add_before(m, root_id, "linear", inputs, std::move(attrs), m.node(root_id).source);
    if (outs.empty()) return false;
    if (m.value(outs[0]).type != m.value(old_out).type) {
      m.node(m.value(outs[0]).producer).dead = true;
      return false;
    }
    m.replace_all_uses(old_out, outs[0]);
    m.node(root_id).dead = true;
    return true;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_linear_fusion() { return std::make_unique<LinearFusion>(); }

}  // namespace memc
