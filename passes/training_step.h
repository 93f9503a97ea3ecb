// Turns a forward Module (outputs[0] = logits [N, C], or a language model's [N, T..., C]) into
// one training step:
//   loss = softmax_cross_entropy(logits, labels)            labels: new i64 [N] (or [N, T...]) input
//   grads = autodiff(loss, params)                          Role::kGrad
//   [global-norm clipping]                                  coef = min(1, max_norm/(‖g‖+1e-6))
//   params', states' = optimizer updates                    written back via Module::add_update
// Token labels count positions (passes/microbatch.h, LossRows). Outputs afterwards: loss (f32
// scalar, unscaled), a classifier's logits (not a language model's), [found_inf under loss
// scaling], then the updates. lr and step are runtime scalar arguments ("lr", "step");
// optimizer states are Role::kOptimizerState arguments that start at zero. Run after import,
// before every memory pass.
#pragma once
#include <string>

#include "ir/graph.h"
#include "passes/pass.h"
#include "passes/microbatch.h"
#include "passes/remat.h"
#include "passes/shard.h"

namespace memc {

struct OptimizerOptions {
  std::string kind = "adamw";  // a registered optimizer (passes/optimizers.h)
  double weight_decay = 0.0;   // AdamW's default is set by the CLI (0.01)
  double momentum = 0.9;
  double dampening = 0.0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip_grad_norm = 0.0;  // 0: no clipping
  // Dynamic loss scaling (fp16-mixed; torch.cuda.amp.GradScaler): autodiff differentiates
  // loss·loss_scale (a runtime scalar "loss_scale"), each gradient is unscaled (·1/loss_scale)
  // in f32 before clipping, output "found_inf" is 1 when any gradient is inf/NaN, and every
  // optimizer update takes it as its `skip` input (1: parameter and states stay unchanged).
  bool loss_scaling = false;
};

// k > 1: the loss and gradients come from k micro-batches (passes/microbatch.h), each a
// forward built by `forward`; the module's own full-batch forward then only supplies the
// arguments and is dropped.
struct MicroBatching {
  int64_t k = 1;
  ForwardFactory forward;
  // A language model's head and loss in chunks of positions (passes/loss_chunks.h): 1 none,
  // 0 auto (auto_loss_chunks), K > 1 that many (at most the positions).
  int64_t loss_chunks = 1;
};

class TrainingStep : public Pass {
 public:
  using Options = OptimizerOptions;
  // `shard`: data parallel over ranks, the optimizer on blocks of flat units (passes/shard.h);
  // the module is then one rank's step, its batch the rank's slice of the global batch.
  explicit TrainingStep(Options options, MicroBatching micro = {}, RematOptions remat = {}, ShardOptions shard = {})
      : options_(std::move(options)), micro_(std::move(micro)), remat_(std::move(remat)), shard_(shard) {}
  std::string_view name() const override { return "training_step"; }
  // Reports micro-batching, remat (statistics "remat.*") and sharding when they act.
  Expected<PassReport> run(Module& module) override;

 private:
  Status build(Module& module);
  PassReport report(int64_t rank_batch) const;
  void record_metadata(Module& module) const;

  Options options_;
  MicroBatching micro_;
  RematOptions remat_;
  ShardOptions shard_;
  RematReport remat_report_;
  int64_t units_ = 0;  // shard units built
  int64_t loss_chunks_ = 1;  // the head's chunks built (passes/loss_chunks.h)
  std::string dropped_;      // "2 concat, 1 linear": nodes built that the step does not read
  std::string units_description_;  // how they were found
};

// Names of the runtime scalar arguments a training step reads.
inline constexpr const char* kLrArg = "lr";
inline constexpr const char* kStepArg = "step";
inline constexpr const char* kLabelsArg = "labels";
inline constexpr const char* kLossScaleArg = "loss_scale";  // argument, under loss scaling
inline constexpr const char* kFoundInfOutput = "found_inf";  // output name, under loss scaling

}  // namespace memc
