// `memc infer MODEL.onnx --input IN.npz -o OUT.npz`: one forward pass on the CPU executor.
// Inputs are matched to graph inputs by name (a single-input model also takes `x`); every
// array is checked against the model's dtype and shape before anything runs.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "frontend/onnx_import.h"
#include "ir/printer.h"
#include "runtime/dataset.h"
#include "runtime/executor.h"
#include "runtime/file_guard.h"
#include "runtime/npz.h"
#include "support/log.h"
#include "tools/commands.h"

namespace memc::cli {
namespace {

// Arrays in a reference file that are not model inputs.
bool is_reference_key(const std::string& key) {
  return key == "y" || key == "labels" || key == "logits" || key == "loss" || key.find('/') != std::string::npos;
}

std::string type_text(DType dtype, const Shape& shape) {
  return std::string(dtype_name(dtype)) + "[" + shape_str(shape) + "]";
}

// Batch (first dim) and sequence length (second dim of rank-2 arrays: tokens, masks) from the
// input arrays, unless given on the command line.
void default_dims(const TensorMap& arrays, ImportOptions& options) {
  for (const auto& [key, t] : arrays) {
    if (is_reference_key(key) || t.rank() == 0) continue;
    if (options.batch < 0) options.batch = t.shape()[0];
    if (options.seq < 0 && t.rank() == 2) options.seq = t.shape()[1];
  }
}

std::string key_list(const TensorMap& arrays) {
  std::string keys;
  for (const auto& [key, t] : arrays) keys += (keys.empty() ? "" : ", ") + key;
  return keys.empty() ? "none" : keys;
}

// Feeds keyed by the argument's source name, checked against its type.
Expected<std::map<std::string, Tensor>> match_inputs(const Module& module, const TensorMap& arrays,
                                                     const std::string& input_path) {
  std::vector<const Value*> inputs;
  for (ValueId id : module.arguments())
    if (module.value(id).role == Role::kInput) inputs.push_back(&module.value(id));
  std::map<std::string, Tensor> feeds;
  for (const Value* v : inputs) {
    const std::string name = v->source_name.empty() ? v->name : v->source_name;
    auto it = arrays.find(name);
    if (it == arrays.end() && inputs.size() == 1) it = arrays.find("x");
    if (it == arrays.end())
      return Status::BadInput(str_cat(input_path, ": no array for model input '", name, "' (",
                                      type_text(v->type.dtype, v->type.shape), "); the file has: ", key_list(arrays)));
    const Tensor& t = it->second;
    if (t.dtype() != v->type.dtype || t.shape() != v->type.shape)
      return Status::BadInput(str_cat(input_path, ": array '", it->first, "' for input '", name, "': expected ",
                                      type_text(v->type.dtype, v->type.shape), ", got ",
                                      type_text(t.dtype(), t.shape())));
    feeds[name] = t;
  }
  return feeds;
}

// Skeleton models import with shapes only: their params have no entry in weights().
Status check_has_weights(const Module& module, const std::string& model_path) {
  int64_t missing = 0;
  std::string first;
  for (ValueId id : module.arguments()) {
    if (!is_model_state(module.value(id).role) || module.weights().count(id)) continue;
    if (missing++ == 0) first = module.value(id).source_name;
  }
  if (missing == 0) return Status::Ok();
  return Status::BadInput(str_cat("model has no weight data (skeleton): ", model_path, ": ", missing,
                                  " initializers without values, e.g. '", first, "'"));
}

// "sample 0: class 3 (7.21)" per row of a float output of rank ≥ 1.
void print_argmax(const std::string& name, const Tensor& t, const TensorMap& arrays) {
  if (!is_float(t.dtype()) || t.rank() == 0 || t.numel() == 0) return;
  const int64_t classes = t.shape().back();
  const int64_t rows = t.numel() / classes;
  const Tensor* labels = nullptr;
  for (const char* key : {"labels", "y"}) {
    auto it = arrays.find(key);
    if (it != arrays.end() && it->second.numel() == rows && is_integer(it->second.dtype())) labels = &it->second;
  }
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (t.get_as_double(r * classes + c) > t.get_as_double(r * classes + best)) best = c;
    std::printf("%s[%lld]: class %lld (%.4g)", name.c_str(), static_cast<long long>(r), static_cast<long long>(best),
                t.get_as_double(r * classes + best));
    if (labels) {
      const int64_t label = labels->get_as_int(r);
      correct += label == best;
      std::printf("  label %lld", static_cast<long long>(label));
    }
    std::printf("\n");
  }
  if (labels) std::printf("%s: %lld/%lld match the labels\n", name.c_str(), static_cast<long long>(correct),
                          static_cast<long long>(rows));
}

// A model can compute NaN or inf for some inputs (an exporter's graph that lost an epsilon, a
// log of a negative): the outputs are written as computed, and a line says where.
void warn_non_finite(const TensorMap& results) {
  for (const auto& [name, t] : results) {
    if (!is_float(t.dtype())) continue;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (std::isfinite(t.get_as_double(i))) continue;
      if (bad++ == 0) first = i;
    }
    if (bad == 0) continue;
    const int64_t row = t.rank() > 1 ? first / (t.numel() / t.shape()[0]) : first;
    warn(str_cat("output '", name, "' holds ", bad, " NaN or infinite value", bad > 1 ? "s" : "", " of ", t.numel(),
                 " (the first in row ", row, "): the model computed them for these inputs"));
  }
}

Status infer(const InferArgs& args) {
  // Fail on the output path before the (possibly long) import and run.
  std::vector<std::string> inputs = model_files(args.model);
  inputs.push_back(args.input);
  MEMC_RETURN_IF_ERROR(check_outputs(inputs, {{"-o", args.output}}, args.force));
  MEMC_ASSIGN_OR_RETURN(TensorMap arrays, read_npz(args.input));
  for (const auto& [name, t] : arrays) MEMC_RETURN_IF_ERROR(check_finite(args.input, name, t));
  ImportOptions options;
  options.batch = args.batch;
  options.seq = args.seq;
  options.load_weights = true;
  options.running_statistics = true;  // a BatchNorm exported in train() infers as in eval()
  default_dims(arrays, options);
  log(1, str_cat("importing ", args.model, " at batch ", options.batch));

  MEMC_ASSIGN_OR_RETURN(Module module_value, import_onnx(args.model, options));
  const Module* module = &module_value;
  log(3, print_module(*module));
  MEMC_RETURN_IF_ERROR(check_has_weights(*module, args.model));
  MEMC_ASSIGN_OR_RETURN(auto feeds, match_inputs(*module, arrays, args.input));

  const auto start = std::chrono::steady_clock::now();
  auto outputs = execute(*module, feeds);
  const double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!outputs.ok()) return outputs.status().with_context(args.model + ": ");

  TensorMap results;
  std::string summary;
  for (size_t i = 0; i < module->outputs().size() && i < outputs->size(); ++i) {
    const Value& v = module->value(module->outputs()[i]);
    std::string name = v.source_name.empty() ? v.name : v.source_name;
    if (results.count(name)) name = v.name;  // two outputs from one ONNX name: keep both
    const Tensor& t = (*outputs)[i];
    summary += (summary.empty() ? "" : ", ") + name + " " + type_text(t.dtype(), t.shape());
    results[name] = t;
  }
  MEMC_RETURN_IF_ERROR(write_npz(args.output, results));
  warn_non_finite(results);
  std::printf("memc infer: %s -> %s: %s in %.1f ms\n", args.model.c_str(), args.output.c_str(), summary.c_str(),
              run_ms);
  if (args.print)
    for (const auto& [name, t] : results) print_argmax(name, t, arrays);
  return Status::Ok();
}

}  // namespace

int run_infer(const InferArgs& args) { return report(infer(args)); }

}  // namespace memc::cli
