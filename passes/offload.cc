#include "passes/offload.h"

#include "support/size.h"

#include <algorithm>
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
    // A transfer's bytes cross once: count the sync op or the start of an async pair.
    if (def && (def->flags & kOpTransfer) && !node.op.ends_with("_done")) t.link_bytes += m.value(node.outputs[0]).type.bytes();
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

// The first scheduled node reading `v`, or kNoNode.
NodeId first_reader(const Module& m, const std::vector<NodeId>& order, ValueId v) {
  for (NodeId n : order) {
    for (ValueId in : m.node(n).inputs) {
      if (in == v) return n;
    }
  }
  return kNoNode;
}

// Whether `v` is a collective's result, or a few elementwise steps from one (a reduce-scattered
// gradient, scaled): its reduction already waits for the next unit's gradient (passes/shard.h).
bool follows_collective(const Module& m, ValueId v) {
  for (int depth = 0; depth < 4 && v != kNoValue; ++depth) {
    const NodeId p = m.value(v).producer;
    if (p == kNoNode || !m.node(p).def) return false;
    if (m.node(p).def->flags & kOpCollective) return true;
    if (!(m.node(p).def->flags & (kOpElementwise | kOpView)) || m.node(p).inputs.empty()) return false;
    v = m.node(p).inputs[0];
  }
  return false;
}

// Every transfer becomes its async pair, start where the transfer was and done right after it
// (the schedule pass moves them apart). Streamed parameters are prefetched one unit ahead: a
// copy feeding a prefetching all_gather_start takes that start's `after`, and on one device,
// where no gather follows, unit k's copy starts right after unit k−1's split, as zero3's gathers
// do (passes/shard.cc). Returns the pairs made.
int split_transfers(Module& m) {
  const OpRegistry& registry = OpRegistry::get();
  std::vector<NodeId> order = m.schedule();
  struct Streamed {
    NodeId start, done, split;
  };
  std::vector<Streamed> streamed;
  std::vector<NodeId> staged_results;  // dones of copies of computed values into host memory
  std::vector<std::pair<NodeId, NodeId>> gathered;  // (copy's start, the prefetching gather it feeds)
  int pairs = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const NodeId n = order[i];
    const std::string op = m.node(n).op;
    if (op != "copy_to_host" && op != "copy_to_device") continue;
    const ValueId x = m.node(n).inputs[0], y = m.node(n).outputs[0];
    auto started = m.add_node(op + "_start", {x}, {}, "offload");
    MEMC_CHECK(started.ok(), "offload: ", op, "_start of %", m.value(x).name, ": ", started.status().message());
    const ValueId pending = (*started)[0];
    m.value(pending).space = m.value(y).space;
    m.value(pending).role = m.value(y).role;
    m.rename(pending, m.value(y).name + ".pending");
    const NodeId start = m.value(pending).producer;
    Node& done = m.node(n);
    done.op = op + "_done";
    done.def = registry.find(done.op);
    done.inputs = {pending, x};
    order.insert(order.begin() + static_cast<std::ptrdiff_t>(i), start);
    ++i;
    ++pairs;
    if (op == "copy_to_host" && m.value(x).producer != kNoNode && !follows_collective(m, x)) staged_results.push_back(n);
    const NodeId reader = first_reader(m, order, y);
    if (reader == kNoNode) continue;
    const Node& r = m.node(reader);
    if (r.op.ends_with("_start") && r.inputs.size() > 1) {
      gathered.push_back({start, reader});
    } else if (r.op == "split_flat" && m.value(x).producer == kNoNode) {
      streamed.push_back({start, n, reader});
    }
  }
  auto position = [&](NodeId n) { return std::find(order.begin(), order.end(), n) - order.begin(); };
  // A copy feeding a prefetching gather (zero3 on N ranks) starts one unit before that gather:
  // at the previous gather's prefetch point, so the copy and the gather each overlap a unit's
  // compute. The step's first gathers take their own gather's point.
  std::sort(gathered.begin(), gathered.end(), [&](const auto& a, const auto& b) { return position(a.second) < position(b.second); });
  for (size_t k = 0; k < gathered.size(); ++k) {
    const Node& gather = m.node(gathered[k].second);
    const Node& previous = m.node(gathered[k > 0 ? k - 1 : k].second);
    m.node(gathered[k].first).inputs.push_back(previous.inputs.size() > 1 ? previous.inputs[1] : gather.inputs[1]);
  }
  // A computed value's copy to the host (a gradient for its host update) completes once the next
  // such value exists: the copy overlaps the backward that computes it, and the device keeps
  // about one gradient more. Not a reduced gradient's: its collective already waits so.
  std::sort(staged_results.begin(), staged_results.end(), [&](NodeId a, NodeId b) {
    return position(m.value(m.node(a).inputs[1]).producer) < position(m.value(m.node(b).inputs[1]).producer);
  });
  for (size_t k = 0; k + 1 < staged_results.size(); ++k) {
    m.node(staged_results[k]).inputs.push_back(m.node(staged_results[k + 1]).inputs[1]);
  }
  std::sort(streamed.begin(), streamed.end(), [&](const Streamed& a, const Streamed& b) { return position(a.split) < position(b.split); });
  for (size_t k = 1; k < streamed.size(); ++k) {
    const NodeId start = streamed[k].start, previous = streamed[k - 1].split;
    m.node(start).inputs.push_back(m.node(previous).outputs[0]);
    order.erase(order.begin() + position(start));
    order.insert(order.begin() + position(previous) + 1, start);
    if (position(streamed[k].done) < position(start)) {  // the done follows its start
      order.erase(order.begin() + position(streamed[k].done));
      order.insert(order.begin() + position(start) + 1, streamed[k].done);
    }
  }
  m.set_schedule(order);
  return pairs;
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
  split_transfers(m);
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
