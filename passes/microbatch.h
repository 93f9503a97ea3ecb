// Micro-batching with gradient accumulation (the `microbatch` memory pass).
//
// The step's batch of N samples runs as k micro-batches whose sizes differ by at most one (the
// first N mod k hold ⌈N/k⌉ samples, the rest ⌊N/k⌋). Micro-batch i is a copy of the forward
// imported at its own size n_i, fed rows [a_i, a_i + n_i) of every input and of the labels. Its
// mean loss is weighted by n_i/N, so Σ_i (n_i/N)·loss_i is the full batch's mean loss and the
// accumulated gradient is the full batch's up to summation order, whether or not k divides N.
//
// Dropout (and attention dropout) draws carry the micro-batch's element offset (attribute
// `rng_offset` = a_i · elements per sample), so a micro-batch draws the very mask the full batch
// draws for those rows: with dropout on, k micro-batches and one batch give the same gradients.
// This holds for tensors whose outermost dimension is the batch, as in every exported ViT and
// BERT-style encoder.
//
// Node order: slices, forward i, loss i, backward i, and each accumulation right after the
// gradient it adds, so one micro-batch's activations are live at a time and the running sums
// are updated in place. The sums have the parameter's dtype, as PyTorch's .grad: f32 under
// fp32 and the mixed modes (f32 master weights), 16-bit under bf16-true and fp16-true.
#pragma once
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace memc {

// The source of the nodes the micro-batching adds (the accumulation of each gradient over the
// micro-batches among them).
inline constexpr std::string_view kMicroBatchSource = "micro-batch";

// Imports the forward for a batch of `batch` samples, with the same precision and dropout
// treatment as the full-batch forward.
using ForwardFactory = std::function<Expected<Module>(int64_t batch)>;

// The counter draws a random op (dropout, attention with dropout) makes per sample of a batch of
// `batch`, when its outermost dimension is that batch; 0 otherwise (it keeps its own draws).
// A slice of the batch starting at sample a offsets its draws by a times this.
int64_t random_draws_per_sample(const Module& m, const Node& node, int64_t batch);

// Sizes of the k micro-batches of a batch of `batch` (k ≤ batch).
std::vector<int64_t> micro_batch_sizes(int64_t batch, int64_t k);

// How the step's cross-entropy counts its rows (ir/ops/training.cc). By default it is the mean
// over the batch. A sharded rank divides its sum by its share of the global batch instead, and
// a rank whose slice is one short ignores the row it pads (passes/shard.h, ShardOptions::batch).
// Token labels (logits [N, T..., C], labels [N, T...]: a language model) count positions, as
// PyTorch's cross_entropy does: labels of kIgnoreLabel add nothing, and the sum over the others
// is divided by `kept`, the count of labels ≥ 0 in the whole batch (every micro-batch's, and
// every rank's), a value the step computes from the labels.
struct LossRows {
  double divisor = 0;                   // 0: the batch's rows
  std::optional<int64_t> ignore_label;  // rows with this label add nothing
  ValueId kept = kNoValue;              // token labels: f32 scalar, the batch's labels ≥ 0
  int64_t chunks = 1;                   // token labels: the head's chunks (passes/loss_chunks.h; 0: auto)
  Attrs attrs() const;  // the cross-entropy's: {ignore_index}, and {divisor} when set
};

// PyTorch's ignore_index: a position whose label is -100 adds nothing to a token-level loss.
inline constexpr int64_t kIgnoreLabel = -100;

// The loss of `logits` against `labels` counted as `rows` says: softmax_cross_entropy itself for
// [N, C] logits; for token labels the positions flattened into rows, their sum over labels that
// are not kIgnoreLabel, divided by rows.kept.
ValueId cross_entropy(Module& m, ValueId logits, ValueId labels, const LossRows& rows);

struct AccumulatedStep {
  ValueId loss = kNoValue;    // f32 scalar: the full batch's mean loss
  ValueId logits = kNoValue;  // [N, C]: the micro-batches' logits concatenated
  std::vector<ValueId> grads;  // d(loss·scale)/d param, in the order of `params`
  int64_t loss_chunks = 1;     // each micro-batch's head chunks (passes/loss_chunks.h)
};

// Called after each micro-batch's autodiff with its node ranges: forward [forward_begin,
// backward_begin), backward [backward_begin, backward_end) (the remat pass runs here).
using AfterAutodiff = std::function<Status(Module&, NodeId forward_begin, NodeId backward_begin, NodeId backward_end)>;

// Where a micro-batch's forward reads a parameter (by its source name) when the step has no
// argument of that name: zero3 and parameter streaming gather each unit again for every
// micro-batch (passes/shard.h). Called before the micro-batch's forward is inlined; the nodes a
// call adds then move to right before their first reader, so a unit is gathered when the
// forward reaches it (not every unit before the first compute).
using ParamBinder = std::function<Expected<ValueId>(const std::string& source_name, size_t micro_batch)>;

// Appends the k micro-batches to `module`, whose arguments are the full-batch forward's
// (inputs [N, ...] and params) plus `labels` [N]; its own forward nodes must already be gone.
// `scale` (kNoValue: none) multiplies the loss that is differentiated (dynamic loss scaling);
// `loss` says how it counts rows (each micro-batch weighs n_i/divisor).
// `params` are what the gradients are taken of: the parameter arguments, or the shards that
// `bind` gathers into the parameters.
Expected<AccumulatedStep> accumulate_micro_batches(Module& module, const ForwardFactory& forward, int64_t k,
                                                   ValueId labels, const std::vector<ValueId>& params,
                                                   ValueId scale, const LossRows& loss = {}, const AfterAutodiff& after_autodiff = {},
                                                   const ParamBinder& bind = {});

}  // namespace memc
