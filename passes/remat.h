// Rematerialization (the `remat` memory pass): which forward activations backward keeps and
// which it recomputes, under a byte limit.
//
// Model. The forward of one (micro-)batch is cut into a chain of segments at the values that
// are alone in crossing a point of the forward order (a transformer's residual stream between
// sub-blocks). Values computed from parameters and constants only (casts of weights) and
// values the user pins with `save` are global: kept, never recomputed. Segment s reads x_s and
// produces x_{s+1}; its tape is what its backward reads. Backward of segments s..t-1, holding
// x_s, is solved by a dynamic program over (s, t, free bytes) with three moves:
//   record s        run s keeping its whole tape, solve s+1..t, then backward of s
//   partial s       run s keeping only the outputs of compute-heavy ops (matmul, linear, conv,
//                   attention) that backward reads; before backward of s recompute the cheap
//                   ops from x_s (the min-cut preference of PyTorch's partitioner: recompute
//                   elementwise, softmax, layernorm and dropout, keep matmul outputs)
//   checkpoint j    run s..j-1 keeping nothing but x_j, solve j..t, then solve s..j again
// minimizing recomputed cost (FLOPs plus bytes written, so memory-bound ops are not free).
// With only checkpoints allowed this is Revolve: on a uniform chain of n segments with c slots
// it recomputes exactly the binomial optimum (tests/remat_test.cc checks the formula).
//
// Materialization. The first execution of every segment is the original forward. Later
// executions are clones of the segment's nodes; backward nodes read the clone of the tape
// they need, and clones are placed right before the first backward node that needs them, so
// liveness frees originals early. Dropout masks come from the counter-based RNG (seed, step,
// element), so a recomputed dropout draws the very same mask: gradients with and without remat
// are bit-identical, which tests check on every committed model.
//
// Run on a training step right after autodiff, per micro-batch (TrainingStep calls it).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace memc {

// kBlocks: checkpoint each transformer block's input and recompute the block (what Fabric's
// activation_checkpointing=EncoderBlock does); kLimit: the dynamic program under limit_bytes.
enum class RematPolicy { kNone, kBlocks, kLimit };
std::string_view remat_policy_name(RematPolicy policy);  // "none" | "blocks" | "limit"

struct RematOptions {
  RematPolicy policy = RematPolicy::kNone;
  int64_t limit_bytes = 0;
  std::vector<std::string> must_save;       // value names (IR name or ONNX name)
  std::vector<std::string> must_recompute;  // never kept from the forward: always recomputed
};

struct RematReport {
  int segments = 0;
  int64_t tape_bytes = 0;       // activations backward reads, without remat
  int64_t held_tape_bytes = 0;  // the most tape bytes held at once along the schedule (checkpoints aside)
  int recomputed_nodes = 0;     // clone nodes added
  int64_t recompute_flops = 0;  // FLOPs of the clones
  int unresolved_pins = 0;      // pinned names that match no forward value
  int blocks = 0;               // policy blocks: the transformer blocks found (0: the forward is one group)
  std::string blocks_found_by;  // policy blocks: how ("module paths in node names", …; "": none found)
  // A limit is met when held_tape_bytes is within it. The solver never holds less than the
  // largest single segment's tape (recorded right before its backward), so a smaller limit is
  // answered with the least it can do and reported here instead of refused.
  bool limit_met = true;
  int64_t dp_table_bytes = 0;   // the chain solver's table (policy limit): at most kMaxChainTableBytes
};

// Parses --remat: none | blocks | SIZE | a comma list of SIZE or blocks, save=NAME, recompute=NAME.
Expected<RematOptions> parse_remat(const std::string& spec);
// "none", "blocks", "pins" (pins only) or the limit as a size.
std::string describe_remat(const RematOptions& remat);

class Remat {
 public:
  explicit Remat(RematOptions options) : options_(std::move(options)) {}
  std::string name() const { return "remat"; }
  // forward: node ids [forward_begin, backward_begin) (including the loss); backward: node ids
  // [backward_begin, backward_end) from autodiff. Other nodes keep their places.
  Expected<RematReport> run(Module& module, NodeId forward_begin, NodeId backward_begin, NodeId backward_end) const;

 private:
  RematOptions options_;
};

// The chain solver alone (exposed for tests): n segments, each with advance cost `cost[s]`,
// boundary bytes `x[s]` (x_s, s = 0..n; x_0 is held by the caller), tape bytes `tape[s]`, heavy
// bytes `heavy[s]` and cheap cost `cheap[s]`. Finds the minimal total cost of all segment
// executions (advances, recordings, partial recomputes) for backward of the whole chain with
// `limit` bytes, counted in units of `unit` bytes (0: limit/256 rounded up, so q ≤ 256 units).
struct ChainAction {
  enum Kind { kAdvance, kRecord, kPartial, kBackward } kind;
  int segment;
};
struct Chain {
  std::vector<double> cost, cheap;
  std::vector<int64_t> x, tape, heavy;
};
struct ChainSolution {
  double cost = -1;  // -1: the limit cannot be met
  std::vector<ChainAction> actions;
  int64_t table_bytes = 0;  // the dynamic program's table
};
ChainSolution solve_chain(const Chain& chain, int64_t limit, int64_t unit = 0);

// The table holds a float cost and a 16-bit move per range s < t of n segments and per m ≤ q
// free units: n(n+1)/2 · (q+1) cells of 6 B. Remat merges neighbouring segments above
// kMaxChainSegments, so with q ≤ 256 it is at most 32,896 · 257 cells = 50,725,632 B (48.4
// MiB). (The full (s, t) square with 32-bit moves took n(n+1)·257·8 B: 515 MB at 500 segments.)
inline constexpr int kMaxChainSegments = 256;
inline constexpr int64_t kChainCellBytes = sizeof(float) + sizeof(int16_t);
inline constexpr int64_t kMaxChainTableBytes = int64_t{kMaxChainSegments} * (kMaxChainSegments + 1) / 2 * 257 * kChainCellBytes;
int64_t chain_table_cells(int64_t segments, int64_t limit_units);

// Minimal number of forward advances of the binomial (Revolve) schedule for n steps with c
// checkpoint slots: t = r·n − C(c+r+1, r−1) ... see remat.cc (Griewank & Walther 2000).
int64_t revolve_advances(int64_t n, int64_t c);

}  // namespace memc
