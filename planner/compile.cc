#include "planner/compile.h"

#include <filesystem>

#include "ir/verifier.h"
#include "passes/training_step.h"

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

Expected<Plan> compile_model(const std::string& model_path, const std::string& plan_path, const CompileOptions& options) {
  if (options.batch <= 0) return Status::BadInput("--batch must be a positive integer");
  if (options.precision != "fp32") {
    return Status::BadInput("--precision " + options.precision + " is not available yet (this memc plans fp32)");
  }
  ImportOptions import;
  import.batch = options.batch;
  import.seq = options.seq;
  import.load_weights = false;
  MEMC_ASSIGN_OR_RETURN(Module forward, import_onnx(model_path, import));
  if (!options.dropout) remove_dropout(forward);
  if (forward.outputs().empty()) return Status::BadInput(model_path + ": the model has no outputs");
  const TensorType logits = forward.value(forward.outputs()[0]).type;
  if (logits.shape.size() != 2) {
    return Status::BadInput(str_cat(model_path, ": first output is [", shape_str(logits.shape), "]; training needs logits [N, C]"));
  }
  forward.set_outputs({forward.outputs()[0]});
  forward.eliminate_dead_nodes();
  forward.compact();

  Plan plan;
  plan.eval = forward;
  plan.train = forward;
  MEMC_RETURN_IF_ERROR(TrainingStep(options.optimizer).run(plan.train).with_context(model_path + ": "));
  MEMC_RETURN_IF_ERROR(verify(plan.train).with_context("training step: "));
  MEMC_RETURN_IF_ERROR(verify(plan.eval).with_context("forward: "));

  std::error_code ec;
  plan.model_path = relative_model_path(model_path, plan_path);
  plan.model_bytes = static_cast<int64_t>(std::filesystem::file_size(model_path, ec));
  plan.batch = options.batch;
  plan.seq = options.seq;
  plan.num_classes = logits.shape[1];
  plan.epochs = options.epochs;
  plan.steps_per_epoch = options.steps_per_epoch;
  plan.dropout = options.dropout;
  plan.optimizer = options.optimizer;
  plan.schedule = options.schedule;
  plan.decisions.precision = options.precision;
  return plan;
}

}  // namespace memc
