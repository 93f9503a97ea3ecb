#include "planner/compile.h"

#include <filesystem>
#include <limits>

#include "ir/verifier.h"
#include "passes/attention.h"
#include "passes/memory_plan.h"
#include "passes/offload.h"
#include "support/log.h"
#include "passes/precision.h"
#include "passes/schedule.h"
#include "backends/backend.h"
#include "passes/training_step.h"
#include "support/size.h"

namespace memc {

namespace {

// Replaces every dropout by its input (inference semantics) for runs that must match a
// framework whose random masks memc cannot reproduce.
void remove_dropout(Module& m) {
  for (NodeId n : m.schedule()) {
    Node& node = m.node(n);
    if (node.op != "dropout") continue;
    m.replace_all_uses(node.outputs[0], node.inputs[0]);
    node.dead = true;
  }
  m.compact();
}

std::string relative_model_path(const std::string& model_path, const std::string& plan_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path model = fs::absolute(model_path, ec);
  const fs::path plan_dir = fs::absolute(plan_path, ec).parent_path();
  const fs::path rel = model.lexically_relative(plan_dir);
  return rel.empty() ? model.string() : rel.string();
}

}  // namespace

Expected<MemorySummary> summarize_memory(const Module& train, const Backend& backend) {
  MEMC_ASSIGN_OR_RETURN(MemoryPlanResult result, MemoryPlan().run(train));
  const SpacePlan& device = result.space(MemSpace::kDevice);
  MemorySummary m;
  // The runtime allocates the arena and one workspace region sized for the hungriest kernel of
  // the backend the plan targets (cuBLASLt's and cuDNN's scratch on a GPU, memc's own on a CPU).
  const int64_t workspace = max_workspace_bytes(backend, train);
  m.predicted_peak_bytes = device.arena_bytes + workspace;
  m.lower_bound_bytes = device.lower_bound_bytes + workspace;
  m.persistent_bytes = device.persistent_bytes;
  m.host_bytes = result.space(MemSpace::kHost).arena_bytes;
  m.algorithm = device.algorithm;
  for (size_t c = 0; c < kNumMemoryCategories; ++c) {
    const std::string name(category_name(static_cast<MemoryCategory>(c)));
    m.breakdown[name] = device.breakdown.bytes[c];
    m.category_peak_bytes[name] = device.category_peak_bytes.bytes[c];
  }
  m.breakdown["workspace"] = workspace;
  m.category_peak_bytes["workspace"] = workspace;
  return m;
}

// "budget 1 MB < planned peak 2.19 MB (lower bound 2.19 MB); largest: activations 1.7 MB"
static Status check_budget(const MemorySummary& m, int64_t budget) {
  if (budget <= 0 || m.predicted_peak_bytes <= budget) return Status::Ok();
  std::string largest;
  int64_t largest_bytes = -1;
  for (const auto& [name, bytes] : m.breakdown) {
    if (bytes > largest_bytes) largest = name, largest_bytes = bytes;
  }
  return Status::Budget(str_cat("budget ", format_size(budget), " (", budget, " bytes) is below the plan's peak ",
                                format_size(m.predicted_peak_bytes), " (", m.predicted_peak_bytes, " bytes; no-fragmentation lower bound ",
                                format_size(m.lower_bound_bytes), "); largest at the peak: ", largest, " ", format_size(largest_bytes)));
}

ModelCompiler::ModelCompiler(std::string model_path, std::string plan_path)
    : model_path_(std::move(model_path)), plan_path_(std::move(plan_path)) {}

Expected<const ModelCompiler::Forward*> ModelCompiler::forward(const CompileOptions& options, int64_t batch) {
  const Key key{batch, options.seq, options.precision, options.attention, options.dropout};
  if (auto it = cache_.find(key); it != cache_.end()) return &it->second;
  Forward f;
  ImportOptions import;
  import.batch = batch;
  import.seq = options.seq;
  import.load_weights = false;
  import.fuse_attention = false;  // the attention pass below
  MEMC_ASSIGN_OR_RETURN(f.imported, import_onnx(model_path_, import));
  Module forward = f.imported;
  if (!options.dropout) remove_dropout(forward);
  if (forward.outputs().empty()) return Status::BadInput(model_path_ + ": the model has no outputs");
  const TensorType logits = forward.value(forward.outputs()[0]).type;
  if (logits.shape.size() != 2) {
    return Status::BadInput(str_cat(model_path_, ": first output is [", shape_str(logits.shape), "]; training needs logits [N, C]"));
  }
  forward.set_outputs({forward.outputs()[0]});
  forward.eliminate_dead_nodes();
  forward.compact();
  if (options.attention == "tiled") {
    MEMC_ASSIGN_OR_RETURN(f.attention, AttentionPass().run(forward));
    f.after_attention = forward;
  }
  // Before TrainingStep: autodiff differentiates the casts, so f32 parameters get f32 gradients.
  if (auto changed = Precision({.mode = options.precision}).run(forward, &f.precision); !changed.ok()) {
    return changed.status().with_context(model_path_ + ": ");
  }
  f.module = std::move(forward);
  return &cache_.emplace(key, std::move(f)).first->second;
}

Expected<int64_t> ModelCompiler::fixed_batch(const CompileOptions& options) {
  MEMC_ASSIGN_OR_RETURN(const Forward* f, forward(options, options.batch));
  return f->imported.metadata().get_int("fixed_batch", -1);
}

Expected<Plan> ModelCompiler::compile(const CompileOptions& options, bool quiet, bool schedule_quiet) {
  if (options.batch <= 0) return Status::BadInput("--batch must be a positive integer");
  // fp32, bf16-true, fp16-true, bf16-mixed, fp16-mixed; an unknown mode is refused here, before importing.
  MEMC_RETURN_IF_ERROR(parse_precision(options.precision).status());
  if (options.attention != "tiled" && options.attention != "naive") {
    return Status::BadInput("--attention '" + options.attention + "': tiled (memory-efficient, the default) or naive");
  }
  const int64_t devices = options.shard.devices;
  if (options.batch % devices != 0) {
    return Status::BadInput(str_cat("--batch ", options.batch, " does not split evenly over --devices ", devices,
                                    " (each rank takes batch/devices samples; unequal slices are not supported yet)"));
  }
  const int64_t rank_batch = options.batch / devices;
  if (options.micro_batches < 1 || options.micro_batches > rank_batch) {
    return Status::BadInput(str_cat("--micro-batches ", options.micro_batches, " must be between 1 and the batch size ", rank_batch,
                                    devices > 1 ? str_cat(" of each of the ", devices, " ranks") : std::string()));
  }
  MEMC_ASSIGN_OR_RETURN(const Forward* main, forward(options, rank_batch));
  const bool report = !quiet;
  if (report && options.after_pass) options.after_pass("import", main->imported);
  if (report && options.attention == "tiled") {
    log(1, str_cat("pass attention: ", main->attention.substituted, " MatMul→Softmax→MatMul patterns → tiled attention; forward activations ",
                   format_size(main->attention.bytes_before), " → ", format_size(main->attention.bytes_after)));
    if (options.after_pass) options.after_pass("attention", main->after_attention);
  }
  if (report) {
    log(1, "pass " + precision_summary(options.precision, main->precision));
    if (options.after_pass) options.after_pass("precision", main->module);
  }
  // Micro-batching asks for the forward again at the micro-batch sizes.
  ForwardFactory build_forward = [&](int64_t batch) -> Expected<Module> {
    MEMC_ASSIGN_OR_RETURN(const Forward* f, forward(options, batch));
    return f->module;
  };
  const int64_t num_classes = main->module.value(main->module.outputs()[0]).type.shape[1];

  Plan plan;
  if (devices > 1) {
    MEMC_ASSIGN_OR_RETURN(const Forward* whole, forward(options, options.batch));  // evaluation runs whole batches
    plan.eval = whole->module;
  } else {
    plan.eval = main->module;
  }
  plan.train = main->module;
  // fp16-mixed: dynamic loss scaling (a "loss_scale" argument, a "found_inf" output; runtime/trainer.cc).
  OptimizerOptions optimizer = options.optimizer;
  optimizer.loss_scaling = optimizer.loss_scaling || options.precision == "fp16-mixed";
  TrainingStep step(optimizer, {.k = options.micro_batches, .forward = build_forward}, options.remat, options.shard);
  MEMC_RETURN_IF_ERROR(step.run(plan.train).with_context(model_path_ + ": "));
  if (report && options.micro_batches > 1) {
    log(1, str_cat("pass microbatch: ", options.micro_batches, " micro-batches of ", options.batch / options.micro_batches,
                   options.batch % options.micro_batches ? "-" + std::to_string(options.batch / options.micro_batches + 1) : std::string(),
                   " samples; gradients accumulated in the parameters' dtype"));
  }
  if (report && options.remat.policy != "none") {
    const RematReport& r = step.remat_report();
    log(1, str_cat("pass remat ", describe_remat(options.remat), ": ", r.segments, " segments; activations read by backward ",
                   format_size(r.tape_bytes), ", tapes held at once ", format_size(r.held_tape_bytes), "; ", r.recomputed_nodes,
                   " nodes recomputed (", r.recompute_flops, " FLOP)"));
    if (r.unresolved_pins > 0) warn(str_cat("--remat: ", r.unresolved_pins, " pinned name(s) match no forward value"));
  }
  if (report && options.shard.active()) {
    log(1, str_cat("pass shard ", shard_stage_name(options.shard.stage), ": ", devices, " ranks of ", rank_batch,
                   " samples; optimizer states in blocks of ", plan.train.metadata().get_ints("memc.shard.blocks").size(), " flat units"));
  }
  if (report && options.after_pass) options.after_pass("training_step", plan.train);
  MEMC_ASSIGN_OR_RETURN(OffloadReport offloaded, Offload(options.offload).run(plan.train));
  if (report && options.offload != "none") {
    log(1, str_cat("pass offload ", options.offload, ": ", offloaded.values, " values (", format_size(offloaded.bytes),
                   ") to host memory; ", offloaded.transfers, " transfers move ", format_size(offloaded.link_bytes),
                   " per step over the host link, the update reads and writes ",
                   format_size(offloaded.host_update_bytes), " on the host"));
    if (options.after_pass) options.after_pass("offload", plan.train);
  }
  // Last transforming pass, right before memory planning: a lower peak, never a higher one.
  // Search candidates skip it: their peak is then an upper bound of the final plan's.
  if (options.reschedule && (!quiet || schedule_quiet)) {
    if (auto scheduled = Schedule().run(plan.train); !scheduled.ok()) return scheduled.status().with_context("schedule: ");
    if (report && options.after_pass) options.after_pass("schedule", plan.train);
  }
  if (!quiet) {
    MEMC_RETURN_IF_ERROR(verify(plan.train).with_context("training step: "));
    MEMC_RETURN_IF_ERROR(verify(plan.eval).with_context("forward: "));
  }

  std::error_code ec;
  plan.model_path = relative_model_path(model_path_, plan_path_);
  plan.model_bytes = static_cast<int64_t>(std::filesystem::file_size(model_path_, ec));
  plan.batch = options.batch;
  plan.seq = options.seq;
  plan.num_classes = num_classes;
  plan.epochs = options.epochs;
  plan.steps_per_epoch = options.steps_per_epoch;
  plan.dropout = options.dropout;
  plan.optimizer = options.optimizer;
  plan.schedule = options.schedule;
  plan.decisions.precision = options.precision;
  plan.decisions.micro_batches = options.micro_batches;
  plan.decisions.remat = describe_remat(options.remat);
  plan.decisions.attention = options.attention;
  plan.decisions.offload = options.offload;
  plan.decisions.shard = static_cast<int64_t>(options.shard.stage);
  plan.devices = devices;
  plan.budget_bytes = options.budget_bytes;
  MEMC_ASSIGN_OR_RETURN(DeviceProfile profile, device_profile(options.target));
  plan.target = profile.name;
  plan.estimated_step_ms = estimate_step(plan.train, profile).step_ms;
  MEMC_ASSIGN_OR_RETURN(plan.memory, summarize_memory(plan.train, planning_backend(options.target)));
  const RematReport& remat = step.remat_report();
  plan.remat_outcome.has_limit = options.remat.policy == "limit" && options.remat.limit_bytes < std::numeric_limits<int64_t>::max() / 8;
  plan.remat_outcome.limit_met = remat.limit_met;
  plan.remat_outcome.held_tape_bytes = remat.held_tape_bytes;
  if (!quiet) {
    if (options.keep_lower) {
      MEMC_ASSIGN_OR_RETURN(plan, keep_lower_without_remat(std::move(plan), options));
    }
    MEMC_RETURN_IF_ERROR(check_budget(plan.memory, options.budget_bytes));
  }
  return plan;
}

// Remat never raises the peak of the plan to write: the step without it is among the choices,
// planned too, and kept when lower (exact: gradients are bit-identical either way). Not for
// search candidates: the search compares peaks itself, and compiling each twice would double
// it. Recompute pins are the user's order: obeyed as given.
Expected<Plan> ModelCompiler::keep_lower_without_remat(Plan plan, const CompileOptions& options) {
  if (options.remat.policy == "none" || !options.remat.must_recompute.empty()) return plan;
  CompileOptions plain = options;
  plain.remat = RematOptions{};
  plain.after_pass = nullptr;
  MEMC_ASSIGN_OR_RETURN(Plan without, compile(plain, /*quiet=*/true, /*schedule_quiet=*/options.reschedule));
  if (without.memory.predicted_peak_bytes >= plan.memory.predicted_peak_bytes) return plan;
  warn(str_cat("--remat ", describe_remat(options.remat), " plans ", plan.memory.predicted_peak_bytes, " bytes, above the ",
               without.memory.predicted_peak_bytes, " bytes without remat: kept the step without remat"));
  without.remat_outcome = plan.remat_outcome;
  without.remat_outcome.kept_without_remat = true;
  without.remat_outcome.remat_peak_bytes = plan.memory.predicted_peak_bytes;
  MEMC_RETURN_IF_ERROR(verify(without.train).with_context("training step: "));  // compiled quietly: checked here
  return without;
}

Expected<Plan> ModelCompiler::schedule(Plan plan, const CompileOptions& options) const {
  if (!options.reschedule) return plan;
  if (auto scheduled = Schedule().run(plan.train); !scheduled.ok()) return scheduled.status().with_context("schedule: ");
  MEMC_ASSIGN_OR_RETURN(DeviceProfile profile, device_profile(options.target));
  plan.estimated_step_ms = estimate_step(plan.train, profile).step_ms;
  MEMC_ASSIGN_OR_RETURN(plan.memory, summarize_memory(plan.train, planning_backend(options.target)));
  return plan;
}

Expected<Plan> compile_model(const std::string& model_path, const std::string& plan_path, const CompileOptions& options) {
  return ModelCompiler(model_path, plan_path).compile(options);
}

std::string describe_remat(const RematOptions& r) {
  if (r.policy != "limit") return r.policy;
  if (r.limit_bytes >= std::numeric_limits<int64_t>::max() / 8) return "pins";
  return format_size(r.limit_bytes);
}

}  // namespace memc
