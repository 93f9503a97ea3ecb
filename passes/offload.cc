#include "passes/offload.h"

#include <unordered_set>

namespace memc {

bool runs_on_host(const Module& m, const Node& node) {
  if (node.op.size() < 7 || node.op.compare(node.op.size() - 7, 7, "_update") != 0) return false;
  for (ValueId v : node.inputs) {
    if (v != kNoValue && m.value(v).space == MemSpace::kHost) return true;
  }
  return false;
}

HostTraffic host_traffic(const Module& m) {
  HostTraffic t;
  for (NodeId n : m.schedule()) {
    const Node& node = m.node(n);
    if (!runs_on_host(m, node)) continue;
    for (ValueId v : node.inputs) {
      if (v == kNoValue) continue;
      const int64_t b = m.value(v).type.bytes();
      t.host_update_bytes += b;
      if (m.value(v).space == MemSpace::kDevice && m.value(v).type.numel() > 1) t.link_bytes += b;  // scalars aside
    }
    for (ValueId v : node.outputs) {
      const int64_t b = m.value(v).type.bytes();
      t.host_update_bytes += b;
      if (m.value(v).space == MemSpace::kDevice) t.link_bytes += b;
    }
  }
  return t;
}

Expected<OffloadReport> Offload::run(Module& m) const {
  OffloadReport r;
  if (level_ == "none") return r;
  if (level_ != "optimizer") return Status::BadInput("--offload '" + level_ + "': none or optimizer");
  // Master weights: f32 parameters whose every use is a cast (to the compute dtype) or an
  // optimizer update; under fp32 the parameters are the compute weights and stay.
  auto users = m.users();
  auto is_master = [&](ValueId p) {
    if (m.value(p).role != Role::kParam || m.value(p).type.dtype != DType::kF32 || users[p].empty()) return false;
    for (NodeId n : users[p]) {
      const std::string& op = m.node(n).op;
      if (op != "cast" && op.find("_update") == std::string::npos) return false;
    }
    return true;
  };
  std::vector<ValueId> moved;
  for (ValueId a : m.arguments()) {
    if (m.value(a).role == Role::kOptimizerState || is_master(a)) moved.push_back(a);
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
  const HostTraffic traffic = host_traffic(m);
  r.link_bytes = traffic.link_bytes;
  r.host_update_bytes = traffic.host_update_bytes;
  m.metadata().set("memc.offload", level_);
  return r;
}

}  // namespace memc
