// `memc inspect MODEL.onnx`: what a model is, imported without weight data so that skeletons
// and huge models answer in seconds.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "frontend/onnx_import.h"
#include "frontend/onnx_tensor.h"
#include "ir/op_registry.h"
#include "ir/printer.h"
#include "support/log.h"
#include "tools/commands.h"

namespace memc::cli {
namespace {

// Facts read from the ONNX file itself (the IR does not keep them).
struct SourceFacts {
  std::map<std::string, int64_t> op_histogram;  // ONNX op types of the main graph
  int64_t nodes = 0;
  int64_t opset = -1;
  std::string producer;
  bool skeleton = false;  // some initializer has dims but no data
};

// Reading the proto a second time is cheap for what inspect is used on (skeletons, small
// models); beyond this size it is skipped rather than double the wait.
constexpr uintmax_t kMaxSourceBytes = uintmax_t{1} << 30;

std::optional<SourceFacts> read_source_facts(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxSourceBytes) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes.str())) return std::nullopt;
  SourceFacts facts;
  for (const auto& node : model.graph().node()) {
    ++facts.op_histogram[node.domain().empty() || node.domain() == "ai.onnx" ? node.op_type()
                                                                              : node.domain() + "." + node.op_type()];
    ++facts.nodes;
  }
  for (const auto& opset : model.opset_import())
    if (opset.domain().empty() || opset.domain() == "ai.onnx") facts.opset = opset.version();
  facts.producer = model.producer_name();
  if (!model.producer_version().empty()) facts.producer += " " + model.producer_version();
  for (const auto& init : model.graph().initializer()) facts.skeleton |= tensor_proto_has_no_data(init);
  return facts;
}

struct IrFacts {
  std::map<std::string, int64_t> op_histogram;
  int64_t nodes = 0;
  int64_t param_count = 0;
  int64_t param_bytes = 0;
  int64_t param_tensors = 0;
  int64_t forward_flops = 0;
};

IrFacts ir_facts(const Module& module) {
  IrFacts facts;
  for (NodeId id : module.schedule()) {
    const Node& node = module.node(id);
    ++facts.op_histogram[node.op];
    ++facts.nodes;
    facts.forward_flops += node_flops(module, node);
  }
  for (ValueId id : module.arguments()) {
    const Value& v = module.value(id);
    if (v.role != Role::kParam) continue;
    facts.param_count += v.type.numel();
    facts.param_bytes += v.type.bytes();
    ++facts.param_tensors;
  }
  return facts;
}

// The model's own outputs, without the buffers' updates.
std::vector<ValueId> model_outputs(const Module& module) {
  std::vector<ValueId> outputs;
  for (size_t i = 0; i < module.outputs().size(); ++i) {
    if (i >= module.output_updates().size() || module.output_updates()[i] == kNoValue) outputs.push_back(module.outputs()[i]);
  }
  return outputs;
}

std::string display_name(const Value& v) { return v.source_name.empty() ? v.name : v.source_name; }

nlohmann::json value_json(const Value& v) {
  return {{"name", display_name(v)}, {"dtype", std::string(dtype_name(v.type.dtype))}, {"shape", v.type.shape}};
}

// Most frequent first: "matmul 24, add 12, ...".
std::string histogram_line(const std::map<std::string, int64_t>& histogram) {
  std::vector<std::pair<std::string, int64_t>> items(histogram.begin(), histogram.end());
  std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.second > b.second; });
  std::string line;
  for (const auto& [op, n] : items) line += (line.empty() ? "" : ", ") + op + " " + std::to_string(n);
  return line;
}

std::string value_line(const Value& v) {
  return display_name(v) + "  " + std::string(dtype_name(v.type.dtype)) + "[" + shape_str(v.type.shape) + "]";
}

void print_text(const std::string& path, const Module& module, const IrFacts& ir,
                const std::optional<SourceFacts>& src, int64_t opset) {
  std::printf("model      %s\n", path.c_str());
  if (src && !src->producer.empty()) std::printf("producer   %s\n", src->producer.c_str());
  if (opset >= 0) std::printf("opset      %lld\n", static_cast<long long>(opset));
  for (ValueId id : module.arguments())
    if (module.value(id).role == Role::kInput) std::printf("input      %s\n", value_line(module.value(id)).c_str());
  for (ValueId id : model_outputs(module)) std::printf("output     %s\n", value_line(module.value(id)).c_str());
  std::printf("params     %s (%s) in %lld tensors%s\n", with_commas(ir.param_count).c_str(),
              human_bytes(ir.param_bytes).c_str(), static_cast<long long>(ir.param_tensors),
              src && src->skeleton ? ", skeleton (no weight data)" : "");
  std::printf("nodes      %lld%s\n", static_cast<long long>(ir.nodes),
              src ? (" (ONNX: " + std::to_string(src->nodes) + ")").c_str() : "");
  std::printf("forward    %s (%s FLOP)\n", human_flops(ir.forward_flops).c_str(), with_commas(ir.forward_flops).c_str());
  std::printf("ops        %s\n", histogram_line(ir.op_histogram).c_str());
  if (src) std::printf("onnx ops   %s\n", histogram_line(src->op_histogram).c_str());
}

// Initializers of `role`: trained as parameters, or updated each step as buffers (a BatchNorm's
// running statistics in train()); the rest of the graph's initializers are constants.
std::vector<std::string> initializer_names(const Module& module, Role role = Role::kParam) {
  std::vector<std::string> names;
  for (ValueId id : module.arguments())
    if (module.value(id).role == role) names.push_back(display_name(module.value(id)));
  return names;
}

// Which initializers memc trains, what the export fixes, and what the exporter did to the
// parameters (the same lines are warnings on stderr).
void print_parameters(const Module& module, const std::vector<std::string>& findings) {
  const auto names = initializer_names(module);
  std::string list;
  for (size_t i = 0; i < names.size() && i < 6; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 6) list += str_cat(", … (", names.size() - 6, " more; --json lists all)");
  std::printf("trainable  %zu initializers: %s\n", names.size(), list.c_str());
  if (const auto buffers = initializer_names(module, Role::kBuffer); !buffers.empty()) {
    std::printf("buffers    %zu initializers updated each step, not trained: the running statistics of BatchNorms in train()\n", buffers.size());
  }
  const int64_t batch = module.metadata().get_int("fixed_batch", -1), seq = module.metadata().get_int("fixed_seq", -1);
  if (batch > 0 || seq > 0) {
    std::string dims = batch > 0 ? str_cat("batch ", batch) : "";
    if (seq > 0) dims += (dims.empty() ? "" : ", ") + str_cat("seq ", seq);
    std::printf("fixed      by the export: %s (other values are refused)\n", dims.c_str());
  }
  for (const auto& f : findings) std::printf("note       %s\n", f.c_str());
}

}  // namespace

int run_inspect(const InspectArgs& args) {
  const std::string ext = std::filesystem::path(args.model).extension().string();
  if (ext != ".onnx") {
    if (!std::filesystem::exists(args.model)) return report(Status::BadInput(args.model + ": no such file"));
    // Not .onnx: a plan from memc compile, or neither.
    std::ifstream probe(args.model, std::ios::binary);
    const int first = probe.get();
    if (first != '{') return report(Status::BadInput(args.model + ": is not an ONNX model (.onnx) or a memc plan"));
    return run_inspect_plan(args.model, args.json, args.print_ir, args.timeline, args.force);
  }
  if (!args.timeline.empty()) return report(Status::BadInput("--timeline needs a plan from memc compile, not an ONNX model"));
  ImportOptions options;
  options.batch = args.batch;
  options.seq = args.seq;
  options.load_weights = false;
  std::vector<std::string> findings;
  options.param_findings = &findings;
  auto module = import_onnx(args.model, options);
  if (!module.ok()) return report(module.status());
  log(3, print_module(*module));

  const IrFacts ir = ir_facts(*module);
  const std::optional<SourceFacts> src = read_source_facts(args.model);
  const int64_t opset = src ? src->opset : module->metadata().get_int("opset", -1);

  if (args.json) {
    nlohmann::json j;
    j["model"] = args.model;
    j["inputs"] = nlohmann::json::array();
    for (ValueId id : module->arguments())
      if (module->value(id).role == Role::kInput) j["inputs"].push_back(value_json(module->value(id)));
    j["outputs"] = nlohmann::json::array();
    for (ValueId id : model_outputs(*module)) j["outputs"].push_back(value_json(module->value(id)));
    j["op_histogram"] = ir.op_histogram;
    if (src) j["onnx_op_histogram"] = src->op_histogram;
    j["param_count"] = ir.param_count;
    j["param_bytes"] = ir.param_bytes;
    j["param_tensors"] = ir.param_tensors;
    j["trainable_params"] = initializer_names(*module);
    j["buffers"] = initializer_names(*module, Role::kBuffer);
    j["param_findings"] = findings;
    j["fixed_batch"] = module->metadata().get_int("fixed_batch", -1);
    j["fixed_seq"] = module->metadata().get_int("fixed_seq", -1);
    j["nodes"] = ir.nodes;
    if (src) j["onnx_nodes"] = src->nodes;
    j["forward_flops"] = ir.forward_flops;
    j["opset"] = opset;
    j["producer"] = src ? src->producer : "";
    j["skeleton"] = src && src->skeleton;
    if (args.print_ir) j["ir"] = print_module(*module);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  print_text(args.model, *module, ir, src, opset);
  print_parameters(*module, findings);
  if (args.print_ir) std::printf("\n%s", print_module(*module).c_str());
  return 0;
}

}  // namespace memc::cli
