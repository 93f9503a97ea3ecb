// shard: data parallelism over N ranks with ZeRO-sharded optimizer states (DESIGN.md, the shard
// pass). Every rank runs the same training step (SPMD) on its slice of the global batch:
//   rank r takes rank_slice(B, N, r): ⌊B/N⌋ rows, one more for the first B mod N ranks; random ops
//   offset their draws by the slice's first row (attribute rng_row_stride), so N ranks replay one
//   device's masks. Every rank's step has ⌈B/N⌉ rows: a short slice pads a row labelled
//   kPaddingLabel, and each rank divides its loss sum by the global batch B
//   (softmax_cross_entropy's ignore_index and divisor), so the ranks' sum is the global batch's
//   mean loss and each rank's backward is one device's rows at one device's scale.
//   Parameters are grouped into units (the transformer's embedding, each block and the head,
//   found from the graph's structure: passes/shard_units.h); a unit's gradients are flattened
//   into one buffer padded to a multiple of N (so each collective is one call) and reduced:
//     zero1  all_reduce of the flat gradient, then this rank's block of it;
//     zero2  reduce_scatter of the flat gradient, as soon as the unit's gradient is complete;
//   both as async pairs (reduce_async), overlapping the backward of the units before.
//   Each rank holds and updates the optimizer state of its block only ([⌈E/N⌉] per unit), then
//   all_gathers the updated block so every rank holds the whole parameters again.
//     zero3  the parameters themselves are sharded: a unit is one argument, this rank's block
//            "shard.unitK", all-gathered and split into the parameters before the forward uses
//            them and gathered again for backward, so whole parameters live only while a unit
//            computes (FSDP); autodiff turns the gather into the gradient's reduce_scatter.
//   The loss and gradients are the global batch's mean: the reduced sums of the ranks' 1/B-scaled
//   losses and gradients, with nothing scaled by 1/N. (Scaling a rank's seed by N/B and the sum
//   by 1/N, as memc did before, is the same in exact arithmetic, but for N not a power of two it
//   rounds every 16-bit tensor of the backward differently from one device: bf16-mixed
//   gradients on 3 ranks were 3× farther from one device's than on 2 or 4, bench/journal/2026.md
//   §44.) Without the global batch (ShardOptions::batch 0) the rank's mean is scaled by 1/N.
//   Global-norm clipping and loss scaling's found_inf all-reduce their sums of squares.
//   zero3's gathers are async pairs, prefetched one unit ahead: unit k's all_gather_start reads
//   unit k−1's first split piece as its `after` point, forward and backward (the schedule pass
//   keeps that order when it costs at most one unit in flight each way, passes/schedule.h).
//   With micro-batches each micro-batch gathers the units again for its forward (and its
//   backward), prefetched one unit ahead within the micro-batch both ways, and the shards'
//   reduce-scattered gradients accumulate (not yet prefetched across micro-batches).
//   Parameter streaming (--offload params, ShardOptions::stream_params) builds the same flat
//   units in host memory, copied to the device before the all_gather (or instead of it on one
//   device); the offload pass places them.
// TrainingStep applies it between autodiff and the optimizer (passes/training_step.h).
//   Block-wise optimizer states (adam8bit's 2048-element quantization blocks) need every block to
//   hold one parameter's elements only, as on one device: ShardOptions::align places each
//   parameter at a multiple of the block in its unit's flat buffer (zeros between) and makes
//   each rank's share a multiple of it, so a rank's quantization blocks are one device's.
//   Optimizers whose states follow each parameter's shape (Adafactor's factored row and column
//   statistics span any flat block) keep them whole and replicated instead: under zero1/zero2
//   each unit's flat gradient is all-reduced (one call per unit) and every rank updates the
//   whole parameters in place, as one device does (ShardOptions::replicate_states). Their
//   states are a parameter's rows plus columns, so replicating them costs little; zero3 and
//   parameter streaming, whose parameters live only as flat blocks, refuse them.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/ops/ops.h"

namespace memc {

enum class ShardStage : int { kNone = 0, kZero1 = 1, kZero2 = 2, kZero3 = 3 };

struct ShardOptions {
  int64_t devices = 1;
  ShardStage stage = ShardStage::kNone;
  // --offload params: each unit's parameters are one flat argument in host memory, streamed to
  // the device (copy_to_device, then all_gather when sharded) before the unit's forward and
  // again for its backward, as zero3 gathers them; also on one device.
  bool stream_params = false;
  // The global batch (0: the rank's rows times devices). Rank r takes rank_slice's rows; when
  // devices does not divide it, every rank's step has rank_rows rows and a rank with one fewer
  // pads a row whose label is kPaddingLabel, which the loss ignores.
  int64_t batch = 0;
  // Each parameter starts at a multiple of `align` elements in its unit's flat buffer, and a
  // rank's share is a multiple of it (the optimizer's state block; 1: packed).
  int64_t align = 1;
  // The optimizer's states follow each parameter's shape: gradients are all-reduced, every rank
  // updates whole parameters with replicated states (zero1/zero2 only).
  bool replicate_states = false;
  bool active() const { return devices > 1 || stage != ShardStage::kNone; }
  bool uneven() const { return devices > 1 && batch > 0 && batch % devices != 0; }
  // Each rank's loss divides by the global batch, and the ranks' reduced values are summed.
  bool global_divisor() const { return devices > 1 && batch > 0; }
  // The parameters are per-unit flat arguments (zero3's shards, or streamed whole units).
  bool flat_params() const { return stage == ShardStage::kZero3 || stream_params; }
  // Streaming on N ranks streams each rank's zero3 shards: one device, or zero3.
  bool can_stream() const { return !active() || stage == ShardStage::kZero3; }
};

// The label of a rank's padding row (ShardOptions::batch).
inline constexpr int64_t kPaddingLabel = -1;

// Rank r's rows of a global batch split over `devices`: the first batch % devices ranks take
// one more, so sizes differ by at most one (as micro-batches do).
struct RankSlice {
  int64_t first = 0, rows = 0;
};
RankSlice rank_slice(int64_t batch, int64_t devices, int64_t rank);
// The rows of every rank's step: the longest slice, ⌈batch / devices⌉ (devices < 1 counts as 1).
inline int64_t rank_rows(int64_t batch, int64_t devices) {
  devices = std::max<int64_t>(devices, 1);
  return (batch + devices - 1) / devices;
}

// Each parameter's first element in a unit's flat buffer: flat_offsets (ir/ops/ops.h).
// A rank's share of a flat buffer whose used length is `elements`: ⌈elements / devices⌉, rounded
// up to a multiple of `align`.
inline int64_t flat_block(int64_t elements, int64_t devices, int64_t align) {
  const int64_t share = (elements + devices - 1) / devices;
  return (share + align - 1) / align * align;
}

// "none" | "zero1" | "zero2" | "zero3" with --devices N.
Expected<ShardOptions> parse_shard(const std::string& stage, int64_t devices);
std::string shard_stage_name(ShardStage stage);

// One unit as the optimizer sees it: the flat block of its parameters this rank updates.
struct ShardUnit {
  std::string name;              // "shard.unit3": its optimizer states are "<state>.shard.unit3"
  std::vector<ValueId> params;   // in flat order (zero3: removed from the module's arguments)
  std::vector<std::string> param_names;  // their source names
  std::vector<int64_t> offsets;  // each parameter's first element in the flat buffer
  int64_t elements = 0;          // the flat buffer's used length: the last parameter's end
  int64_t block = 0;             // ⌈elements / N⌉: this rank's share, padding included
  ValueId weight = kNoValue;     // this rank's block of the flat parameters [block]
  ValueId grad = kNoValue;       // this rank's block of the mean gradient over ranks [block]
  std::vector<ValueId> views;    // zero3: the gathered parameters forward reads, one per param
  ValueId pending = kNoValue;    // zero3 on N > 1: all_gather_start's result (prefetched one unit ahead)
  ValueId split = kNoValue;      // zero3 on N > 1: the first piece split_flat cuts from the gathered
                                 // unit; the next unit's start follows it (the unit's compute begins)
};

// Without structural units (no repeated block), consecutive parameters up to this many bytes
// form a unit (PyTorch DDP's default bucket, 25 MiB): large enough that a collective's latency
// is amortized, small enough that a unit's flat gradient is a small part of the peak.
inline constexpr int64_t kUnitBytes = int64_t{25} << 20;

// Which parameters form each unit (indices into the parameter list), decided on the forward
// before autodiff: the transformer's embedding, blocks and head from the graph's structure
// (passes/shard_units.h), else size buckets of kUnitBytes. `description` says which.
struct UnitGroups {
  std::vector<std::vector<size_t>> members;
  std::string description;
};
UnitGroups plan_units(const Module& forward, const std::vector<ValueId>& params);

// zero3 and streaming, before autodiff: replaces each unit's parameter arguments by its flat
// argument and the gather (or host copy) that rebuilds them before their first reader; `params`
// becomes the flat arguments.
Expected<std::vector<ShardUnit>> shard_parameters(Module& m, std::vector<ValueId>& params, const UnitGroups& groups, const ShardOptions& options);
// zero3 and streaming with micro-batches: unit `u`'s parameters gathered again for one
// micro-batch's forward (a new chain at the end of the schedule; the schedule pass places it):
// a copy of `u` whose views (one per parameter in u.params order), pending and split are the
// new chain's.
ShardUnit gather_again(Module& m, const ShardUnit& u, const ShardOptions& options);
// Prefetch one unit ahead over `chains` (one micro-batch's gathers, in any order): each unit's
// all_gather_start follows the split of the unit gathered before it.
void prefetch_gathers(Module& m, const std::vector<ShardUnit>& chains);
// zero3, once every pass over the units is built: each pass (a micro-batch's forward, its
// backward) prefetches within itself, so each pass's first gather waited exposed. This links it
// to the split scheduled before it: backward's first regather to the forward's last unit, and
// micro-batch k+1's first gather to micro-batch k's last backward unit. Only the step's first
// gather has nothing to follow.
void prefetch_across_passes(Module& m);
// zero3, after autodiff: backward nodes (ids ≥ backward_begin) read a second gather of each
// unit, so the forward's gathered parameters die when the forward is done with them.
Status regather_for_backward(Module& m, const std::vector<ShardUnit>& units, NodeId backward_begin, const ShardOptions& options);

// zero1/zero2: groups `params` into units and emits each unit's gradient reduction and
// parameter block.
Expected<std::vector<ShardUnit>> shard_gradients(Module& m, const std::vector<ValueId>& params, const std::vector<ValueId>& grads,
                                                 const UnitGroups& groups, const ShardOptions& options);
// replicate_states: each parameter's mean gradient over ranks, from one all_reduce of each
// unit's flat gradient.
std::vector<ValueId> all_reduce_gradients(Module& m, const std::vector<ValueId>& params, const std::vector<ValueId>& grads,
                                          const UnitGroups& groups, const ShardOptions& options);
// The sum (or max) of a value over ranks; `v` itself on one rank.
ValueId all_reduce_value(Module& m, ValueId v, const ShardOptions& options, const std::string& reduce = "sum");
// A gradient's sum over ranks as an async pair, OP_start(x) → pending, OP_done(pending, x), for
// op "reduce_scatter" or "all_reduce" (x itself for all_reduce on one rank): the schedule pass
// issues the start as soon as x is complete and the done right before its first reader, so the
// transfer overlaps the backward compute scheduled between them (passes/schedule.h).
ValueId reduce_async(Module& m, const std::string& op, ValueId x, const ShardOptions& options);
// Completes unit k's gradient reduction (dones[k], an OP_done's result; units in forward order)
// only once after[k] exists (its `after` input): the backward finishes the units in reverse
// order, so with after[k] the gradient of unit k−1, unit k's transfer overlaps unit k−1's
// backward, one unit in flight. The done moves right after after[k]'s producer where nothing
// before that reads its result; kNoValue entries are skipped.
void overlap_reductions(Module& m, const std::vector<ValueId>& dones, const std::vector<ValueId>& after);
// {kNoValue, values[0], …, values[n−2]}: each unit's predecessor's value (overlap_reductions'
// `after` when units are in forward order).
std::vector<ValueId> previous_unit(const std::vector<ValueId>& values);
// The global batch's mean from the ranks' reduced sum `v`: v itself when each rank's loss
// divides by the global batch (ShardOptions::global_divisor), else v / N in v's dtype.
ValueId mean_over_ranks(Module& m, ValueId v, const ShardOptions& options);
// After the optimizer updated `unit.weight` to `updated`: all_gather the blocks and write each
// parameter's slice back as its update.
Status gather_updated_params(Module& m, const ShardUnit& unit, ValueId updated, const ShardOptions& options);
// Sets rng_row_stride on the random ops whose outermost dimension is the rank's batch or one of
// its micro-batches (`batches`), so each rank's draws continue at its first row of the global
// batch.
void mark_rank_draws(Module& m, const std::vector<int64_t>& batches);

// What the runtime needs to consolidate sharded optimizer states into per-parameter ones
// (checkpoints) and back: recorded in the module's metadata.
struct ShardLayout {
  int64_t devices = 1;
  ShardStage stage = ShardStage::kNone;
  struct Unit {
    std::string name;
    std::vector<std::string> params;  // source names, in flat order
    int64_t block = 0;
  };
  int64_t align = 1;  // ShardOptions::align: parameter i starts at the multiple of it after i − 1 ends
  std::vector<Unit> units;
  bool flat_params = false;  // the parameters are the units' flat arguments (zero3, streaming)
};
void record_shard_layout(Module& m, const std::vector<ShardUnit>& units, const ShardOptions& options);
// The layout of a training step; devices 1 and no units when it is not sharded.
Expected<ShardLayout> shard_layout(const Module& m);

}  // namespace memc
