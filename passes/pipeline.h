// The pass pipeline as data. Each registered pass (passes/pipeline.cc, one line each) names
// its stage, when the options enable it, and how it is built from them; a pipeline is the
// enabled passes of a stage in registry order. The forward stage turns the imported model into
// the forward pass that training and evaluation start from; the training stage turns that
// forward into one training step.
//
// Running a pipeline verifies the module after every pass (ir/verifier.h) and names the pass
// whose output fails; it prints -v reports and IR dumps (MLIR's "// -----// IR Dump After X
// //----- //" banner) from one place.
#pragma once
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "passes/attention.h"
#include "passes/offload.h"
#include "passes/pass.h"
#include "passes/precision.h"
#include "passes/remat.h"
#include "passes/shard.h"
#include "passes/training_step.h"

namespace memc {

// Every decision the passes act on, as types.
struct PipelineOptions {
  bool dropout = true;  // false: dropout nodes become identities (strip_dropout)
  AttentionKernel attention = AttentionKernel::kTiled;
  // Attention reads and writes its operands in the layouts the model's projections use
  // (passes/attention.h), as the planner chooses per target and precision (planner/compile.cc).
  AttentionLayouts attention_layouts = AttentionLayouts::kNone;
  // Patch embeddings (stride = kernel convolutions) as patches and one GEMM (passes/patch_gemm.h).
  // Set for GPU targets (planner/compile.cc), whose convolution is im2col and a batched GEMM.
  bool patch_gemm = false;
  // Gathers of one slice along an axis a transpose moved read the untransposed tensor
  // (passes/split_gathers.h: torch's packed q/k/v). Set for GPU targets.
  bool gather_transposes = false;
  PrecisionKind precision = PrecisionKind::kFp32;
  OptimizerOptions optimizer;
  int64_t micro_batches = 1;  // k > 1: gradient accumulation over k micro-batches (passes/microbatch.h)
  ForwardFactory forward;     // the forward at a micro-batch's size (set by the planner)
  // A language model's head and loss in chunks of positions (passes/loss_chunks.h; --loss-chunks):
  // 1 none, 0 auto, K > 1 that many.
  int64_t loss_chunks = 1;
  RematOptions remat;         // policy "none" by default
  ShardOptions shard;         // --devices N --shard zero1|zero2|zero3
  OffloadLevel offload = OffloadLevel::kNone;
  bool reschedule = true;     // the peak-lowering schedule pass (off: import order)
  // The schedule places consecutive optimizer updates together where that costs no memory, so a
  // GPU runs them as fused launches (Schedule::Options::group_updates). Set for GPU targets.
  bool group_updates = false;
  // A linear layer's bias gradient inside its weight-gradient GEMM (passes/bias_grad_gemm.h):
  // cuBLASLt's epilogue. Set for GPU targets.
  bool bias_grad_gemm = false;
  // Gradients' widening casts inside the optimizer updates that read them
  // (passes/update_grad_casts.h). Set for GPU targets.
  bool update_grad_casts = false;
  // Transposes of 16-bit values instead of f32 ones where a cast beside them allows
  // (passes/narrow_transposes.h). Set for GPU targets.
  bool narrow_transposes = false;
  // Residual adds inside the layernorms that read them, and gradient adds inside the
  // layernorm_grads they follow (passes/add_layernorm.h). Set for GPU targets.
  bool add_layernorm = false;
  // A layernorm's bias gradient inside its layernorm_grad (passes/layernorm_bias_grad.h). Set for
  // GPU targets.
  bool layernorm_bias_grad = false;
  // A layernorm_grad reads its 16-bit dy and writes dx's 16-bit copy, where casts did
  // (passes/layernorm_grad_casts.h). Set for GPU targets.
  bool layernorm_grad_casts = false;
  // Gradients accumulated from gather_grads that fill every slice of an axis once become one
  // concat of the slices (passes/split_gathers.h). Set for GPU targets.
  bool concat_gather_grads = false;
  // Chains of elementwise ops as one kernel each (passes/fuse_elementwise.h). Set for GPU targets.
  bool fuse_elementwise = false;
  // The schedule may issue prefetching starts early (zero3's gathers, streamed units' copies),
  // at up to one unit in flight each way; false: never (what a budget too tight for it needs).
  bool prefetch = true;
  // Optional rewrites turned off by name (compile --disable-pass, or MEMC_DISABLE_PASSES;
  // optional_rewrites()): a plan is correct without any of them, so one suspected on a new device
  // is ruled out without a build. Checked by check_disabled_passes.
  std::set<std::string> disabled_passes;
};

enum class PassStage { kForward, kTraining };

struct PassInfo {
  std::string_view name;  // --print-ir-after NAME, --dump-dir's NN-NAME.mlir
  std::string_view description;
  PassStage stage;
  bool (*enabled)(const PipelineOptions& options);
  std::unique_ptr<Pass> (*create)(const PipelineOptions& options);
  // A rewrite the plan is correct without (a speed choice): --disable-pass may turn it off.
  bool optional = false;
};

// In pipeline order.
const std::vector<PassInfo>& registered_passes();
const PassInfo* find_pass(std::string_view name);
// What --print-ir-after accepts: "import" (the imported module) and every registered pass.
std::vector<std::string> ir_dump_points();
// The same, as "import, strip_dropout, ...", for help and messages.
std::string ir_dump_point_list();

// What --disable-pass accepts, with each one's description: the optional registered passes and
// two choices inside other passes ("attention_layouts": the attention pass's operand layouts;
// "group_updates": the schedule's update groups, one launch each).
std::vector<std::pair<std::string, std::string>> optional_rewrites();
// Their names as "patch_gemm, gather_transposes, ...", for help and messages.
std::string optional_rewrite_list();
// BadInput naming the first of `names` that optional_rewrites() lacks, and listing them.
Status check_disabled_passes(const std::set<std::string>& names, std::string_view where);

// "// -----// IR Dump After NAME //----- //"
std::string ir_dump_banner(std::string_view pass);

struct PassInstrumentation {
  bool verify = true;   // verify after every pass
  bool report = false;  // print each pass's -v lines and its warnings
  // Called with each pass's name and the module after it (dumps).
  std::function<void(std::string_view pass, const Module& module)> after_pass;
  // When set: fills a report's peak_before/peak_after that its pass left unmeasured.
  std::function<Expected<int64_t>(const Module& module)> peak;
};

class PassPipeline {
 public:
  // The registered passes of `stage` that `options` enable, in registry order.
  static PassPipeline build(PassStage stage, const PipelineOptions& options);
  void add(std::unique_ptr<Pass> pass) { passes_.push_back(std::move(pass)); }
  std::vector<std::string> names() const;
  // Runs every pass in order. A failing pass's status is returned as it is; a module that fails
  // verification after a pass is an internal error naming the pass.
  Expected<std::vector<PassReport>> run(Module& module, const PassInstrumentation& instrumentation) const;

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
};

// Prints a report's lines at -v (and its warnings), as the pipeline does when reporting.
void print_pass_report(const PassReport& report);

}  // namespace memc
