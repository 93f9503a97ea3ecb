#include "passes/fuse_elementwise.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "frontend/fusion_util.h"
#include "ir/fused_program.h"

namespace memc {
namespace {

constexpr size_t kMaxRank = 8;  // the CUDA body's strided maps

bool fusable_value(const Module& m, ValueId v) {
  if (v == kNoValue) return false;
  const Value& value = m.value(v);
  return value.space == MemSpace::kDevice && value.type.shape.size() <= kMaxRank && fusable_dtype(value.type.dtype);
}

// A dropout's mask output, when it has one, must be unread: the fused step makes only y.
bool fusable_node(const Module& m, const Node& n, const Users& users, const std::vector<bool>& is_output) {
  if (n.dead || !is_fusable_op(n.op) || n.outputs.empty() || n.inputs.empty()) return false;
  for (size_t k = 1; k < n.outputs.size(); ++k) {
    if (n.op != "dropout" || !users[n.outputs[k]].empty() || is_output[n.outputs[k]]) return false;
  }
  for (ValueId v : n.inputs) {
    if (!fusable_value(m, v) || (m.value(v).type.dtype == DType::kBool && !fused_step_reads_i1(n.op))) return false;
  }
  return fusable_value(m, n.outputs[0]);
}

class Grouper {
 public:
  explicit Grouper(const Module& m) : m_(m), users_(m.users()), is_output_(m.values().size(), false) {
    for (ValueId v : m.outputs()) is_output_[v] = true;
    const std::vector<NodeId> order = m.schedule();
    for (size_t i = 0; i < order.size(); ++i) position_[order[i]] = i;
  }
  int dropouts(const std::vector<NodeId>& members) const {
    return static_cast<int>(std::count_if(members.begin(), members.end(), [&](NodeId n) { return m_.node(n).op == "dropout"; }));
  }
  bool fusable(NodeId n) const { return fusable_node(m_, m_.node(n), users_, is_output_); }

  // The chain ending at `root`, in schedule order (just the root when nothing joins it).
  std::vector<NodeId> grow(NodeId root) {
    std::vector<NodeId> members = {root};
    std::unordered_set<NodeId> in_group = {root};
    const Shape& shape = m_.value(m_.node(root).outputs[0]).type.shape;
    for (size_t k = 0; k < members.size(); ++k) {
      for (ValueId v : m_.node(members[k]).inputs) {
        const NodeId p = m_.value(v).producer;
        if (p == kNoNode || in_group.count(p) || assigned_.count(p) || !joins(p, v, shape, in_group)) continue;
        if (members.size() + 1 > static_cast<size_t>(kFusedMaxSteps)) continue;
        if (m_.node(p).op == "dropout" && dropouts(members) + 1 > kFusedMaxDropouts) continue;
        add_within_inputs(p, members, in_group);
      }
    }
    const NodeId u = second_result(root, in_group);
    if (u != kNoNode && members.size() + 1 <= static_cast<size_t>(kFusedMaxSteps)) add_within_inputs(u, members, in_group);
    if (members.size() >= 2) {
      for (NodeId n : members) assigned_.insert(n);
    }
    std::sort(members.begin(), members.end(), [&](NodeId a, NodeId b) { return position_.at(a) < position_.at(b); });
    return members;
  }

  // Adds n to the group unless the group would then read more than kFusedMaxInputs values.
  void add_within_inputs(NodeId n, std::vector<NodeId>& members, std::unordered_set<NodeId>& in_group) const {
    in_group.insert(n);
    members.push_back(n);
    if (external_inputs(members, in_group).size() > static_cast<size_t>(kFusedMaxInputs)) {
      in_group.erase(n);
      members.pop_back();
    }
  }

  // A consumer of the root's result that the fused node can also compute, as its second result
  // (a gradient sum that the next GEMM reads in bf16 and a later add in f32: add, then cast):
  // fusable, of the chain's shape, no larger than the root's result, and reading besides it only
  // values made before the root, so computing it at the root's place reads nothing early.
  NodeId second_result(NodeId root, const std::unordered_set<NodeId>& in_group) const {
    const ValueId r = m_.node(root).outputs[0];
    if (users_[r].size() < 2 && !is_output_[r]) return kNoNode;  // a lone reader would have taken the root in
    for (NodeId u : users_[r]) {
      const Node& node = m_.node(u);
      if (in_group.count(u) || assigned_.count(u) || !fusable(u)) continue;
      const Value& out = m_.value(node.outputs[0]);
      if (out.type.shape != m_.value(r).type.shape || out.type.bytes() > m_.value(r).type.bytes()) continue;
      if (node.op == "dropout" && dropouts(std::vector<NodeId>(in_group.begin(), in_group.end())) + 1 > kFusedMaxDropouts) continue;
      bool early = true;
      for (ValueId v : node.inputs) {
        // A node fused already (not in position_) sits at a later chain's place: not early.
        const NodeId p = m_.value(v).producer;
        const auto at = position_.find(p);
        early = early && (v == r || p == kNoNode || (at != position_.end() && at->second < position_.at(root)));
      }
      if (early) return u;
    }
    return kNoNode;
  }

  // The values the group reads that it does not make, in the order its steps first read them.
  std::vector<ValueId> external_inputs(const std::vector<NodeId>& members, const std::unordered_set<NodeId>& in_group) const {
    std::vector<NodeId> sorted = members;
    std::sort(sorted.begin(), sorted.end(), [&](NodeId a, NodeId b) { return position_.at(a) < position_.at(b); });
    std::vector<ValueId> inputs;
    for (NodeId n : sorted) {
      for (ValueId v : m_.node(n).inputs) {
        const NodeId p = m_.value(v).producer;
        if ((p == kNoNode || !in_group.count(p)) && std::find(inputs.begin(), inputs.end(), v) == inputs.end()) inputs.push_back(v);
      }
    }
    return inputs;
  }

 private:
  // Whether producer p (of v) computes an intermediate only the group reads.
  bool joins(NodeId p, ValueId v, const Shape& shape, const std::unordered_set<NodeId>& in_group) const {
    const Value& value = m_.value(v);
    if (!fusable(p) || value.role != Role::kActivation || is_output_[v] || value.type.shape != shape) return false;
    for (NodeId u : users_[v]) {
      if (!in_group.count(u)) return false;
    }
    // A producer whose result is smaller than an input it reads (a mask from an activation, a
    // cast to 16 bits) stays apart: the schedule may run it early so that input dies sooner,
    // which fused into a later consumer it could not.
    for (ValueId in : m_.node(p).inputs) {
      if (m_.value(in).type.bytes() > value.type.bytes()) return false;
    }
    return true;
  }

  const Module& m_;
  Users users_;
  std::vector<bool> is_output_;
  std::unordered_map<NodeId, size_t> position_;
  std::unordered_set<NodeId> assigned_;
};

// The group's program; its first input is one the output may overwrite (the same shape and
// bytes: liveness's in-place rule), if any.
FusedProgram program_of(const Module& m, const std::vector<NodeId>& members, const std::vector<NodeId>& roots,
                        std::vector<ValueId>& inputs) {
  const Value& out = m.value(m.node(roots.front()).outputs[0]);
  const auto same_bytes = std::find_if(inputs.begin(), inputs.end(), [&](ValueId v) {
    return m.value(v).type.bytes() == out.type.bytes() && m.value(v).type.shape == out.type.shape;
  });
  if (same_bytes != inputs.end()) std::rotate(inputs.begin(), same_bytes, same_bytes + 1);
  std::unordered_map<ValueId, int> slot;
  for (size_t i = 0; i < inputs.size(); ++i) slot[inputs[i]] = static_cast<int>(i);
  FusedProgram p;
  p.inputs = static_cast<int>(inputs.size());
  for (NodeId n : members) {
    const Node& node = m.node(n);
    FusedStep step{node.op, {}, {}, fused_step_attr_text(node.op, node.attrs)};
    for (ValueId v : node.inputs) step.args.push_back(slot.at(v));
    slot[node.outputs[0]] = p.slots();
    p.steps.push_back(std::move(step));
  }
  // The results: the root's, and a second result's (Grouper::second_result), in schedule order.
  for (NodeId n : roots) p.results.push_back(slot.at(m.node(n).outputs[0]));
  return p;
}

}  // namespace

Expected<PassReport> FuseElementwise::run(Module& m) {
  Grouper grouper(m);
  std::vector<NodeId> order = m.schedule();
  std::unordered_map<NodeId, NodeId> fused_at;  // chain's last node → its fused node
  int64_t groups = 0, nodes = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeId root = *it;
    if (!grouper.fusable(root)) continue;
    const std::vector<NodeId> members = grouper.grow(root);
    if (members.size() < 2) continue;
    std::unordered_set<NodeId> in_group(members.begin(), members.end());
    std::vector<ValueId> inputs = grouper.external_inputs(members, in_group);
    std::vector<NodeId> roots = {root};
    if (members.back() != root) roots.push_back(members.back());  // a second result comes after the root
    FusedProgram program = program_of(m, members, roots, inputs);
    Attrs attrs;
    write_fused_program(program, attrs);
    auto out = m.add_node("fused_elementwise", inputs, std::move(attrs), m.node(root).source);
    if (!out.ok()) return Status::Internal(str_cat("fuse_elementwise: ", fused_program_text(program), ": ", out.status().message()));
    for (size_t k = 0; k < roots.size(); ++k) {
      const ValueId result = m.node(roots[k]).outputs[0];
      if (out->size() != roots.size() || m.value((*out)[k]).type != m.value(result).type) {
        return Status::Internal(str_cat("fuse_elementwise: ", m.node(roots[k]).source, " fused as ", type_str(m.value((*out)[k]).type)));
      }
      fusion::take_identity(m, result, (*out)[k]);
    }
    for (NodeId n : members) m.node(n).dead = true;
    fused_at[root] = m.value(out->front()).producer;
    ++groups;
    nodes += static_cast<int64_t>(members.size());
  }
  if (groups > 0) {
    std::vector<NodeId> fused_order;
    for (NodeId n : order) {
      if (auto f = fused_at.find(n); f != fused_at.end()) fused_order.push_back(f->second);
      fused_order.push_back(n);
    }
    m.set_schedule(fused_order);
  }
  return rewrite_report(m, {{"groups", groups}, {"nodes", nodes}}, str_cat("fuse_elementwise: ", nodes, " elementwise ops as ", groups, " kernels"));
}

}  // namespace memc
