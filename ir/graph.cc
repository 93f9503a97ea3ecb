#include "ir/graph.h"

#include <algorithm>

#include "ir/op_registry.h"

namespace memc {

std::string_view role_name(Role r) {
  switch (r) {
    case Role::kInput: return "input";
    case Role::kParam: return "param";
    case Role::kConstant: return "constant";
    case Role::kActivation: return "activation";
    case Role::kGrad: return "grad";
    case Role::kOptimizerState: return "optimizer_state";
    case Role::kMasterWeight: return "master_weight";
    case Role::kScalar: return "scalar";
    case Role::kBuffer: return "buffer";
  }
  return "?";
}

std::optional<Role> parse_role(std::string_view s) {
  for (Role r : {Role::kInput, Role::kParam, Role::kConstant, Role::kActivation, Role::kGrad,
                 Role::kOptimizerState, Role::kMasterWeight, Role::kScalar, Role::kBuffer}) {
    if (role_name(r) == s) return r;
  }
  return std::nullopt;
}

std::string_view space_name(MemSpace s) { return s == MemSpace::kHost ? "host" : "device"; }

std::string type_str(const TensorType& t) {
  std::string s = "tensor<";
  for (int64_t d : t.shape) s += std::to_string(d) + "x";
  s += dtype_name(t.dtype);
  return s + ">";
}

std::string sanitize_name(const std::string& raw) {
  std::string s;
  for (char c : raw) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.' || c == '-';
    s += ok ? c : '_';
  }
  if (s.empty()) return "v";
  const bool all_digits = std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  if (!all_digits && std::isdigit(static_cast<unsigned char>(s[0]))) s = "v" + s;
  return s;
}

std::string Module::unique_name(const std::string& hint) {
  std::string base = sanitize_name(hint);
  if (!by_name_.count(base)) return base;
  // Probing starts after the last suffix handed out for this base: many copies of one value
  // (remat clones, micro-batches) stay linear, not quadratic.
  int& next = next_suffix_[base];
  for (int i = std::max(next, 1);; ++i) {
    std::string candidate = sanitize_name(base + "_" + std::to_string(i));
    if (!by_name_.count(candidate)) {
      next = i + 1;
      return candidate;
    }
  }
}

void Module::rename(ValueId id, const std::string& hint) {
  Value& v = values_.at(id);
  by_name_.erase(v.name);
  v.name = unique_name(hint);
  by_name_[v.name] = id;
}

ValueId Module::new_value(const std::string& name_hint, TensorType type, Role role) {
  Value v;
  v.id = static_cast<ValueId>(values_.size());
  v.name = unique_name(name_hint.empty() ? std::to_string(v.id) : name_hint);
  v.source_name = name_hint;
  v.type = std::move(type);
  v.role = role;
  by_name_[v.name] = v.id;
  values_.push_back(std::move(v));
  return values_.back().id;
}

ValueId Module::add_argument(const std::string& name, TensorType type, Role role) {
  ValueId id = new_value(name, std::move(type), role);
  arguments_.push_back(id);
  return id;
}

Status Module::remove_argument(ValueId arg) {
  auto it = std::find(arguments_.begin(), arguments_.end(), arg);
  if (it == arguments_.end()) return Status::Internal(str_cat("%", values_.at(arg).name, " is not an argument"));
  for (NodeId n : schedule()) {
    for (ValueId v : nodes_[n].inputs) {
      if (v == arg) return Status::Internal(str_cat("argument %", values_[arg].name, " is still read by memc.", nodes_[n].op));
    }
  }
  if (std::find(outputs_.begin(), outputs_.end(), arg) != outputs_.end() ||
      std::find(output_updates_.begin(), output_updates_.end(), arg) != output_updates_.end()) {
    return Status::Internal(str_cat("argument %", values_[arg].name, " is an output or is updated"));
  }
  arguments_.erase(it);
  weights_.erase(arg);
  return Status::Ok();
}

void Module::keep_outputs(size_t count) {
  std::vector<ValueId> outputs, updates;
  size_t plain = 0;
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const ValueId arg = i < output_updates_.size() ? output_updates_[i] : kNoValue;
    if (arg == kNoValue && plain++ >= count) continue;
    outputs.push_back(outputs_[i]);
    updates.push_back(arg);
  }
  outputs_ = std::move(outputs);
  output_updates_ = std::move(updates);
}

ValueId Module::find_value(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? kNoValue : it->second;
}

NodeId Module::add_node_typed(const std::string& op, std::vector<ValueId> inputs, Attrs attrs,
                              std::vector<TensorType> output_types,
                              std::vector<std::string> output_names, const std::string& source) {
  Node n;
  n.id = static_cast<NodeId>(nodes_.size());
  n.op = op;
  n.def = OpRegistry::get().find(op);
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.source = source;
  for (size_t i = 0; i < output_types.size(); ++i) {
    const std::string hint = i < output_names.size() ? output_names[i] : "";
    ValueId v = new_value(hint, output_types[i], Role::kActivation);
    values_[v].producer = n.id;
    n.outputs.push_back(v);
  }
  nodes_.push_back(std::move(n));
  order_.push_back(nodes_.back().id);
  return nodes_.back().id;
}

Expected<std::vector<ValueId>> Module::add_node(const std::string& op, std::vector<ValueId> inputs,
                                                Attrs attrs, const std::string& source,
                                                int num_outputs) {
  Node probe;
  probe.op = op;
  probe.def = OpRegistry::get().find(op);
  probe.inputs = inputs;
  probe.attrs = attrs;
  probe.source = source;
  if (num_outputs > 0) probe.outputs.assign(num_outputs, kNoValue);
  std::vector<TensorType> in_types;
  std::vector<bool> present;
  for (ValueId v : inputs) {
    present.push_back(v != kNoValue);
    if (v != kNoValue) in_types.push_back(values_.at(v).type);
  }
  std::vector<TensorType> out_types;
  Status st = infer_types(probe, in_types, present, out_types);
  if (!st.ok()) return st;
  NodeId id = add_node_typed(op, std::move(inputs), std::move(attrs), std::move(out_types), {}, source);
  return nodes_[id].outputs;
}

ValueId Module::add_constant(Tensor value, const std::string& name_hint) {
  TensorType t{value.dtype(), value.shape()};
  Attrs attrs;
  attrs.set("value", std::move(value));
  NodeId id = add_node_typed("constant", {}, std::move(attrs), {t}, {name_hint});
  ValueId out = nodes_[id].outputs[0];
  values_[out].role = Role::kConstant;
  return out;
}

std::vector<NodeId> Module::schedule() const {
  std::vector<NodeId> live;
  live.reserve(order_.size());
  for (NodeId n : order_) {
    MEMC_CHECK(n >= 0 && n < static_cast<NodeId>(nodes_.size()), "schedule names node ", n, " of ", nodes_.size());
    if (!nodes_[n].dead) live.push_back(n);
  }
  return live;
}

void Module::set_schedule(const std::vector<NodeId>& order) { order_ = order; }

void Module::move_before(NodeId n, NodeId anchor) {
  if (auto it = std::find(order_.rbegin(), order_.rend(), n); it != order_.rend()) order_.erase(std::next(it).base());
  if (nodes_.at(anchor).dead) return;
  if (auto at = std::find(order_.begin(), order_.end(), anchor); at != order_.end()) order_.insert(at, n);
}

void Module::replace_all_uses(ValueId from, ValueId to) {
  for (Node& n : nodes_) {
    if (n.dead) continue;
    for (ValueId& v : n.inputs) {
      if (v == from) v = to;
    }
  }
  for (ValueId& v : outputs_) {
    if (v == from) v = to;
  }
}

void Module::replace_uses(ValueId from, ValueId to, std::span<const NodeId> readers) {
  for (NodeId n : readers) {
    for (ValueId& v : nodes_[n].inputs) {
      if (v == from) v = to;
    }
  }
  for (ValueId& v : outputs_) {
    if (v == from) v = to;
  }
}

Users Module::users() const {
  Users u;
  u.start_.assign(values_.size() + 1, 0);
  const std::vector<NodeId> order = schedule();
  for (NodeId n : order) {
    for (ValueId v : nodes_[n].inputs) {
      if (v != kNoValue) ++u.start_[v + 1];
    }
  }
  for (size_t v = 1; v < u.start_.size(); ++v) u.start_[v] += u.start_[v - 1];
  u.readers_.resize(u.start_.back());
  std::vector<int32_t> next(u.start_.begin(), u.start_.end() - 1);
  for (NodeId n : order) {
    for (ValueId v : nodes_[n].inputs) {
      if (v != kNoValue) u.readers_[next[v]++] = n;
    }
  }
  return u;
}

int Module::eliminate_dead_nodes() {
  std::vector<bool> needed(values_.size(), false);
  for (ValueId v : outputs_) needed[v] = true;
  int removed = 0;
  std::vector<NodeId> order = schedule();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node& n = nodes_[*it];
    const bool used = std::any_of(n.outputs.begin(), n.outputs.end(), [&](ValueId v) { return needed[v]; });
    if (!used) {
      n.dead = true;
      ++removed;
      continue;
    }
    for (ValueId v : n.inputs) {
      if (v != kNoValue) needed[v] = true;
    }
  }
  return removed;
}

void Module::compact() {
  // Keep arguments, outputs of live nodes; drop the rest and renumber.
  std::vector<NodeId> order = schedule();
  std::vector<ValueId> value_map(values_.size(), kNoValue);
  std::vector<Value> new_values;
  auto keep = [&](ValueId v) {
    if (value_map[v] != kNoValue) return;
    value_map[v] = static_cast<ValueId>(new_values.size());
    new_values.push_back(values_[v]);
    new_values.back().id = value_map[v];
  };
  for (ValueId v : arguments_) keep(v);
  for (NodeId n : order) {
    for (ValueId v : nodes_[n].outputs) keep(v);
  }
  std::vector<Node> new_nodes;
  for (NodeId n : order) {
    Node node = nodes_[n];
    node.id = static_cast<NodeId>(new_nodes.size());
    for (ValueId& v : node.inputs) {
      if (v != kNoValue) v = value_map[v];
    }
    for (ValueId& v : node.outputs) {
      v = value_map[v];
      new_values[v].producer = node.id;
    }
    new_nodes.push_back(std::move(node));
  }
  for (ValueId& v : arguments_) v = value_map[v];
  for (ValueId& v : outputs_) v = value_map[v];
  for (ValueId& v : output_updates_) {
    if (v != kNoValue) v = value_map[v];
  }
  std::unordered_map<ValueId, Tensor> new_weights;
  for (auto& [v, t] : weights_) {
    if (value_map[v] != kNoValue) new_weights[value_map[v]] = t;
  }
  values_ = std::move(new_values);
  nodes_ = std::move(new_nodes);
  weights_ = std::move(new_weights);
  order_.clear();
  for (const Node& n : nodes_) order_.push_back(n.id);
  by_name_.clear();
  for (const Value& v : values_) by_name_[v.name] = v.id;
}

}  // namespace memc
