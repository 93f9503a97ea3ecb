#include "passes/memory_plan.h"

#include <chrono>
#include <memory>

namespace memc {

std::string_view category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParams: return "params";
    case MemoryCategory::kGrads: return "grads";
    case MemoryCategory::kOptimizerState: return "optimizer_state";
    case MemoryCategory::kMasterWeights: return "master_weights";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kWorkspace: return "workspace";
  }
  return "?";
}

MemoryCategory category_of(Role role) {
  switch (role) {
    case Role::kParam:
    case Role::kBuffer: return MemoryCategory::kParams;
    case Role::kGrad: return MemoryCategory::kGrads;
    case Role::kOptimizerState: return MemoryCategory::kOptimizerState;
    case Role::kMasterWeight: return MemoryCategory::kMasterWeights;
    default: return MemoryCategory::kActivations;
  }
}

int64_t CategoryBytes::total() const {
  int64_t sum = 0;
  for (int64_t b : bytes) sum += b;
  return sum;
}

namespace {

int64_t align_up(int64_t bytes, int64_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

std::vector<std::unique_ptr<HeapAlgorithm>> algorithms_for(MemoryPlan::Algorithm choice) {
  std::vector<std::unique_ptr<HeapAlgorithm>> result;
  using A = MemoryPlan::Algorithm;
  if (choice == A::kBest || choice == A::kGreedyBySize) result.push_back(std::make_unique<GreedyBySizeHeap>());
  if (choice == A::kBest || choice == A::kGreedyByArea) result.push_back(std::make_unique<GreedyByAreaHeap>());
  if (choice == A::kBest || choice == A::kBestFit) result.push_back(std::make_unique<BestFitHeap>());
  return result;
}

// Live bytes by category at every position, from each buffer's role changes (a difference array).
void fill_timeline(const Liveness& live, const std::vector<Slice>& slices, MemSpace space, SpacePlan& plan) {
  const int32_t n = live.num_positions;
  std::vector<CategoryBytes> delta(n + 1);
  for (const Buffer& b : live.buffers) {
    if (b.space != space) continue;
    const int64_t size = slices[b.id].size;
    for (size_t k = 0; k < b.role_changes.size(); ++k) {
      const int32_t start = std::max(b.role_changes[k].first, b.range.first);
      const int32_t end = k + 1 < b.role_changes.size() ? b.role_changes[k + 1].first : b.range.last + 1;
      if (end <= start) continue;
      const MemoryCategory c = category_of(b.role_changes[k].second);
      delta[start][c] += size;
      delta[end][c] -= size;
    }
  }
  plan.timeline.assign(n, CategoryBytes{});
  CategoryBytes running;
  int64_t best = -1;
  for (int32_t p = 0; p < n; ++p) {
    for (size_t c = 0; c < kNumMemoryCategories; ++c) {
      running.bytes[c] += delta[p].bytes[c];
      plan.category_peak_bytes.bytes[c] = std::max(plan.category_peak_bytes.bytes[c], running.bytes[c]);
    }
    plan.timeline[p] = running;
    if (running.total() > best) {
      best = running.total();
      plan.peak_position = p;
    }
  }
  plan.lower_bound_bytes = std::max<int64_t>(best, 0);
  plan.breakdown = plan.timeline[plan.peak_position];
}

// Places the buffers of one space: persistent ones stacked from 0, the rest by the algorithms.
void plan_space(const Liveness& live, MemSpace space, MemoryPlan::Algorithm choice, std::vector<Slice>& slices,
                SpacePlan& plan) {
  plan.space = space;
  std::vector<BufferId> transient;
  std::vector<HeapBuffer> heap_buffers;
  int64_t persistent_top = 0;
  for (const Buffer& b : live.buffers) {
    if (b.space != space) continue;
    ++plan.num_buffers;
    if (b.persistent) {
      slices[b.id].offset = persistent_top;
      persistent_top += slices[b.id].size;
    } else {
      transient.push_back(b.id);
      heap_buffers.push_back({slices[b.id].size, b.range});
    }
  }
  plan.persistent_bytes = persistent_top;
  HeapPlacement best;
  best.heap_bytes = -1;
  // A placement at the bytes live at once cannot be beaten, and ties keep the first: the
  // algorithms after it are not run.
  const int64_t least = heap_lower_bound(heap_buffers);
  for (const auto& algorithm : algorithms_for(choice)) {
    HeapPlacement placement = algorithm->place(heap_buffers);
    if (best.heap_bytes < 0 || placement.heap_bytes < best.heap_bytes) {
      best = std::move(placement);
      plan.algorithm = algorithm->name();
    }
    if (best.heap_bytes <= least) break;
  }
  for (size_t i = 0; i < transient.size(); ++i) slices[transient[i]].offset = persistent_top + best.offsets[i];
  plan.arena_bytes = persistent_top + std::max<int64_t>(best.heap_bytes, 0);
  fill_timeline(live, slices, space, plan);
}

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace

Expected<MemoryPlanResult> MemoryPlan::run(const Module& module) const {
  const int64_t alignment = options_.alignment_bytes;
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    return Status::BadInput(str_cat("memory_plan: alignment ", alignment, " is not a positive power of two"));
  }
  const auto start = std::chrono::steady_clock::now();
  MemoryPlanResult result;
  MEMC_ASSIGN_OR_RETURN(result.liveness, analyze_liveness(module));
  const Liveness& live = result.liveness;
  result.slices.resize(live.buffers.size());
  for (const Buffer& b : live.buffers) result.slices[b.id] = Slice{b.id, 0, align_up(b.bytes, alignment)};
  for (MemSpace space : {MemSpace::kDevice, MemSpace::kHost}) {
    plan_space(live, space, options_.algorithm, result.slices, result.spaces[static_cast<size_t>(space)]);
  }
  result.planning_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::string memory_plan_summary(const MemoryPlanResult& result) {
  std::string out;
  for (const SpacePlan& s : result.spaces) {
    if (s.num_buffers == 0) continue;
    char pct[32];
    std::snprintf(pct, sizeof pct, "%+.2f%%", 100.0 * s.fragmentation());
    out += str_cat(space_name(s.space), ": arena ", human_bytes(s.arena_bytes), ", lower bound ",
                   human_bytes(s.lower_bound_bytes), " (", pct, "), ", s.algorithm, "\n");
  }
  return out;
}

}  // namespace memc
