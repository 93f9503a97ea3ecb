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
#include "passes/attention.h"
#include "passes/precision.h"
#include "planner/cost_model.h"
#include "runtime/plan.h"

namespace memc {

struct CompileOptions {
  int64_t batch = 0;
  int64_t seq = -1;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  int64_t epochs = 1;
  int64_t steps_per_epoch = 0;
  bool dropout = true;         // false: dropout nodes become identities (for exact comparisons)
  std::string precision = "fp32";
  int64_t micro_batches = 1;
  RematOptions remat;  // passes/remat.h; policy "none" by default
  std::string target = "cpu";       // device profile of the step-time estimate (planner/cost_model.h)
  std::string offload = "none";     // none | optimizer (passes/offload.h)
  ShardOptions shard;               // --devices N --shard zero1|zero2 (passes/shard.h); `batch` is the global batch
  std::string attention = "tiled";  // tiled: the memory-efficient attention pass; naive: the exported MatMul→Softmax→MatMul
  // Called with each pass's name and the module after it (--print-ir-after-all, --dump-dir):
  // "import", "attention", "precision" (forward), "training_step" (autodiff, micro-batching,
  // remat, optimizer), "schedule" (the training step).
  std::function<void(const std::string& pass, const Module& module)> after_pass;  // k > 1: gradient accumulation over k micro-batches (passes/microbatch.h)
  int64_t budget_bytes = 0;  // 0: no budget; else a plan whose device peak exceeds it fails (exit 3)
  bool reschedule = true;    // the peak-lowering schedule pass (off: import order, for tests)
  // Plan the step without remat too, and keep the lower peak (compile's contract below). Off
  // for a search's choice: the search judged those decisions.
  bool keep_lower = true;
};

// The device/host memory of a training step, from passes/memory_plan, with the kernel
// workspace `backend` (the plan's target: backends/backend.h planning_backend) needs.
Expected<MemorySummary> summarize_memory(const Module& train, const Backend& backend);

// `plan_path` is where the plan will be written; the model path is stored relative to it.
Expected<Plan> compile_model(const std::string& model_path, const std::string& plan_path, const CompileOptions& options);

// Compiles one model under many options (the budget search): the imported forward, after the
// attention and precision passes, is kept per (batch, seq, precision, attention, dropout).
class ModelCompiler {
 public:
  ModelCompiler(std::string model_path, std::string plan_path);
  // quiet: no pass reports or dumps, no verification and no budget check (search candidates),
  // and no schedule pass unless `schedule_quiet` (its peak is then an upper bound). Not quiet:
  // a remat plan whose peak is above the same step's without remat is replaced by that step.
  Expected<Plan> compile(const CompileOptions& options, bool quiet = false, bool schedule_quiet = false);
  // A plan compiled quietly without the schedule pass, scheduled now: the same plan as
  // compile(options, true, true), without building the step again.
  Expected<Plan> schedule(Plan plan, const CompileOptions& options) const;
  const std::string& model_path() const { return model_path_; }
  // The batch the export fixes (a static dim 0 on its inputs), or -1 when it is dynamic.
  Expected<int64_t> fixed_batch(const CompileOptions& options);

 private:
  struct Forward {
    Module imported, after_attention, module;
    AttentionReport attention;
    PrecisionReport precision;
  };
  using Key = std::tuple<int64_t, int64_t, std::string, std::string, bool>;
  Expected<const Forward*> forward(const CompileOptions& options, int64_t batch);
  Expected<Plan> keep_lower_without_remat(Plan plan, const CompileOptions& options);

  std::string model_path_, plan_path_;
  std::map<Key, Forward> cache_;
};

// "none", "blocks", "pins" (pins only) or the limit as a size.
std::string describe_remat(const RematOptions& remat);

}  // namespace memc
