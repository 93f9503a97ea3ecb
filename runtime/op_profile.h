// Where a training step's time goes: `memc run --profile` times every kernel the planned
// executor launches (wall clock around the call, synchronized with its stream) and sums by op
// and by category. Off by default; when on, the cost is two clock reads per node.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace memc {

struct OpTime {
  std::string op;        // "linear", "attention_grad", ...
  std::string category;  // op_category(op)
  double ms = 0;         // summed over every call
  int64_t calls = 0;
};

void enable_op_profile();
bool op_profile_enabled();
void record_op_time(const std::string& op, double ms);
// Everything recorded so far, most time first.
std::vector<OpTime> op_profile();

// The breakdown's categories: "gemm" (matmul, linear, conv and their backward ops), "attention"
// (the fused attention forward and backward), "optimizer" (the update ops),
// "normalization" (layernorm, softmax and their backward), "copies" (copy, cast, transpose,
// concat, slice, gather, pad, host/device transfers: data movement), "collective" (all_reduce,
// reduce_scatter, all_gather, broadcast), "reduction" (reduce_*, argmax/argmin, cumsum), "loss",
// else "elementwise" (the gradient-clipping and loss-scaling arithmetic among them).
std::string op_category(const std::string& op);

}  // namespace memc
