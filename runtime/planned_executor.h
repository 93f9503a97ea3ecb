// Runs a Module inside its memory plan on the accountant's backend (backends/backend.h): one
// device arena of the planned size (plus the kernel workspace region) and, for offloaded values,
// one pinned host arena, each allocated once through the DeviceMemory accountant; every value
// is a view at its planned offset, so nothing is allocated per tensor while training. Kernels
// write their whole outputs, so nothing is cleared per step either.
// Persistent values (parameters, optimizer states) stay in the arena between steps, and
// updates land on them in place (the plan aliases an update with the argument it replaces).
#pragma once
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "passes/memory_plan.h"
#include "runtime/device_memory.h"
#include "runtime/executor.h"

namespace memc {

class PlannedExecutor {
 public:
  // Plans `module` (deterministically, as compile did) and allocates its arenas and workspace
  // through `memory`, on `memory`'s backend, which must have a kernel for every node. The
  // workspace region is the larger of what the nodes need now and `planned_workspace_bytes`
  // (the plan's): a CPU run with fewer threads than the plan was sized for (a rank bound to one
  // core) needs smaller GEMM scratchpads, and still takes the planned bytes, so measured = planned.
  static Expected<PlannedExecutor> create(const Module& module, DeviceMemory& memory, int64_t planned_workspace_bytes = 0);

  // The tensor of an argument or value, in its arena (a view in the backend's memory; valid
  // while the executor lives). Host code reads device values through fetch().
  Tensor tensor(ValueId v) const;
  const void* address(ValueId v) const;  // where tensor(v) starts, without making the view
  // A host copy of value `v` (synchronous: waits for the step that writes it).
  Expected<Tensor> fetch(ValueId v) const;
  // Copies `value` into the argument named `name` (IR or source name): parameters and states
  // before the first step, data and scalars before each step.
  Status set_argument(const std::string& name, const Tensor& value);
  // One execution. Every argument must have been set (persistent ones once).
  Status run(const ExecOptions& options);
  // Module output i, read from the arena (a view).
  Tensor output(size_t i) const { return tensor(module_.outputs().at(i)); }
  Expected<Tensor> fetch_output(size_t i) const { return fetch(module_.outputs().at(i)); }

  const Module& module() const { return module_; }
  Backend& backend() const { return *backend_; }
  int64_t arena_bytes() const { return arena_bytes_; }
  int64_t host_arena_bytes() const { return host_arena_bytes_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }
  const MemoryPlanResult& plan() const { return plan_; }

 private:
  PlannedExecutor() = default;
  Module module_;
  MemoryPlanResult plan_;
  Backend* backend_ = nullptr;
  DeviceMemory::Block arena_, workspace_;
  DeviceMemory::Block host_arena_;  // offloaded values (memory space "host"): pinned host memory
  int64_t arena_bytes_ = 0, workspace_bytes_ = 0, host_arena_bytes_ = 0;
  // Per scheduled node, resolved once at create() rather than on every step.
  struct Step {
    NodeId node;
    const Kernel* kernel;
    bool in_place;            // an output shares an input's bytes (not poisoned in check mode)
    bool skip;                // a view whose output is its input's bytes already
    int64_t workspace_bytes;  // what the kernel declared for this node
    // A fused run: this step and the next group_size − 1 (the same op, consecutive in the
    // schedule) go to the backend's GroupKernel together; 1: the step runs alone.
    GroupKernel group = nullptr;
    int group_size = 1;
  };
  std::vector<Step> steps_;
  // Backends that capture graphs (CUDA): the first step runs kernel by kernel (libraries set up,
  // constants staged), the second is captured, and every later one replays the capture. A change
  // in what the capture fixed (training, seed, batch offset) captures again.
  int64_t eager_runs_ = 0;
  std::shared_ptr<void> graph_;  // Graph::handle, destroyed through the backend
  ExecOptions graph_options_;
  Status launch_kernels(const ExecOptions& options, Stream stream, bool poison);
  Expected<std::vector<Tensor>> host_copies(const std::vector<Tensor>& values) const;
  Status run_checked(const Step& step, std::span<KernelContext> members, const std::vector<std::vector<Tensor>>& inputs,
                     const std::vector<std::vector<Tensor>>& outputs, const ExecOptions& options) const;
  Status capture_and_launch(const ExecOptions& options, Stream stream);
};

}  // namespace memc
