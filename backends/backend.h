// The Backend seam: everything the planned executor, the device-memory accountant and the
// planner need from a device, and nothing else. Runtime and planner code reach kernels, memory,
// copies and streams only through this interface (never through backends/cpu or backends/cuda
// directly), so a plan runs on whichever backend `memc run --device` names, and a plan compiled
// for a target counts that target's kernel workspaces.
//
// Backends:
//   cpu   backends/cpu/cpu_backend.h  — the reference; "device" memory is a heap kept apart from
//         host memory, streams are in-order and synchronous, so every copy has completed on return.
//   cuda  backends/cuda/cuda_backend.h — cudaMalloc'd arenas, cudaMallocHost'd staging, a compute
//         and a copy stream with events. Planning for a GPU target needs no GPU: the workspace
//         model is plain C++.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "support/status.h"

namespace memc {

namespace comm {
class Communicator;
}

// What a kernel sees: the node, views of its inputs and outputs (in the backend's device
// memory), the per-run RNG coordinates, its declared scratch and the stream to run on.
// Kernels write every element of every output: the executor never clears a buffer.
struct KernelContext {
  const Node& node;
  std::vector<const Tensor*> inputs;  // nullptr marks an absent optional input
  std::vector<Tensor*> outputs;       // pre-allocated with the planned types
  bool training = false;              // dropout active
  uint64_t seed = 0;                  // counter-based RNG: (seed, step, node id, element)
  int64_t step = 0;
  void* workspace = nullptr;     // scratch: 64-byte aligned, workspace_bytes long
  int64_t workspace_bytes = 0;   // what the backend's workspace function declared for this node
  void* stream = nullptr;        // the backend's compute stream (nullptr on the CPU)
  // The backend's copy stream, where a transfer's async pair (copy_to_host_start …) runs; nullptr
  // where there is none (the CPU, or a caller without streams): the copy then runs on `stream`.
  void* copy_stream = nullptr;
  // Data-parallel runs (passes/shard.h): this rank's communicator (collective kernels; nullptr
  // on one device) and the global batch row of this rank's first sample, which random ops add
  // to their draw counters so N ranks replay the masks of one device's batch.
  comm::Communicator* comm = nullptr;
  int64_t batch_row_offset = 0;
  // The step in the backend's memory, where the backend keeps a run state
  // (Backend::run_state_bytes): device kernels read it there, so one captured step (a CUDA
  // graph) replays with each step's dropout draws. Null on the CPU: `step` holds it.
  const int64_t* device_step = nullptr;
};

// Returns bad input for data-dependent errors (an out-of-range token id); shapes and dtypes
// were checked by the verifier and are MEMC_CHECKed by the kernel.
using Kernel = Status (*)(KernelContext& ctx);
// One op over several nodes at once (a fused multi-tensor optimizer update): what running each
// node's Kernel in order would do, as fewer launches. Every node shares the first one's stream.
using GroupKernel = Status (*)(std::span<KernelContext> nodes);

// Where an allocation lives. On the CPU backend all three are RAM; the split is what a GPU run
// has, so budgets and offload are exercised without one.
enum class MemoryKind : uint8_t {
  kDevice,      // the device's memory: arenas, kernel workspace, communication buffers
  kHost,        // pageable host memory
  kPinnedHost,  // page-locked host memory: the host arena of offloaded values, copy staging
};
inline std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kDevice: return "device";
    case MemoryKind::kHost: return "host";
    case MemoryKind::kPinnedHost: return "pinned host";
  }
  return "?";
}

// An in-order queue of work on the device, and a marker in one. Opaque to callers.
struct Stream {
  void* handle = nullptr;
};
struct Event {
  void* handle = nullptr;
};
// A captured sequence of a stream's work, replayable as one launch (a CUDA graph).
struct Graph {
  void* handle = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;  // "cpu", "cuda:0"

  // --- kernels ---
  // The kernel for `op` (registry name without "memc."), or nullptr if this backend has none.
  virtual const Kernel* find_kernel(std::string_view op) const = 0;
  // A kernel that runs consecutive scheduled nodes of `op` together, or nullptr: the executor
  // then runs them one by one (the CPU, whose per-node cost is no launch).
  virtual GroupKernel find_group_kernel(std::string_view op) const { return nullptr; }
  // Bytes of scratch `node` needs on this backend, worst case over runs (dropout on or off, any
  // data). The planner counts these for the plan's target; the executor hands exactly this much.
  virtual int64_t workspace_bytes(const Module& module, const Node& node) const = 0;

  // --- memory ---
  // 256-byte aligned. Device memory is not initialized; host memory is not either.
  virtual Expected<void*> allocate(MemoryKind kind, int64_t bytes) = 0;
  virtual void deallocate(MemoryKind kind, void* p) = 0;
  // Sets `bytes` bytes at `p` (device memory) to `byte`, synchronously.
  virtual Status fill(void* p, uint8_t byte, int64_t bytes) = 0;
  // allocate, with every byte zero: fill (device) or memset (host) unless the backend gets zeroed
  // memory for free (the CPU's large blocks are fresh pages, backed only once written).
  virtual Expected<void*> allocate_zeroed(MemoryKind kind, int64_t bytes);

  // --- copies and streams ---
  // Synchronous: complete on return. Either side may be device or host memory.
  virtual Status copy(void* dst, const void* src, int64_t bytes) = 0;
  // Ordered on `stream`; complete once the stream reaches it. Host sides should be pinned.
  virtual Status copy_async(void* dst, const void* src, int64_t bytes, Stream stream) = 0;
  virtual Stream compute_stream() = 0;
  virtual Stream copy_stream() = 0;
  // An event marking everything queued on `stream` so far; `wait` orders `stream` after it.
  virtual Expected<Event> record(Stream stream) = 0;
  virtual Status wait(Stream stream, Event event) = 0;
  virtual void destroy(Event event) = 0;
  virtual Status synchronize(Stream stream) = 0;
  // Whole-step graphs: what `stream` receives between begin_capture and end_capture is recorded,
  // not run, and launch() replays it. A backend without them (the CPU) says so; the executor then
  // runs kernels one by one.
  virtual bool can_capture() const { return false; }
  virtual Status begin_capture(Stream) { return Status::Internal(str_cat(name(), " captures no graphs")); }
  virtual Expected<Graph> end_capture(Stream) { return Status::Internal(str_cat(name(), " captures no graphs")); }
  virtual Status launch(Graph, Stream) { return Status::Internal(str_cat(name(), " captures no graphs")); }
  virtual void destroy(Graph) {}
  // Bytes at the start of the kernel workspace that hold the run state (the step, written by the
  // executor before each step; KernelContext::device_step); counted in every node's
  // workspace_bytes, so the plan includes them. 0: the backend reads KernelContext::step.
  virtual int64_t run_state_bytes() const { return 0; }
  // Bytes in use on the device as its driver reports them (every allocation of every process,
  // and the runtime's own context), or -1 where there is no such figure (the CPU backend).
  virtual int64_t device_bytes_in_use() const { return -1; }
};

// The CPU backend (always present).
Backend& cpu_backend();

// The backend whose kernel workspaces a plan for `target` counts: "cpu" or a calibrated
// profile (a .json path) plans for the CPU; "a100", "h100", "h200" for CUDA. Needs no device.
const Backend& planning_backend(const std::string& target);

// The largest workspace any scheduled node of `module` needs on `backend`: the one scratch
// region the executor allocates.
int64_t max_workspace_bytes(const Backend& backend, const Module& module);

// The backend for `memc run --device`: "cpu", "cuda" or "cuda:K". A CUDA device that is absent
// (no driver, no GPU, or memc built without CUDA) is a bad-input error naming why.
Expected<Backend*> open_backend(const std::string& device);

}  // namespace memc
