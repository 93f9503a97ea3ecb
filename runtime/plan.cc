#include "runtime/plan.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ir/printer.h"
#include "ir/verifier.h"
#include "runtime/atomic_file.h"

namespace memc {

using json = nlohmann::json;

const char* memc_version() { return "0.1.0"; }

double learning_rate(const ScheduleOptions& s, int64_t step, int64_t total_steps) {
  const int64_t horizon = s.total_steps > 0 ? s.total_steps : total_steps;
  if (s.kind == "constant" || horizon <= 0) return s.lr;
  int64_t warmup = s.kind == "warmup-cosine" ? s.warmup_steps : 0;
  if (warmup > 0 && step <= warmup) return s.lr * static_cast<double>(step) / static_cast<double>(warmup);
  // Cosine from lr to min_lr over the steps after warm-up (torch's CosineAnnealingLR shape).
  const double progress = std::min(1.0, static_cast<double>(step - 1 - warmup) / std::max<double>(1.0, static_cast<double>(horizon - warmup)));
  return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(M_PI * progress));
}

static json optimizer_json(const OptimizerOptions& o) {
  return {{"kind", o.kind}, {"weight_decay", o.weight_decay}, {"momentum", o.momentum}, {"dampening", o.dampening},
          {"nesterov", o.nesterov}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}, {"clip_grad_norm", o.clip_grad_norm}};
}

Status write_plan(const std::string& path, const Plan& plan) {
  json doc = {
      {"format", "memc-plan"},
      {"format_version", kPlanFormatVersion},
      {"memc_version", memc_version()},
      {"model", {{"path", plan.model_path}, {"bytes", plan.model_bytes}}},
      {"batch", plan.batch},
      {"seq", plan.seq},
      {"num_classes", plan.num_classes},
      {"epochs", plan.epochs},
      {"steps_per_epoch", plan.steps_per_epoch},
      {"dropout", plan.dropout},
      {"optimizer", optimizer_json(plan.optimizer)},
      {"schedule", {{"kind", plan.schedule.kind}, {"lr", plan.schedule.lr}, {"warmup_steps", plan.schedule.warmup_steps},
                    {"total_steps", plan.schedule.total_steps}, {"min_lr", plan.schedule.min_lr}}},
      {"decisions", {{"precision", plan.decisions.precision}, {"micro_batches", plan.decisions.micro_batches},
                     {"remat", plan.decisions.remat}, {"shard", plan.decisions.shard}, {"offload", plan.decisions.offload},
                     {"attention", plan.decisions.attention}}},
      {"estimate", {{"target", plan.target}, {"step_ms", plan.estimated_step_ms}}},
      {"budget_bytes", plan.budget_bytes},
      {"memory", {{"predicted_peak_bytes", plan.memory.predicted_peak_bytes}, {"lower_bound_bytes", plan.memory.lower_bound_bytes},
                  {"persistent_bytes", plan.memory.persistent_bytes}, {"host_bytes", plan.memory.host_bytes},
                  {"algorithm", plan.memory.algorithm}, {"breakdown", plan.memory.breakdown},
                  {"category_peak_bytes", plan.memory.category_peak_bytes}}},
      {"train_ir", print_module(plan.train)},
      {"eval_ir", print_module(plan.eval)},
  };
  return write_file_atomic(path, doc.dump(1) + "\n");
}

namespace {

// Reads a field, turning a missing or mistyped field into one error naming it.
template <typename T>
Status get(const json& j, const char* key, T& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return Status::BadInput(where + ": missing field '" + key + "'");
  try {
    out = it->template get<T>();
  } catch (const json::exception&) {
    return Status::BadInput(where + ": field '" + key + "' has the wrong type");
  }
  return Status::Ok();
}

}  // namespace

Expected<Plan> read_plan(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::BadInput(path + ": cannot open plan file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  json doc = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return Status::BadInput(path + ": not a memc plan (truncated or not JSON)");
  std::string format;
  MEMC_RETURN_IF_ERROR(get(doc, "format", format, path));
  if (format != "memc-plan") return Status::BadInput(path + ": not a memc plan (format '" + format + "')");
  int version = 0;
  std::string writer;
  MEMC_RETURN_IF_ERROR(get(doc, "format_version", version, path));
  MEMC_RETURN_IF_ERROR(get(doc, "memc_version", writer, path));
  if (version != kPlanFormatVersion) {
    return Status::BadInput(str_cat(path, ": plan format ", version, " written by memc ", writer, "; this memc ",
                                    memc_version(), " reads format ", kPlanFormatVersion, " — recompile the model"));
  }
  Plan plan;
  const json& model = doc.value("model", json::object());
  MEMC_RETURN_IF_ERROR(get(model, "path", plan.model_path, path + ": model"));
  MEMC_RETURN_IF_ERROR(get(model, "bytes", plan.model_bytes, path + ": model"));
  MEMC_RETURN_IF_ERROR(get(doc, "batch", plan.batch, path));
  MEMC_RETURN_IF_ERROR(get(doc, "seq", plan.seq, path));
  MEMC_RETURN_IF_ERROR(get(doc, "num_classes", plan.num_classes, path));
  MEMC_RETURN_IF_ERROR(get(doc, "epochs", plan.epochs, path));
  MEMC_RETURN_IF_ERROR(get(doc, "steps_per_epoch", plan.steps_per_epoch, path));
  MEMC_RETURN_IF_ERROR(get(doc, "dropout", plan.dropout, path));
  const json& opt = doc.value("optimizer", json::object());
  const std::string ow = path + ": optimizer";
  MEMC_RETURN_IF_ERROR(get(opt, "kind", plan.optimizer.kind, ow));
  MEMC_RETURN_IF_ERROR(get(opt, "weight_decay", plan.optimizer.weight_decay, ow));
  MEMC_RETURN_IF_ERROR(get(opt, "momentum", plan.optimizer.momentum, ow));
  MEMC_RETURN_IF_ERROR(get(opt, "dampening", plan.optimizer.dampening, ow));
  MEMC_RETURN_IF_ERROR(get(opt, "nesterov", plan.optimizer.nesterov, ow));
  MEMC_RETURN_IF_ERROR(get(opt, "beta1", plan.optimizer.beta1, ow));
  MEMC_RETURN_IF_ERROR(get(opt, "beta2", plan.optimizer.beta2, ow));
  MEMC_RETURN_IF_ERROR(get(opt, "eps", plan.optimizer.eps, ow));
  MEMC_RETURN_IF_ERROR(get(opt, "clip_grad_norm", plan.optimizer.clip_grad_norm, ow));
  const json& sched = doc.value("schedule", json::object());
  const std::string sw = path + ": schedule";
  MEMC_RETURN_IF_ERROR(get(sched, "kind", plan.schedule.kind, sw));
  MEMC_RETURN_IF_ERROR(get(sched, "lr", plan.schedule.lr, sw));
  MEMC_RETURN_IF_ERROR(get(sched, "warmup_steps", plan.schedule.warmup_steps, sw));
  MEMC_RETURN_IF_ERROR(get(sched, "total_steps", plan.schedule.total_steps, sw));
  MEMC_RETURN_IF_ERROR(get(sched, "min_lr", plan.schedule.min_lr, sw));
  const json& dec = doc.value("decisions", json::object());
  const std::string dw = path + ": decisions";
  MEMC_RETURN_IF_ERROR(get(dec, "precision", plan.decisions.precision, dw));
  MEMC_RETURN_IF_ERROR(get(dec, "micro_batches", plan.decisions.micro_batches, dw));
  MEMC_RETURN_IF_ERROR(get(dec, "remat", plan.decisions.remat, dw));
  MEMC_RETURN_IF_ERROR(get(dec, "shard", plan.decisions.shard, dw));
  MEMC_RETURN_IF_ERROR(get(dec, "offload", plan.decisions.offload, dw));
  if (dec.contains("attention")) MEMC_RETURN_IF_ERROR(get(dec, "attention", plan.decisions.attention, dw));
  if (const json& est = doc.value("estimate", json::object()); !est.empty()) {
    MEMC_RETURN_IF_ERROR(get(est, "target", plan.target, path + ": estimate"));
    MEMC_RETURN_IF_ERROR(get(est, "step_ms", plan.estimated_step_ms, path + ": estimate"));
  }
  MEMC_RETURN_IF_ERROR(get(doc, "budget_bytes", plan.budget_bytes, path));
  const json& mem = doc.value("memory", json::object());
  const std::string mw = path + ": memory";
  MEMC_RETURN_IF_ERROR(get(mem, "predicted_peak_bytes", plan.memory.predicted_peak_bytes, mw));
  MEMC_RETURN_IF_ERROR(get(mem, "lower_bound_bytes", plan.memory.lower_bound_bytes, mw));
  MEMC_RETURN_IF_ERROR(get(mem, "persistent_bytes", plan.memory.persistent_bytes, mw));
  MEMC_RETURN_IF_ERROR(get(mem, "host_bytes", plan.memory.host_bytes, mw));
  MEMC_RETURN_IF_ERROR(get(mem, "algorithm", plan.memory.algorithm, mw));
  MEMC_RETURN_IF_ERROR(get(mem, "breakdown", plan.memory.breakdown, mw));
  MEMC_RETURN_IF_ERROR(get(mem, "category_peak_bytes", plan.memory.category_peak_bytes, mw));
  for (auto [key, module] : {std::pair{"train_ir", &plan.train}, std::pair{"eval_ir", &plan.eval}}) {
    std::string text;
    MEMC_RETURN_IF_ERROR(get(doc, key, text, path));
    Expected<Module> parsed = parse_module(text);
    if (!parsed.ok()) return parsed.status().with_context(path + ": " + key + ": ");
    MEMC_RETURN_IF_ERROR(verify(*parsed).with_context(path + ": " + key + ": "));
    *module = std::move(parsed).value();
  }
  return plan;
}

std::string resolve_model_path(const std::string& plan_path, const Plan& plan) {
  namespace fs = std::filesystem;
  fs::path model(plan.model_path);
  if (model.is_absolute()) return model.string();
  return (fs::path(plan_path).parent_path() / model).lexically_normal().string();
}

}  // namespace memc
