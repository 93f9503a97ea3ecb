// Schedule: picks a topological order of the step with a lower memory peak than the current one.
//
// Contract:
//  - Changes only Module's schedule (a permutation of the live nodes); nodes, values and ids are
//    untouched, so the result computes exactly what the input computed (dropout masks depend on
//    (seed, node seed, step), never on order).
//  - Every input is defined before use, and every read of a persistent argument's storage (the
//    argument or a view of it) stays before the node writing its update: the optimizer updates
//    in place (passes/liveness.h rule B), so a read after the update would see the new value.
//  - Never makes the peak worse: each candidate order is measured with MemoryPlan (arena, then
//    lower bound) and the current order is kept unless a candidate is strictly smaller.
//  - Prefetch (collective starts with an `after` point, passes/shard.h) and gradient reductions
//    (a collective start on a computed value): every policy also runs issuing prefetches as soon
//    as `after` exists and reductions as soon as their gradient does. The best such order (the
//    given one included) is kept when it costs at most twice the largest prefetched buffer plus
//    twice the largest reduction's result (one unit in flight each way) over the best order
//    without; otherwise the overlap is dropped.
//  - Run after every pass that adds or removes nodes (precision, microbatch, shard, remat,
//    offload), right before memory_plan; anything that reorders afterwards voids the choice.
//
// Candidates are list schedules over a simple storage model (views share their source's
// bytes, updates write in place, a value is freed after its last reader; liveness.h in
// miniature). At each step, among the ready nodes:
//  - kEagerFree: a node that frees at least as many bytes as it allocates runs at once (the most
//    freed first); otherwise the next node of the current order. Pulls optimizer updates, gradient
//    accumulations and last reads forward, so gradients die as soon as their update has run.
//  - kLazy: as kEagerFree, but an allocating node waits until the earliest current position of
//    its readers: values computed in forward but read only in backward are computed late.
//  - kMinDelta: the node with the smallest allocated-minus-freed bytes (ties: current order).
// A ready set ordered by key makes each candidate O((N + E) log N).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"

namespace memc {

enum class SchedulePolicy : int32_t { kEagerFree, kLazy, kMinDelta };
std::string_view schedule_policy_name(SchedulePolicy policy);

// What the pass tried and kept; printed at -v, each candidate at -vv.
struct ScheduleReport {
  struct Candidate {
    std::string policy;  // "original" or a SchedulePolicy name
    int64_t arena_bytes = 0;        // device arena (MemoryPlan)
    int64_t lower_bound_bytes = 0;  // device no-fragmentation bound
    int64_t host_arena_bytes = 0;
  };
  std::vector<Candidate> candidates;  // [0] is the order the pass was given
  size_t chosen = 0;                  // index into candidates
  bool prefetch_kept = false;         // the chosen order issues prefetching starts early
  double schedule_ms = 0;             // the whole pass: list schedules + measuring each
  const Candidate& before() const { return candidates.front(); }
  const Candidate& after() const { return candidates.at(chosen); }
};
std::string schedule_summary(const ScheduleReport& report);

class Schedule : public Pass {
 public:
  struct Options {
    std::vector<SchedulePolicy> policies = {SchedulePolicy::kEagerFree, SchedulePolicy::kLazy, SchedulePolicy::kMinDelta};
    int64_t alignment_bytes = 64;  // MemoryPlan's, for measuring candidates
    // After choosing: each optimizer update moves down to join the next update of its op when
    // only light nodes (no GEMM, no attention) lie between and none reads its results, so a GPU
    // runs the run as one fused launch. Kept only where the device arena does not grow.
    bool group_updates = false;
    // Whether orders that issue prefetching starts early are candidates at all.
    bool prefetch = true;
  };
  Schedule() = default;
  explicit Schedule(Options options) : options_(std::move(options)) {}
  std::string_view name() const override { return "schedule"; }
  // `changed`: whether the schedule changed; the peaks are the device arena of the given order
  // and of the chosen one. Fails when the given order does not pass liveness (an update that
  // cannot be in place). details() holds every candidate measured.
  Expected<PassReport> run(Module& module) override;
  const ScheduleReport& details() const { return details_; }

 private:
  Options options_;
  ScheduleReport details_;
};

// One list schedule of `module`'s live nodes under `policy` (the pass's candidate; exposed for
// tests). Always a topological order that keeps argument reads before their updates.
Expected<std::vector<NodeId>> list_schedule(const Module& module, SchedulePolicy policy);

}  // namespace memc
