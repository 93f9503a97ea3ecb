#include "runtime/plan.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>
#include <sstream>

#include <nlohmann/json.hpp>

#include "frontend/onnx_weights.h"
#include "ir/printer.h"
#include "passes/optimizers.h"
#include "passes/precision.h"
#include "ir/verifier.h"
#include "support/atomic_file.h"
#include "support/crc32c.h"

namespace memc {

using json = nlohmann::json;

const char* memc_version() { return MEMC_VERSION; }

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

Expected<FileDigest> digest_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::BadInput(path + ": cannot open");
  FileDigest d;
  d.path = path;
  uint32_t crc = 0;
  std::vector<char> chunk(size_t{4} << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const std::streamsize got = in.gcount();
    if (got <= 0) break;
    crc = crc32c(chunk.data(), static_cast<size_t>(got), crc);
    d.bytes += got;
  }
  if (in.bad()) return Status::BadInput(path + ": read error");
  d.crc32c = crc32c_hex(crc);
  return d;
}

static std::string model_folder(const std::string& model) {
  const std::filesystem::path p(model);
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

std::vector<std::string> plan_input_files(const std::string& plan_path, const Plan& plan) {
  const std::string model = resolve_model_path(plan_path, plan);
  std::vector<std::string> files = {model};
  for (const FileDigest& d : plan.external_data) files.push_back((std::filesystem::path(model_folder(model)) / d.path).string());
  return files;
}

Status check_model_unchanged(const std::string& plan_path, const Plan& plan) {
  const std::string model = resolve_model_path(plan_path, plan);
  std::error_code ec;
  const auto size = std::filesystem::file_size(model, ec);
  if (ec) return Status::BadInput(model + ": model file of the plan not found");
  if (static_cast<int64_t>(size) != plan.model_bytes) {
    return Status::BadInput(str_cat(model, ": has ", size, " bytes, the plan was compiled from ", plan.model_bytes, " bytes: recompile"));
  }
  if (plan.model_crc32c.empty()) return Status::Ok();
  auto check = [](const std::string& file, int64_t bytes, const std::string& crc) -> Status {
    MEMC_ASSIGN_OR_RETURN(FileDigest now, digest_file(file));
    if (now.bytes != bytes || now.crc32c != crc) {
      return Status::BadInput(str_cat(file, ": changed since the plan was compiled (", now.bytes, " bytes, crc32c ", now.crc32c, "; the plan recorded ",
                                      bytes, " bytes, crc32c ", crc, "): recompile"));
    }
    return Status::Ok();
  };
  MEMC_RETURN_IF_ERROR(check(model, plan.model_bytes, plan.model_crc32c));
  for (const FileDigest& d : plan.external_data) {
    MEMC_RETURN_IF_ERROR(check((std::filesystem::path(model_folder(model)) / d.path).string(), d.bytes, d.crc32c));
  }
  return Status::Ok();
}

Status write_plan(const std::string& path, const Plan& plan_in) {
  Plan recorded;  // only the file fields are filled in here: the rest is read from plan_in
  const Plan& plan = plan_in;
  recorded.model_crc32c = plan.model_crc32c;
  recorded.external_data = plan.external_data;
  recorded.model_bytes = plan.model_bytes;
  if (recorded.model_crc32c.empty()) {  // record what the weights will be read from
    const std::string model = resolve_model_path(path, plan);
    MEMC_ASSIGN_OR_RETURN(FileDigest digest, digest_file(model));
    recorded.model_bytes = digest.bytes;
    recorded.model_crc32c = digest.crc32c;
    MEMC_ASSIGN_OR_RETURN(std::vector<std::string> external, onnx_external_data_files(model));
    for (const std::string& location : external) {
      MEMC_ASSIGN_OR_RETURN(FileDigest d, digest_file((std::filesystem::path(model_folder(model)) / location).string()));
      d.path = location;
      recorded.external_data.push_back(d);
    }
  }
  json external = json::array();
  for (const FileDigest& d : recorded.external_data) external.push_back({{"path", d.path}, {"bytes", d.bytes}, {"crc32c", d.crc32c}});
  json doc = {
      {"format", "memc-plan"},
      {"format_version", kPlanFormatVersion},
      {"memc_version", memc_version()},
      {"model", {{"path", plan.model_path}, {"bytes", recorded.model_bytes}, {"crc32c", recorded.model_crc32c}, {"external_data", external}}},
      {"batch", plan.batch},
      {"devices", plan.devices},
      {"threads", plan.threads},
      {"bf16_gemm", plan.bf16_gemm},
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
                     {"attention", plan.decisions.attention}, {"loss_chunks", plan.decisions.loss_chunks}}},
      {"estimate", {{"target", plan.target}, {"step_ms", plan.estimated_step_ms}, {"comm_ms", plan.estimated_comm_ms},
                    {"comm_exposed_ms", plan.estimated_comm_exposed_ms}, {"interconnect", plan.interconnect}}},
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

bool is_hex8(const std::string& s) { return s.size() == 8 && s.find_first_not_of("0123456789abcdef") == std::string::npos; }

// Values no compile writes: an edited or corrupt plan is refused naming the field.
Status validate_fields(const Plan& plan, const std::string& path) {
  auto bad = [&](const std::string& field, const auto& value, const char* want) {
    return Status::BadInput(str_cat(path, ": field '", field, "' = ", value, " is invalid (", want, ")"));
  };
  if (plan.model_path.empty()) return Status::BadInput(path + ": field 'model.path' is empty");
  if (plan.model_bytes < 0) return bad("model.bytes", plan.model_bytes, "a size");
  if (!is_hex8(plan.model_crc32c)) return bad("model.crc32c", "'" + plan.model_crc32c + "'", "8 hex digits");
  for (const FileDigest& d : plan.external_data) {
    if (d.path.empty() || d.path.find("..") != std::string::npos || std::filesystem::path(d.path).is_absolute()) {
      return bad("model.external_data.path", "'" + d.path + "'", "a file in the model's folder");
    }
    if (d.bytes < 0 || !is_hex8(d.crc32c)) return bad("model.external_data", d.path, "a size and 8 hex digits");
  }
  if (plan.batch <= 0) return bad("batch", plan.batch, "positive");
  if (plan.seq < -1 || plan.seq == 0) return bad("seq", plan.seq, "-1 or positive");
  if (plan.num_classes <= 0) return bad("num_classes", plan.num_classes, "positive");
  if (plan.epochs < 0) return bad("epochs", plan.epochs, "non-negative");
  if (plan.steps_per_epoch < 0) return bad("steps_per_epoch", plan.steps_per_epoch, "non-negative");
  const OptimizerOptions& o = plan.optimizer;
  if (!find_optimizer(o.kind)) return bad("optimizer.kind", "'" + o.kind + "'", optimizer_names(false, " or ").c_str());
  for (auto [name, v] : {std::pair{"weight_decay", o.weight_decay}, std::pair{"momentum", o.momentum}, std::pair{"dampening", o.dampening},
                         std::pair{"beta1", o.beta1}, std::pair{"beta2", o.beta2}, std::pair{"eps", o.eps},
                         std::pair{"clip_grad_norm", o.clip_grad_norm}}) {
    if (!std::isfinite(v) || v < 0) return bad(std::string("optimizer.") + name, v, "finite, non-negative");
  }
  const ScheduleOptions& sc = plan.schedule;
  if (sc.kind != "constant" && sc.kind != "cosine" && sc.kind != "warmup-cosine") {
    return bad("schedule.kind", "'" + sc.kind + "'", "constant, cosine or warmup-cosine");
  }
  if (!std::isfinite(sc.lr) || sc.lr < 0) return bad("schedule.lr", sc.lr, "finite, non-negative");
  if (!std::isfinite(sc.min_lr) || sc.min_lr < 0) return bad("schedule.min_lr", sc.min_lr, "finite, non-negative");
  if (sc.warmup_steps < 0) return bad("schedule.warmup_steps", sc.warmup_steps, "non-negative");
  if (sc.total_steps < 0) return bad("schedule.total_steps", sc.total_steps, "non-negative");
  if (!parse_precision(plan.decisions.precision).ok()) return bad("decisions.precision", "'" + plan.decisions.precision + "'", "a precision");
  if (plan.devices < 1 || plan.devices > 4096 || plan.devices > plan.batch) return bad("devices", plan.devices, "1 to 4096, at most the batch");
  if (plan.decisions.micro_batches < 1 || plan.decisions.micro_batches > plan.rank_rows()) {
    return bad("decisions.micro_batches", plan.decisions.micro_batches, "1 to the batch");
  }
  if (plan.decisions.shard < 0 || plan.decisions.shard > 3) return bad("decisions.shard", plan.decisions.shard, "0 to 3");
  if (plan.threads < 0 || plan.threads > 4096) return bad("threads", plan.threads, "0 to 4096");
  if (!plan.bf16_gemm.empty() && plan.bf16_gemm != "native" && plan.bf16_gemm != "widened") {
    return bad("bf16_gemm", "'" + plan.bf16_gemm + "'", "native or widened");
  }
  if (plan.budget_bytes < 0) return bad("budget_bytes", plan.budget_bytes, "non-negative");
  const MemorySummary& m = plan.memory;
  for (auto [name, v] : {std::pair{"predicted_peak_bytes", m.predicted_peak_bytes}, std::pair{"lower_bound_bytes", m.lower_bound_bytes},
                         std::pair{"persistent_bytes", m.persistent_bytes}, std::pair{"host_bytes", m.host_bytes}}) {
    if (v < 0) return bad(std::string("memory.") + name, v, "non-negative");
  }
  return Status::Ok();
}

// The file is a JSON object in the format and version this memc reads.
Expected<json> read_plan_document(const std::string& path) {
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
  return doc;
}

// "model": the model file and each external data file, as recorded (checked against the files at run time).
Status read_model_fields(const json& doc, const std::string& path, Plan& plan) {
  const json& model = doc.value("model", json::object());
  MEMC_RETURN_IF_ERROR(get(model, "path", plan.model_path, path + ": model"));
  MEMC_RETURN_IF_ERROR(get(model, "bytes", plan.model_bytes, path + ": model"));
  MEMC_RETURN_IF_ERROR(get(model, "crc32c", plan.model_crc32c, path + ": model"));
  json external;
  MEMC_RETURN_IF_ERROR(get(model, "external_data", external, path + ": model"));
  if (!external.is_array()) return Status::BadInput(path + ": model: field 'external_data' is not a list");
  for (const json& e : external) {
    FileDigest d;
    const std::string ew = path + ": model: external_data";
    if (!e.is_object()) return Status::BadInput(ew + ": an entry is not an object");
    MEMC_RETURN_IF_ERROR(get(e, "path", d.path, ew));
    MEMC_RETURN_IF_ERROR(get(e, "bytes", d.bytes, ew));
    MEMC_RETURN_IF_ERROR(get(e, "crc32c", d.crc32c, ew));
    plan.external_data.push_back(d);
  }
  return Status::Ok();
}

// The training hyperparameters: batch and data shape, epochs, optimizer and schedule ("devices",
// "threads" and "bf16_gemm" may be absent: older plans).
Status read_training_fields(const json& doc, const std::string& path, Plan& plan) {
  MEMC_RETURN_IF_ERROR(get(doc, "batch", plan.batch, path));
  if (doc.contains("devices")) MEMC_RETURN_IF_ERROR(get(doc, "devices", plan.devices, path));
  if (doc.contains("threads")) MEMC_RETURN_IF_ERROR(get(doc, "threads", plan.threads, path));
  if (doc.contains("bf16_gemm")) MEMC_RETURN_IF_ERROR(get(doc, "bf16_gemm", plan.bf16_gemm, path));
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
  return Status::Ok();
}

// What the planner chose and predicted: decisions, estimate, budget and memory summary
// ("attention" and "estimate" may be absent: older plans).
Status read_planner_fields(const json& doc, const std::string& path, Plan& plan) {
  const json& dec = doc.value("decisions", json::object());
  const std::string dw = path + ": decisions";
  MEMC_RETURN_IF_ERROR(get(dec, "precision", plan.decisions.precision, dw));
  MEMC_RETURN_IF_ERROR(get(dec, "micro_batches", plan.decisions.micro_batches, dw));
  MEMC_RETURN_IF_ERROR(get(dec, "remat", plan.decisions.remat, dw));
  MEMC_RETURN_IF_ERROR(get(dec, "shard", plan.decisions.shard, dw));
  MEMC_RETURN_IF_ERROR(get(dec, "offload", plan.decisions.offload, dw));
  if (dec.contains("attention")) MEMC_RETURN_IF_ERROR(get(dec, "attention", plan.decisions.attention, dw));
  if (dec.contains("loss_chunks")) MEMC_RETURN_IF_ERROR(get(dec, "loss_chunks", plan.decisions.loss_chunks, dw));
  if (const json& est = doc.value("estimate", json::object()); !est.empty()) {
    MEMC_RETURN_IF_ERROR(get(est, "target", plan.target, path + ": estimate"));
    MEMC_RETURN_IF_ERROR(get(est, "step_ms", plan.estimated_step_ms, path + ": estimate"));
    // (plans written before the communication estimate have none)
    if (est.contains("comm_ms")) MEMC_RETURN_IF_ERROR(get(est, "comm_ms", plan.estimated_comm_ms, path + ": estimate"));
    if (est.contains("comm_exposed_ms")) MEMC_RETURN_IF_ERROR(get(est, "comm_exposed_ms", plan.estimated_comm_exposed_ms, path + ": estimate"));
    if (est.contains("interconnect")) MEMC_RETURN_IF_ERROR(get(est, "interconnect", plan.interconnect, path + ": estimate"));
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
  return Status::Ok();
}

// Both IR texts parse and verify.
Status read_modules(const json& doc, const std::string& path, Plan& plan) {
  for (auto [key, module] : {std::pair{"train_ir", &plan.train}, std::pair{"eval_ir", &plan.eval}}) {
    std::string text;
    MEMC_RETURN_IF_ERROR(get(doc, key, text, path));
    Expected<Module> parsed = parse_module(text);
    if (!parsed.ok()) return parsed.status().with_context(path + ": " + key + ": ");
    MEMC_RETURN_IF_ERROR(verify(*parsed).with_context(path + ": " + key + ": "));
    *module = std::move(parsed).value();
  }
  return Status::Ok();
}

}  // namespace

// Fields are read in a fixed order and the first bad one is named; values are validated before the
// IR is parsed.
Expected<Plan> read_plan(const std::string& path) {
  MEMC_ASSIGN_OR_RETURN(const json doc, read_plan_document(path));
  Plan plan;
  MEMC_RETURN_IF_ERROR(read_model_fields(doc, path, plan));
  MEMC_RETURN_IF_ERROR(read_training_fields(doc, path, plan));
  MEMC_RETURN_IF_ERROR(read_planner_fields(doc, path, plan));
  MEMC_RETURN_IF_ERROR(validate_fields(plan, path));
  MEMC_RETURN_IF_ERROR(read_modules(doc, path, plan));
  return plan;
}

std::string resolve_model_path(const std::string& plan_path, const Plan& plan) {
  namespace fs = std::filesystem;
  fs::path model(plan.model_path);
  if (model.is_absolute()) return model.string();
  return (fs::path(plan_path).parent_path() / model).lexically_normal().string();
}

}  // namespace memc
