#include "frontend/param_audit.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>

#include "frontend/onnx_tensor.h"
#include "google/protobuf/unknown_field_set.h"
#include "support/log.h"

namespace memc {
namespace {

// Ops that read a tensor's shape, not its values: not "uses" of a weight.
bool reads_shape_only(const std::string& op) { return op == "Shape" || op == "Size"; }

// Ops through which a batch-expanded copy meets per-sample activations.
bool is_batch_wise(const onnx::NodeProto& n) {
  if (n.op_type() == "Concat") {
    for (const auto& a : n.attribute())
      if (a.name() == "axis") return a.i() != 0;
    return false;
  }
  static const std::set<std::string> elementwise = {"Add", "Sub", "Mul", "Div", "Where"};
  return elementwise.count(n.op_type()) > 0;
}

// Exporter-made names ("val_12", "_val_3", "onnx::MatMul_494"): a weight under such a name was
// computed from a parameter at export (a folded transpose), not saved as the parameter.
bool synthesized_name(const std::string& name) {
  return name.rfind("val_", 0) == 0 || name.rfind("_val_", 0) == 0 || name.rfind("onnx::", 0) == 0;
}

// An op-output name ("embedding_1": the dynamo exporter names folded values after the aten op
// that made them), never a module path ("encoder.ln.weight") or a plain attribute ("class_token").
bool op_output_name(const std::string& name) {
  const size_t underscore = name.rfind('_');
  if (underscore == std::string::npos || underscore + 1 == name.size() || name.find('.') != std::string::npos) return false;
  return std::all_of(name.begin() + underscore + 1, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// NodeProto.metadata_props (field 9, ONNX ≥ 1.16) is newer than Debian's onnx.proto: protobuf
// keeps it as an unknown field, each entry a serialized StringStringEntryProto.
std::string metadata(const onnx::NodeProto& n, const std::string& key) {
  constexpr int kMetadataProps = 9;
  const google::protobuf::UnknownFieldSet& fields = n.GetReflection()->GetUnknownFields(n);
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() != kMetadataProps || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    onnx::StringStringEntryProto entry;
    if (entry.ParseFromString(f.length_delimited()) && entry.key() == key) return entry.value();
  }
  return "";
}

// The parameter a Linear's folded weight came from: the FX node reads it as "%p_<module path
// with _>_<attribute>"; the innermost module scope (name_scopes) whose path prefixes such a
// token gives the dotted name ("...q_lin" + "weight"). "" when the metadata does not say.
std::string parameter_behind(const onnx::NodeProto& n) {
  const std::string scopes = metadata(n, "pkg.torch.onnx.name_scopes"), fx = metadata(n, "pkg.torch.onnx.fx_node");
  std::vector<std::string> paths;  // "['', 'inner', 'inner.distilbert', …, 'linear']"
  for (size_t open = scopes.find('\''); open != std::string::npos; open = scopes.find('\'', open + 1)) {
    const size_t close = scopes.find('\'', open + 1);
    if (close == std::string::npos) break;
    paths.push_back(scopes.substr(open + 1, close - open - 1));
    open = close;
  }
  auto is_ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (auto it = paths.rbegin(); it != paths.rend(); ++it) {
    if (it->empty()) continue;
    std::string prefix = "%p_" + *it + "_";
    std::replace(prefix.begin(), prefix.end(), '.', '_');
    const size_t at = fx.find(prefix);
    if (at == std::string::npos) continue;
    size_t end = at + prefix.size();
    while (end < fx.size() && is_ident(fx[end])) ++end;
    const std::string attribute = fx.substr(at + prefix.size(), end - at - prefix.size());
    if (!attribute.empty()) return *it + "." + attribute;
  }
  return "";
}

bool all_rows_equal(const Tensor& t) {
  if (t.rank() < 1 || t.shape()[0] < 2) return false;
  const size_t row = t.nbytes() / static_cast<size_t>(t.shape()[0]);
  const char* data = static_cast<const char*>(t.raw());
  for (int64_t r = 1; r < t.shape()[0]; ++r)
    if (std::memcmp(data, data + r * row, row) != 0) return false;
  return true;
}

std::string node_label(const onnx::NodeProto& n) { return n.name().empty() ? n.op_type() : n.name(); }

// Each finding is printed once per process: compile imports the same model several times.
void warn_once(const std::string& line) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(line).second) warn(line);
}

}  // namespace

Tensor first_row(const Tensor& t) {
  Shape shape = t.shape();
  shape[0] = 1;
  Tensor row = Tensor::zeros(t.dtype(), shape);
  if (row.nbytes()) std::memcpy(row.raw(), t.raw(), row.nbytes());
  return row;
}

ParamAudit audit_parameters(const onnx::ModelProto& model, const std::vector<onnx::NodeProto>& nodes,
                            const std::set<std::string>& weights, int64_t fixed_batch, const std::string& base_dir,
                            const std::string& file, bool print_warnings) {
  std::map<std::string, std::vector<const onnx::NodeProto*>> uses;
  for (const auto& n : nodes) {
    if (reads_shape_only(n.op_type())) continue;
    std::set<std::string> seen;  // a node reading a weight twice is one use
    for (const auto& in : n.input())
      if (weights.count(in) && seen.insert(in).second) uses[in].push_back(&n);
  }
  ParamAudit audit;
  auto report = [&](const std::string& line) {
    audit.findings.push_back(line);
    if (print_warnings) warn_once(file + ": " + line);
  };
  for (const auto& init : model.graph().initializer()) {
    const std::string& name = init.name();
    if (!weights.count(name)) continue;
    const auto& users = uses[name];
    Shape dims(init.dims().begin(), init.dims().end());
    // Ties through Identity nodes (torch 1.13's EVAL export) have their own warning in the importer.
    const bool through_identity = std::any_of(users.begin(), users.end(), [](const auto* n) { return n->op_type() == "Identity"; });
    if (users.size() >= 2 && !through_identity) {
      std::string list;
      for (size_t i = 0; i < users.size() && i < 4; ++i) list += (i ? ", " : "") + node_label(*users[i]);
      if (users.size() > 4) list += ", …";
      report(str_cat("initializer '", name, "' is shared by ", users.size(), " layers (", list,
                     "): memc trains it as one tensor; if the exporter merged equal-valued weights, re-export with distinct values"));
    }
    const bool batch_wise = std::any_of(users.begin(), users.end(), [](const auto* n) { return is_batch_wise(*n); });
    if (fixed_batch > 1 && dims.size() >= 2 && dims[0] == fixed_batch && batch_wise) {
      Shape row = dims;
      row[0] = 1;
      bool equal = false;
      if (!tensor_proto_has_no_data(init) && numel(dims) <= (int64_t{1} << 24)) {
        auto value = tensor_from_proto(init, base_dir);
        equal = value.ok() && all_rows_equal(*value);
      }
      if (equal) {
        audit.batch_expanded[name] = row;
        report(str_cat("initializer '", name, "' [", shape_str(dims), "] is a batch-expanded copy (", dims[0],
                       " equal rows, the export's batch): memc trains it as one [", shape_str(row), "] parameter"));
      } else {
        report(str_cat("initializer '", name, "' [", shape_str(dims), "] has the export's batch ", fixed_batch,
                       " as leading dim and meets the batch in ", node_label(*users.front()),
                       ": if it is a batch-expanded copy of a parameter, memc trains each row separately"));
      }
    }
    const bool matmul_weight = std::any_of(users.begin(), users.end(), [](const auto* n) {
      return n->op_type() == "MatMul" || n->op_type() == "Gemm";
    });
    if (dims.size() == 2 && synthesized_name(name) && matmul_weight) {
      std::string from;
      for (const auto* n : users)
        if (from.empty()) from = parameter_behind(*n);
      if (!from.empty()) {
        audit.folded_from[name] = from;
        report(str_cat("initializer '", name, "' [", shape_str(dims), "] is the exporter's folded transpose of parameter '", from,
                       "': memc trains it as '", name, "' in this layout (its gradient is that parameter's, transposed)"));
      } else {
        report(str_cat("initializer '", name, "' [", shape_str(dims),
                       "] is a weight the exporter computed (a folded transpose; the parameter's name is lost): memc trains it in this layout"));
      }
    } else if (!audit.batch_expanded.count(name) && (synthesized_name(name) || op_output_name(name))) {
      report(str_cat("initializer '", name, "' [", shape_str(dims),
                     "] is a value the exporter computed from parameters (a folded constant): memc trains it as its own parameter"));
    }
  }
  return audit;
}

}  // namespace memc
