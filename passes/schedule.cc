#include "passes/schedule.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

#include "ir/op_registry.h"
#include "passes/liveness.h"
#include "passes/memory_plan.h"
#include "support/log.h"
#include "support/size.h"

namespace memc {

std::string_view schedule_policy_name(SchedulePolicy policy) {
  switch (policy) {
    case SchedulePolicy::kEagerFree: return "eager_free";
    case SchedulePolicy::kLazy: return "lazy";
    case SchedulePolicy::kMinDelta: return "min_delta";
  }
  return "?";
}

namespace {

// The step as the list scheduler sees it: dependence edges and a storage model. A storage group
// is a value with its views (liveness rule A); it is freed once its last reader has run, unless
// it persists (a persistent argument) or is a module output.
struct StepGraph {
  std::vector<NodeId> order;                    // the current schedule (live nodes)
  std::vector<int32_t> position;                // by NodeId: index in `order`, -1 if not live
  std::vector<std::vector<NodeId>> successors;   // by NodeId: data edges + update edges, unique
  std::vector<int32_t> num_predecessors;         // by NodeId
  std::vector<ValueId> group_of;                 // by ValueId: the group's root value
  std::vector<bool> freeable;                    // by root
  std::vector<std::vector<NodeId>> readers;      // by root: distinct nodes reading a member
  std::vector<std::vector<ValueId>> groups_read; // by NodeId: distinct roots among its inputs
  std::vector<int64_t> alloc_bytes;              // by NodeId: bytes its outputs keep after it
};

ValueId find_root(std::vector<ValueId>& parent, ValueId v) {
  while (parent[v] != v) v = parent[v] = parent[parent[v]];
  return v;
}

// Views join their source's group when they relabel the same bytes in the same space (rule A).
bool is_view_of_input(const Module& m, const Node& node, ValueId out) {
  const OpDef* def = node.def;
  if (def == nullptr || !(def->flags & kOpView) || node.inputs.empty() || node.inputs[0] == kNoValue) return false;
  const Value &in = m.value(node.inputs[0]), &o = m.value(out);
  return in.type.bytes() == o.type.bytes() && in.space == o.space;
}

void add_edge(StepGraph& g, NodeId from, NodeId to) {
  if (from != to && g.position[from] >= 0) g.successors[from].push_back(to);
}

StepGraph build_step_graph(const Module& m) {
  StepGraph g;
  const size_t n_values = m.values().size(), n_nodes = m.nodes().size();
  g.order = m.schedule();
  g.position.assign(n_nodes, -1);
  for (size_t p = 0; p < g.order.size(); ++p) g.position[g.order[p]] = static_cast<int32_t>(p);

  std::vector<ValueId> parent(n_values);
  std::iota(parent.begin(), parent.end(), 0);
  std::vector<bool> is_view(n_values, false);
  for (NodeId n : g.order) {
    const Node& node = m.node(n);
    for (ValueId out : node.outputs) {
      if (!is_view_of_input(m, node, out)) continue;
      parent[find_root(parent, out)] = find_root(parent, node.inputs[0]);
      is_view[out] = true;
    }
  }
  g.group_of.resize(n_values);
  for (size_t v = 0; v < n_values; ++v) g.group_of[v] = find_root(parent, static_cast<ValueId>(v));
  g.freeable.assign(n_values, true);
  for (ValueId a : m.arguments()) {
    if (is_persistent_role(m.value(a).role)) g.freeable[g.group_of[a]] = false;
  }
  std::vector<bool> is_output(n_values, false), is_update(n_values, false);
  for (size_t i = 0; i < m.outputs().size(); ++i) {
    const ValueId v = m.outputs()[i];
    is_output[v] = true;
    g.freeable[g.group_of[v]] = false;
    if (i < m.output_updates().size() && m.output_updates()[i] != kNoValue) is_update[v] = true;
  }

  g.readers.resize(n_values);
  g.groups_read.resize(n_nodes);
  g.successors.resize(n_nodes);
  for (NodeId n : g.order) {
    std::vector<ValueId>& groups = g.groups_read[n];
    for (ValueId v : m.node(n).inputs) {
      if (v == kNoValue) continue;
      groups.push_back(g.group_of[v]);
      if (m.value(v).producer != kNoNode) add_edge(g, m.value(v).producer, n);
    }
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    for (ValueId root : groups) g.readers[root].push_back(n);
  }
  // An update overwrites its argument's storage: every other reader of it goes first (rule B).
  // The storage is first written by the producer of the update's group (a transfer's start,
  // when the update is its done: a view of the pending buffer).
  for (size_t i = 0; i < m.outputs().size() && i < m.output_updates().size(); ++i) {
    const ValueId arg = m.output_updates()[i];
    const NodeId update = m.value(m.outputs()[i]).producer;
    if (arg == kNoValue || update == kNoNode || g.position[update] < 0) continue;
    const NodeId writer = m.value(g.group_of[m.outputs()[i]]).producer;
    for (NodeId reader : g.readers[g.group_of[arg]]) {
      add_edge(g, reader, update);
      if (writer != kNoNode && writer != update && reader != writer) add_edge(g, reader, writer);
    }
  }
  g.num_predecessors.assign(n_nodes, 0);
  for (NodeId n : g.order) {
    std::vector<NodeId>& s = g.successors[n];
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    for (NodeId t : s) ++g.num_predecessors[t];
  }
  // Views and updates reuse existing bytes; an unread non-output dies at its own position.
  g.alloc_bytes.assign(n_nodes, 0);
  for (NodeId n : g.order) {
    for (ValueId out : m.node(n).outputs) {
      if (is_view[out] || is_update[out]) continue;
      if (g.readers[g.group_of[out]].empty() && !is_output[out]) continue;
      g.alloc_bytes[n] += m.value(out).type.bytes();
    }
  }
  return g;
}

// A collective start placed with an `after` point: the shard pass's prefetch of the next unit
// (and the copy that brings a streamed unit to the device, passes/offload.h).
bool is_prefetch(const Node& node) { return node.op.ends_with("_start") && node.inputs.size() > 1; }

// A transfer's start whose source the step computes (a gradient staged for a host update, a
// weight's new value going back to the device): issued as soon as that source exists, since its
// source stays live until the done anyway. A start from an argument waits for its place.
bool is_copy_of_computed(const Module& m, const Node& node) {
  return node.def && (node.def->flags & kOpTransfer) && node.op.ends_with("_start") && m.value(node.inputs[0]).producer != kNoNode;
}

// A collective's start on a computed value without an `after` point: a unit's gradient
// reduction (zero1/2's all-reduce or reduce-scatter, zero3's reduce-scatter from autodiff). An
// order that overlaps collectives issues it as soon as its gradient exists: its input stays live
// until the done anyway, and a memory-first policy would otherwise start it right before its
// done, hiding nothing. Its result (1/N of the input for a reduce-scatter, all of it for an
// all-reduce) is what the overlap costs.
bool is_reduction_start(const Module& m, const Node& node) {
  return node.def && (node.def->flags & kOpCollective) && node.op.ends_with("_start") && node.inputs.size() == 1 &&
         m.value(node.inputs[0]).producer != kNoNode;
}

// (bucket, primary, current position): smallest first; the position makes keys unique.
using Key = std::tuple<int, int64_t, int32_t>;

class ListScheduler {
 public:
  ListScheduler(const Module& m, const StepGraph& g, SchedulePolicy policy, bool prefetch = false)
      : m_(m), g_(g), policy_(policy), prefetch_(prefetch), remaining_(m.values().size(), 0), preds_(g.num_predecessors),
        key_(m.nodes().size()), ready_flag_(m.nodes().size(), false), done_(m.nodes().size(), false),
        urgency_(m.nodes().size(), 0), staged_(m.nodes().size(), false) {
    for (size_t v = 0; v < g.readers.size(); ++v) remaining_[v] = static_cast<int32_t>(g.readers[v].size());
    for (NodeId n : g.order) {
      urgency_[n] = g.position[n];
      if (!g.successors[n].empty()) {
        int32_t first = INT32_MAX;
        for (NodeId s : g.successors[n]) first = std::min(first, g.position[s]);
        urgency_[n] = first;
      }
    }
  }

  Expected<std::vector<NodeId>> run() {
    std::vector<NodeId> result;
    result.reserve(g_.order.size());
    for (NodeId n : g_.order) {
      // Nodes with no predecessors at all: a staged one releases its successors at once, and
      // those must not be made ready a second time here.
      if (g_.num_predecessors[n] == 0) make_ready(n);
    }
    while (!ready_.empty()) {
      const NodeId n = g_.order[std::get<2>(*ready_.begin())];
      ready_.erase(ready_.begin());
      ready_flag_[n] = false;
      emit_staged_inputs(n, result);  // its staged host copies and dones go right before it
      emit(n, result);
      for (NodeId s : g_.successors[n]) {
        if (--preds_[s] == 0) make_ready(s);
      }
    }
    for (NodeId n : g_.order) {  // a done nothing reads (a weight's new value) ends the step
      if (staged_[n] && !done_[n]) {
        emit_staged_inputs(n, result);
        emit(n, result);
      }
    }
    if (result.size() != g_.order.size()) {
      return Status::Internal(str_cat("schedule: ", g_.order.size() - result.size(),
                                      " nodes wait on a cycle (an argument read after its update?)"));
    }
    return result;
  }

 private:
  // Bytes the node allocates minus bytes of groups whose last reader it is.
  int64_t delta_bytes(NodeId n) const {
    int64_t delta = g_.alloc_bytes[n];
    for (ValueId root : g_.groups_read[n]) {
      if (remaining_[root] == 1 && g_.freeable[root]) delta -= m_.value(root).type.bytes();
    }
    return delta;
  }
  Key key_of(NodeId n) const {
    const int64_t delta = delta_bytes(n);
    const int32_t pos = g_.position[n];
    // A prefetching start (one with an `after` point) goes as soon as that point allows:
    // delaying it would only shorten the overlap it was placed for.
    if (prefetch_ && (is_prefetch(m_.node(n)) || is_reduction_start(m_, m_.node(n)))) return Key{-1, pos, pos};
    if (is_copy_of_computed(m_, m_.node(n))) return Key{-1, pos, pos};
    // What reads a prefetched transfer's result (a unit's split) waits until it is needed, or
    // the next prefetch, which follows it, would run ahead through every unit.
    if (prefetch_ && reads_prefetched(n)) return Key{1, urgency_[n], pos};
    switch (policy_) {
      case SchedulePolicy::kEagerFree: return delta <= 0 ? Key{0, delta, pos} : Key{1, pos, pos};
      case SchedulePolicy::kLazy: return delta <= 0 ? Key{0, delta, pos} : Key{1, urgency_[n], pos};
      case SchedulePolicy::kMinDelta: return Key{0, delta, pos};
    }
    return Key{0, 0, pos};
  }
  // Whether n reads the completion of a prefetching start (an async pair's done whose start
  // has an `after` point).
  bool reads_prefetched(NodeId n) const {
    for (ValueId v : m_.node(n).inputs) {
      const NodeId p = v == kNoValue ? kNoNode : m_.value(v).producer;
      if (p == kNoNode || !is_async_done(p)) continue;
      const ValueId pending = m_.node(p).inputs[0];
      if (m_.value(pending).producer != kNoNode && is_prefetch(m_.node(m_.value(pending).producer))) return true;
    }
    return false;
  }
  // The staged producers of n's inputs, each after its own staged producers (a done's start).
  void emit_staged_inputs(NodeId n, std::vector<NodeId>& result) {
    for (ValueId v : m_.node(n).inputs) {
      const NodeId p = v == kNoValue ? kNoNode : m_.value(v).producer;
      if (p == kNoNode || !staged_[p] || done_[p]) continue;
      emit_staged_inputs(p, result);
      emit(p, result);
    }
  }
  void emit(NodeId n, std::vector<NodeId>& result) {
    done_[n] = true;
    result.push_back(n);
    for (ValueId root : g_.groups_read[n]) {
      if (--remaining_[root] == 1 && g_.freeable[root]) refresh_last_reader(root);
    }
  }
  void make_ready(NodeId n) {
    // A synchronous copy into host memory (offload's staging of an update's operand) is not placed
    // on its own: it runs right before its first reader, so its host buffer lives only as long as
    // the update needs it rather than from wherever its source became available. An async pair's
    // OP_done likewise: the longer it waits, the more compute its transfer overlaps.
    if (is_host_transfer(n) || is_async_done(n)) {
      staged_[n] = true;
      for (NodeId s : g_.successors[n]) {
        if (--preds_[s] == 0) make_ready(s);
      }
      return;
    }
    key_[n] = key_of(n);
    ready_.insert(key_[n]);
    ready_flag_[n] = true;
  }
  // The group's one unfinished reader now frees it: its key changes if it is ready.
  void refresh_last_reader(ValueId root) {
    for (NodeId r : g_.readers[root]) {
      if (done_[r]) continue;
      if (ready_flag_[r]) {
        ready_.erase(key_[r]);
        make_ready(r);
      }
      return;
    }
  }

  const Module& m_;
  const StepGraph& g_;
  SchedulePolicy policy_;
  bool prefetch_;  // issue prefetching starts as soon as their `after` point allows
  std::vector<int32_t> remaining_;  // by root: readers not yet scheduled
  std::vector<int32_t> preds_;      // by NodeId: predecessors not yet scheduled
  std::vector<Key> key_;
  std::vector<bool> ready_flag_, done_;
  std::vector<int32_t> urgency_;  // by NodeId: earliest current position of a successor
  std::vector<bool> staged_;      // by NodeId: a ready host copy or async done, emitted with its first reader
  // A collective's or a copy's completion waits as late as it can: right before its first reader.
  bool is_async_done(NodeId n) const {
    const OpDef* def = m_.node(n).def;
    return def && (def->flags & (kOpCollective | kOpTransfer)) && m_.node(n).op.ends_with("_done");
  }
  // A copy into host memory of what the step does not compute (a weight staged for its host
  // update), or a synchronous one (copy_to_host, not yet split into its pair): its source is
  // there from the start, so an early start would only hold the host buffer longer.
  bool is_host_transfer(NodeId n) const {
    const Node& node = m_.node(n);
    if (node.op == "copy_to_host") return true;
    return node.op == "copy_to_host_start" && m_.value(node.inputs[0]).producer == kNoNode;
  }
  std::set<Key> ready_;
};

Expected<ScheduleReport::Candidate> measure(const Module& m, const std::string& policy, int64_t alignment) {
  MEMC_ASSIGN_OR_RETURN(MemoryPlanResult plan, MemoryPlan({.alignment_bytes = alignment}).run(m));
  ScheduleReport::Candidate c;
  c.policy = policy;
  c.arena_bytes = plan.space(MemSpace::kDevice).arena_bytes;
  c.lower_bound_bytes = plan.space(MemSpace::kDevice).lower_bound_bytes;
  c.host_arena_bytes = plan.space(MemSpace::kHost).arena_bytes;
  return c;
}

// What overlapping collectives may add to the peak: one unit in flight each way, forward and
// backward (twice the largest prefetched buffer), and one gradient reduction's result in flight
// beside the one a late start would hold (twice the largest).
int64_t prefetch_allowance(const Module& m) {
  int64_t gathered = 0, reduced = 0;
  for (NodeId n : m.schedule()) {
    const Node& node = m.node(n);
    if (is_prefetch(node)) gathered = std::max(gathered, m.value(node.outputs[0]).type.bytes());
    if (is_reduction_start(m, node)) reduced = std::max(reduced, m.value(node.outputs[0]).type.bytes());
  }
  return 2 * gathered + 2 * reduced;
}

bool smaller(const ScheduleReport::Candidate& a, const ScheduleReport::Candidate& b) {
  return std::tie(a.arena_bytes, a.lower_bound_bytes, a.host_arena_bytes) <
         std::tie(b.arena_bytes, b.lower_bound_bytes, b.host_arena_bytes);
}

std::string candidate_str(const ScheduleReport::Candidate& c) {
  return str_cat(c.policy, ": arena ", format_size(c.arena_bytes), ", lower bound ", format_size(c.lower_bound_bytes));
}

bool is_update(const Node& node) { return node.def && (node.def->flags & kOpOptimizerUpdate); }

// Runs of consecutive updates of one op: the launches a GPU makes for them.
int update_runs(const Module& m, const std::vector<NodeId>& order) {
  int runs = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const Node& node = m.node(order[i]);
    runs += is_update(node) && (i == 0 || m.node(order[i - 1]).op != node.op);
  }
  return runs;
}

// Schedule::Options::group_updates on `order`: an update moves down to right before the next
// update of its op when nothing between is heavy or reads one of its results. From the bottom
// up, so a run already gathered below is joined whole (U1 X U2 X U3 → X X U1 U2 U3). With
// `keep`, each move stays only if keep(order) says so, for at most `trials` moves.
std::vector<NodeId> group_updates(const Module& m, std::vector<NodeId> order,
                                  const std::function<bool(const std::vector<NodeId>&)>& keep = nullptr, int trials = 0) {
  for (size_t i = order.size(); i-- > 0;) {
    const Node& node = m.node(order[i]);
    if (!is_update(node)) continue;
    size_t j = i + 1;
    for (; j < order.size(); ++j) {
      const Node& next = m.node(order[j]);
      if (next.op == node.op) break;
      const bool heavy = next.def && (next.def->flags & kOpComputeHeavy);
      const bool reads = std::any_of(next.inputs.begin(), next.inputs.end(), [&](ValueId v) {
        return std::find(node.outputs.begin(), node.outputs.end(), v) != node.outputs.end();
      });
      if (heavy || reads || is_update(next)) break;
    }
    if (j == order.size() || j == i + 1 || m.node(order[j]).op != node.op) continue;
    const NodeId moved = order[i];
    order.erase(order.begin() + static_cast<std::ptrdiff_t>(i));
    order.insert(order.begin() + static_cast<std::ptrdiff_t>(j - 1), moved);
    if (!keep) continue;
    if (trials-- <= 0) break;
    if (!keep(order)) {
      order.erase(order.begin() + static_cast<std::ptrdiff_t>(j - 1));
      order.insert(order.begin() + static_cast<std::ptrdiff_t>(i), moved);
    }
  }
  return order;
}

// Schedule::Options::group_updates, after choosing: the chosen order with updates grouped
// (group_updates) becomes the chosen candidate if the arena does not grow. Returns -v's line.
std::string group_chosen(Module& module, ScheduleReport& r, std::vector<std::vector<NodeId>>& orders, std::vector<bool>& prefetching,
                         int64_t alignment) {
  const int runs_before = update_runs(module, orders[r.chosen]);
  const int64_t limit = r.candidates[r.chosen].arena_bytes;
  std::vector<NodeId> order = group_updates(module, orders[r.chosen]);
  module.set_schedule(order);
  const std::string name = r.candidates[r.chosen].policy + "+grouped";
  auto measured = measure(module, name, alignment);
  if (!measured.ok() || measured->arena_bytes > limit) {
    // All at once grew the arena: move by move, each kept only if the arena stays (at most
    // 64 moves measured).
    auto keep = [&](const std::vector<NodeId>& candidate) {
      module.set_schedule(candidate);
      auto m = measure(module, name, alignment);
      return m.ok() && m->arena_bytes <= limit;
    };
    order = group_updates(module, orders[r.chosen], keep, 64);
    module.set_schedule(order);
    measured = measure(module, name, alignment);
  }
  if (measured.ok() && measured->arena_bytes <= limit) {
    r.candidates.push_back(*measured);
    prefetching.push_back(prefetching[r.chosen]);
    r.chosen = r.candidates.size() - 1;
    orders.push_back(std::move(order));
    return str_cat("schedule: ", update_runs(module, orders[r.chosen]), " fused update launches (", runs_before, " before grouping)");
  }
  module.set_schedule(orders[r.chosen]);
  return str_cat("schedule: updates left ungrouped (", runs_before, " launches): grouping ",
                 measured.ok() ? str_cat("grew the arena to ", format_size(measured->arena_bytes)) : measured.status().message());
}

}  // namespace

Expected<std::vector<NodeId>> list_schedule(const Module& module, SchedulePolicy policy) {
  const StepGraph graph = build_step_graph(module);
  return ListScheduler(module, graph, policy).run();
}

std::string schedule_summary(const ScheduleReport& r) {
  const auto &b = r.before(), &a = r.after();
  return str_cat("schedule: ", a.policy, ", device arena ", format_size(b.arena_bytes), " -> ", format_size(a.arena_bytes),
                 ", lower bound ", format_size(b.lower_bound_bytes), " -> ", format_size(a.lower_bound_bytes), " (",
                 r.schedule_ms, " ms)");
}

Expected<PassReport> Schedule::run(Module& module) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<NodeId> original = module.schedule();
  ScheduleReport& r = details_;
  r = ScheduleReport{};
  MEMC_ASSIGN_OR_RETURN(ScheduleReport::Candidate before, measure(module, "original", options_.alignment_bytes));
  r.candidates.push_back(before);
  std::vector<std::vector<NodeId>> orders = {original};
  const StepGraph graph = build_step_graph(module);
  // With prefetching starts (zero3's gathers, passes/shard.h) every policy runs twice: issuing
  // them as early as their `after` points allow, and freely. The best prefetching order (the
  // given one among them) wins unless it costs more than one unit in flight each way over the
  // best free one; then the prefetch is dropped where it would cost more (and -v says so).
  const int64_t allowance = options_.prefetch ? prefetch_allowance(module) : 0;
  std::vector<bool> prefetching = {allowance > 0};
  for (const bool prefetch : allowance > 0 ? std::vector<bool>{true, false} : std::vector<bool>{false}) {
    for (SchedulePolicy policy : options_.policies) {
      MEMC_ASSIGN_OR_RETURN(std::vector<NodeId> order, ListScheduler(module, graph, policy, prefetch).run());
      const std::string name = str_cat(schedule_policy_name(policy), prefetch ? "+prefetch" : "");
      // An order already measured (policies often agree) has the same plan: its figures again.
      const auto same = std::find(orders.begin(), orders.end(), order);
      Expected<ScheduleReport::Candidate> measured = ScheduleReport::Candidate{};
      if (same != orders.end()) {
        measured = r.candidates[same - orders.begin()];
        measured->policy = name;
      } else {
        module.set_schedule(order);
        measured = measure(module, name, options_.alignment_bytes);
      }
      if (!measured.ok()) {  // the storage model missed a liveness rule: never keep such an order
        log(2, str_cat("schedule: ", name, " rejected: ", measured.status().message()));
        continue;
      }
      log(2, "schedule: candidate " + candidate_str(*measured));
      r.candidates.push_back(*measured);
      orders.push_back(std::move(order));
      prefetching.push_back(prefetch);
    }
  }
  std::optional<size_t> best_prefetching, best_free;
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    std::optional<size_t>& best = prefetching[i] ? best_prefetching : best_free;
    if (!best || smaller(r.candidates[i], r.candidates[*best])) best = i;
  }
  r.chosen = best_prefetching.value_or(0);
  if (best_free && (!best_prefetching || r.candidates[*best_prefetching].arena_bytes > r.candidates[*best_free].arena_bytes + allowance)) {
    r.chosen = *best_free;
  }
  r.prefetch_kept = allowance > 0 && prefetching[r.chosen];
  module.set_schedule(orders[r.chosen]);
  const std::string grouped = options_.group_updates ? group_chosen(module, r, orders, prefetching, options_.alignment_bytes) : "";
  r.schedule_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  PassReport report;
  report.changed = r.chosen != 0 && orders[r.chosen] != original;
  report.peak_before = r.before().arena_bytes;
  report.peak_after = r.after().arena_bytes;
  report.set("candidates", static_cast<int64_t>(r.candidates.size()));
  report.set("prefetch_kept", r.prefetch_kept ? 1 : 0);
  report.set("lower_bound_before", r.before().lower_bound_bytes);
  report.set("lower_bound_after", r.after().lower_bound_bytes);
  report.lines.push_back(schedule_summary(r));
  if (!grouped.empty()) report.lines.push_back(grouped);
  if (allowance > 0) {
    report.lines.push_back(r.prefetch_kept ? str_cat("schedule: collectives prefetch one unit ahead (allowed up to ", format_size(allowance), " over the best order without)")
                                           : str_cat("schedule: prefetch dropped: it cost more than ", format_size(allowance), " over the best order without"));
  }
  return report;
}

}  // namespace memc
