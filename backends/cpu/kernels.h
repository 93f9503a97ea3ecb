// CPU kernels: the reference backend. One kernel per registry op, found by op name.
// Kernels compute f16/bf16 in f32 and store with round-to-nearest-even.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/kernel_math.h"  // counter_random, dropout draws, GELU, Adam
#include "ir/graph.h"

namespace memc::cpu {

// The kernel interface is the Backend seam's (backends/backend.h); CPU kernels use it as is.
using KernelContext = memc::KernelContext;
using Kernel = memc::Kernel;

// Bytes of scratch the kernel needs for this node's static types, worst case over runs (dropout
// on or off, any data). Absent optional inputs appear as a default TensorType. A kernel without
// one needs no workspace.
using WorkspaceFn = int64_t (*)(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out);

const Kernel* find_kernel(std::string_view op);
// The workspace `node` needs on the CPU backend (0: none, or no CPU kernel); for the planner.
int64_t cpu_workspace_bytes(const Module& module, const Node& node);
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
void register_collective_kernels(KernelTable& t);  // through the rank's Communicator

struct KernelTable {
  struct Entry {
    std::string op;
    Kernel kernel;
    WorkspaceFn workspace_bytes;  // nullptr: the kernel needs no scratch
  };
  void add(const std::string& op, Kernel k, WorkspaceFn workspace_bytes = nullptr);
  std::vector<Entry> entries;
};


}  // namespace memc::cpu
