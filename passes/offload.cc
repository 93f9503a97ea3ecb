#include "passes/offload.h"

#include "support/size.h"

#include <unordered_map>
#include <unordered_set>

#include "ir/op_registry.h"

namespace memc {

bool runs_on_host(const Module& m, const Node& node) {
  const OpDef* def = node.def;
  if (!def || !(def->flags & kOpOptimizerUpdate)) return false;
  for (ValueId v : node.inputs) {
    if (v != kNoValue && m.value(v).space == MemSpace::kHost) return true;
  }
  return false;
}

HostTraffic host_traffic(const Module& m) {
  const OpRegistry& registry = OpRegistry::get();
  HostTraffic t;
  for (NodeId n : m.schedule()) {
    const Node& node = m.node(n);
    const OpDef* def = registry.find(node.op);
    if (def && (def->flags & kOpTransfer)) t.link_bytes += m.value(node.outputs[0]).type.bytes();
    if (!runs_on_host(m, node)) continue;
    for (ValueId v : node.inputs) {
      if (v != kNoValue) t.host_update_bytes += m.value(v).type.bytes();
    }
    for (ValueId v : node.outputs) t.host_update_bytes += m.value(v).type.bytes();
  }
  return t;
}

namespace {

// Makes every operand of the host updates a host value: device inputs arrive by copy_to_host
// (one copy per value, placed before its first host reader), and results that update a device
// argument (the weights under fp32) are computed into host memory and go back by copy_to_device,
// right after the update. Returns the number of transfers added.
int insert_transfers(Module& m) {
  std::vector<NodeId> order;
  std::unordered_map<ValueId, ValueId> host_copy;
  int transfers = 0;
  auto transfer = [&](const char* op, ValueId v, MemSpace to, const char* suffix) {
    auto out = m.add_node(op, {v});
    MEMC_CHECK(out.ok(), "offload: ", op, " of %", m.value(v).name, ": ", out.status().message());
    const ValueId moved = (*out)[0];
    m.value(moved).space = to;
    // A staged gradient stays a gradient and a weight's new value a weight; a host staging copy
    // of a weight argument is not itself a parameter (it is read once, by the update).
    const Role role = m.value(v).role;
    m.value(moved).role = to == MemSpace::kHost && role == Role::kParam ? Role::kActivation : role;
    m.rename(moved, m.value(v).name + suffix);
    order.push_back(m.value(moved).producer);
    ++transfers;
    return moved;
  };
  for (NodeId n : m.schedule()) {
    if (!runs_on_host(m, m.node(n))) {
      order.push_back(n);
      continue;
    }
    for (size_t k = 0; k < m.node(n).inputs.size(); ++k) {
      const ValueId v = m.node(n).inputs[k];
      if (v == kNoValue || m.value(v).space == MemSpace::kHost) continue;
      if (!host_copy.count(v)) host_copy[v] = transfer("copy_to_host", v, MemSpace::kHost, ".host");
      m.node(n).inputs[k] = host_copy[v];
    }
    order.push_back(n);
    const std::vector<ValueId> results = m.node(n).outputs;
    for (ValueId r : results) {
      if (m.value(r).space == MemSpace::kHost) continue;
      m.value(r).space = MemSpace::kHost;
      const std::string name = m.value(r).name;
      m.rename(r, name + ".host");
      const ValueId back = transfer("copy_to_device", r, MemSpace::kDevice, "");
      m.replace_all_uses(r, back);  // the module output (the weight's update) is the device copy
      m.node(m.value(back).producer).inputs[0] = r;
      m.rename(back, name);
    }
  }
  m.set_schedule(order);
  return transfers;
}

}  // namespace

Expected<OffloadLevel> parse_offload_level(std::string_view name) {
  if (name == "none") return OffloadLevel::kNone;
  if (name == "optimizer") return OffloadLevel::kOptimizer;
  if (name == "params") return OffloadLevel::kParams;
  return Status::BadInput(str_cat("--offload '", name, "': none, optimizer or params"));
}

std::string_view offload_level_name(OffloadLevel level) {
  switch (level) {
    case OffloadLevel::kNone: return "none";
    case OffloadLevel::kOptimizer: return "optimizer";
    case OffloadLevel::kParams: return "params";
  }
  return "?";
}

Expected<PassReport> Offload::run(Module& m) {
  OffloadReport r;
  if (level_ == OffloadLevel::kNone) return PassReport{};
  // Master weights: f32 parameters whose every use is a cast (to the compute dtype) or an
  // optimizer update; under fp32 the parameters are the compute weights and stay.
  auto users = m.users();
  auto is_master = [&](ValueId p) {
    if (m.value(p).role != Role::kParam || m.value(p).type.dtype != DType::kF32 || users[p].empty()) return false;
    for (NodeId n : users[p]) {
      const OpDef* def = m.node(n).def;
      if (m.node(n).op != "cast" && !(def && (def->flags & kOpOptimizerUpdate))) return false;
    }
    return true;
  };
  std::vector<ValueId> moved;
  for (ValueId a : m.arguments()) {
    const bool streamed = level_ == OffloadLevel::kParams && m.value(a).role == Role::kParam;  // TrainingStep placed them
    if (m.value(a).role == Role::kOptimizerState || is_master(a) || streamed) moved.push_back(a);
  }
  // The update's new values of the moved arguments (memc.updates) live with them.
  const std::unordered_set<ValueId> moved_args(moved.begin(), moved.end());
  const std::vector<ValueId>& updates = m.output_updates();
  for (size_t i = 0; i < updates.size(); ++i) {
    if (updates[i] != kNoValue && moved_args.count(updates[i])) moved.push_back(m.outputs()[i]);
  }
  for (ValueId v : moved) {
    m.value(v).space = MemSpace::kHost;
    ++r.values;
    r.bytes += m.value(v).type.bytes();
  }
  r.transfers = insert_transfers(m);
  const HostTraffic traffic = host_traffic(m);
  r.link_bytes = traffic.link_bytes;
  r.host_update_bytes = traffic.host_update_bytes;
  m.metadata().set("memc.offload", std::string(offload_level_name(level_)));
  PassReport report;
  report.changed = r.values > 0;
  report.set("values", r.values);
  report.set("transfers", r.transfers);
  report.set("bytes", r.bytes);
  report.set("link_bytes", r.link_bytes);
  report.set("host_update_bytes", r.host_update_bytes);
  report.lines.push_back(str_cat("offload ", offload_level_name(level_), ": ", r.values, " values (", format_size(r.bytes), ") to host memory; ",
                                 r.transfers, " transfers move ", format_size(r.link_bytes), " per step over the host link, the update reads and writes ",
                                 format_size(r.host_update_bytes), " on the host"));
  return report;
}

}  // namespace memc
