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

// The timeline of the last profiled training step (`memc run --profile --json`): each kernel's
// wall-clock span, from the step's first kernel, as the executor saw it (each call waits for its
// stream, so a span is the kernel's own time). A collective that the plan starts early
// (OP_start … OP_done) is in flight from its start kernel to the end of its done kernel; the
// start and done kernels' spans are the time the step waited for it, the rest went to compute.
// On MPI ranks Open MPI moves the data of a started collective inside MPI calls, so in-flight
// time there is where overlap could happen; on GPU ranks NCCL's stream runs beside compute and
// the wait is what compute did not hide.
struct CollectiveSpan {
  std::string op;         // all_gather, reduce_scatter, all_reduce, broadcast
  double start_ms = 0;    // its start kernel began (a blocking call: the call began)
  double end_ms = 0;      // its done kernel (or the blocking call) returned
  double wait_ms = 0;     // the step stood still for it: its start and done kernels' spans, or the whole call
  double transfer_ms = -1;  // its own time on NCCL's stream (CUDA events); -1 where unknown (MPI)
  double hidden_ms() const { return end_ms - start_ms - wait_ms; }
};
struct StepTimeline {
  double step_ms = 0;      // first kernel's start to last kernel's end
  double kernel_ms = 0;    // Σ of every kernel's span but the collectives'
  std::vector<CollectiveSpan> collectives;  // in the order they started
};
// The executor: a training step's kernels are about to launch (clears the last step's timeline).
void begin_profiled_step();
// A kernel's span; `pair` is the start node of a done node (else -1), `node` its own id.
void record_span(int64_t node, int64_t pair, const std::string& op, double start_ms, double end_ms);
// The current step's time origin, for record_span: ms since begin_profiled_step.
double profiled_step_ms();
StepTimeline last_step_timeline();
// The communicator's device time of each of the step's collectives, in the order they started
// (Communicator::take_transfer_ms; NaN or absent: unknown).
void record_collective_transfers(std::vector<double> ms);

// The breakdown's categories: "gemm" (matmul, linear, conv and their backward ops), "attention"
// (the fused attention forward and backward), "optimizer" (the update ops),
// "normalization" (layernorm, softmax and their backward), "copies" (copy, cast, transpose,
// concat, slice, gather, pad, host/device transfers: data movement), "collective" (all_reduce,
// reduce_scatter, all_gather, broadcast), "reduction" (reduce_*, argmax/argmin, cumsum), "loss",
// else "elementwise" (the gradient-clipping and loss-scaling arithmetic among them).
std::string op_category(const std::string& op);

}  // namespace memc
