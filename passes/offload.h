// The offload pass (one device): optimizer state, and under mixed precision the f32 master
// weights, live in host memory (memory space "host"), as in ZeRO-Offload; the optimizer update
// that reads and writes them runs on the host. What the device keeps: the compute copies of the
// weights (the f32 weights themselves under fp32), activations and gradients. Every byte that
// crosses is an explicit op: copy_to_host brings an update's device operands (its gradient, the
// fp32 weight, the loss-scaling flag) into host staging buffers, and copy_to_device returns a
// device weight's new value; on CUDA they run on the copy stream from the pinned host arena.
// Host placement is decided by op flags (kOpOptimizerUpdate, kOpTransfer), not op names.
//
// Levels: "none"; "optimizer" (optimizer state, plus master weights under a mixed precision);
// "params" (ZeRO-Infinity style: the parameters too, each unit streamed to the device before its
// forward and again before its backward, its gradient staged back for the host update).
// Exact: the same kernels run on the same values, so gradients and weights are bit-identical
// to the plan without offload; only the memory space of the values changes. Memory planning
// gives the host its own arena (planned and measured like the device one), and the cost model
// charges the copies over the host link and the update at host bandwidth.
//
// Run on the training step after TrainingStep (and remat), before scheduling.
#pragma once
#include <string>
#include <string_view>

#include "ir/graph.h"
#include "passes/pass.h"

namespace memc {

// What lives in host memory: nothing; the optimizer state (and master weights); or also the
// parameters themselves, streamed to the device one unit at a time (TrainingStep builds the
// streams, passes/shard.h; this pass places the units' arguments and their gradients' staging).
enum class OffloadLevel { kNone, kOptimizer, kParams };
// "none" | "optimizer" | "params"; anything else is bad input.
Expected<OffloadLevel> parse_offload_level(std::string_view name);
std::string_view offload_level_name(OffloadLevel level);

struct OffloadReport {
  int values = 0;               // values moved to host memory
  int transfers = 0;            // copy_to_host / copy_to_device ops inserted
  int64_t bytes = 0;            // their bytes
  int64_t link_bytes = 0;       // host↔device bytes per step (what the transfer ops move)
  int64_t host_update_bytes = 0;  // bytes the host update reads and writes
};

class Offload : public Pass {
 public:
  explicit Offload(OffloadLevel level) : level_(level) {}
  std::string_view name() const override { return "offload"; }
  // Statistics: values, transfers, bytes, link_bytes, host_update_bytes.
  Expected<PassReport> run(Module& train) override;

 private:
  OffloadLevel level_;
};

// Whether `node` runs on the host under offload: an optimizer update (kOpOptimizerUpdate)
// touching host values.
bool runs_on_host(const Module& m, const Node& node);

// Per step, what the updates that run on the host read and write there, and what crosses the
// host link (the transfer ops' bytes). The offload report and the cost model share it.
struct HostTraffic {
  int64_t link_bytes = 0;
  int64_t host_update_bytes = 0;
};
HostTraffic host_traffic(const Module& m);

}  // namespace memc
