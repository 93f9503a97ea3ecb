// Runs a Module on the CPU backend, node by node in schedule order, without a memory plan:
// each value gets its own buffer, freed after its last use (`memc infer`, gradient dumps and
// tests; training runs in runtime/planned_executor.h's arena). Kernel scratch is one buffer of
// max_workspace_bytes allocated per execute() call; each kernel gets exactly what its workspace
// function declared, carved from the start of it. Kernels write their whole outputs: fresh
// output buffers are filled with NaN bytes, not zeros, so one that does not shows in every test.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "ir/graph.h"

namespace memc {

struct ExecOptions {
  bool training = false;  // dropout active
  uint64_t seed = 0;
  int64_t step = 0;
  // Debug: poison each kernel's workspace (and, in the planned executor, its outputs) and fail
  // the run (an internal error naming the node) when a kernel writes into the
  // kWorkspaceGuardBytes after its declared size. Also on when the environment sets
  // MEMC_CHECK_WORKSPACE=1.
  bool check_workspace = false;
  // Data-parallel runs: KernelContext::comm and ::batch_row_offset (backends/backend.h).
  comm::Communicator* comm = nullptr;
  int64_t batch_row_offset = 0;
  // A training step: with --profile its kernels' spans become the step timeline (op_profile.h).
  bool train_step = false;
  // execute() only: the backend whose kernels run (null: the CPU's). Values live in host memory,
  // so only a backend whose kernels run there fits (tests run the CUDA kernels' bodies so).
  const Backend* kernels = nullptr;
  // Planned executor, debug: each node (or fused run) runs synchronized, without a graph, and
  // `node_check` gets each node's context with host copies of its inputs as they were before it
  // ran and of its outputs after; a failing status stops the run. Not with `comm`. A device's
  // kernels are checked node by node against the CPU's so (tests/cuda/ops_host_test.cc).
  std::function<Status(const KernelContext& ctx, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs)> node_check;
};

constexpr int64_t kWorkspaceGuardBytes = 4096;

// BadInput unless `value` has the argument's dtype and shape: "input 'x' has f32[2x3], expected f32[4x3]".
Status check_argument(const Value& arg, const Tensor& value);

// Feeds are keyed by argument: IR name or source (ONNX) name. Params come from the module's
// weights unless fed. Returns the module outputs in order.
Expected<std::vector<Tensor>> execute(const Module& module, const std::map<std::string, Tensor>& feeds,
                                      const ExecOptions& options = {});

}  // namespace memc
