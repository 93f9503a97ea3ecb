#include "passes/training_step.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "ir/grad.h"
#include "passes/autodiff.h"
#include "passes/emit.h"
#include "passes/loss_chunks.h"
#include "passes/optimizers.h"
#include "passes/shard.h"
#include "support/size.h"

namespace memc {
namespace {

ValueId emit(Module& m, const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {}) {
  return emit_node(m, "training step", op, std::move(inputs), std::move(attrs));
}
ValueId cast(Module& m, ValueId v, DType to) { return emit_cast(m, "training step", v, to); }

// coef = min(1, max_norm / (√Σ‖g‖² + 1e-6)), applied to every gradient (torch's clip_grad_norm_).
// Σ‖g‖² in f32 over `grads`, and over ranks when they hold blocks of the gradients.
ValueId sum_of_squares(Module& m, const std::vector<ValueId>& grads, const ShardOptions& shard) {
  ValueId total = kNoValue;
  for (ValueId g : grads) {
    ValueId sq = emit(m, "reduce_sum_square", {cast(m, g, DType::kF32)}, make_attrs({{"axes", std::vector<int64_t>{}}, {"keepdims", int64_t{0}}}));
    total = total == kNoValue ? sq : emit(m, "add", {total, sq});
  }
  return all_reduce_value(m, total, shard);
}

std::vector<ValueId> clip_by_global_norm(Module& m, const std::vector<ValueId>& grads, double max_norm, const ShardOptions& shard) {
  ValueId norm = emit(m, "sqrt", {sum_of_squares(m, grads, shard)});
  ValueId coef = emit(m, "min", {f32_scalar(m, 1.0), emit(m, "div", {f32_scalar(m, max_norm), emit(m, "add", {norm, f32_scalar(m, 1e-6)})})});
  std::vector<ValueId> clipped;
  for (ValueId g : grads) {
    ValueId out = emit(m, "mul", {g, cast(m, coef, m.value(g).type.dtype)});
    m.value(out).role = Role::kGrad;
    clipped.push_back(out);
  }
  return clipped;
}

// Gradients of loss·scale times 1/scale, in f32 and back in each gradient's dtype.
std::vector<ValueId> unscale(Module& m, const std::vector<ValueId>& grads, ValueId scale) {
  const ValueId inv = emit(m, "div", {f32_scalar(m, 1.0), scale});
  std::vector<ValueId> out;
  for (ValueId g : grads) {
    const DType t = m.value(g).type.dtype;
    const std::string name = m.value(g).name;
    m.rename(g, "scaled_" + name);
    const ValueId u = cast(m, emit(m, "mul", {cast(m, g, DType::kF32), inv}), t);
    m.value(u).role = Role::kGrad;
    m.rename(u, name);  // "grad.<param>": what compute_gradients reads
    out.push_back(u);
  }
  return out;
}

// 1 when any gradient holds inf or NaN: s = Σ‖g‖² is then inf or NaN, and s - s is not 0.
ValueId found_inf(Module& m, const std::vector<ValueId>& grads, const ShardOptions& shard) {
  const ValueId total = sum_of_squares(m, grads, shard);
  const ValueId finite = emit(m, "equal", {emit(m, "sub", {total, total}), f32_scalar(m, 0.0)});
  return emit(m, "sub", {f32_scalar(m, 1.0), cast(m, finite, DType::kF32)});
}

// What one optimizer update acts on: a parameter, or (sharded) this rank's block of a unit.
struct UpdateTarget {
  ValueId weight = kNoValue;
  ValueId grad = kNoValue;
  std::string name;  // its optimizer states are "<state>.<name>"
};
struct UpdateScalars {
  ValueId lr = kNoValue, step = kNoValue, skip = kNoValue;  // skip: kNoValue without loss scaling
};

// The optimizer's update node for one target (passes/optimizers.h); each state's next value
// updates it in place, and the weight's next value too when `update_weight` (a parameter
// argument). Returns the weight's next value.
Expected<ValueId> add_optimizer_update(Module& module, const OptimizerDef& optimizer, const OptimizerOptions& o, const UpdateTarget& target,
                                       const UpdateScalars& s, bool update_weight) {
  const UpdateContext context{module, o, target.weight, target.grad, target.name, s.lr, s.step, s.skip};
  const UpdateNode u = optimizer.build(context);
  MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> outs, module.add_node(u.op, u.inputs, u.attrs, "optimizer", u.outputs));
  for (size_t k = 0; k < outs.size(); ++k) {
    if (k == 0 && !update_weight) continue;
    module.value(outs[k]).role = module.value(u.updated[k]).role;
    module.rename(outs[k], module.value(u.updated[k]).name + ".next");
    module.add_update(u.updated[k], outs[k]);
  }
  return outs[0];
}

// The values the step is built from, filled in order by the steps of TrainingStep::run.
struct StepValues {
  ValueId logits = kNoValue;            // the forward's, [N, C]
  ValueId labels = kNoValue;            // new i64 [N] input
  ValueId scale = kNoValue;             // loss scaling's "loss_scale" argument, or kNoValue
  std::vector<ValueId> params;          // zero3: the shards
  UnitGroups groups;                    // sharded or streamed: the units' parameters, from the forward
  std::vector<ShardUnit> units;         // zero3: from shard_parameters; zero1/2: shard_gradients
  ValueId loss = kNoValue, logits_out = kNoValue;
  int64_t loss_chunks = 1;              // the head's chunks, as differentiable_loss chose
  std::vector<ValueId> grads;           // one per params entry
};

// The optimizer named in `o`, known, and one whose states work on flat units when the
// parameters are (zero3, streaming); on zero1/zero2 the others keep whole, replicated states.
Expected<const OptimizerDef*> checked_optimizer(const OptimizerOptions& o, const ShardOptions& shard) {
  const OptimizerDef* def = find_optimizer(o.kind);
  if (!def) return Status::BadInput("unknown optimizer '" + o.kind + "' (" + optimizer_names() + ")");
  if (shard.stream_params && def->flat_align == 0) {
    return Status::BadInput(str_cat("--offload params needs an optimizer whose states work on flat units (", optimizer_names(true), "); ", o.kind,
                                    "'s states follow each parameter's shape"));
  }
  if (shard.stage == ShardStage::kZero3 && def->flat_align == 0) {
    return Status::BadInput(str_cat("--shard zero3 needs an optimizer whose states work on flat units (", optimizer_names(true), "); ",
                                    o.kind, "'s states follow each parameter's shape"));
  }
  return def;
}

struct BufferUpdate {
  ValueId buffer, next;
};

// The buffers the forward updates (BatchNorm's running statistics, in train()): the step keeps
// their updates. Each normalizes with its batch's statistics: ranks sum theirs (the import's
// ImportOptions::ranks) when their slices are equal, but micro-batches would take their own rows'
// only, and are refused, as are uneven slices.
Expected<std::vector<BufferUpdate>> forward_buffer_updates(const Module& module, int64_t micro_batches, const ShardOptions& shard) {
  std::vector<BufferUpdate> updates;
  for (size_t i = 0; i < module.outputs().size() && i < module.output_updates().size(); ++i) {
    if (module.output_updates()[i] != kNoValue) updates.push_back({module.output_updates()[i], module.outputs()[i]});
  }
  if (!updates.empty() && (micro_batches > 1 || shard.uneven())) {
    return Status::BadInput(str_cat("the model normalizes with its batch's statistics (a BatchNorm exported in train() mode, updating '",
                                    module.value(updates[0].buffer).source_name, "'): ",
                                    micro_batches > 1 ? str_cat(micro_batches, " micro-batches would each take the statistics of their own rows, "
                                                                               "not the batch's; train it with one micro-batch")
                                                      : str_cat("batch ", shard.batch, " does not split evenly over ", shard.devices,
                                                                " ranks, and a padded row would enter the statistics; use a batch the ranks divide"),
                                    ", or export the module after .eval() to train with its running statistics"));
  }
  return updates;
}

// The forward's first output as float logits [N, C], the labels argument, the parameters (in
// argument order) and, under loss scaling, the scale argument.
Expected<StepValues> step_inputs(Module& module, bool loss_scaling) {
  if (module.outputs().empty()) return Status::BadInput("the model has no outputs");
  StepValues v;
  v.logits = module.outputs()[0];
  const TensorType logits_type = module.value(v.logits).type;
  if (logits_type.shape.size() < 2 || !is_float(logits_type.dtype)) {
    return Status::BadInput(str_cat("the first output '", module.value(v.logits).source_name, "' is ", dtype_name(logits_type.dtype), "[",
                                    shape_str(logits_type.shape), "]; cross-entropy training needs float logits [N, C] (or [N, T, C])"));
  }
  // One label per row, or per position of token-level logits (logits [N, T..., C] → labels [N, T...]).
  v.labels = module.add_argument(kLabelsArg, TensorType{DType::kI64, Shape(logits_type.shape.begin(), logits_type.shape.end() - 1)}, Role::kInput);
  for (ValueId a : module.arguments()) {
    if (module.value(a).role == Role::kParam) v.params.push_back(a);
  }
  if (v.params.empty()) return Status::BadInput("the model has no trainable parameters");
  if (loss_scaling) v.scale = module.add_argument(kLossScaleArg, TensorType{DType::kF32, {}}, Role::kScalar);
  v.logits_out = v.logits;
  return v;
}

// The count of the labels ≥ 0 in `labels` (the positions a token-level loss counts), summed
// over the ranks, and at least 1 (a batch of ignored positions has a zero loss and gradient).
ValueId kept_labels(Module& m, ValueId labels, const ShardOptions& shard) {
  const int64_t rank = static_cast<int64_t>(m.value(labels).type.shape.size());
  std::vector<int64_t> axes(static_cast<size_t>(rank));
  std::iota(axes.begin(), axes.end(), int64_t{0});
  const ValueId kept = emit(m, "greater_equal", {labels, m.add_constant(Tensor::zeros(DType::kI64, {}), "label_zero")});
  const ValueId count = emit(m, "reduce_sum", {cast(m, kept, DType::kF32)}, make_attrs({{"axes", axes}, {"keepdims", int64_t{0}}}));
  const ValueId at_least_one = emit(m, "max", {all_reduce_value(m, count, shard), f32_scalar(m, 1.0, "one")});
  m.rename(at_least_one, "kept_labels");
  return at_least_one;
}

// A rank's loss: its sum over its real rows divided by the global batch, so the ranks' sum is
// the global batch's mean loss and the backward seeds each row as one device does (passes/shard.h);
// a short slice's padding row is ignored. Token labels: the sum over the kept positions divided
// by the global batch's count of them (a padding row's labels are all kIgnoreLabel).
LossRows loss_rows(Module& m, const StepValues& v, const ShardOptions& shard, int64_t loss_chunks) {
  if (m.value(v.labels).type.shape.size() > 1) return {.kept = kept_labels(m, v.labels, shard), .chunks = loss_chunks};
  if (!shard.global_divisor()) return {.chunks = loss_chunks};
  LossRows rows{.divisor = static_cast<double>(shard.batch), .chunks = loss_chunks};
  if (shard.uneven()) rows.ignore_label = kPaddingLabel;
  return rows;
}

// One batch's loss and gradients: softmax cross-entropy (times the loss scale), autodiff, then
// `after_autodiff` (remat) on the new forward and backward; zero3 regathers for backward.
Status differentiate_one_batch(Module& module, StepValues& v, const AfterAutodiff& after_autodiff, const ShardOptions& shard,
                               int64_t loss_chunks) {
  MEMC_ASSIGN_OR_RETURN(const LossStart start,
                        differentiable_loss(module, v.logits, v.labels, loss_rows(module, v, shard, loss_chunks), v.scale));
  v.loss = start.loss;
  v.loss_chunks = start.chunks;
  module.rename(v.loss, "loss");
  const auto backward_begin = static_cast<NodeId>(module.nodes().size());
  MEMC_ASSIGN_OR_RETURN(v.grads, Autodiff().run(module, start.seeds, v.params));
  MEMC_RETURN_IF_ERROR(after_autodiff(module, 0, backward_begin, static_cast<NodeId>(module.nodes().size())));
  if (shard.flat_params()) MEMC_RETURN_IF_ERROR(regather_for_backward(module, v.units, backward_begin, shard));
  return Status::Ok();
}

// Data parallel: each rank's gradients and loss are its slice's, reduced here to the global
// batch's; the optimizer then acts on this rank's blocks of flat units (passes/shard.h).
// Without sharding, each parameter is its own target.
Expected<std::vector<UpdateTarget>> update_targets(Module& module, StepValues& v, const ShardOptions& shard, int64_t micro_batches) {
  std::vector<UpdateTarget> targets;
  if (!shard.active()) {
    for (size_t i = 0; i < v.params.size(); ++i) {
      targets.push_back({v.params[i], v.grads[i], v.units.empty() ? module.value(v.params[i]).source_name : v.units[i].name});
    }
    return targets;
  }
  module.rename(v.loss, "rank_loss");
  const int64_t rank_batch = module.value(v.logits).type.shape[0];
  std::vector<int64_t> batches = micro_batch_sizes(rank_batch, micro_batches);
  batches.insert(batches.begin(), rank_batch);
  mark_rank_draws(module, batches);
  if (shard.stage == ShardStage::kZero3) {  // each shard's gradient is reduce-scattered already (the gather's gradient)
    // Each unit's reduce-scatter completes once the unit before it has its gathered gradient.
    std::vector<ValueId> dones, gathered;
    for (ValueId g : v.grads) {
      const NodeId p = module.value(g).producer;
      const bool done = p != kNoNode && module.node(p).op == "reduce_scatter_done";
      dones.push_back(done ? g : kNoValue);
      gathered.push_back(done ? module.node(p).inputs[1] : kNoValue);
    }
    overlap_reductions(module, dones, previous_unit(gathered));
    for (size_t i = 0; i < v.units.size(); ++i) {
      module.rename(v.grads[i], "rank_sum_grad." + v.units[i].name);  // "grad.<unit>" is the mean's name
      const ValueId g = mean_over_ranks(module, v.grads[i], shard);
      module.value(g).role = Role::kGrad;
      module.rename(g, "grad." + v.units[i].name);
      targets.push_back({v.units[i].weight, g, v.units[i].name});
    }
  } else if (shard.replicate_states) {  // whole parameters, updated alike on every rank
    const std::vector<ValueId> mean = all_reduce_gradients(module, v.params, v.grads, v.groups, shard);
    for (size_t i = 0; i < v.params.size(); ++i) targets.push_back({v.params[i], mean[i], module.value(v.params[i]).source_name});
  } else {
    MEMC_ASSIGN_OR_RETURN(v.units, shard_gradients(module, v.params, v.grads, v.groups, shard));
    for (const ShardUnit& u : v.units) targets.push_back({u.weight, u.grad, u.name});
  }
  v.loss = mean_over_ranks(module, all_reduce_value(module, v.loss, shard), shard);
  module.rename(v.loss, "loss");
  return targets;
}

// Loss scaling unscales the targets' gradients and returns found_inf (else kNoValue); clipping
// then sees the unscaled gradients.
ValueId finish_gradients(Module& module, const StepValues& v, std::vector<UpdateTarget>& targets, const OptimizerOptions& o,
                         const ShardOptions& shard) {
  std::vector<ValueId> grads;
  for (const UpdateTarget& t : targets) grads.push_back(t.grad);
  // Blocks of the gradients are summed over ranks; replicated whole gradients are not.
  const ShardOptions over = shard.replicate_states ? ShardOptions{} : shard;
  ValueId skip = kNoValue;
  if (o.loss_scaling) {
    grads = unscale(module, grads, v.scale);
    skip = found_inf(module, grads, over);
    module.rename(skip, kFoundInfOutput);
  }
  if (o.clip_grad_norm > 0) grads = clip_by_global_norm(module, grads, o.clip_grad_norm, over);
  for (size_t i = 0; i < targets.size(); ++i) targets[i].grad = grads[i];
  return skip;
}

// Remat's reports of each micro-batch, folded into one: the largest segment count and held
// tapes, the sums of what was added, the last pin count, and whether every limit was met.
void merge_remat_report(RematReport& total, const RematReport& r) {
  total.segments = std::max(total.segments, r.segments);
  total.tape_bytes += r.tape_bytes;
  total.held_tape_bytes = std::max(total.held_tape_bytes, r.held_tape_bytes);
  total.recomputed_nodes += r.recomputed_nodes;
  total.recompute_flops += r.recompute_flops;
  total.unresolved_pins = r.unresolved_pins;
  total.limit_met = total.limit_met && r.limit_met;
  total.dp_table_bytes = std::max(total.dp_table_bytes, r.dp_table_bytes);
  total.blocks = r.blocks;
  total.blocks_found_by = r.blocks_found_by;
}

// "; 12 blocks (module paths in node names)" for --remat blocks; "" for a limit.
std::string blocks_found(const RematOptions& options, const RematReport& r) {
  if (options.policy != RematPolicy::kBlocks) return "";
  if (r.blocks == 0) return "; no transformer blocks found (no layer path in node names, no repeated run of ops): nothing to checkpoint";
  return str_cat("; ", r.blocks, " blocks (", r.blocks_found_by, ")");
}

// The loss and gradients of the whole batch, in one pass or accumulated over micro-batches,
// with remat applied to each (micro-)batch right after its autodiff; `report` sums remat's.
Status differentiate(Module& module, StepValues& v, const MicroBatching& micro, const RematOptions& remat_options, const ShardOptions& shard,
                     RematReport& report) {
  report = {};
  const AfterAutodiff remat = [&](Module& m, NodeId forward_begin, NodeId backward_begin, NodeId backward_end) -> Status {
    MEMC_ASSIGN_OR_RETURN(RematReport r, Remat(remat_options).run(m, forward_begin, backward_begin, backward_end));
    merge_remat_report(report, r);
    return Status::Ok();
  };
  if (micro.k == 1) return differentiate_one_batch(module, v, remat, shard, micro.loss_chunks);
  for (NodeId n : module.schedule()) module.node(n).dead = true;  // each micro-batch brings its own copy
  // zero3 and streaming: each micro-batch gathers every unit again (each chain right before its
  // first reader: passes/microbatch.h), and its backward regathers. Each micro-batch's chains
  // are prefetched one unit ahead, in its forward and (through the regathered clones of its
  // chains) in its backward; build() then links each pass's first gather to the one before it.
  std::map<std::pair<size_t, size_t>, ShardUnit> gathered;  // (micro-batch, unit) → its chain
  size_t current = 0;                                        // the micro-batch being built
  const ParamBinder gather = [&](const std::string& name, size_t mb) -> Expected<ValueId> {
    current = mb;
    for (size_t i = 0; i < v.units.size(); ++i) {
      const std::vector<std::string>& names = v.units[i].param_names;
      const auto it = std::find(names.begin(), names.end(), name);
      if (it == names.end()) continue;
      auto chain = gathered.find({mb, i});
      if (chain == gathered.end()) chain = gathered.emplace(std::make_pair(mb, i), gather_again(module, v.units[i], shard)).first;
      return chain->second.views[static_cast<size_t>(it - names.begin())];
    }
    return Status::Internal(str_cat("parameter '", name, "' is in no shard unit"));
  };
  const AfterAutodiff remat_and_regather = [&](Module& m, NodeId forward_begin, NodeId backward_begin, NodeId backward_end) -> Status {
    MEMC_RETURN_IF_ERROR(remat(m, forward_begin, backward_begin, backward_end));
    std::vector<ShardUnit> chains;
    for (const auto& [key, chain] : gathered) {
      if (key.first == current) chains.push_back(chain);
    }
    prefetch_gathers(m, chains);
    return regather_for_backward(m, chains, backward_begin, shard);
  };
  const bool flat = shard.flat_params();
  MEMC_ASSIGN_OR_RETURN(AccumulatedStep acc, accumulate_micro_batches(module, micro.forward, micro.k, v.labels, v.params, v.scale,
                                                                      loss_rows(module, v, shard, micro.loss_chunks), flat ? remat_and_regather : remat,
                                                                      flat ? gather : ParamBinder()));
  v.loss = acc.loss;
  v.logits_out = acc.logits;
  v.loss_chunks = acc.loss_chunks;
  v.grads = std::move(acc.grads);
  return Status::Ok();
}

}  // namespace

Expected<PassReport> TrainingStep::run(Module& module) {
  // The forward's batch, read before the step replaces its outputs (build() refuses logits not [N, C]).
  const Shape logits = module.outputs().empty() ? Shape{} : module.value(module.outputs()[0]).type.shape;
  const int64_t rank_batch = logits.empty() ? 0 : logits[0];
  MEMC_RETURN_IF_ERROR(build(module));
  return report(rank_batch);
}

// The -v lines of micro-batching, remat and sharding, and remat's figures as statistics.
PassReport TrainingStep::report(int64_t rank_batch) const {
  PassReport report;
  report.changed = true;
  if (micro_.k > 1) {
    const int64_t batch = shard_.batch > 0 ? shard_.batch : rank_batch * shard_.devices;  // the global batch
    report.lines.push_back(str_cat("microbatch: ", micro_.k, " micro-batches of ", batch / micro_.k,
                                   batch % micro_.k ? "-" + std::to_string(batch / micro_.k + 1) : std::string(),
                                   " samples; gradients accumulated in the parameters' dtype"));
  }
  if (loss_chunks_ > 1) {
    report.lines.push_back(str_cat("loss_chunks: the head and its loss in ", loss_chunks_, " chunks of positions per ",
                                   micro_.k > 1 ? "micro-batch" : "batch", ", differentiated as each chunk's loss is computed"));
  }
  report.set("loss_chunks", loss_chunks_);
  if (!dropped_.empty()) report.lines.push_back("training_step: nodes the step does not read dropped: " + dropped_);
  const RematReport& r = remat_report_;
  if (remat_.policy != RematPolicy::kNone) {
    report.lines.push_back(str_cat("remat ", describe_remat(remat_), ": ", r.segments, " segments; activations read by backward ",
                                   format_size(r.tape_bytes), ", tapes held at once ", format_size(r.held_tape_bytes), "; ", r.recomputed_nodes,
                                   " nodes recomputed (", r.recompute_flops, " FLOP)", blocks_found(remat_, r),
                                   r.dp_table_bytes > 0 ? str_cat("; solver table ", format_size(r.dp_table_bytes)) : std::string()));
    if (r.unresolved_pins > 0) report.warnings.push_back(str_cat("--remat: ", r.unresolved_pins, " pinned name(s) match no forward value"));
  }
  report.set("remat.segments", r.segments);
  report.set("remat.tape_bytes", r.tape_bytes);
  report.set("remat.held_tape_bytes", r.held_tape_bytes);
  report.set("remat.recomputed_nodes", r.recomputed_nodes);
  report.set("remat.recompute_flops", r.recompute_flops);
  report.set("remat.limit_met", r.limit_met);
  report.set("remat.dp_table_bytes", r.dp_table_bytes);
  if (shard_.stream_params) {
    report.lines.push_back(str_cat("stream params: ", units_, " units in host memory (", units_description_,
                                   "), each copied to the device before its forward and again for its backward"));
  }
  if (shard_.active()) {
    const std::string rows = shard_.uneven() ? str_cat(rank_batch, " or ", rank_batch - 1, " samples (a short slice pads a row the loss ignores)")
                                             : str_cat(rank_batch, " samples");
    const std::string states = shard_.replicate_states
                                   ? str_cat("; gradients all-reduced in ", units_, " flat units (", units_description_, "), ", options_.kind,
                                             "'s states whole on every rank (they follow each parameter's shape)")
                                   : str_cat("; optimizer states in blocks of ", units_, " flat units (", units_description_, ")");
    report.lines.push_back(str_cat("shard ", shard_stage_name(shard_.stage), ": ", shard_.devices, " ranks of ", rows, states));
  }
  return report;
}

Status TrainingStep::build(Module& module) {
  MEMC_ASSIGN_OR_RETURN(const OptimizerDef* optimizer, checked_optimizer(options_, shard_));
  if (shard_.active() || shard_.stream_params) {
    shard_.align = std::max<int64_t>(optimizer->flat_align, 1);
    shard_.replicate_states = shard_.active() && optimizer->flat_align == 0;
  }
  MEMC_ASSIGN_OR_RETURN(const std::vector<BufferUpdate> buffer_updates, forward_buffer_updates(module, micro_.k, shard_));
  MEMC_ASSIGN_OR_RETURN(StepValues v, step_inputs(module, options_.loss_scaling));
  if (micro_.loss_chunks > 1 && module.value(v.labels).type.shape.size() == 1) {
    return Status::BadInput(str_cat("--loss-chunks ", micro_.loss_chunks, ": the logits '", module.value(v.logits).source_name, "' are ",
                                    type_str(module.value(v.logits).type), ", one row per sample; chunks split a language model's positions (logits [N, T, V])"));
  }
  // zero3 and streaming: the parameters become per-unit flat arguments (shards, or host units),
  // gathered or streamed before use; autodiff differentiates them (passes/shard.h).
  const bool flat = shard_.flat_params();
  if (shard_.stream_params && !shard_.can_stream()) {
    return Status::BadInput(str_cat("--offload params on ", shard_.devices, " devices streams each rank's zero3 shards: use --shard zero3 (not ",
                                    shard_stage_name(shard_.stage), ")"));
  }
  if (shard_.active() || flat) {
    v.groups = plan_units(module, v.params);
    units_description_ = v.groups.description;
  }
  if (flat) {
    MEMC_ASSIGN_OR_RETURN(v.units, shard_parameters(module, v.params, v.groups, shard_));
  }
  MEMC_RETURN_IF_ERROR(differentiate(module, v, micro_, remat_, shard_, remat_report_));
  loss_chunks_ = v.loss_chunks;
  if (flat) prefetch_across_passes(module);
  module.rename(v.loss, "loss");
  MEMC_ASSIGN_OR_RETURN(std::vector<UpdateTarget> targets, update_targets(module, v, shard_, micro_.k));
  const ValueId skip = finish_gradients(module, v, targets, options_, shard_);
  const UpdateScalars scalars{.lr = module.add_argument(kLrArg, TensorType{DType::kF32, {}}, Role::kScalar),
                              .step = module.add_argument(kStepArg, TensorType{DType::kF32, {}}, Role::kScalar),
                              .skip = skip};
  // A language model's logits ([N, T, V], the largest activation at its head) are not returned:
  // nothing reads them after the step, and a micro-batched step would hold every micro-batch's
  // until the end to concatenate them. A classifier's [N, C] are.
  std::vector<ValueId> outputs{v.loss};
  if (module.value(v.labels).type.shape.size() == 1) outputs.push_back(v.logits_out);
  if (skip != kNoValue) outputs.push_back(skip);
  module.set_outputs(outputs);
  for (const BufferUpdate& u : buffer_updates) module.add_update(u.buffer, u.next);
  for (size_t i = 0; i < targets.size(); ++i) {
    const bool whole = !shard_.active() || flat || shard_.replicate_states;  // the target is an argument: updated in place
    MEMC_ASSIGN_OR_RETURN(const ValueId next, add_optimizer_update(module, *optimizer, options_, targets[i], scalars, whole));
    if (!whole) MEMC_RETURN_IF_ERROR(gather_updated_params(module, v.units[i], next, shard_));
  }
  if (shard_.active() || flat) record_shard_layout(module, v.units, shard_);
  units_ = static_cast<int64_t>(shard_.replicate_states ? v.groups.members.size() : v.units.size());
  // What the step no longer reads goes: a language model's logits, which a chunked loss
  // recomputes per chunk and micro-batches would concatenate for nothing.
  dropped_.clear();
  std::map<std::string, int> live_ops;
  for (NodeId n : module.schedule()) ++live_ops[module.node(n).op];
  if (module.eliminate_dead_nodes() > 0) {
    for (NodeId n : module.schedule()) --live_ops[module.node(n).op];
    for (const auto& [op, count] : live_ops) {
      if (count > 0) dropped_ += str_cat(dropped_.empty() ? "" : ", ", count, " ", op);
    }
    module.compact();
  }
  record_metadata(module);
  return Status::Ok();
}

// What the runtime and reports read back from the step: the optimizer, loss scaling, remat's
// recompute, the micro-batch count; micro-batching's full-batch forward goes.
void TrainingStep::record_metadata(Module& module) const {
  module.metadata().set("memc.optimizer", options_.kind);
  if (options_.loss_scaling) module.metadata().set("memc.loss_scaling", int64_t{1});
  if (loss_chunks_ > 1) module.metadata().set("memc.loss_chunks", loss_chunks_);
  if (remat_.policy != RematPolicy::kNone) {
    module.metadata().set("memc.remat_recomputed_nodes", int64_t{remat_report_.recomputed_nodes});
    module.metadata().set("memc.remat_recompute_flops", remat_report_.recompute_flops);
  }
  if (micro_.k > 1) {
    module.metadata().set("memc.micro_batches", micro_.k);
    module.compact();  // drops the full-batch forward
  }
}

}  // namespace memc
