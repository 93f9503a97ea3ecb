#include "passes/training_step.h"

#include <algorithm>

#include "ir/grad.h"
#include "passes/autodiff.h"
#include "passes/shard.h"

namespace memc {
namespace {

ValueId emit(Module& m, const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {}, int outputs = -1) {
  auto out = m.add_node(op, std::move(inputs), std::move(attrs), "training step", outputs);
  MEMC_CHECK(out.ok(), out.status().message());
  return (*out)[0];
}

ValueId f32_scalar(Module& m, double v) {
  Tensor t = Tensor::zeros(DType::kF32, {});
  t.data<float>()[0] = static_cast<float>(v);
  return m.add_constant(std::move(t), "c");
}

// coef = min(1, max_norm / (√Σ‖g‖² + 1e-6)), applied to every gradient (torch's clip_grad_norm_).
// Σ‖g‖² in f32 over `grads`, and over ranks when they hold blocks of the gradients.
ValueId sum_of_squares(Module& m, const std::vector<ValueId>& grads, const ShardOptions& shard) {
  ValueId total = kNoValue;
  for (ValueId g : grads) {
    ValueId g32 = m.value(g).type.dtype == DType::kF32 ? g : emit(m, "cast", {g}, make_attrs({{"to", std::string("f32")}}));
    ValueId sq = emit(m, "reduce_sum_square", {g32}, make_attrs({{"axes", std::vector<int64_t>{}}, {"keepdims", int64_t{0}}}));
    total = total == kNoValue ? sq : emit(m, "add", {total, sq});
  }
  return all_reduce_value(m, total, shard);
}

std::vector<ValueId> clip_by_global_norm(Module& m, const std::vector<ValueId>& grads, double max_norm, const ShardOptions& shard) {
  ValueId norm = emit(m, "sqrt", {sum_of_squares(m, grads, shard)});
  ValueId coef = emit(m, "min", {f32_scalar(m, 1.0), emit(m, "div", {f32_scalar(m, max_norm), emit(m, "add", {norm, f32_scalar(m, 1e-6)})})});
  std::vector<ValueId> clipped;
  for (ValueId g : grads) {
    const DType t = m.value(g).type.dtype;
    ValueId c = t == DType::kF32 ? coef : emit(m, "cast", {coef}, make_attrs({{"to", std::string(dtype_name(t))}}));
    ValueId out = emit(m, "mul", {g, c});
    m.value(out).role = Role::kGrad;
    clipped.push_back(out);
  }
  return clipped;
}

ValueId to_f32(Module& m, ValueId v) {
  return m.value(v).type.dtype == DType::kF32 ? v : emit(m, "cast", {v}, make_attrs({{"to", std::string("f32")}}));
}

// Gradients of loss·scale times 1/scale, in f32 and back in each gradient's dtype.
std::vector<ValueId> unscale(Module& m, const std::vector<ValueId>& grads, ValueId scale) {
  const ValueId inv = emit(m, "div", {f32_scalar(m, 1.0), scale});
  std::vector<ValueId> out;
  for (ValueId g : grads) {
    const DType t = m.value(g).type.dtype;
    const std::string name = m.value(g).name;
    m.rename(g, "scaled_" + name);
    ValueId u = emit(m, "mul", {to_f32(m, g), inv});
    if (t != DType::kF32) u = emit(m, "cast", {u}, make_attrs({{"to", std::string(dtype_name(t))}}));
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
  return emit(m, "sub", {f32_scalar(m, 1.0), emit(m, "cast", {finite}, make_attrs({{"to", std::string("f32")}}))});
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

// The update node of `kind` for one target, with its optimizer states as new arguments; each
// state's next value updates it in place, and the weight's next value too when `update_weight`
// (a parameter argument). Returns the weight's next value.
Expected<ValueId> add_optimizer_update(Module& module, const OptimizerOptions& o, const UpdateTarget& target,
                                       const UpdateScalars& s, bool update_weight) {
  const ValueId w = target.weight, g = target.grad;
  const TensorType t = module.value(w).type;
  auto state = [&](const std::string& prefix, TensorType type) {
    return module.add_argument(prefix + "." + target.name, std::move(type), Role::kOptimizerState);
  };
  auto with_skip = [&](std::vector<ValueId> in) {
    if (s.skip != kNoValue) in.push_back(s.skip);
    return in;
  };
  Attrs a;
  a.set("weight_decay", o.weight_decay);
  std::vector<ValueId> updated = {w};
  std::string op;
  std::vector<ValueId> in;
  int outputs = -1;
  if (o.kind == "sgd") {
    op = "sgd_update";
    in = with_skip({w, g, s.lr});
  } else if (o.kind == "momentum") {
    a.set("momentum", o.momentum);
    a.set("dampening", o.dampening);
    a.set("nesterov", int64_t{o.nesterov});
    const ValueId buf = state("momentum_buffer", t);
    updated.push_back(buf);
    op = "momentum_update";
    in = with_skip({w, g, buf, s.lr, s.step});
  } else if (o.kind == "adam8bit") {
    // AdamW with block-wise 8-bit moments: u8 codes like the parameter, an f32 absmax per block.
    constexpr int64_t kBlock = 2048;
    const int64_t blocks = (t.numel() + kBlock - 1) / kBlock;
    a.set("beta1", o.beta1);
    a.set("beta2", o.beta2);
    a.set("eps", o.eps);
    a.set("decoupled", int64_t{1});
    a.set("block", kBlock);
    const TensorType codes{DType::kU8, t.shape}, maxima{DType::kF32, {blocks}};
    const ValueId mq = state("exp_avg.q8", codes), mm = state("exp_avg.absmax", maxima);
    const ValueId vq = state("exp_avg_sq.q8", codes), vm = state("exp_avg_sq.absmax", maxima);
    updated.insert(updated.end(), {mq, mm, vq, vm});
    op = "adam8bit_update";
    in = with_skip({w, g, mq, mm, vq, vm, s.lr, s.step});
  } else if (o.kind == "adafactor") {
    // Factored second moment over the last two dims for rank ≥ 2; no first moment.
    a.set("decay_rate", -0.8);
    a.set("eps1", 1e-30);
    a.set("clip_threshold", 1.0);
    const bool factored = t.shape.size() >= 2;
    a.set("factored", int64_t{factored});
    in = {w, g};
    if (factored) {
      Shape rows(t.shape.begin(), t.shape.end() - 1), cols(t.shape.begin(), t.shape.end() - 2);
      cols.push_back(t.shape.back());
      const ValueId r = state("exp_avg_sq_row", {DType::kF32, rows}), c = state("exp_avg_sq_col", {DType::kF32, cols});
      updated.insert(updated.end(), {r, c});
      in.insert(in.end(), {r, c});
    } else {
      const ValueId v = state("exp_avg_sq", {DType::kF32, t.shape});
      updated.push_back(v);
      in.push_back(v);
    }
    in = with_skip(in);
    in.insert(in.end() - (s.skip != kNoValue ? 1 : 0), {s.lr, s.step});
    op = "adafactor_update";
    outputs = factored ? 3 : 2;
  } else {
    a.set("beta1", o.beta1);
    a.set("beta2", o.beta2);
    a.set("eps", o.eps);
    a.set("decoupled", int64_t{o.kind == "adamw"});
    const ValueId m = state("exp_avg", t), v = state("exp_avg_sq", t);
    updated.push_back(m);
    updated.push_back(v);
    op = "adam_update";
    in = with_skip({w, g, m, v, s.lr, s.step});
  }
  MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> outs, module.add_node(op, in, a, "optimizer", outputs));
  for (size_t k = 0; k < outs.size(); ++k) {
    if (k == 0 && !update_weight) continue;
    module.value(outs[k]).role = module.value(updated[k]).role;
    module.rename(outs[k], module.value(updated[k]).name + ".next");
    module.add_update(updated[k], outs[k]);
  }
  return outs[0];
}

}  // namespace

Status TrainingStep::run(Module& module) {
  const auto& kind = options_.kind;
  if (kind != "sgd" && kind != "momentum" && kind != "adam" && kind != "adamw" && kind != "adam8bit" && kind != "adafactor") {
    return Status::BadInput("unknown optimizer '" + kind + "' (sgd, momentum, adam, adamw, adam8bit, adafactor)");
  }
  if (shard_.active() && kind != "sgd" && kind != "momentum" && kind != "adam" && kind != "adamw") {
    return Status::BadInput(str_cat("--shard ", shard_stage_name(shard_.stage), " needs an elementwise optimizer (sgd, momentum, adam, adamw); ", kind,
                                    "'s states follow each parameter's shape"));
  }
  if (module.outputs().empty()) return Status::BadInput("the model has no outputs");
  const ValueId logits = module.outputs()[0];
  const TensorType logits_type = module.value(logits).type;
  if (logits_type.shape.size() != 2 || !is_float(logits_type.dtype)) {
    return Status::BadInput(str_cat("the first output '", module.value(logits).source_name, "' is ",
                                    dtype_name(logits_type.dtype), "[", shape_str(logits_type.shape),
                                    "]; cross-entropy training needs float logits [N, C]"));
  }
  const ValueId labels = module.add_argument(kLabelsArg, TensorType{DType::kI64, {logits_type.shape[0]}}, Role::kInput);
  std::vector<ValueId> params;
  for (ValueId a : module.arguments()) {
    if (module.value(a).role == Role::kParam) params.push_back(a);
  }
  if (params.empty()) return Status::BadInput("the model has no trainable parameters");
  ValueId scale = kNoValue, skip = kNoValue;
  if (options_.loss_scaling) scale = module.add_argument(kLossScaleArg, TensorType{DType::kF32, {}}, Role::kScalar);

  ValueId loss = kNoValue, logits_out = logits;
  std::vector<ValueId> grads;
  remat_report_ = {};
  // zero3: the parameters become per-unit shards, gathered before use; autodiff differentiates
  // the shards (passes/shard.h).
  const bool zero3 = shard_.stage == ShardStage::kZero3;
  std::vector<ShardUnit> units;
  if (zero3) {
    if (micro_.k > 1) return Status::BadInput("--shard zero3 with --micro-batches is not supported yet (zero2 is)");
    MEMC_ASSIGN_OR_RETURN(units, shard_parameters(module, params, shard_));
  }
  // Rematerialization acts on each (micro-)batch's forward and backward right after autodiff.
  const AfterAutodiff remat = [this](Module& m, NodeId forward_begin, NodeId backward_begin, NodeId backward_end) -> Status {
    MEMC_ASSIGN_OR_RETURN(RematReport r, Remat(remat_).run(m, forward_begin, backward_begin, backward_end));
    remat_report_.segments = std::max(remat_report_.segments, r.segments);
    remat_report_.tape_bytes += r.tape_bytes;
    remat_report_.held_tape_bytes = std::max(remat_report_.held_tape_bytes, r.held_tape_bytes);
    remat_report_.recomputed_nodes += r.recomputed_nodes;
    remat_report_.recompute_flops += r.recompute_flops;
    remat_report_.unresolved_pins = r.unresolved_pins;
    remat_report_.limit_met = remat_report_.limit_met && r.limit_met;
    return Status::Ok();
  };
  if (micro_.k > 1) {
    for (NodeId n : module.schedule()) module.node(n).dead = true;  // each micro-batch brings its own copy
    MEMC_ASSIGN_OR_RETURN(AccumulatedStep acc, accumulate_micro_batches(module, micro_.forward, micro_.k, labels, params, scale, remat));
    loss = acc.loss;
    logits_out = acc.logits;
    grads = std::move(acc.grads);
  } else {
    auto loss_out = module.add_node("softmax_cross_entropy", {logits, labels}, {}, "loss");
    if (!loss_out.ok()) return loss_out.status();
    loss = (*loss_out)[0];
    ValueId loss_for_grad = loss;
    if (scale != kNoValue) {
      loss_for_grad = emit(module, "mul", {loss, scale});
      module.rename(loss_for_grad, "scaled_loss");
    }
    const auto backward_begin = static_cast<NodeId>(module.nodes().size());
    MEMC_ASSIGN_OR_RETURN(grads, Autodiff().run(module, loss_for_grad, params));
    MEMC_RETURN_IF_ERROR(remat(module, 0, backward_begin, static_cast<NodeId>(module.nodes().size())));
    if (zero3) MEMC_RETURN_IF_ERROR(regather_for_backward(module, units, backward_begin, shard_));
  }
  module.rename(loss, "loss");
  // Data parallel: each rank's gradients and loss are its slice's; reduced here to the global
  // batch's, with the optimizer acting on this rank's blocks of flat units (passes/shard.h).
  std::vector<UpdateTarget> targets;
  if (shard_.active()) {
    module.rename(loss, "rank_loss");
    mark_rank_draws(module, logits_type.shape[0]);
    if (zero3) {  // each shard's gradient is reduce-scattered already (the gather's gradient)
      for (size_t i = 0; i < units.size(); ++i) {
        const ValueId g = mean_over_ranks(module, grads[i], shard_);
        module.value(g).role = Role::kGrad;
        module.rename(g, "grad." + units[i].name);
        targets.push_back({units[i].weight, g, units[i].name});
      }
    } else {
      MEMC_ASSIGN_OR_RETURN(units, shard_gradients(module, params, grads, shard_));
      for (const ShardUnit& u : units) targets.push_back({u.weight, u.grad, u.name});
    }
    loss = mean_over_ranks(module, all_reduce_value(module, loss, shard_), shard_);
    module.rename(loss, "loss");
  } else {
    for (size_t i = 0; i < params.size(); ++i) targets.push_back({params[i], grads[i], module.value(params[i]).source_name});
  }
  std::vector<ValueId> target_grads;
  for (const UpdateTarget& t : targets) target_grads.push_back(t.grad);
  if (options_.loss_scaling) {
    target_grads = unscale(module, target_grads, scale);
    skip = found_inf(module, target_grads, shard_);
    module.rename(skip, kFoundInfOutput);
  }
  // Clipping sees the unscaled gradients.
  if (options_.clip_grad_norm > 0) target_grads = clip_by_global_norm(module, target_grads, options_.clip_grad_norm, shard_);
  for (size_t i = 0; i < targets.size(); ++i) targets[i].grad = target_grads[i];

  const UpdateScalars scalars{.lr = module.add_argument(kLrArg, TensorType{DType::kF32, {}}, Role::kScalar),
                              .step = module.add_argument(kStepArg, TensorType{DType::kF32, {}}, Role::kScalar),
                              .skip = skip};
  if (skip != kNoValue) {
    module.set_outputs({loss, logits_out, skip});
  } else {
    module.set_outputs({loss, logits_out});
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const bool whole = !shard_.active() || zero3;  // the target is an argument: updated in place
    MEMC_ASSIGN_OR_RETURN(const ValueId next, add_optimizer_update(module, options_, targets[i], scalars, whole));
    if (!whole) MEMC_RETURN_IF_ERROR(gather_updated_params(module, units[i], next, shard_));
  }
  if (shard_.active()) record_shard_layout(module, units, shard_);
  module.metadata().set("memc.optimizer", kind);
  if (options_.loss_scaling) module.metadata().set("memc.loss_scaling", int64_t{1});
  if (remat_.policy != "none") {
    module.metadata().set("memc.remat_recomputed_nodes", int64_t{remat_report_.recomputed_nodes});
    module.metadata().set("memc.remat_recompute_flops", remat_report_.recompute_flops);
  }
  if (micro_.k > 1) {
    module.metadata().set("memc.micro_batches", micro_.k);
    module.compact();  // drops the full-batch forward
  }
  return Status::Ok();
}

}  // namespace memc
