// `memc compile`: imports the model for a fixed batch, builds the training step (loss,
// autodiff, optimizer) and the forward pass for evaluation, verifies both, and fills a Plan.
// The memory passes and the budget search of later work plug in here.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "backends/backend.h"
#include "frontend/onnx_import.h"
#include "passes/pipeline.h"
#include "planner/cost_model.h"
#include "planner/plan.h"

namespace memc {

// The passes' decisions (passes/pipeline.h) and what the planner adds: the shapes, the run's
// length, the target and the budget.
struct CompileOptions : PipelineOptions {
  int64_t batch = 0;  // the global batch (rank r takes rank_slice(batch, devices, r)'s rows)
  // The rows of each rank's step: ⌈batch / devices⌉ (a shorter slice pads; passes/shard.h).
  int64_t rank_batch() const { return rank_rows(batch, shard.devices); }
  int64_t seq = -1;
  // Initializers kept as constants rather than trained (a module's buffers and frozen parameters:
  // --freeze); each must name an initializer.
  std::vector<std::string> frozen;
  ScheduleOptions schedule;
  int64_t epochs = 1;
  int64_t steps_per_epoch = 0;
  std::string target = "cpu";  // device profile of the step-time estimate (planner/cost_model.h)
  int64_t threads = 1;         // compute threads the step runs with on a CPU target (the estimate's speedup)
  // How GPU ranks are joined (--interconnect nvlink|ib, --gpus-per-node; planner/cost_model.h
  // set_interconnect); empty: the target's own (nvlink, 8 GPUs per node, on a GPU target).
  std::string interconnect;
  int64_t gpus_per_node = 8;
  // Called with "import" and each pass's name, and the module after it (--print-ir-after-all,
  // --dump-dir); only for plans that report (not for search candidates).
  std::function<void(std::string_view pass, const Module& module)> after_pass;
  int64_t budget_bytes = 0;  // 0: no budget; else a plan whose device peak exceeds it fails (exit 3)
  // Plan the step without remat too, and keep the lower peak (compile's contract below). Off
  // for a search's choice: the search judged those decisions.
  bool keep_lower = true;
  // Attention keeps the default layout on every target, where the planner would lay it out
  // (lays_out_attention in planner/compile.cc); tests compare the laid-out steps with it.
  bool default_attention_layout = false;
};

// The device/host memory of a training step, from passes/memory_plan, with the kernel
// workspace `backend` (the plan's target: backends/backend.h planning_backend) needs.
Expected<MemorySummary> summarize_memory(const Module& train, const Backend& backend);

// The device profile of options.target with options.interconnect applied.
Expected<DeviceProfile> target_profile(const CompileOptions& options);

// `plan_path` is where the plan will be written; the model path is stored relative to it.
Expected<Plan> compile_model(const std::string& model_path, const std::string& plan_path, const CompileOptions& options);

// Compiles one model under many options (the budget search): the imported forward, after the
// attention and precision passes, is kept per (batch, seq, precision, attention, dropout).
class ModelCompiler {
 public:
  ModelCompiler(std::string model_path, std::string plan_path);
  // Every pass's output is verified. quiet: no pass reports or dumps and no budget check (search
  // candidates), and no schedule pass unless `schedule_quiet` (its peak is then an upper bound).
  // Not quiet: a remat plan whose peak is above the same step's without remat is replaced by
  // that step.
  Expected<Plan> compile(const CompileOptions& options, bool quiet = false, bool schedule_quiet = false);
  // A plan compiled quietly without the schedule pass, scheduled now: the same plan as
  // compile(options, true, true), without building the step again.
  Expected<Plan> schedule(Plan plan, const CompileOptions& options) const;
  const std::string& model_path() const { return model_path_; }
  // The batch the export fixes (a static dim 0 on its inputs), or -1 when it is dynamic; read at
  // the rank's batch.
  Expected<int64_t> fixed_batch(const CompileOptions& options);
  // Whether the forward updates buffers (a BatchNorm exported in train()): each micro-batch
  // would normalize with its own statistics, so the search keeps one.
  Expected<bool> updates_buffers(const CompileOptions& options);
  // The head chunks --loss-chunks auto takes for the forward at the rank's batch (passes/loss_chunks.h).
  Expected<int64_t> auto_loss_chunks(const CompileOptions& options);

 private:
  struct Forward {
    Module module;             // after the forward pipeline
    int64_t fixed_batch = -1;  // the import's
    bool updates_buffers = false;  // BatchNorm's running statistics, in train()
  };
  // …, dropout, attention layouts, patch GEMMs, gathers of transposes, evaluation, devices
  using Key = std::tuple<int64_t, int64_t, PrecisionKind, AttentionKernel, bool, AttentionLayouts, bool, bool, bool, int64_t>;
  static Key key_of(const CompileOptions& options, int64_t batch, bool evaluation = false);
  // The forward at `batch`, cached per key (search candidates: verified, not reported).
  // `evaluation`: BatchNorms exported in train() read their running statistics (the forward
  // `memc run --eval` scores), where the training forward normalizes with the batch's.
  Expected<const Forward*> forward(const CompileOptions& options, int64_t batch, bool evaluation = false);
  // Imports and runs the forward pipeline under `instrumentation`.
  Expected<Forward> build_forward(const CompileOptions& options, int64_t batch, const PassInstrumentation& instrumentation,
                                  bool evaluation = false) const;
  Expected<std::vector<PassReport>> train(const CompileOptions& options, const Module& forward, Plan& plan, bool quiet, bool schedule_quiet);
  Status describe_plan(Plan& plan, const CompileOptions& options, int64_t num_classes) const;
  Expected<Plan> keep_lower_without_remat(Plan plan, const CompileOptions& options);
  Status in_model(const Status& status) const;

  std::string model_path_, plan_path_;
  std::map<Key, Forward> cache_;
};

}  // namespace memc
