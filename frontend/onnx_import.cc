#include "frontend/onnx_import.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_set>

#include "frontend/fusion.h"
#include "frontend/lowering.h"
#include "frontend/onnx_graph_prep.h"
#include "frontend/onnx_tensor.h"
#include "frontend/param_audit.h"
#include "support/log.h"

namespace memc {

const LoweringTable& onnx_lowerings() {
  static const LoweringTable* table = [] {
    auto* t = new LoweringTable();
    add_elementwise_lowerings(*t);
    add_shape_lowerings(*t);
    add_nn_lowerings(*t);
    add_pool_lowerings(*t);
    add_rnn_lowerings(*t);
    return t;
  }();
  return *table;
}

std::vector<std::string> supported_onnx_ops() {
  std::vector<std::string> ops;
  for (const auto& [name, fn] : onnx_lowerings()) ops.push_back(name);
  return ops;
}

namespace {

// Names exporters give the constants they synthesize ("onnx::Div_123", "_val_12", "val_3").
bool looks_synthesized(const std::string& name) {
  return name.rfind("onnx::", 0) == 0 || name.rfind("_val_", 0) == 0 || name.rfind("val_", 0) == 0 ||
         name.rfind("_v_", 0) == 0 || name.rfind("/", 0) == 0;
}

// A rank-0 initializer that is a module's own value, by its name: not the exporter's (onnx::,
// val_, an FX op's output such as `add_6` or `scalar_tensor_default`) and holding a letter.
bool module_scalar_name(const std::string& name) {
  return !looks_synthesized(name) && !op_output_name(name) && !creation_op_name(name) &&
         std::any_of(name.begin(), name.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
}

class Importer {
 public:
  Importer(const onnx::ModelProto& model, const std::string& file, const std::string& base_dir,
           const ImportOptions& options)
      : model_(model), file_(file), base_dir_(base_dir), options_(options) {}

  Expected<Module> run();

 private:
  Status read_opset();
  Status check_ops(const std::vector<onnx::NodeProto>& nodes);
  Status add_inputs(ImportContext& ctx);
  Status add_initializers(ImportContext& ctx);
  std::set<std::string> weight_names() const;
  bool training_export(const std::vector<onnx::NodeProto>& nodes) const;
  void find_static_operands(const std::vector<onnx::NodeProto>& nodes);
  void untie_static_aliases(std::vector<onnx::NodeProto>& nodes);
  void untie_merged_weights(std::vector<onnx::NodeProto>& nodes);
  void untie_merged_reads(std::vector<onnx::NodeProto>& nodes);
  void restore_removed_biases(std::vector<onnx::NodeProto>& nodes);
  std::map<std::string, int64_t> find_padding_rows(const std::vector<onnx::NodeProto>& nodes);
  // A float initializer is a trainable weight unless it is a one-element tensor the exporter
  // synthesized, or a rank-0 scalar that is no parameter (CLIP's logit_scale, NFNet's
  // skipinit_gain and a ReZero gate are 0-d parameters): the dynamo export's graph signature
  // says which are, or the exporter folded it from parameters (DiffLlama's lambda_full); without
  // a signature (TorchScript), a scalar under a module's name is taken for one, and said.
  bool is_weight(const onnx::TensorProto& init, DType dtype, int64_t count) const {
    if (!is_float(dtype)) return false;
    if (init.dims_size() > 0) return !(count <= 1 && looks_synthesized(init.name()));
    if (!signature_.empty()) {
      const auto kind = signature_.find(init.name());
      if (kind != signature_.end()) return kind->second == "PARAMETER";
      return folded_from_parameters_.count(init.name()) > 0;
    }
    if (fx_export_) return fx_parameters_.count(placeholder_spelling(init.name())) > 0;  // an older dynamo export: read as a %p_ placeholder
    return pytorch_export_ && module_scalar_name(init.name());
  }
  bool trains(const onnx::TensorProto& init, DType dtype, int64_t count) const {
    return is_weight(init, dtype, count) && !static_operands_.count(init.name()) && !options_.frozen.count(init.name()) &&
           !buffers_.count(init.name());
  }
  // torch.export's graph signature (target → PARAMETER, BUFFER, …), empty without one; and the
  // initializers the exporter folded from parameters.
  std::map<std::string, std::string> signature_;
  std::set<std::string> folded_from_parameters_;
  // A dynamo export (its nodes carry FX metadata) and the parameters its FX nodes read (%p_
  // placeholders, mangled); a file torch wrote (TorchScript's, where neither is there).
  bool fx_export_ = false, pytorch_export_ = false;
  std::set<std::string> fx_parameters_;
  // The module's buffers, as the export's graph signature names them, and the exporter's constants
  // folded from no parameter (frontend/param_audit.h): PyTorch trains neither.
  std::set<std::string> buffers_;
  // Float initializers read only where an op needs a value known at import (Resize's roi and
  // scales) or a constant (BatchNormalization's running statistics): not parameters.
  std::set<std::string> static_operands_;
  // BatchNormalization's running statistics that a train()-mode export updates: buffers.
  std::set<std::string> running_statistics_;
  // Identity outputs of an initializer the step trains, read only where a constant is meant (a
  // running statistic the exporter merged with an equal-valued weight), and such reads at a
  // node's own static input: each is defined as a constant copy of the initializer's value
  // instead (untie_static_aliases). Copy → the initializer and, for a node's own input (not an
  // Identity's output), the node and the input that reads the copy, for `memc export`.
  struct StaticCopy {
    std::string root;
    std::string node;
    int input = -1;
  };
  std::map<std::string, StaticCopy> static_copies_;
  // Parameters an exporter merged by value into one initializer, each trained as its own
  // (untie_merged_weights): parameter → the initializer whose value it starts from, and for
  // `memc export` the uses moved to it (metadata "untied_uses": parameter, initializer, node,
  // input index or -1 for an Identity that named it; the constant copies above are recorded there
  // too, frontend/onnx_weights.h).
  std::map<std::string, std::string> untied_;
  std::vector<std::string> untied_uses_;
  // The copies of a node that untie_merged_reads adds (metadata "untied_copies": copy, original,
  // reader, reader's input).
  std::vector<std::string> untied_copies_;
  // Biases the exporter's optimizer removed for being zero (restore_removed_biases), each trained
  // from zeros as the parameter the node's FX metadata names: parameter → its type. `memc export`
  // gives the node the bias input back ("untied_uses" with no source).
  std::map<std::string, TensorType> restored_;
  // The two untying passes' lines: parameter findings (inspect prints them, compile warns).
  std::vector<std::string> untie_findings_;
  // What memc does as PyTorch does without the file saying so: `memc inspect` lists them, -v prints them.
  std::vector<std::string> quiet_findings_;
  Expected<int64_t> resolve_dim(const std::string& input, DType dtype, int index, const onnx::TensorShapeProto_Dimension& dim);
  Status set_outputs(ImportContext& ctx);
  void warn_tied_initializers(const std::vector<onnx::NodeProto>& nodes);
  Status error(const std::string& msg) const { return Status::BadInput(file_ + ": " + msg); }

  const onnx::ModelProto& model_;
  std::string file_, base_dir_;
  const ImportOptions& options_;
  int64_t opset_ = 0;
  Module module_;
  std::map<std::string, int64_t> resolved_dims_;
  bool skeleton_ = false;
  int64_t fixed_batch_ = -1, fixed_seq_ = -1;  // dims the export fixes (static input dims)
  ParamAudit audit_;
};

Status Importer::read_opset() {
  bool found = false;
  for (const auto& o : model_.opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx") {
      opset_ = o.version();
      found = true;
    }
  }
  if (!found) return error("the model imports no default-domain opset");
  if (opset_ < 1 || opset_ > 100) return error(str_cat("opset ", opset_, " is not a valid ONNX opset"));
  return Status::Ok();
}

Status Importer::check_ops(const std::vector<onnx::NodeProto>& nodes) {
  const auto& table = onnx_lowerings();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    const bool default_domain = n.domain().empty() || n.domain() == "ai.onnx";
    if (default_domain && table.count(n.op_type())) continue;
    const std::string name = n.name().empty() ? str_cat("#", i) : n.name();
    const std::string op = default_domain ? n.op_type() : n.domain() + "::" + n.op_type();
    return error(str_cat("node '", name, "' (", op, ", opset ", opset_, "): unsupported op"));
  }
  return Status::Ok();
}

Expected<int64_t> Importer::resolve_dim(const std::string& input, DType dtype, int index,
                                        const onnx::TensorShapeProto_Dimension& dim) {
  const bool token_like = !is_float(dtype) || input.find("mask") != std::string::npos;
  if (dim.has_dim_value() && dim.dim_value() >= 0) {
    const int64_t fixed = dim.dim_value();
    if (fixed > (int64_t{1} << 40)) return error(str_cat("input '", input, "' dim ", index, " is too large"));
    // A traced export without dynamic axes fixes batch (and sequence length): another value
    // would silently run the traced one, or fail deep inside the graph.
    if (index == 0) {
      fixed_batch_ = fixed;
      if (options_.batch > 0 && options_.batch != fixed) {
        return error(str_cat("the export fixes the batch at ", fixed, " (input '", input, "' dim 0); batch ", options_.batch,
                             " cannot be used: re-export with a dynamic batch dimension"));
      }
    } else if (index == 1 && token_like) {
      fixed_seq_ = fixed;
      if (options_.seq > 0 && options_.seq != fixed) {
        return error(str_cat("the export fixes the sequence length at ", fixed, " (input '", input, "' dim 1); seq ", options_.seq,
                             " cannot be used: re-export with a dynamic sequence dimension"));
      }
    }
    return fixed;
  }
  const std::string param = dim.has_dim_param() ? dim.dim_param() : "";
  if (!param.empty()) {
    if (auto it = options_.dim_values.find(param); it != options_.dim_values.end()) return it->second;
    if (auto it = resolved_dims_.find(param); it != resolved_dims_.end()) return it->second;
  }
  int64_t value = -1;
  if (index == 0) {
    value = options_.batch > 0 ? options_.batch : 1;
  } else if (index == 1 && token_like) {
    if (options_.seq <= 0) {
      return error(str_cat("input '", input, "' dim 1 ('", param.empty() ? "?" : param, "') is dynamic; pass --seq"));
    }
    value = options_.seq;
  } else {
    return error(str_cat("input '", input, "' dim ", index, " ('", param.empty() ? "?" : param,
                         "') is dynamic; pass its value (ImportOptions::dim_values)"));
  }
  if (!param.empty()) resolved_dims_[param] = value;
  return value;
}

Status Importer::add_inputs(ImportContext& ctx) {
  std::unordered_set<std::string> initializers;
  for (const auto& init : model_.graph().initializer()) initializers.insert(init.name());
  for (const auto& in : model_.graph().input()) {
    if (initializers.count(in.name())) continue;
    if (in.name().empty()) return error("a graph input has no name");
    if (!in.type().has_tensor_type()) return error(str_cat("input '", in.name(), "' is not a tensor"));
    const auto& tt = in.type().tensor_type();
    auto dtype = dtype_from_onnx(tt.elem_type());
    if (!dtype.ok()) return error(str_cat("input '", in.name(), "': ", dtype.status().message()));
    if (!tt.has_shape()) return error(str_cat("input '", in.name(), "' has no shape"));
    Shape shape;
    int64_t count = 1;
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      MEMC_ASSIGN_OR_RETURN(int64_t d, resolve_dim(in.name(), *dtype, i, tt.shape().dim(i)));
      if (d > 0 && count > (int64_t{1} << 40) / d) return error(str_cat("input '", in.name(), "' is too large"));
      count *= std::max<int64_t>(d, 1);
      shape.push_back(d);
    }
    if (ctx.lookup(in.name()) != kNoValue) return error(str_cat("input '", in.name(), "' is declared twice"));
    ctx.define(in.name(), module_.add_argument(in.name(), TensorType{*dtype, shape}, Role::kInput));
  }
  return Status::Ok();
}

std::set<std::string> Importer::weight_names() const {
  std::set<std::string> names;
  for (const auto& init : model_.graph().initializer()) {
    auto dtype = dtype_from_onnx(init.data_type());
    auto shape = shape_from_proto(init);
    if (dtype.ok() && shape.ok() && trains(init, *dtype, numel(*shape))) names.insert(init.name());
  }
  return names;
}

Status Importer::add_initializers(ImportContext& ctx) {
  for (const auto& name : options_.frozen) {
    const auto& inits = model_.graph().initializer();
    if (std::none_of(inits.begin(), inits.end(), [&](const auto& i) { return i.name() == name; }) && !untied_.count(name) &&
        !static_copies_.count(name) && !restored_.count(name))
      return error(str_cat("--freeze names '", name, "', which is no initializer of the model"));
  }
  for (const auto& init : model_.graph().initializer()) {
    const std::string what = str_cat("initializer '", init.name(), "'");
    if (init.name().empty()) return error("an initializer has no name");
    auto dtype = dtype_from_onnx(init.data_type());
    if (!dtype.ok()) return error(str_cat(what, ": ", dtype.status().message()));
    auto shape = shape_from_proto(init);
    if (!shape.ok()) return error(str_cat(what, ": ", shape.status().message()));
    if (ctx.lookup(init.name()) != kNoValue) return error(str_cat(what, " is defined twice"));
    const bool no_data = tensor_proto_has_no_data(init);
    if (audit_.same_as.count(init.name()) || audit_.transposed_of.count(init.name())) continue;  // a folded copy another stands for: below
    if (running_statistics_.count(init.name()) && is_float(*dtype)) {
      const ValueId id = module_.add_argument(init.name(), TensorType{*dtype, *shape}, Role::kBuffer);
      ctx.define(init.name(), id);
      if (no_data) skeleton_ = true;
      if (!options_.load_weights || no_data) continue;
      auto t = tensor_from_proto(init, base_dir_);
      if (!t.ok()) return error(str_cat(what, ": ", t.status().message()));
      module_.weights()[id] = std::move(*t);
      continue;
    }
    if (trains(init, *dtype, numel(*shape))) {
      // An exact batch-expanded copy trains as its one row, expanded where the graph reads it.
      auto expanded = audit_.batch_expanded.find(init.name());
      const Shape trained = expanded != audit_.batch_expanded.end() ? expanded->second : *shape;
      ValueId id = module_.add_argument(init.name(), TensorType{*dtype, trained}, Role::kParam);
      if (trained != *shape) {
        Attrs a;
        a.set("shape", *shape);
        auto full = ctx.emit("expand", {id}, std::move(a));
        if (!full.ok()) return error(str_cat(what, ": ", full.status().message()));
        ctx.define(init.name(), *full);
      } else {
        ctx.define(init.name(), id);
      }
      if (no_data) skeleton_ = true;
      if (!options_.load_weights || no_data) continue;
      auto t = tensor_from_proto(init, base_dir_);
      if (!t.ok()) return error(str_cat(what, ": ", t.status().message()));
      module_.weights()[id] = trained != *shape ? first_row(*t) : std::move(*t);
      continue;
    }
    if (no_data) return error(str_cat(what, " has dims but no data and is not a weight (memc needs its value)"));
    auto t = tensor_from_proto(init, base_dir_);
    if (!t.ok()) return error(str_cat(what, ": ", t.status().message()));
    ctx.define(init.name(), ctx.constant(std::move(*t), init.name()));
  }
  // Each tied folded copy reads the tensor trained for the first; `memc export` writes it back
  // under both names (module metadata "tied_copies": copy, first, copy, first, ...).
  std::vector<std::string> tied;
  for (const auto& [copy, first] : audit_.same_as) {
    ctx.define(copy, ctx.lookup(first));
    tied.push_back(copy);
    tied.push_back(first);
  }
  if (!tied.empty()) module_.metadata().set("tied_copies", tied);
  // Each tied folded transpose reads the transpose of the tensor trained for its parameter;
  // `memc export` writes it back so (metadata "tied_transposes": copy, parameter, ...).
  std::vector<std::string> transposed;
  for (const auto& [copy, original] : audit_.transposed_of) {
    auto t = ctx.transpose(ctx.lookup(original), {1, 0});
    if (!t.ok()) return error(str_cat("initializer '", copy, "': ", t.status().message()));
    ctx.define(copy, *t);
    transposed.push_back(copy);
    transposed.push_back(original);
  }
  if (!transposed.empty()) module_.metadata().set("tied_transposes", transposed);
  // Each running statistic untied from a trained initializer (untie_static_aliases) keeps its
  // value as a constant; `memc export` writes it back as its own initializer ("untied_uses").
  for (const auto& [copy, from] : static_copies_) {
    const auto& inits = model_.graph().initializer();
    const auto init = std::find_if(inits.begin(), inits.end(), [&](const auto& i) { return i.name() == from.root; });
    auto t = tensor_from_proto(*init, base_dir_);
    if (!t.ok()) return error(str_cat("initializer '", from.root, "': ", t.status().message()));
    ctx.define(copy, ctx.constant(std::move(*t), copy));
    untied_uses_.insert(untied_uses_.end(), {copy, from.root, from.node, std::to_string(from.input)});
  }
  // A parameter the import makes (untied or restored) trains from `value`; one that --freeze
  // names is a constant of that value instead. The value is read only where it is used.
  const auto define_parameter = [&](const std::string& parameter, const TensorType& type, const auto& value) -> Status {
    if (options_.frozen.count(parameter)) {
      MEMC_ASSIGN_OR_RETURN(Tensor t, value());
      ctx.define(parameter, ctx.constant(std::move(t), parameter));
      return Status::Ok();
    }
    const ValueId id = module_.add_argument(parameter, type, Role::kParam);
    ctx.define(parameter, id);
    if (options_.load_weights) {
      MEMC_ASSIGN_OR_RETURN(module_.weights()[id], value());
    }
    return Status::Ok();
  };
  // Each parameter untied from a merged initializer (untie_merged_weights) starts from the
  // initializer's value; the weights stream under its name from that initializer (and `memc
  // export` writes a frozen one with the model's value).
  for (const auto& [parameter, name] : untied_) {
    const auto& inits = model_.graph().initializer();
    const auto init = std::find_if(inits.begin(), inits.end(), [&](const auto& i) { return i.name() == name; });
    auto dtype = dtype_from_onnx(init->data_type());
    auto shape = shape_from_proto(*init);
    if (!dtype.ok() || !shape.ok()) return error(str_cat("initializer '", name, "' cannot be read"));
    MEMC_RETURN_IF_ERROR(define_parameter(parameter, TensorType{*dtype, *shape}, [&]() -> Expected<Tensor> {
      auto t = tensor_from_proto(*init, base_dir_);
      if (!t.ok()) return error(str_cat("initializer '", name, "': ", t.status().message()));
      return t;
    }));
  }
  // Each bias the exporter removed for being zero (restore_removed_biases) starts from zeros.
  for (const auto& [parameter, type] : restored_) {
    MEMC_RETURN_IF_ERROR(define_parameter(parameter, type, [&]() -> Expected<Tensor> { return Tensor::zeros(type.dtype, type.shape); }));
  }
  if (!untied_uses_.empty()) module_.metadata().set("untied_uses", untied_uses_);
  if (!untied_copies_.empty()) module_.metadata().set("untied_copies", untied_copies_);
  return Status::Ok();
}

Status Importer::set_outputs(ImportContext& ctx) {
  std::vector<ValueId> outputs;
  for (const auto& out : model_.graph().output()) {
    ValueId v = ctx.lookup(out.name());
    if (v == kNoValue) return error(str_cat("graph output '", out.name(), "' is never computed"));
    // Outputs that are arguments or constants get their own node so each output has a producer.
    const Value& value = module_.value(v);
    if (value.producer == kNoNode || value.role == Role::kConstant ||
        std::find(outputs.begin(), outputs.end(), v) != outputs.end()) {
      auto copy = module_.add_node("copy", {v}, {}, "output " + out.name());
      if (!copy.ok()) return error(copy.status().message());
      v = copy->front();
    }
    if (module_.value(v).source_name.empty()) {
      module_.rename(v, out.name());
      module_.value(v).source_name = out.name();
    }
    outputs.push_back(v);
  }
  if (outputs.empty()) return error("the graph has no outputs");
  module_.set_outputs(outputs);
  return Status::Ok();
}

// torch 1.13's EVAL export merges equal-valued initializers and reaches them through
// Identity nodes: one initializer then stands for several parameters.
void Importer::warn_tied_initializers(const std::vector<onnx::NodeProto>& nodes) {
  std::unordered_set<std::string> weights;
  for (const auto& init : model_.graph().initializer()) weights.insert(init.name());
  std::map<std::string, std::vector<std::string>> aliases;
  for (const auto& n : nodes) {
    if (n.op_type() == "Identity" && n.input_size() == 1 && n.output_size() == 1 && weights.count(n.input(0))) {
      aliases[n.input(0)].push_back(n.output(0));
    }
  }
  for (const auto& [init, uses] : aliases) {
    if (uses.empty() || static_operands_.count(init)) continue;  // constants: nothing trains
    std::string list;
    for (const auto& u : uses) list += (list.empty() ? "" : ", ") + u;
    warn(str_cat(file_, ": initializer '", init, "' is tied to ", uses.size() + 1,
                 " parameter uses through Identity nodes (", init, ", ", list,
                 "); training updates them together. Re-export in TRAINING mode or with distinct values"));
  }
}

// The first of n's inputs read only as a constant (Resize's roi and scales, BatchNormalization's
// running statistics, Pad's value, Dropout's ratio, Range's bounds); inputs before it are data.
int first_static_input(const onnx::NodeProto& n) {
  static const std::map<std::string, int> first = {{"Resize", 1}, {"Upsample", 1}, {"BatchNormalization", 3}, {"Pad", 1},
                                                   {"Dropout", 1}, {"Range", 0}, {"OneHot", 1}, {"Trilu", 1}};
  const auto it = first.find(n.op_type());
  return it == first.end() ? n.input_size() : std::min(it->second, n.input_size());
}

void Importer::find_static_operands(const std::vector<onnx::NodeProto>& nodes) {
  std::set<std::string> data;
  for (const auto& n : nodes) {
    const int first_static = first_static_input(n);
    for (int i = 0; i < n.input_size(); ++i) (i < first_static ? data : static_operands_).insert(n.input(i));
  }
  for (const auto& name : data) static_operands_.erase(name);
  for (const auto& n : nodes) {
    if (n.op_type() != "BatchNormalization" || n.input_size() < 5 || !updates_running_statistics(n)) continue;
    running_statistics_.insert(n.input(3));
    running_statistics_.insert(n.input(4));
  }
}

// TorchScript's EVAL export merges equal-valued initializers, reaching the others through Identity
// nodes: in a fresh model, BatchNorms' running means (zeros) and variances (ones) merge with
// biases and weights. PyTorch never trains a running statistic. Where every use of such a group
// is a constant's, its initializer is one (static_operands_); where the initializer is trained,
// each alias read only as a constant is defined as a constant copy of its value (static_copies_)
// and its Identity node goes. Where the initializer itself is read only as a constant but an
// alias is trained, the group still trains as one (the tie warning names it).
void Importer::untie_static_aliases(std::vector<onnx::NodeProto>& nodes) {
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& init : model_.graph().initializer()) inits[init.name()] = &init;
  // The dynamo exporter's optimizer points the uses at one initializer instead: a fresh
  // BatchNorm reads BatchNormalization(x, w, b, b, w). A trained initializer read at a node's
  // static input gets a constant copy there, named as the module's statistic would be.
  // An initializer is read as data by a node, or through an Identity alias that one reads so
  // (TorchScript's merges); an alias alone is no read (one read only as a statistic keeps the
  // whole group constant, below).
  auto is_alias = [&](const onnx::NodeProto& n) {
    return n.op_type() == "Identity" && n.input_size() == 1 && n.output_size() == 1 && inits.count(n.input(0));
  };
  std::map<std::string, std::string> root_of;  // an Identity's output → the initializer it reads
  for (const auto& n : nodes) {
    if (is_alias(n)) root_of[n.output(0)] = n.input(0);
  }
  std::set<std::string> read_as_data, taken;
  auto data_read = [&](const std::string& name) {
    read_as_data.insert(name);
    if (auto alias = root_of.find(name); alias != root_of.end()) read_as_data.insert(alias->second);
  };
  for (const auto& in : model_.graph().input()) taken.insert(in.name());
  for (const auto& n : nodes) {
    taken.insert(n.output().begin(), n.output().end());
    if (is_alias(n)) continue;
    for (int i = 0; i < n.input_size() && i < first_static_input(n); ++i) data_read(n.input(i));
  }
  for (const auto& out : model_.graph().output()) data_read(out.name());
  std::string listed;
  size_t copied = 0;
  for (onnx::NodeProto& n : nodes) {
    if (n.name().empty() || (n.op_type() == "BatchNormalization" && updates_running_statistics(n))) continue;
    for (int i = first_static_input(n); i < n.input_size(); ++i) {
      const std::string root = n.input(i);
      if (!inits.count(root) || !read_as_data.count(root) || tensor_proto_has_no_data(*inits.at(root))) continue;
      const auto dtype = dtype_from_onnx(inits.at(root)->data_type());
      if (!dtype.ok() || !is_float(*dtype)) continue;  // never trained (Range's int64 start, merged with an index)
      const size_t dot = root.rfind('.');
      const std::string slot = n.op_type() == "BatchNormalization" ? (i == 3 ? "running_mean" : "running_var") : str_cat("input_", i);
      std::string copy = dot == std::string::npos ? str_cat(n.name(), ".", slot) : str_cat(root.substr(0, dot), ".", slot);
      if (taken.count(copy) || inits.count(copy) || static_copies_.count(copy)) copy = str_cat(n.name(), ".", slot);
      if (taken.count(copy) || inits.count(copy) || static_copies_.count(copy)) continue;
      static_copies_[copy] = {root, n.name(), i};
      n.set_input(i, copy);
      if (++copied <= 2) listed += str_cat(listed.empty() ? "'" : ", '", root, "' as '", copy, "'");
    }
  }
  if (copied > 0) {
    if (copied > 2) listed += str_cat(" and ", copied - 2, " more");
    untie_findings_.push_back(str_cat(copied, " constant input", copied > 1 ? "s" : "",
                                      " (running statistics) read trained initializers the exporter merged them with by value (",
                                      listed, "): memc reads a constant copy of each there, as PyTorch never trains them"));
  }
  std::map<std::string, std::vector<std::string>> aliases;
  for (const auto& n : nodes) {
    if (is_alias(n)) aliases[n.input(0)].push_back(n.output(0));
  }
  if (aliases.empty()) return;
  std::set<std::string> used, data;  // initializers and aliases read by a node, and read as data
  for (const auto& n : nodes) {
    if (is_alias(n)) continue;
    const int first_static = first_static_input(n);
    for (int i = 0; i < n.input_size(); ++i) {
      if (!inits.count(n.input(i)) && !root_of.count(n.input(i))) continue;
      used.insert(n.input(i));
      if (i < first_static) data.insert(n.input(i));
    }
  }
  for (const auto& out : model_.graph().output()) data.insert(out.name());
  std::set<std::string> removed;
  for (const auto& [root, names] : aliases) {
    std::vector<std::string> constant, trained;
    for (const std::string& name : names) {
      if (used.count(name)) (data.count(name) ? trained : constant).push_back(name);
    }
    if (constant.empty()) continue;
    const bool root_trained = data.count(root) > 0;
    if (trained.empty() && !root_trained) {
      static_operands_.insert(root);  // the whole group is read as constants
      continue;
    }
    if (!root_trained || tensor_proto_has_no_data(*inits.at(root))) continue;
    std::string list;
    for (const std::string& name : constant) {
      static_copies_[name] = {root, "", -1};
      removed.insert(name);
      list += (list.empty() ? "'" : ", '") + name + "'";
    }
    untie_findings_.push_back(str_cat("initializer '", root, "' also stands for ", constant.size(), " running statistic",
                 constant.size() > 1 ? "s" : "", " the exporter merged with it by value (", list,
                 "): memc keeps ", constant.size() > 1 ? "them" : "it", " constant, as PyTorch does"));
  }
  std::erase_if(nodes, [&](const onnx::NodeProto& n) { return is_alias(n) && removed.count(n.output(0)); });
}

// Both of torch's exporters merge equal-valued initializers in eval exports: the dynamo optimizer
// points every use at one, TorchScript's EVAL export reaches the others through Identity nodes.
// In a fresh model every LayerNorm weight (all 1) and zero bias of a size becomes one tensor,
// which PyTorch trains as many. An initializer is untied where (1) its elements are all equal
// (a merge by value: a weight PyTorch really ties, an embedding, holds distinct values), and (2)
// its uses stand for different parameters: an Identity's output is the parameter's name, and a
// dynamo node's FX metadata names the parameter it reads (`<scope>.<attribute>`, the attribute
// being the initializer's own last name part). Each other parameter becomes an initializer of
// its own with the value, its uses read it, and `memc export` writes the graph so.
void Importer::untie_merged_weights(std::vector<onnx::NodeProto>& nodes) {
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& init : model_.graph().initializer()) inits[init.name()] = &init;
  std::set<std::string> names;  // every value the graph names: a parameter's new name must be free
  for (const auto& in : model_.graph().input()) names.insert(in.name());
  for (const auto& n : nodes) names.insert(n.output().begin(), n.output().end());
  const std::set<std::string> module_buffers = exported_buffers(model_);
  struct Use {
    size_t node;
    int input;  // -1: the Identity node whose output names the parameter
  };
  std::set<std::string> fx_read, fx_computed;  // the FX values the nodes read (a folded value keeps its op's name: "cat", "exp_1"), compute
  for (const auto& n : nodes) {
    for (std::string& value : fx_arguments(n)) fx_read.insert(std::move(value));
    if (std::string value = fx_value(n); !value.empty()) fx_computed.insert(std::move(value));
  }
  const std::map<std::string, std::string> components = name_components(model_);  // what placeholders split into
  // The parameter that node n's input j, initializer `name`, stands for.
  const auto parameter_of = [&](const onnx::NodeProto& n, int j, const std::string& name) {
    const size_t dot = name.rfind('.');
    std::vector<std::string> inputs;  // the initializer inputs (a statistic's constant copy was one), j's place among them
    size_t place = 0;
    for (int k = 0; k < n.input_size(); ++k) {
      if (!inits.count(n.input(k)) && !static_copies_.count(n.input(k))) continue;
      if (k < j) ++place;
      inputs.push_back(n.input(k));
    }
    const std::vector<std::string> places = parameters_by_place(n, inputs, &components);
    if (!places.empty() && !places[place].empty()) return places[place];
    // One initializer under the exporter's own name, read where the FX node reads one parameter
    // (gpt-oss's zero expert biases of two layers, merged into `val_N`, each read by a GatherND:
    // `index(%p_..._layers_0_mlp_experts_down_proj_bias, [%view_9])`).
    if (inputs.size() == 1 && looks_synthesized(name)) {
      const std::vector<std::string> read = placeholder_parameters(n, &components);
      if (read.size() == 1 && !read[0].empty()) return read[0];
    }
    std::string read;
    if (dot != std::string::npos) {
      read = parameter_read(n, name.substr(dot + 1), &components);
      if (read.empty()) {
        std::set<std::string> known;  // what the node's other initializers stand for, by their own attribute
        for (int k = 0; k < n.input_size(); ++k) {
          const size_t at = n.input(k).rfind('.');
          if (k == j || !inits.count(n.input(k)) || at == std::string::npos) continue;
          if (std::string other = parameter_read(n, n.input(k).substr(at + 1), &components); !other.empty()) known.insert(other);
        }
        read = single_parameter_read(n, known);
      }
      // A use through a view the exporter folded (timm's Scale reads `self.scale.view(shape)`,
      // merged with an equal LayerNorm weight) is named by the FX value it reads ("view_5").
      if (read.empty()) read = folded_value_read(n, j, fx_computed);
    } else if (op_output_name(name) || fx_read.count(name)) {
      read = folded_value_read(n, j, fx_computed);
    }
    return read.empty() ? name : read;
  };
  std::map<std::string, std::map<std::string, std::vector<Use>>> by_parameter;  // initializer → parameter → uses
  for (size_t i = 0; i < nodes.size(); ++i) {
    const onnx::NodeProto& n = nodes[i];
    for (int j = 0; j < n.input_size(); ++j) {
      auto init = inits.find(n.input(j));
      if (init == inits.end()) continue;
      const std::string& name = init->first;
      if (n.op_type() == "Identity" && n.output_size() == 1) by_parameter[name][n.output(0)].push_back({i, -1});
      else by_parameter[name][parameter_of(n, j, name)].push_back({i, j});
    }
  }
  std::set<size_t> removed;
  for (const auto& [name, parameters] : by_parameter) {
    if (parameters.size() < 2 || static_operands_.count(name) || module_buffers.count(name)) continue;
    const onnx::TensorProto& init = *inits.at(name);
    auto dtype = dtype_from_onnx(init.data_type());
    if (!dtype.ok() || !is_float(*dtype) || tensor_proto_has_no_data(init)) continue;
    auto value = tensor_from_proto(init, base_dir_);
    if (!value.ok() || !all_elements_equal(*value)) continue;
    // One element is equal to itself, no evidence of a merge: only module paths naming every use
    // (StarReLU's scale and bias, merged across blocks) say the uses are parameters of their own.
    const auto module_path = [](const std::string& p) {
      return p.find('.') != std::string::npos && p.rfind("onnx::", 0) != 0 && p.rfind("val_", 0) != 0 && p.rfind("_val_", 0) != 0;
    };
    if (value->numel() < 2 && !std::all_of(parameters.begin(), parameters.end(), [&](const auto& p) { return module_path(p.first); })) continue;
    // The initializer keeps its own name's uses (or the first parameter's, by name).
    const std::string kept = parameters.count(name) ? name : parameters.begin()->first;
    std::string list;
    for (const auto& [parameter, uses] : parameters) {
      if (parameter == kept) continue;
      const bool named_by_identity = uses.size() == 1 && uses[0].input < 0;
      if ((!named_by_identity && names.count(parameter)) || inits.count(parameter)) continue;  // the name is taken
      bool named_nodes = true;
      for (const Use& u : uses) named_nodes = named_nodes && !nodes[u.node].name().empty();
      if (!named_nodes) continue;  // memc export could not find the uses again
      untied_[parameter] = name;
      for (const Use& u : uses) {
        untied_uses_.insert(untied_uses_.end(), {parameter, name, nodes[u.node].name(), std::to_string(u.input)});
        if (u.input < 0) removed.insert(u.node);
        else nodes[u.node].set_input(u.input, parameter);
      }
      names.insert(parameter);
      list += (list.empty() ? "'" : ", '") + parameter + "'";
    }
    if (!list.empty()) {
      untie_findings_.push_back(str_cat("initializer '", name, "' (all elements ", value->get_as_double(0), ") also stood for ", list,
                   ", which the exporter merged with it by value: memc trains each as its own parameter, as PyTorch does"));
    }
  }
  for (size_t i = nodes.size(); i-- > 0;) {
    if (removed.count(i)) nodes.erase(nodes.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

// The dynamo exporter's optimizer also merges equal computations once their initializers are
// merged: HF DeiT's class and distillation tokens (both zeros) become one initializer read by one
// Expand, and the Concat reads that Expand's output twice; timm LeViT's two heads' BatchNorms
// (fresh weights of one, biases of zero) become one BatchNorm read by both heads. The reader's FX
// node still names the value it read (`cat([%expand, %expand_1, %transpose])`), and no node of
// the graph computes it any more, while another read names the value kept: that read was a
// computation of its own, on parameters of its own with equal values. It gets a copy of the node,
// whose trained initializers that hold all-equal values are untied, each named after the one it
// copies and the FX value (`...cls_token@expand_1`: the graph keeps no trace of the PyTorch
// name); a zero bias the exporter removed and memc restored gets its own zeros alike (two zero-
// initialised heads, merged into one Gemm). Only where the reader's FX arguments match its inputs
// one for one, and only where an initializer of all-equal values shows the merge.
void Importer::untie_merged_reads(std::vector<onnx::NodeProto>& nodes) {
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& init : model_.graph().initializer()) inits[init.name()] = &init;
  std::set<std::string> names, fx_defined, fx_read;  // the graph's values and node names; the FX values its nodes compute, read
  std::map<std::string, size_t> producer;
  for (const auto& in : model_.graph().input()) names.insert(in.name());
  for (size_t i = 0; i < nodes.size(); ++i) {
    names.insert(nodes[i].name());
    for (const std::string& out : nodes[i].output()) names.insert(out), producer[out] = i;
    if (std::string fx = fx_value(nodes[i]); !fx.empty()) fx_defined.insert(fx);
    for (std::string& value : fx_arguments(nodes[i])) fx_read.insert(std::move(value));
  }
  const std::set<std::string> module_buffers = exported_buffers(model_);
  static const std::set<std::string> kRandom = {"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"};
  // The initializer a trained input starts from (an input untied before reads its own name).
  const auto root = [&](const std::string& input) { return untied_.count(input) ? untied_.at(input) : input; };
  std::vector<onnx::NodeProto> copies;
  std::string list;
  size_t untied = 0;
  for (onnx::NodeProto& reader : nodes) {
    if (reader.name().empty()) continue;
    // The FX value each input read: the arguments one for one, or, where the exporter decomposed
    // the op (aten.linear → MatMul reading a folded weight, then Add), the computed inputs in the
    // order of the FX arguments that are no placeholders (GPT-NeoX's MLP reads `%layer_norm_1`).
    std::vector<std::string> args = fx_arguments(reader);
    if (args.size() != static_cast<size_t>(reader.input_size())) {
      std::vector<std::string> computed;
      for (const std::string& a : args)
        if (!placeholder_value(a)) computed.push_back(a);
      std::vector<std::string> read(static_cast<size_t>(reader.input_size()));
      size_t next = 0;
      for (int k = 0; k < reader.input_size(); ++k) {
        const std::string& in = reader.input(k);
        const bool parameter = inits.count(in) || untied_.count(in) || restored_.count(in) || static_copies_.count(in);
        if (in.empty() || parameter) continue;  // an absent optional input is neither
        if (next < computed.size()) read[k] = computed[next];
        ++next;
      }
      if (next != computed.size() || computed.empty()) continue;
      args = std::move(read);
    }
    // The exporter may reorder an op's operands (masked_fill(x, mask, v) → Where(mask, v, x)): an
    // input that keeps its FX name where the arguments place it at another, mismatched position
    // shows a permutation, not a merge (DeiT's second read of `%expand` is at a place matched by
    // the first), and the node is left as it is.
    bool permuted = false;
    for (int k = 0; k < reader.input_size() && !permuted; ++k) {
      if (args[k].empty() || args[k] == reader.input(k)) continue;
      for (int j = 0; j < reader.input_size() && !permuted; ++j)
        permuted = j != k && args[j] == reader.input(k) && args[j] != reader.input(j);
    }
    if (permuted) continue;
    for (int k = 0; k < reader.input_size(); ++k) {
      const std::string& want = args[k];
      if (want.empty() || placeholder_value(want)) continue;
      const auto from = producer.find(reader.input(k));
      if (want == reader.input(k) || !fx_read.count(reader.input(k)) || fx_defined.count(want) || names.count(want) || from == producer.end()) continue;
      const onnx::NodeProto& original = nodes[from->second];
      if (kRandom.count(original.op_type()) || !original.domain().empty() || original.output_size() != 1 || original.name().empty()) continue;
      std::vector<std::pair<int, std::string>> untie;  // input → the new parameter
      for (int j = 0; j < original.input_size(); ++j) {
        // A zero bias the exporter removed, restored (restore_removed_biases): the copy's own, from zeros.
        if (restored_.count(original.input(j))) {
          const std::string parameter = original.input(j) + "@" + want;
          if (!options_.frozen.count(original.input(j)) && !names.count(parameter) && !inits.count(parameter) && !restored_.count(parameter))
            untie.emplace_back(j, parameter);
          continue;
        }
        const std::string& source = root(original.input(j));
        const auto init = inits.find(source);
        if (init == inits.end() || static_operands_.count(source) || module_buffers.count(source) || options_.frozen.count(original.input(j)) ||
            tensor_proto_has_no_data(*init->second)) {
          continue;
        }
        auto dtype = dtype_from_onnx(init->second->data_type());
        if (!dtype.ok() || !is_float(*dtype)) continue;
        auto value = tensor_from_proto(*init->second, base_dir_);
        if (!value.ok() || value->numel() < 2 || !all_elements_equal(*value)) continue;
        const std::string parameter = original.input(j) + "@" + want;
        if (names.count(parameter) || inits.count(parameter) || untied_.count(parameter)) continue;
        untie.emplace_back(j, parameter);
      }
      // Only parameters whose elements are all equal are evidence of the merge; a restored bias alone is not.
      if (std::all_of(untie.begin(), untie.end(), [&](const auto& u) { return restored_.count(original.input(u.first)) > 0; })) continue;
      onnx::NodeProto copy = original;
      copy.set_name(want);
      copy.set_output(0, want);
      for (const auto& [j, parameter] : untie) {
        if (auto bias = restored_.find(original.input(j)); bias != restored_.end()) {
          restored_[parameter] = bias->second;
          untied_uses_.insert(untied_uses_.end(), {parameter, "", want, std::to_string(j)});
        } else {
          untied_[parameter] = root(original.input(j));
          untied_uses_.insert(untied_uses_.end(), {parameter, untied_[parameter], want, std::to_string(j)});
        }
        copy.set_input(j, parameter);
        names.insert(parameter);
        list += (list.empty() ? "'" : ", '") + parameter + "'";
        ++untied;
      }
      // The copy reads the same constant copies of running statistics, which `memc export` gives it too.
      for (int j = 0; j < original.input_size(); ++j) {
        if (auto alias = static_copies_.find(original.input(j)); alias != static_copies_.end())
          untied_uses_.insert(untied_uses_.end(), {alias->first, alias->second.root, want, std::to_string(j)});
      }
      untied_copies_.insert(untied_copies_.end(), {want, original.name(), reader.name(), std::to_string(k)});
      reader.set_input(k, want);
      names.insert(want);
      copies.push_back(std::move(copy));
    }
  }
  nodes.insert(nodes.end(), copies.begin(), copies.end());  // topological_sort places them
  if (!list.empty()) {
    untie_findings_.push_back(str_cat("the exporter computed ", copies.size(), copies.size() == 1 ? " value" : " values",
                                      " once for two, after merging their parameters by value; memc computes each and trains ", list,
                                      untied == 1 ? " as a parameter of its own" : " as parameters of their own",
                                      ", as PyTorch does (the model file keeps no trace of ", untied == 1 ? "its PyTorch name)" : "their PyTorch names)"));
  }
}

// The dynamo exporter's optimizer removes a Gemm's, Conv's or ConvTranspose's bias input whose
// elements are all zero (onnxscript's RemoveOptionalBias rules): in a fresh model every Linear and
// convolution bias that HF or timm initialise to 0, and a BatchNorm folded into the layer before
// it with its fresh statistics. PyTorch trains that bias. The node's FX metadata still names it
// (`aten.linear(%x, %p_<scope>_weight, %p_<scope>_bias)`; a folded BatchNorm's own bias for the
// fused form, whose bias gradient it is): the node gets a zero bias input under that name,
// trained as the parameter.
void Importer::restore_removed_biases(std::vector<onnx::NodeProto>& nodes) {
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& init : model_.graph().initializer()) inits[init.name()] = &init;
  std::set<std::string> names;  // the new parameter's name must be free
  for (const auto& in : model_.graph().input()) names.insert(in.name());
  for (const auto& n : nodes) names.insert(n.output().begin(), n.output().end());
  for (onnx::NodeProto& n : nodes) {
    const bool gemm = n.op_type() == "Gemm", conv = n.op_type() == "Conv", transposed = n.op_type() == "ConvTranspose";
    if ((!gemm && !conv && !transposed) || n.input_size() != 2 || n.output_size() != 1 || n.name().empty() || !n.domain().empty()) continue;
    const std::string bias = parameter_read(n, "bias");
    if (bias.empty() || names.count(bias) || inits.count(bias) || restored_.count(bias)) continue;
    auto w = inits.find(n.input(1));
    if (w == inits.end()) continue;
    auto dtype = dtype_from_onnx(w->second->data_type());
    auto shape = shape_from_proto(*w->second);
    if (!dtype.ok() || !is_float(*dtype) || !shape.ok() || shape->size() < 2) continue;
    int64_t transpose_b = 0, group = 1;
    for (const auto& a : n.attribute()) {
      if (a.name() == "transB") transpose_b = a.i();
      if (a.name() == "group") group = a.i();
    }
    if (gemm && shape->size() != 2) continue;
    const int64_t outputs = gemm ? (*shape)[transpose_b ? 0 : 1] : transposed ? (*shape)[1] * group : (*shape)[0];
    restored_[bias] = TensorType{*dtype, {outputs}};
    untied_uses_.insert(untied_uses_.end(), {bias, "", n.name(), "2"});
    names.insert(bias);
    n.add_input(bias);
  }
  if (restored_.empty()) return;
  std::string list;
  int listed = 0;
  for (const auto& [parameter, type] : restored_) {
    if (listed++ < 4) list += str_cat(listed > 1 ? ", '" : "'", parameter, "'");
  }
  if (restored_.size() > 4) list += str_cat(" and ", restored_.size() - 4, " more");
  untie_findings_.push_back(str_cat("the exporter removed ", restored_.size(), restored_.size() == 1 ? " bias" : " biases",
                                    " whose elements were all zero (", list,
                                    "): memc trains each from zeros under its PyTorch name, as PyTorch does"));
}

// nn.Embedding(padding_idx=p) gives row p no gradient from its lookups, and keeps that row at
// zero from its initialisation on (PyTorch's and Hugging Face's init zero it; a step never moves
// it). An ONNX Gather has no padding index, and TorchScript's export keeps no metadata: an
// embedding table (a float initializer of rank 2 that a Gather without FX metadata looks rows
// up in along axis 0) with exactly one row of zeros among rows that are not is taken for one with
// that padding index (a trained or random row is never exactly zero); `memc inspect` and -v say so.
// The dynamo exporter's metadata names the index itself (lower_gather).
std::map<std::string, int64_t> Importer::find_padding_rows(const std::vector<onnx::NodeProto>& nodes) {
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& init : model_.graph().initializer()) inits[init.name()] = &init;
  std::map<std::string, int64_t> rows;
  std::set<std::string> seen, constant_outputs;
  for (const auto& n : nodes)
    if (n.op_type() == "Constant") constant_outputs.insert(n.output().begin(), n.output().end());
  for (const auto& n : nodes) {
    if (n.op_type() != "Gather" || !n.domain().empty() || n.input_size() < 2 || !node_metadata(n, "pkg.torch.onnx.fx_node").empty()) continue;
    int64_t axis = 0;
    for (const auto& a : n.attribute())
      if (a.name() == "axis") axis = a.i();
    const auto init = inits.find(n.input(0));
    // Looked up by indices the step computes or is given (token ids, positions), not constant ones.
    if (inits.count(n.input(1)) || constant_outputs.count(n.input(1))) continue;
    if (axis != 0 || init == inits.end() || !seen.insert(n.input(0)).second || init->second->dims_size() != 2 ||
        init->second->dims(0) < 2 || tensor_proto_has_no_data(*init->second) || static_operands_.count(n.input(0))) {
      continue;
    }
    auto dtype = dtype_from_onnx(init->second->data_type());
    if (!dtype.ok() || !is_float(*dtype)) continue;
    auto table = tensor_from_proto(*init->second, base_dir_);
    if (!table.ok()) continue;
    const int64_t count = table->shape()[0], width = table->shape()[1];
    int64_t zero_row = -1, zero_rows = 0;
    for (int64_t r = 0; r < count && zero_rows < 2; ++r) {
      bool zero = true;
      for (int64_t c = 0; c < width && zero; ++c) zero = table->get_as_double(r * width + c) == 0;
      if (zero) zero_row = r, ++zero_rows;
    }
    if (zero_rows != 1 || width < 1) continue;
    rows[n.input(0)] = zero_row;
    quiet_findings_.push_back(str_cat("embedding '", n.input(0), "' has one row of zeros (row ", zero_row,
                                      "), nn.Embedding's padding row: memc gives it no gradient from the lookup, as PyTorch does "
                                      "(TorchScript's export keeps no padding index)"));
  }
  return rows;
}

bool Importer::training_export(const std::vector<onnx::NodeProto>& nodes) const {
  if (model_.producer_name() == "pytorch") return true;
  std::map<std::string, const onnx::TensorProto*> known;
  for (const auto& init : model_.graph().initializer()) known[init.name()] = &init;
  for (const auto& n : nodes)
    if (n.op_type() == "Constant" && n.output_size() == 1)
      for (const auto& a : n.attribute())
        if (a.name() == "value" && a.has_t()) known[n.output(0)] = &a.t();
  for (const auto& n : nodes) {
    if (n.op_type() != "Dropout" || n.input_size() < 3 || !known.count(n.input(2))) continue;
    auto mode = tensor_from_proto(*known.at(n.input(2)), base_dir_);
    if (mode.ok() && mode->numel() == 1 && mode->get_as_int(0) != 0) return true;
  }
  return false;
}

Expected<Module> Importer::run() {
  MEMC_RETURN_IF_ERROR(read_opset());
  if (!model_.has_graph()) return error("the model has no graph");
  std::vector<onnx::NodeProto> nodes(model_.graph().node().begin(), model_.graph().node().end());
  MEMC_RETURN_IF_ERROR(inline_functions(model_, nodes, file_));
  rewrite_random_masks(nodes);
  MEMC_RETURN_IF_ERROR(check_ops(nodes));
  ImportContext ctx(module_, options_, file_, opset_);
  ctx.set_training_export(training_export(nodes));
  ctx.set_pytorch_export(model_.producer_name() == "pytorch");
  find_static_operands(nodes);
  untie_static_aliases(nodes);
  untie_merged_weights(nodes);
  restore_removed_biases(nodes);
  untie_merged_reads(nodes);  // after the biases: the reader's inputs and FX arguments match one for one
  ctx.set_padding_rows(find_padding_rows(nodes));
  MEMC_RETURN_IF_ERROR(add_inputs(ctx));
  buffers_ = exported_buffers(model_);
  const std::map<std::string, FoldedSources> folded = folded_sources(model_, nodes);
  for (const auto& [name, from] : folded_constants(folded)) buffers_.insert(name);
  signature_ = signature_kinds(model_);
  pytorch_export_ = model_.producer_name() == "pytorch";
  fx_export_ = std::any_of(nodes.begin(), nodes.end(), [](const onnx::NodeProto& n) { return !node_metadata(n, "pkg.torch.onnx.fx_node").empty(); });
  fx_parameters_ = fx_names(nodes).parameters;
  for (const auto& [name, from] : folded)
    if (!from.parameters.empty()) folded_from_parameters_.insert(name);
  if (signature_.empty() && !fx_export_) {
    for (const auto& init : model_.graph().initializer()) {
      const auto dtype = dtype_from_onnx(init.data_type());
      if (init.dims_size() != 0 || !dtype.ok() || !trains(init, *dtype, 1)) continue;
      quiet_findings_.push_back(str_cat("initializer '", init.name(), "' is a scalar under a module's name: memc trains it as a parameter "
                                        "(the export does not say whether it is one or a buffer: --freeze it if a buffer)"));
    }
  }
  audit_ = audit_parameters(model_, nodes, folded, weight_names(), running_statistics_, fixed_batch_, base_dir_, file_, options_.param_findings == nullptr);
  for (const std::string& line : untie_findings_) {
    if (options_.param_findings == nullptr) warn_finding_once(file_ + ": " + line);
    audit_.findings.push_back(line);
  }
  for (const std::string& line : quiet_findings_) {
    if (options_.param_findings == nullptr) log(1, file_ + ": " + line);
    audit_.findings.push_back(line);
  }
  MEMC_RETURN_IF_ERROR(add_initializers(ctx));
  std::vector<std::string> defined;
  for (const auto& in : model_.graph().input()) defined.push_back(in.name());
  for (const auto& init : model_.graph().initializer()) defined.push_back(init.name());
  for (const auto& [copy, from] : static_copies_) defined.push_back(copy);
  for (const auto& [parameter, init] : untied_) defined.push_back(parameter);
  for (const auto& [parameter, type] : restored_) defined.push_back(parameter);
  MEMC_RETURN_IF_ERROR(topological_sort(nodes, defined, file_, opset_));
  warn_tied_initializers(nodes);

  const auto& table = onnx_lowerings();
  for (size_t i = 0; i < nodes.size(); ++i) {
    ctx.begin_node(&nodes[i], static_cast<int>(i));
    MEMC_RETURN_IF_ERROR(table.at(nodes[i].op_type())(ctx));
  }
  MEMC_RETURN_IF_ERROR(set_outputs(ctx));
  for (const auto& [buffer, next] : ctx.updates()) module_.add_update(buffer, next);
  module_.eliminate_dead_nodes();
  module_.compact();
  if (options_.fuse) run_fusions(module_, options_.fuse_attention);
  // Fusion replaces the values that produce outputs: the graph's output names go on last.
  for (int i = 0; i < model_.graph().output_size() && i < static_cast<int>(module_.outputs().size()); ++i) {
    const ValueId v = module_.outputs()[i];
    const std::string& name = model_.graph().output(i).name();
    if (module_.value(v).source_name != name) {
      module_.rename(v, name);
      module_.value(v).source_name = name;
    }
  }

  Attrs& meta = module_.metadata();
  meta.set("opset", opset_);
  meta.set("producer", str_cat(model_.producer_name(), model_.producer_version().empty() ? "" : " ", model_.producer_version()));
  meta.set("source_file", file_);
  if (skeleton_) meta.set("skeleton", int64_t{1});
  if (fixed_batch_ > 0) meta.set("fixed_batch", fixed_batch_);
  if (fixed_seq_ > 0) meta.set("fixed_seq", fixed_seq_);
  if (options_.param_findings) *options_.param_findings = audit_.findings;
  return std::move(module_);
}

}  // namespace

Expected<Module> import_onnx_bytes(std::string_view bytes, const std::string& base_dir, const ImportOptions& options,
                                   const std::string& display_name) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return Status::BadInput(display_name + ": larger than 2 GB (use external data)");
  }
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Status::BadInput(display_name + ": not a valid ONNX model (protobuf parse failed)");
  }
  if (!model.has_graph()) return Status::BadInput(display_name + ": not a valid ONNX model (no graph)");
  return Importer(model, display_name, base_dir, options).run();
}

Expected<Module> import_onnx(const std::string& path, const ImportOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::BadInput(path + ": no such file");
  if (fs::is_directory(path, ec)) return Status::BadInput(path + ": is a directory, not an ONNX file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::BadInput(path + ": cannot open");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  const std::string base_dir = fs::path(path).parent_path().string();
  return import_onnx_bytes(bytes, base_dir, options, path);
}

}  // namespace memc
