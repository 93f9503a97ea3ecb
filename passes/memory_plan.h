// MemoryPlan: buffer assignment. Gives every buffer of the step (passes/liveness.h) an offset
// in one arena per memory space (device, host), so the runtime allocates each arena once and
// places every tensor at its planned offset; nothing is allocated per tensor while training.
//
// Contract:
//  - Runs last, on the final schedule (after every transforming pass); the module is not
//    changed. Any later change to nodes or schedule invalidates the offsets.
//  - Every buffer gets a Slice{buffer, offset, size} in its space's arena; offsets and sizes are
//    multiples of Options::alignment_bytes (64 by default: a cache line, and what CUDA and
//    AVX-512 kernels want). Two buffers whose live ranges overlap never share a byte; every
//    slice lies inside its arena. Values of one buffer (views, in-place results, updates) share
//    its slice.
//  - Persistent buffers (parameters, optimizer states, master weights, constant arguments: live
//    the whole step) are stacked first from offset 0 in buffer order, so they form one
//    contiguous region [0, persistent_bytes) that survives from step to step; this costs
//    nothing (a buffer live at every position takes its bytes at every position anyway). The
//    heap algorithm places the remaining (transient) buffers above that region.
//  - arena_bytes (the planned peak) is what the runtime must allocate; lower_bound_bytes is the
//    no-fragmentation bound (max over positions of the live aligned bytes); their difference is
//    fragmentation. The breakdown by role is taken at peak_position, the position with the most
//    live bytes; it sums to lower_bound_bytes. Workspace is 0 until kernels plan theirs.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "passes/heap_simulator.h"
#include "passes/liveness.h"

namespace memc {

// The categories of the memory breakdown (issue 4's report keys).
enum class MemoryCategory : uint8_t { kParams, kGrads, kOptimizerState, kMasterWeights, kActivations, kWorkspace };
inline constexpr size_t kNumMemoryCategories = 6;
std::string_view category_name(MemoryCategory c);  // "params", "grads", ...
// Params (with the model's buffers), grads (of parameters), optimizer states and master weights by their role; inputs,
// constants, scalars and every activation (and activation gradient) count as activations.
MemoryCategory category_of(Role role);

struct CategoryBytes {
  std::array<int64_t, kNumMemoryCategories> bytes{};
  int64_t& operator[](MemoryCategory c) { return bytes[static_cast<size_t>(c)]; }
  int64_t operator[](MemoryCategory c) const { return bytes[static_cast<size_t>(c)]; }
  int64_t total() const;
};

struct Slice {
  BufferId buffer = kNoBuffer;
  int64_t offset = 0;  // bytes from the start of the buffer's space's arena
  int64_t size = 0;    // aligned bytes
};

struct SpacePlan {
  MemSpace space = MemSpace::kDevice;
  std::string algorithm;          // the heap algorithm whose placement was kept
  int64_t arena_bytes = 0;        // planned peak: the arena the runtime allocates
  int64_t lower_bound_bytes = 0;  // max over positions of live aligned bytes
  int64_t persistent_bytes = 0;   // the region [0, persistent_bytes) of persistent buffers
  int32_t peak_position = 0;      // a position where live bytes reach lower_bound_bytes
  CategoryBytes breakdown;        // live bytes by category at peak_position
  CategoryBytes category_peak_bytes;  // per category, its own max over positions
  std::vector<CategoryBytes> timeline;  // live bytes by category at every position
  int64_t num_buffers = 0;
  double fragmentation() const {  // (arena - lower bound) / lower bound
    return lower_bound_bytes == 0 ? 0.0 : double(arena_bytes - lower_bound_bytes) / double(lower_bound_bytes);
  }
};

struct MemoryPlanResult {
  Liveness liveness;
  std::vector<Slice> slices;        // by BufferId
  std::array<SpacePlan, 2> spaces;  // by MemSpace: [device, host]
  double planning_ms = 0;           // liveness + every algorithm tried

  const SpacePlan& space(MemSpace s) const { return spaces[static_cast<size_t>(s)]; }
  const Slice& slice_of(ValueId v) const { return slices.at(liveness.buffer_of.at(v)); }
};

class MemoryPlan {
 public:
  enum class Algorithm { kBest, kBestFit, kGreedyBySize, kGreedyByArea };
  struct Options {
    Algorithm algorithm = Algorithm::kBest;  // kBest: try each, keep the smallest arena per space
    int64_t alignment_bytes = 64;            // a power of two
  };
  MemoryPlan() = default;
  explicit MemoryPlan(Options options) : options_(options) {}
  std::string name() const { return "memory_plan"; }
  // Fails when liveness fails (an update that cannot be in place) or the options are invalid.
  Expected<MemoryPlanResult> run(const Module& module) const;

 private:
  Options options_;
};

// One-line summary per space: "device: arena 1.2 GiB, lower bound 1.1 GiB (+3.1%), greedy_by_size".
std::string memory_plan_summary(const MemoryPlanResult& result);

}  // namespace memc
