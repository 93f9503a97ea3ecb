#include "frontend/fusion_util.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "frontend/fusion.h"
#include "support/log.h"

namespace memc::fusion {

const Node* producer(const Module& m, ValueId v) {
  if (v == kNoValue) return nullptr;
  const NodeId p = m.value(v).producer;
  if (p == kNoNode || m.node(p).dead) return nullptr;
  return &m.node(p);
}

const Node* producer_if(const Module& m, ValueId v, const std::string& op) {
  const Node* n = producer(m, v);
  return n && n->op == op ? n : nullptr;
}

std::optional<double> constant_value(const Module& m, ValueId v) {
  const Node* n = producer_if(m, v, "constant");
  if (!n) return std::nullopt;
  const Tensor* t = n->attrs.get_tensor("value");
  if (!t || t->numel() < 1 || !is_float(t->dtype())) return std::nullopt;
  const double first = t->get_as_double(0);
  for (int64_t i = 1; i < t->numel(); ++i) {
    if (t->get_as_double(i) != first) return std::nullopt;
  }
  return first;
}

bool is_constant_near(const Module& m, ValueId v, double expected, double tolerance) {
  auto c = constant_value(m, v);
  return c && std::abs(*c - expected) <= tolerance * std::max(1.0, std::abs(expected));
}

bool is_output(const Module& m, ValueId v) { return std::find(m.outputs().begin(), m.outputs().end(), v) != m.outputs().end(); }

const Node* only_reader(const Module& m, const Users& users, ValueId v) {
  const Node* reader = nullptr;
  for (NodeId u : users[v]) {
    if (m.node(u).dead) continue;
    if (reader || std::count(m.node(u).inputs.begin(), m.node(u).inputs.end(), v) != 1) return nullptr;
    reader = &m.node(u);
  }
  return reader && !is_output(m, v) ? reader : nullptr;
}

bool is_16bit_cast(const Module& m, const Node* n, bool narrowing) {
  if (!n || n->dead || n->op != "cast" || n->inputs.size() != 1) return false;
  const DType from = m.value(n->inputs[0]).type.dtype, to = m.value(n->outputs[0]).type.dtype;
  return narrowing ? from == DType::kF32 && is_16bit_float(to) : is_16bit_float(from) && to == DType::kF32;
}

ValueId other_operand(const Node& n, ValueId known) {
  if (n.inputs.size() != 2) return kNoValue;
  if (n.inputs[0] == known) return n.inputs[1];
  if (n.inputs[1] == known) return n.inputs[0];
  return kNoValue;
}

std::vector<ValueId> add_before(Module& m, NodeId anchor, const std::string& op, std::vector<ValueId> inputs,
                                Attrs attrs, const std::string& source) {
  auto outs = m.add_node(op, std::move(inputs), std::move(attrs), source);
  if (!outs.ok()) return {};
  m.move_before(m.value(outs->front()).producer, anchor);
  return *outs;
}

Walk::Walk(const Module& m) : users_(m.users()), place_(m.nodes().size(), -1), touched_(m.values().size(), 0) {
  const std::vector<NodeId> order = m.schedule();
  for (size_t i = 0; i < order.size(); ++i) place_[order[i]] = static_cast<int32_t>(i);
}

bool Walk::fresh(const Module& m, NodeId n) const {
  if (n == kNoNode || n >= static_cast<NodeId>(place_.size()) || place_[n] < 0) return false;
  const Node& node = m.node(n);
  return std::none_of(node.inputs.begin(), node.inputs.end(), [&](ValueId v) { return touched(v); }) &&
         std::none_of(node.outputs.begin(), node.outputs.end(), [&](ValueId v) { return touched(v); });
}

void Walk::touch(const Module& m, NodeId n) {
  if (touched_.size() < m.values().size()) touched_.resize(m.values().size(), 0);
  for (ValueId v : m.node(n).inputs)
    if (v != kNoValue) touched_[v] = 1;
  for (ValueId v : m.node(n).outputs) touched_[v] = 1;
}

NodeId Walk::fused_place(const Module& m, NodeId a, NodeId b, const std::vector<ValueId>& inputs) const {
  if (place_[a] < 0 || place_[b] < 0) return kNoNode;
  const NodeId later = place_[a] > place_[b] ? a : b, earlier = later == a ? b : a;
  bool ready = true;
  for (ValueId v : inputs) {
    const NodeId p = m.value(v).producer;
    ready = ready && (p == kNoNode || (p < static_cast<NodeId>(place_.size()) && place_[p] >= 0 && place_[p] < place_[earlier]));
  }
  if (ready) return earlier;
  // Otherwise at the later node, if nothing between reads the earlier one's outputs.
  for (ValueId v : m.node(earlier).outputs) {
    for (NodeId u : users_[v]) {
      if (u != later && place_[u] < place_[later]) return kNoNode;
    }
  }
  return later;
}

namespace {

void take_name_and_place(Module& m, ValueId from, ValueId to) {
  const Value old = m.value(from);
  m.rename(from, old.name + "_unfused");
  m.rename(to, old.name);
  Value& v = m.value(to);
  v.source_name = old.source_name, v.role = old.role, v.space = old.space;
}

}  // namespace

void take_identity(Module& m, ValueId from, ValueId to) {
  take_name_and_place(m, from, to);
  m.replace_all_uses(from, to);
}

void take_identity(Module& m, ValueId from, ValueId to, std::span<const NodeId> readers) {
  take_name_and_place(m, from, to);
  m.replace_uses(from, to, readers);
}

}  // namespace memc::fusion

namespace memc {

int run_fusions(Module& module, bool attention) {
  std::vector<std::unique_ptr<FusionPass>> passes;
  passes.push_back(make_gelu_fusion());
  passes.push_back(make_layernorm_fusion());
  passes.push_back(make_linear_fusion());
  if (attention) passes.push_back(make_attention_fusion());
  int total = 0;
  for (auto& pass : passes) {
    const size_t before = module.schedule().size();
    const bool changed = pass->run(module);
    const int removed = module.eliminate_dead_nodes();
    const size_t after = module.schedule().size();
    if (changed) {
      ++total;
      log(1, str_cat("fusion ", pass->name(), ": ", before, " → ", after, " nodes (", removed, " removed)"));
    }
  }
  module.compact();
  return total;
}

}  // namespace memc
