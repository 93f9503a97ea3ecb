// The cost model: a step-time estimate for a training step on a device profile.
//
// Each node costs max(compute, memory) plus a per-node overhead (kernel launch on a GPU, the
// executor's dispatch on the CPU), its time divided by the profile's thread speedup on a CPU:
//   compute = FLOPs / (peak rate of its dtype · efficiency of its family)
//             families: compute-heavy (matmul, linear, conv and their gradients), attention
//             (forward and backward: the fused kernel, its own efficiency) and the rest
//             (elementwise, reductions, normalizations); a heavy call also pays a fixed cost
//             of f_half FLOPs, so it runs at efficiency · f/(f + f_half), f its FLOPs, and
//             attention pays another fixed cost per batch·head entry (a CPU kernel's per-entry
//             block products; 0 on a GPU, where one kernel covers every entry)
//   memory  = bytes read and written / (memory bandwidth · efficiency), or, on a CPU, when the
//             node's bytes fit the per-core cache (L2), / the cache bandwidth: a small model's
//             elementwise ops and copies run from cache, several times the streaming rate
// Views (reshape and friends) are free. A collective costs its wire bytes over the interconnect
// plus a latency per call (NVLink/NVSwitch on the GPU profiles, MPI over shared memory on cpu). Host↔device copies of offloaded state go over the
// host link and overlap compute (the step takes the longer of the two plus what cannot
// overlap); an update that runs on the host is charged at host bandwidth.
//
// Profiles: "cpu" (the machine memc runs on: from `memc calibrate`'s file when present, else
// defaults measured on the development machine), and data-sheet profiles "a100", "h100",
// "h200" (SXM parts; dense tensor-core rates, HBM bandwidth, PCIe host link).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace memc {

struct DeviceProfile {
  std::string name;
  double f32_flops = 0;       // FLOP/s, dense, no TF32
  double low_flops = 0;       // FLOP/s for bf16/f16 operands (tensor cores on a GPU)
  bool bf16 = true, fp16 = true;  // whether mixed precision in that dtype is offered to the search
  double mem_bandwidth = 0;   // bytes/s, device memory
  double host_bandwidth = 0;  // bytes/s, host memory (optimizer update on the host)
  double link_bandwidth = 0;  // bytes/s, host↔device copies (0: same memory)
  double heavy_efficiency = 0.6, other_efficiency = 0.3, bandwidth_efficiency = 0.8;
  double half_flops = 1e8;    // FLOPs at which a heavy op reaches half its efficiency
  double attention_efficiency = 0.6;  // attention's share of the peak rate
  double attention_entry_flops = 0;   // attention's fixed cost per batch·head entry, in FLOPs
  bool attention_widens = false;      // the attention kernel computes 16-bit operands in f32 (the
                                      // CPU's): at the f32 rate, not the 16-bit one
  double low_other_factor = 1.0;  // time factor of non-heavy ops on 16-bit operands (CPU: conversions)
  double node_overhead_s = 5e-6;
  // A node whose bytes (read + written) are at most cache_bytes moves them at cache_bandwidth
  // (bytes/s, efficiency included) instead, when that is faster than streaming; 0: one tier
  // (GPUs, and profile files written before the tier).
  int64_t cache_bytes = 0;
  double cache_bandwidth = 0;
  // CPU threads: T threads run a heavy op's compute 1 + heavy_thread_gain·(T − 1) times as fast,
  // and the rest's compute and memory time 1 + other_thread_gain·(T − 1) (0: no gain; GPUs).
  double heavy_thread_gain = 0, other_thread_gain = 0;
  int64_t memory_bytes = 0;   // device memory (for reports only: the budget is the user's)
  // Collectives between ranks (ring algorithms: ir/op_registry.h collective_wire_bytes):
  // bytes/s each rank sends, and the latency of one collective call. Under NCCL's model
  // (interconnect set) comm_bandwidth is the bus bandwidth within a node and the latency is
  // NCCL's own (collective_seconds).
  double comm_bandwidth = 5e9;
  double comm_latency_s = 1e-5;
  // How GPU ranks are joined (`memc compile --interconnect`; the GPU profiles default to nvlink):
  //   "nvlink"  node_ranks GPUs per node on an NVLink switch (comm_bandwidth), nodes joined by one
  //             InfiniBand NIC per GPU: a ring that crosses nodes runs at the lesser of NVLink
  //             and the node's NICs (node_ranks · nic_bandwidth · kNicEfficiency);
  //   "ib"      every rank reaches every other over its own NIC (node_ranks 1);
  //   ""        one tier: comm_bandwidth and comm_latency_s at any rank count (CPU, MPI).
  std::string interconnect;
  int64_t node_ranks = 1;
  double nic_bandwidth = 0;  // bytes/s of one NIC, each direction (data sheet)
};
// The share of a NIC's line rate NCCL's bus bandwidth reaches on large messages.
inline constexpr double kNicEfficiency = 0.9;

// One collective's seconds. Flat profiles: wire bytes (ir/op_registry.h collective_wire_bytes)
// over comm_bandwidth, plus comm_latency_s. NCCL's model (its src/graph/tuning.cc, as published):
// for ring and, for all_reduce, tree, each with the LL and Simple protocols,
//   time = latency + bytes / (bus bandwidth · protocol factor · ratio)
//   ring: ratio ranks/steps (steps: 2(n−1) for all_reduce, n−1 for all_gather/reduce_scatter),
//         latency base + (steps − inter-node steps)·NVLink hop + inter-node steps·network hop
//   tree: ratio ½, latency base + 2·((ranks per node − 1)·NVLink hop + log2(nodes)·network hop)
// and the fastest of them, as NCCL picks; `bytes` is the whole buffer (all_gather's output,
// reduce_scatter's and all_reduce's input). `op` without _start.
double collective_seconds(const DeviceProfile& profile, std::string_view op, int64_t bytes, int64_t ranks);

// Sets how ranks are joined: "nvlink" (gpus_per_node per NVLink node, nodes over InfiniBand) or
// "ib" (every rank over its own NIC). GPU profiles only; their NICs are the parts' usual ones
// (A100: HDR 200 Gb/s, H100/H200: NDR 400 Gb/s, one per GPU).
Status set_interconnect(DeviceProfile& profile, const std::string& kind, int64_t gpus_per_node);
// "nvlink, 8 GPUs per node" | "ib" | "" (flat).
std::string interconnect_name(const DeviceProfile& profile);

// The per-core cache a CPU node's bytes must fit to run from it: L2 (sysconf), 1 MiB when the
// system does not say.
int64_t cpu_cache_bytes();

// A GPU target's data-sheet profile ("a100", "h100", "h200"), whatever MEMC_GPU_PROFILE says;
// bad input for another name.
Expected<DeviceProfile> gpu_data_sheet(const std::string& target);
// "cpu", "a100", "h100", "h200", or a path to a JSON profile (memc calibrate writes one).
// MEMC_CPU_PROFILE=FILE replaces "cpu"'s defaults; MEMC_GPU_PROFILE=FILE (memc calibrate
// --device cuda --target T) replaces T's data sheet, and is refused for another target.
Expected<DeviceProfile> device_profile(const std::string& target);
Status write_profile(const std::string& path, const DeviceProfile& profile);

struct StepEstimate {
  double compute_ms = 0;   // nodes on the device
  double transfer_ms = 0;  // host↔device copies (overlap compute)
  double host_ms = 0;      // work on the host (offloaded optimizer update)
  double comm_ms = 0;      // collectives between ranks not hidden behind compute (exposed)
  double comm_total_ms = 0;  // all of their time: an async pair (OP_start … OP_done) hides up to
                             // the compute scheduled between its start and its done
  double step_ms = 0;      // the estimate: max(compute, transfer) + host + comm (exposed)
};

// Nodes that run on the host (passes/offload.h) are charged at host bandwidth, and their
// device-side operands cross the host link. `threads`: the CPU compute threads the step runs with.
// `by_op` (optional) gets each op's compute time in ms summed over its nodes, overhead included
// (`memc run --profile` prints it beside the measured time).
StepEstimate estimate_step(const Module& train, const DeviceProfile& profile, int64_t threads = 1,
                           std::map<std::string, double>* by_op = nullptr);

}  // namespace memc
