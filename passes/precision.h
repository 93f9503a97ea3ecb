// precision: retypes a forward Module for a training precision, as torch autocast / Lightning
// Fabric's `precision=` do.
//   fp32        nothing changes.
//   bf16-true,  every f32 value becomes the 16-bit type: data inputs, parameters (the runtime
//   fp16-true   casts weights to the plan's dtype as it streams them; optimizer states follow
//               the parameters' dtype), constants, `full` and casts to f32. Changes numerics;
//               only applied when the user asks.
//   bf16-mixed  parameters and inputs stay f32 (the parameters are the master weights).
//               matmul/linear/conv/attention compute in bf16 on bf16 casts of their float
//               inputs (a parameter's cast is a forward node, recomputed each step;
//               attention's additive bias/mask stays f32: its kernel reads any dtype);
//               softmax, log_softmax, layernorm, reductions, exp/log/pow/rsqrt/reciprocal/
//               softplus run in f32 on f32 casts; any other op whose float inputs mix bf16
//               and f32 runs in f32 (autocast's type promotion), else in its inputs' dtype.
//   fp16-mixed  bf16-mixed's split with f16 as the low type. Needs dynamic loss scaling
//               (f16's range is narrow): compile_model asks TrainingStep for it
//               (OptimizerOptions::loss_scaling, see passes/training_step.h).
// Every float output of the module that the pass retyped is cast back to f32, so logits,
// and the loss TrainingStep appends, stay f32.
//
// Order: run on the forward Module right after import and before TrainingStep. Autodiff then
// differentiates the inserted casts (grad of cast = cast back), so the gradients of f32
// parameters under bf16-mixed arrive in f32 and the optimizer updates f32 weights. Must not
// run after TrainingStep (it would retype gradients and optimizer updates).
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "ir/graph.h"
#include "passes/pass.h"

namespace memc {

struct PrecisionReport {
  int64_t casts_inserted = 0;   // new cast nodes (including retargeted ones under *-true: 0)
  int64_t values_retyped = 0;   // existing values whose dtype changed
  int64_t float_bytes_before = 0;  // bytes of every float value (arguments and node results)
  int64_t float_bytes_after = 0;   // the same afterwards, casts included
};
// The training precisions, spelled as in Lightning Fabric's `precision=`.
enum class PrecisionKind { kFp32, kBf16Mixed, kFp16Mixed, kBf16True, kFp16True };
// "fp32" | "bf16-mixed" | "fp16-mixed" | "bf16-true" | "fp16-true"; anything else is bad input.
Expected<PrecisionKind> parse_precision(std::string_view name);
std::string_view precision_name(PrecisionKind kind);

std::string precision_summary(PrecisionKind kind, const PrecisionReport& report);

// The 16-bit dtype of a mode and whether it is a *-true mode; nullopt for fp32.
struct PrecisionMode {
  DType low = DType::kF32;
  bool pure = false;  // *-true: everything in `low`; else mixed
};
std::optional<PrecisionMode> precision_mode(PrecisionKind kind);

class Precision : public Pass {
 public:
  struct Options {
    PrecisionKind mode = PrecisionKind::kFp32;
  };
  explicit Precision(Options options) : options_(std::move(options)) {}
  std::string_view name() const override { return "precision"; }
  // Returns whether the module changed; fails when an op
  // rejects the new types (the message names the node).
  // Statistics: casts_inserted, values_retyped, float_bytes_before, float_bytes_after.
  Expected<PassReport> run(Module& module) override;
  const PrecisionReport& details() const { return details_; }

 private:
  Options options_;
  PrecisionReport details_;
};

}  // namespace memc
