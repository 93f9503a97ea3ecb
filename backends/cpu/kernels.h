// CPU kernels: the reference backend. One kernel per registry op, found by op name.
// Kernels compute f16/bf16 in f32 and store with round-to-nearest-even.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace memc::cpu {

struct KernelContext {
  const Node& node;
  std::vector<const Tensor*> inputs;  // nullptr marks an absent optional input
  std::vector<Tensor*> outputs;       // pre-allocated with the planned types
  bool training = false;              // dropout active
  uint64_t seed = 0;                  // counter-based RNG: (seed, step, node id, element)
  int64_t step = 0;
};

// Returns bad input for data-dependent errors (an out-of-range token id); shapes and dtypes
// were checked by the verifier and are MEMC_CHECKed here.
using Kernel = Status (*)(KernelContext& ctx);

const Kernel* find_kernel(const std::string& op);
// Every op that has a CPU kernel.
std::vector<std::string> kernel_ops();

// Registration entry points, one per kernel family file.
struct KernelTable;
void register_elementwise_kernels(KernelTable& t);
void register_linalg_kernels(KernelTable& t);
void register_reduce_kernels(KernelTable& t);
void register_shape_kernels(KernelTable& t);
void register_misc_kernels(KernelTable& t);
void register_training_kernels(KernelTable& t);
void register_optimizer_kernels(KernelTable& t);  // loss, fills, fused backward ops

struct KernelTable {
  void add(const std::string& op, Kernel k);
  std::vector<std::pair<std::string, Kernel>> entries;
};

// Counter-based RNG (Philox-style mixing): the same (seed, stream, index) gives the same bits
// on every run and every recomputation.
uint32_t counter_random(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace memc::cpu
