#include "ir/op_registry.h"

#include <algorithm>
#include <mutex>

namespace memc {

OpRegistry& OpRegistry::get() {
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();
    register_all_ops(*r);
    return r;
  }();
  return *registry;
}

void OpRegistry::add(OpDef def) {
  MEMC_CHECK(find(def.name) == nullptr, "op registered twice: ", def.name);
  defs_.push_back(std::move(def));
  by_name_.emplace(defs_.back().name, &defs_.back());
}

const OpDef* OpRegistry::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

OpDef* OpRegistry::find_mutable(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::string> OpRegistry::names() const {
  std::vector<std::string> out;
  for (const OpDef& d : defs_) out.push_back(d.name);
  std::sort(out.begin(), out.end());
  return out;
}

Status infer_types(const Node& node, const std::vector<TensorType>& input_types,
                   const std::vector<bool>& present, std::vector<TensorType>& out) {
  const OpDef* def = node.def ? node.def : OpRegistry::get().find(node.op);  // a node built by hand may not carry it
  const std::string where = node.source.empty() ? "" : " (" + node.source + ")";
  if (!def) return Status::BadInput("unknown op memc." + node.op + where);
  const int n = static_cast<int>(present.size());
  if (n < def->min_inputs || (def->max_inputs >= 0 && n > def->max_inputs)) {
    return Status::BadInput(str_cat("memc.", node.op, where, ": expects ", def->min_inputs,
                                    def->max_inputs == def->min_inputs ? "" : (def->max_inputs < 0 ? "+" : str_cat("..", def->max_inputs)),
                                    " inputs, got ", n));
  }
  for (int i = 0; i < std::min(n, def->min_inputs); ++i) {
    if (!present[i]) return Status::BadInput(str_cat("memc.", node.op, where, ": input ", i, " is required"));
  }
  out.clear();
  ShapeContext ctx{node, input_types, present};
  Status st = def->shape(ctx, out);
  if (!st.ok()) return st.with_context(str_cat("memc.", node.op, where, ": "));
  if (def->num_outputs >= 0 && static_cast<int>(out.size()) != def->num_outputs) {
    // Ops with optional outputs (dropout's mask) trim or keep by node.outputs.
    if (!node.outputs.empty() && out.size() > node.outputs.size()) out.resize(node.outputs.size());
  }
  return Status::Ok();
}

static std::vector<TensorType> types_of(const Module& m, const std::vector<ValueId>& ids) {
  std::vector<TensorType> t;
  for (ValueId v : ids) {
    if (v != kNoValue) t.push_back(m.value(v).type);
  }
  return t;
}

int64_t node_flops(const Module& m, const Node& node) {
  const OpDef* def = node.def;
  std::vector<TensorType> in = types_of(m, node.inputs), out = types_of(m, node.outputs);
  if (def && def->flops) return def->flops(node, in, out);
  int64_t total = 0;
  for (const TensorType& t : out) total += t.numel();
  return (def && (def->flags & kOpView)) ? 0 : total;
}

int64_t node_bytes(const Module& m, const Node& node) {
  const bool partial = node.def && (node.def->flags & kOpPartialRead);
  int64_t total = 0, written = 0;
  for (const TensorType& t : types_of(m, node.outputs)) written += t.bytes();
  const std::vector<TensorType> in = types_of(m, node.inputs);
  for (size_t i = 0; i < in.size(); ++i) total += partial && i == 0 ? written : in[i].bytes();
  return total + written;
}

}  // namespace memc
