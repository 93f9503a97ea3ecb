#include "planner/compile.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <string_view>

#include "backends/backend.h"
#include "passes/loss_chunks.h"
#include "passes/memory_plan.h"
#include "passes/schedule.h"
#include "support/log.h"
#include "support/size.h"

namespace memc {

namespace {

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

// The optional rewrites turned off: the options' and MEMC_DISABLE_PASSES's (a comma list, so a
// device script, a test binary or the Python package can rule a rewrite out without a flag).
static std::set<std::string> disabled_passes(const CompileOptions& options) {
  std::set<std::string> names = options.disabled_passes;
  if (const char* env = std::getenv("MEMC_DISABLE_PASSES")) {
    for (std::string_view rest = env; !rest.empty();) {
      const size_t comma = rest.find(',');
      const std::string_view name = rest.substr(0, comma);
      if (!name.empty()) names.emplace(name);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
  }
  return names;
}

static bool disabled(const CompileOptions& options, const char* pass) { return disabled_passes(options).contains(pass); }

// A GPU target: its plans take the GPU rewrites and group their optimizer updates.
static bool gpu_target(const CompileOptions& options) { return &planning_backend(options.target) != &cpu_backend(); }

// Attention in the layouts the projections write (passes/attention.h).
// CPU targets: in 16-bit precisions only. The CPU kernel copies 16-bit operands into f32 scratch
// anyway, so reading them where the projections wrote them costs nothing and the graph's
// transposes go (vit_small32 b32 bf16-mixed: 205–209 → 189–196 ms per step). f32 operands it
// reads in place; gathering them costs more than the transposes save (vit_small32 b32 fp32:
// 174 → 189 ms) until its block GEMMs take strided operands (bench/journal/2026.md §35).
// GPU targets: every layout in 16-bit precisions, which cuDNN reads through strides; in fp32 the
// sequence-first one only, whose heads lie one stride apart for the GEMM path's batched
// products ([B, T, H, E] would take one batched GEMM per sample).
static AttentionLayouts lays_out_attention(const CompileOptions& options) {
  const bool fp32 = options.precision == PrecisionKind::kFp32;
  if (options.default_attention_layout || disabled(options, "attention_layouts")) return AttentionLayouts::kNone;
  if (!gpu_target(options)) return fp32 ? AttentionLayouts::kNone : AttentionLayouts::kAll;
  return fp32 ? AttentionLayouts::kSequenceFirst : AttentionLayouts::kAll;
}

// Patch embeddings as one GEMM (passes/patch_gemm.h): on GPU targets, whose convolution is
// im2col and a batched GEMM with a separate bias pass; or where the options ask for it (tests
// compare it with the convolution on the CPU).
static bool patch_gemm(const CompileOptions& options) {
  return (options.patch_gemm || gpu_target(options)) && !disabled(options, "patch_gemm");
}

// Gathers of a transposed tensor's slices read the tensor itself (passes/split_gathers.h): on
// GPU targets, or where the options ask for it (tests compare it with the transposes on the CPU).
static bool gather_transposes(const CompileOptions& options) {
  return (options.gather_transposes || gpu_target(options)) && !disabled(options, "gather_transposes");
}

// Import, keep the logits [N, C] as the only output, then the forward pipeline.
Expected<ModelCompiler::Forward> ModelCompiler::build_forward(const CompileOptions& options, int64_t batch,
                                                               const PassInstrumentation& instrumentation, bool evaluation) const {
  ImportOptions import;
  import.running_statistics = evaluation;
  import.ranks = options.shard.devices;  // a BatchNorm's batch statistics are the whole batch's
  import.batch = batch;
  import.seq = options.seq;
  import.frozen = std::set<std::string>(options.frozen.begin(), options.frozen.end());
  import.load_weights = false;
  import.fuse_attention = false;  // the attention pass
  Forward f;
  MEMC_ASSIGN_OR_RETURN(f.module, import_onnx(model_path_, import));
  Module& forward = f.module;
  f.fixed_batch = forward.metadata().get_int("fixed_batch", -1);
  if (instrumentation.after_pass) instrumentation.after_pass("import", forward);
  if (forward.outputs().empty()) return Status::BadInput(model_path_ + ": the model has no outputs");
  const TensorType logits = forward.value(forward.outputs()[0]).type;
  if (logits.shape.size() < 2) {
    return Status::BadInput(str_cat(model_path_, ": first output is [", shape_str(logits.shape),
                                    "]; training needs logits [N, C] (a class per sample) or [N, T, C] (a class per position)"));
  }
  forward.keep_outputs(1);  // and the buffers' updates (BatchNorm's running statistics in train())
  f.updates_buffers = std::any_of(forward.output_updates().begin(), forward.output_updates().end(), [](ValueId a) { return a != kNoValue; });
  forward.eliminate_dead_nodes();
  forward.compact();
  // Precision runs before TrainingStep: autodiff differentiates its casts, so f32 parameters
  // get f32 gradients.
  PipelineOptions forward_options = options;
  forward_options.attention_layouts = lays_out_attention(options);
  forward_options.patch_gemm = patch_gemm(options);
  forward_options.gather_transposes = gather_transposes(options);
  forward_options.disabled_passes = disabled_passes(options);
  if (auto ran = PassPipeline::build(PassStage::kForward, forward_options).run(forward, instrumentation); !ran.ok()) {
    return in_model(ran.status());
  }
  return f;
}

// A pass's failure, prefixed with the model's path unless the message names it already (an
// import inside the pass, as micro-batching's).
Status ModelCompiler::in_model(const Status& status) const {
  if (status.message().rfind(model_path_ + ": ", 0) == 0) return status;
  return status.with_context(model_path_ + ": ");
}

ModelCompiler::Key ModelCompiler::key_of(const CompileOptions& options, int64_t batch, bool evaluation) {
  return {batch, options.seq, options.precision, options.attention, options.dropout, lays_out_attention(options), patch_gemm(options), gather_transposes(options),
          evaluation, options.shard.devices};
}

Expected<const ModelCompiler::Forward*> ModelCompiler::forward(const CompileOptions& options, int64_t batch, bool evaluation) {
  const Key key = key_of(options, batch, evaluation);
  if (auto it = cache_.find(key); it != cache_.end()) return &it->second;
  MEMC_ASSIGN_OR_RETURN(Forward f, build_forward(options, batch, PassInstrumentation{}, evaluation));
  return &cache_.emplace(key, std::move(f)).first->second;
}

Expected<int64_t> ModelCompiler::fixed_batch(const CompileOptions& options) {
  // At a rank's batch: the global batch of N ranks is N times what a fixed-batch export holds.
  MEMC_ASSIGN_OR_RETURN(const Forward* f, forward(options, options.rank_batch()));
  return f->fixed_batch;
}

Expected<bool> ModelCompiler::updates_buffers(const CompileOptions& options) {
  MEMC_ASSIGN_OR_RETURN(const Forward* f, forward(options, options.rank_batch()));
  return f->updates_buffers;
}

Expected<int64_t> ModelCompiler::auto_loss_chunks(const CompileOptions& options) {
  MEMC_ASSIGN_OR_RETURN(const Forward* f, forward(options, options.rank_batch()));
  return f->module.outputs().empty() ? int64_t{1} : memc::auto_loss_chunks(f->module, f->module.outputs()[0]);
}

Expected<DeviceProfile> target_profile(const CompileOptions& options) {
  MEMC_ASSIGN_OR_RETURN(DeviceProfile profile, device_profile(options.target));
  if (!options.interconnect.empty()) MEMC_RETURN_IF_ERROR(set_interconnect(profile, options.interconnect, options.gpus_per_node));
  return profile;
}

namespace {

// The plan's estimated step time on the options' target and the memory summary of its step.
Status measure_step(Plan& plan, const CompileOptions& options) {
  MEMC_ASSIGN_OR_RETURN(DeviceProfile profile, target_profile(options));
  plan.target = profile.name;
  const StepEstimate e = estimate_step(plan.train, profile, options.threads);
  plan.estimated_step_ms = e.step_ms;
  plan.estimated_comm_ms = e.comm_total_ms;
  plan.estimated_comm_exposed_ms = e.comm_ms;
  plan.interconnect = plan.devices > 1 ? interconnect_name(profile) : "";
  MEMC_ASSIGN_OR_RETURN(plan.memory, summarize_memory(plan.train, planning_backend(options.target)));
  return Status::Ok();
}

// Every rank has a sample, and each rank's step 1..rows micro-batches.
Status check_batch(const CompileOptions& options) {
  if (options.batch <= 0) return Status::BadInput("--batch must be a positive integer");
  const int64_t devices = options.shard.devices;
  if (options.batch < devices) {
    return Status::BadInput(str_cat("--batch ", options.batch, " is smaller than --devices ", devices, ": every rank needs a sample"));
  }
  const int64_t rank_batch = options.rank_batch();
  if (options.micro_batches < 1 || options.micro_batches > rank_batch) {
    return Status::BadInput(str_cat("--micro-batches ", options.micro_batches, " must be between 1 and the batch size ", rank_batch,
                                    devices > 1 ? str_cat(" of each of the ", devices, " ranks") : std::string()));
  }
  return Status::Ok();
}

// A reporting compile prints pass reports at -v and dumps; every compile verifies.
PassInstrumentation instrumentation_for(const CompileOptions& options, bool quiet) {
  PassInstrumentation instrumentation;
  if (quiet) return instrumentation;
  instrumentation.report = true;
  instrumentation.after_pass = options.after_pass;
  if (verbosity() >= 2) {  // -vv: every pass's device arena before and after it
    instrumentation.peak = [](const Module& module) -> Expected<int64_t> {
      MEMC_ASSIGN_OR_RETURN(MemoryPlanResult planned, MemoryPlan().run(module));
      return planned.space(MemSpace::kDevice).arena_bytes;
    };
  }
  return instrumentation;
}

}  // namespace

// The training step of `forward`: the training pipeline, with micro-batches' forwards from the
// cache; returns the pipeline's reports.
Expected<std::vector<PassReport>> ModelCompiler::train(const CompileOptions& options, const Module& forward, Plan& plan, bool quiet,
                                                        bool schedule_quiet) {
  PipelineOptions pipeline = options;
  pipeline.shard.batch = options.batch;
  pipeline.forward = [this, &options](int64_t batch) -> Expected<Module> {
    MEMC_ASSIGN_OR_RETURN(const Forward* f, this->forward(options, batch));
    return f->module;
  };
  // fp16-mixed: dynamic loss scaling (a "loss_scale" argument, a "found_inf" output; runtime/trainer.cc).
  pipeline.optimizer.loss_scaling = options.optimizer.loss_scaling || options.precision == PrecisionKind::kFp16Mixed;
  // The schedule pass is the last transforming pass, right before memory planning: a lower peak,
  // never a higher one. Search candidates skip it: their peak is then an upper bound of the
  // final plan's.
  pipeline.reschedule = options.reschedule && (!quiet || schedule_quiet);
  // A GPU target fuses consecutive updates into one launch (Backend::find_group_kernel).
  const bool gpu = gpu_target(options);
  // Each of the rewrites below may be turned off by name (PipelineOptions::disabled_passes).
  pipeline.disabled_passes = disabled_passes(options);
  pipeline.group_updates = gpu && !pipeline.disabled_passes.contains("group_updates");
  // … and computes each linear layer's bias gradient in its weight-gradient GEMM's epilogue.
  pipeline.bias_grad_gemm = options.bias_grad_gemm || gpu;
  // … and lets each update read its 16-bit gradient without a cast to f32 first.
  pipeline.update_grad_casts = options.update_grad_casts || gpu;
  // … and moves casts to 16 bits before transposes, casts from 16 bits after them.
  pipeline.narrow_transposes = options.narrow_transposes || gpu;
  // … and each residual add (and its gradient's add) inside the layernorm beside it.
  pipeline.add_layernorm = options.add_layernorm || gpu;
  // … and each layernorm's bias gradient inside its layernorm_grad.
  pipeline.layernorm_bias_grad = options.layernorm_bias_grad || gpu;
  // … and the casts at each layernorm gradient's edges inside it.
  pipeline.layernorm_grad_casts = options.layernorm_grad_casts || gpu;
  // … and writes the gradients of a tensor's gathered slices as one concat.
  pipeline.concat_gather_grads = options.concat_gather_grads || gpu;
  // … and runs each chain of elementwise ops as one kernel.
  pipeline.fuse_elementwise = options.fuse_elementwise || gpu;
  plan.train = forward;
  auto reports = PassPipeline::build(PassStage::kTraining, pipeline).run(plan.train, instrumentation_for(options, quiet));
  if (!reports.ok()) return in_model(reports.status());
  return reports;
}

Expected<Plan> ModelCompiler::compile(const CompileOptions& options, bool quiet, bool schedule_quiet) {
  MEMC_RETURN_IF_ERROR(check_batch(options));
  MEMC_RETURN_IF_ERROR(check_disabled_passes(options.disabled_passes, "--disable-pass"));
  MEMC_RETURN_IF_ERROR(check_disabled_passes(disabled_passes(CompileOptions{}), "MEMC_DISABLE_PASSES"));
  const int64_t devices = options.shard.devices, rank_batch = options.rank_batch();
  const Forward* main = nullptr;
  if (quiet) {
    MEMC_ASSIGN_OR_RETURN(main, forward(options, rank_batch));
  } else {
    // A reporting compile runs the forward pipeline itself, for its reports and dumps (a search
    // before it may have cached the forward quietly), and leaves the result cached.
    MEMC_ASSIGN_OR_RETURN(Forward reported, build_forward(options, rank_batch, instrumentation_for(options, quiet)));
    main = &(cache_.insert_or_assign(key_of(options, rank_batch), std::move(reported)).first->second);
  }
  Plan plan;
  // Evaluation runs whole batches on N ranks, slices of the rank's size on one device or where
  // the export fixes its batch; a forward that updates buffers is imported again to read them.
  const int64_t eval_batch = devices > 1 && main->fixed_batch < 0 ? options.batch : rank_batch;
  if (eval_batch != rank_batch || main->updates_buffers) {
    MEMC_ASSIGN_OR_RETURN(const Forward* evaluation, forward(options, eval_batch, main->updates_buffers));
    plan.eval = evaluation->module;
  } else {
    plan.eval = main->module;
  }
  MEMC_ASSIGN_OR_RETURN(const std::vector<PassReport> reports, train(options, main->module, plan, quiet, schedule_quiet));
  const int64_t num_classes = main->module.value(main->module.outputs()[0]).type.shape.back();  // per row, or per position
  MEMC_RETURN_IF_ERROR(describe_plan(plan, options, num_classes));
  // Prefetching holds up to a unit in flight each way; where that breaks the budget, the plan is
  // scheduled without it (zero3's gathers and streamed units' copies then wait for their place).
  const bool prefetched = std::any_of(reports.begin(), reports.end(), [](const PassReport& r) { return r.get("prefetch_kept", 0) != 0; });
  if (prefetched && options.budget_bytes > 0 && plan.memory.predicted_peak_bytes > options.budget_bytes) {
    log(1, str_cat("schedule: prefetching plans ", format_size(plan.memory.predicted_peak_bytes), ", over the budget: scheduled without it"));
    CompileOptions without = options;
    without.prefetch = false;
    return compile(without, quiet, schedule_quiet);
  }
  for (const PassReport& r : reports) {
    if (r.pass != "training_step") continue;
    plan.remat_outcome.has_limit = options.remat.policy == RematPolicy::kLimit && options.remat.limit_bytes < std::numeric_limits<int64_t>::max() / 8;
    plan.remat_outcome.limit_met = r.get("remat.limit_met", 1) != 0;
    plan.remat_outcome.held_tape_bytes = r.get("remat.held_tape_bytes");
  }
  if (!quiet) {
    if (options.keep_lower) {
      MEMC_ASSIGN_OR_RETURN(plan, keep_lower_without_remat(std::move(plan), options));
    }
    MEMC_RETURN_IF_ERROR(check_budget(plan.memory, options.budget_bytes));
  }
  return plan;
}

// The plan's fields other than its modules: the run's settings, the decisions, the estimate
// and the memory summary of the training step.
Status ModelCompiler::describe_plan(Plan& plan, const CompileOptions& options, int64_t num_classes) const {
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
  plan.decisions.precision = std::string(precision_name(options.precision));
  plan.decisions.micro_batches = options.micro_batches;
  plan.decisions.remat = describe_remat(options.remat);
  plan.decisions.attention = std::string(attention_kernel_name(options.attention));
  plan.decisions.offload = std::string(offload_level_name(options.offload));
  plan.decisions.shard = static_cast<int64_t>(options.shard.stage);
  plan.decisions.loss_chunks = plan.train.metadata().get_int("memc.loss_chunks", 1);
  plan.devices = options.shard.devices;
  plan.budget_bytes = options.budget_bytes;
  return measure_step(plan, options);
}

// Remat never raises the peak of the plan to write: the step without it is among the choices,
// planned too, and kept when lower (exact: gradients are bit-identical either way). Not for
// search candidates: the search compares peaks itself, and compiling each twice would double
// it. Recompute pins are the user's order: obeyed as given.
Expected<Plan> ModelCompiler::keep_lower_without_remat(Plan plan, const CompileOptions& options) {
  if (options.remat.policy == RematPolicy::kNone || !options.remat.must_recompute.empty()) return plan;
  CompileOptions plain = options;
  plain.remat = RematOptions{};
  plain.after_pass = nullptr;
  MEMC_ASSIGN_OR_RETURN(Plan without, compile(plain, /*quiet=*/true, /*schedule_quiet=*/options.reschedule));
  log(1, str_cat("pass remat ", describe_remat(options.remat), ": planned peak ", format_size(without.memory.predicted_peak_bytes),
                 " without remat → ", format_size(plan.memory.predicted_peak_bytes), " with it"));
  if (without.memory.predicted_peak_bytes >= plan.memory.predicted_peak_bytes) return plan;
  warn(str_cat("--remat ", describe_remat(options.remat), " plans ", plan.memory.predicted_peak_bytes, " bytes, above the ",
               without.memory.predicted_peak_bytes, " bytes without remat: kept the step without remat"));
  without.remat_outcome = plan.remat_outcome;
  without.remat_outcome.kept_without_remat = true;
  without.remat_outcome.remat_peak_bytes = plan.memory.predicted_peak_bytes;
  return without;
}

Expected<Plan> ModelCompiler::schedule(Plan plan, const CompileOptions& options) const {
  if (!options.reschedule) return plan;
  const Plan given = plan;
  for (const bool prefetch : {options.prefetch, false}) {
    Schedule::Options schedule;
    schedule.group_updates = gpu_target(options) && !disabled(options, "group_updates");
    schedule.prefetch = prefetch;
    PassPipeline pipeline;  // the schedule pass alone, verified like every other
    pipeline.add(std::make_unique<Schedule>(schedule));
    plan = given;
    auto scheduled = pipeline.run(plan.train, PassInstrumentation{});
    if (!scheduled.ok()) return scheduled.status().with_context("schedule: ");
    MEMC_RETURN_IF_ERROR(measure_step(plan, options));
    // As compile(): a prefetching order over the budget gives way to one without.
    const bool kept = !scheduled->empty() && scheduled->front().get("prefetch_kept", 0) != 0;
    if (!kept || options.budget_bytes <= 0 || plan.memory.predicted_peak_bytes <= options.budget_bytes) break;
  }
  return plan;
}

Expected<Plan> compile_model(const std::string& model_path, const std::string& plan_path, const CompileOptions& options) {
  return ModelCompiler(model_path, plan_path).compile(options);
}

}  // namespace memc
