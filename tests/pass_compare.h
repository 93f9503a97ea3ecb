// Shared by the memory-pass tests: compile a committed model with given options, take the
// first step's loss and gradients on committed data, and compare two plans' results.
#pragma once
#include <map>
#include <string>

#include "ir/tensor.h"
#include "planner/compile.h"

namespace memc::testing {

// Compiles models/<model>.onnx (no plan file is written; the plan's model path is absolute).
Plan compile_committed(const std::string& model, const CompileOptions& options);

// Loss ("loss") and every parameter gradient of the first step on the first batch of
// data/<data>, from fresh initial weights, all as f32.
std::map<std::string, Tensor> first_step_gradients(const Plan& plan, const std::string& data);

struct GradientDiff {
  double loss_rel = 0;         // |loss − loss₀| / |loss₀|
  double grad_rel_l2 = 0;      // ‖g − g₀‖ / ‖g₀‖ over all parameters together
  // The largest per-parameter ‖g − g₀‖ / ‖g₀‖ among parameters whose ‖g₀‖ is at least 1e-4 of
  // the largest one's: a gradient that is zero in exact arithmetic (an attention key bias: the
  // softmax ignores a per-row constant) holds only rounding noise, and its relative error is noise.
  double worst_param_rel = 0;
  std::string worst_param;
  bool bit_identical = true;   // loss and every gradient equal bit for bit
  std::string missing;         // a gradient of `want` absent from `got` or of another shape
};
GradientDiff compare_gradients(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want);

// Runs `steps` training steps of `plan` on data/<data>; returns the measured device peak
// (fails the test when the run fails or a loss is not finite).
int64_t measured_peak(const Plan& plan, const std::string& data, int64_t steps);

}  // namespace memc::testing
