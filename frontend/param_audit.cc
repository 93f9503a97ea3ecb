#include "frontend/param_audit.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <sstream>

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

// NodeProto.metadata_props (field 9, ONNX ≥ 1.16) is newer than Debian's onnx.proto: protobuf
// keeps it as an unknown field, each entry a serialized StringStringEntryProto.
// ValueInfoProto's (field 4) likewise.
std::string unknown_metadata(const google::protobuf::Message& m, int field, const std::string& key) {
  const google::protobuf::UnknownFieldSet& fields = m.GetReflection()->GetUnknownFields(m);
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() != field || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    onnx::StringStringEntryProto entry;
    if (entry.ParseFromString(f.length_delimited()) && entry.key() == key) return entry.value();
  }
  return "";
}

}  // namespace

bool op_output_name(const std::string& name) {
  const size_t underscore = name.rfind('_');
  if (underscore == std::string::npos || underscore + 1 == name.size() || name.find('.') != std::string::npos) return false;
  return std::all_of(name.begin() + underscore + 1, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string node_metadata(const onnx::NodeProto& n, const std::string& key) {
  constexpr int kNodeMetadata = 9;
  return unknown_metadata(n, kNodeMetadata, key);
}

std::string fx_target(const onnx::NodeProto& n) {
  const std::string fx = node_metadata(n, "pkg.torch.onnx.fx_node");
  const std::string prefix = "target=torch.ops.aten.";
  const size_t at = fx.find(prefix);
  if (at == std::string::npos) return "";
  const size_t from = at + prefix.size();
  return fx.substr(from, fx.find(']', from) - from);
}

namespace {

// Every quoted name in a Python list's repr ("['', 'inner', 'inner.bert']").
std::vector<std::string> quoted_names(const std::string& list) {
  std::vector<std::string> names;
  for (size_t open = list.find('\''); open != std::string::npos; open = list.find('\'', open + 1)) {
    const size_t close = list.find('\'', open + 1);
    if (close == std::string::npos) break;
    names.push_back(list.substr(open + 1, close - open - 1));
    open = close;
  }
  return names;
}

}  // namespace

bool placeholder_value(const std::string& v) { return v.rfind("p_", 0) == 0 || v.rfind("b_", 0) == 0 || v.rfind("c_", 0) == 0; }

std::string module_scope(const onnx::NodeProto& n) {
  const std::vector<std::string> scopes = quoted_names(node_metadata(n, "pkg.torch.onnx.name_scopes"));
  return scopes.size() >= 2 ? scopes[scopes.size() - 2] : "";
}

namespace {

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }


// torch.export lower-cases its placeholders' names ("%p_m_bert_embeddings_layernorm_weight" for
// HF's "LayerNorm", "%p_..._selfattention_q_weight" for T5's "SelfAttention"): FX text and module
// paths are matched lower-cased.
std::string lower_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The parameter a Linear's folded weight came from: the FX node reads it as "%p_<module path
// with _>_<attribute>"; the innermost module scope (name_scopes) whose path prefixes such a
// token gives the dotted name ("...q_lin" + "weight"). "" when the metadata does not say.
std::string parameter_behind(const onnx::NodeProto& n) {
  const std::string fx = lower_ascii(node_metadata(n, "pkg.torch.onnx.fx_node"));
  const std::vector<std::string> paths = quoted_names(node_metadata(n, "pkg.torch.onnx.name_scopes"));
  for (auto it = paths.rbegin(); it != paths.rend(); ++it) {
    if (it->empty()) continue;
    std::string prefix = lower_ascii("%p_" + *it + "_");
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

}  // namespace

std::string parameter_read(const onnx::NodeProto& n, const std::string& attribute, const std::map<std::string, std::string>* components) {
  const std::string fx = lower_ascii(node_metadata(n, "pkg.torch.onnx.fx_node"));
  const std::vector<std::string> paths = quoted_names(node_metadata(n, "pkg.torch.onnx.name_scopes"));
  for (auto it = paths.rbegin(); it != paths.rend() && !attribute.empty(); ++it) {
    if (it->empty()) continue;
    std::string token = lower_ascii("%p_" + *it + "_" + attribute);
    std::replace(token.begin(), token.end(), '.', '_');
    for (size_t at = fx.find(token); at != std::string::npos; at = fx.find(token, at + 1)) {
      const size_t end = at + token.size();
      if (end == fx.size() || !is_ident(fx[end])) return *it + "." + attribute;
    }
  }
  if (!components || attribute.empty()) return "";
  // The scope does not reach the module: a placeholder under the innermost scope that has one,
  // whose path ends in the attribute.
  const std::string suffix = lower_ascii("_" + attribute);
  for (auto it = paths.rbegin(); it != paths.rend(); ++it) {
    if (it->empty()) continue;
    std::string prefix = lower_ascii("p_" + *it + "_");
    std::replace(prefix.begin(), prefix.end(), '.', '_');
    std::set<std::string> found;
    for (const std::string& value : fx_arguments(n)) {
      const std::string token = lower_ascii(value);
      if (token.size() <= prefix.size() + suffix.size() || token.rfind(prefix, 0) != 0 || !token.ends_with(suffix)) continue;
      const std::string dotted = dotted_path(token.substr(prefix.size()), *components);
      const bool ends_in_attribute = dotted.size() > attribute.size() && lower_ascii(dotted).ends_with(lower_ascii("." + attribute));
      found.insert(ends_in_attribute ? *it + "." + dotted : "");
    }
    if (found.size() == 1 && !found.begin()->empty()) return *found.begin();
    if (!found.empty()) return "";
  }
  return "";
}

std::string dotted_path(const std::string& mangled, const std::map<std::string, std::string>& components) {
  std::vector<std::string> tokens;
  for (size_t at = 0; at <= mangled.size();) {
    const size_t end = std::min(mangled.find('_', at), mangled.size());
    tokens.push_back(mangled.substr(at, end - at));
    at = end + 1;
  }
  // ways[i]: how many splits tokens[i..] has (capped at 2), next[i]: the end of its first component.
  const size_t n = tokens.size();
  std::vector<int> ways(n + 1, 0);
  std::vector<size_t> next(n + 1, 0);
  ways[n] = 1;
  for (size_t i = n; i-- > 0;) {
    std::string component;
    for (size_t j = i; j < n; ++j) {
      component += (j > i ? "_" : "") + tokens[j];
      const auto it = components.find(component);
      if (it == components.end() || it->second.empty() || ways[j + 1] == 0) continue;
      if (ways[i] == 0) next[i] = j + 1;
      ways[i] = std::min(2, ways[i] + ways[j + 1]);
    }
  }
  if (ways[0] != 1) return "";
  std::string path;
  for (size_t i = 0; i < n; i = next[i]) {
    std::string component;
    for (size_t j = i; j < next[i]; ++j) component += (j > i ? "_" : "") + tokens[j];
    path += (path.empty() ? "" : ".") + components.at(component);
  }
  return path;
}

std::string placeholder_spelling(std::string name) {
  name = lower_ascii(name);
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

std::vector<std::string> placeholder_parameters(const onnx::NodeProto& n, const std::map<std::string, std::string>* components) {
  const std::vector<std::string> paths = quoted_names(node_metadata(n, "pkg.torch.onnx.name_scopes"));
  std::vector<std::string> places;
  for (const std::string& value : fx_arguments(n)) {
    if (!placeholder_value(value)) continue;
    const std::string token = lower_ascii(value);
    std::string name;  // `<scope>.<attribute>` under the innermost scope that prefixes the token
    for (auto it = paths.rbegin(); it != paths.rend() && name.empty(); ++it) {
      if (it->empty()) continue;
      const std::string prefix = token.substr(0, 2) + placeholder_spelling(*it) + "_";
      if (token.size() <= prefix.size() || token.rfind(prefix, 0) != 0) continue;
      const std::string rest = token.substr(prefix.size());
      const std::string dotted = components && rest.find('_') != std::string::npos ? dotted_path(rest, *components) : "";
      name = *it + "." + (dotted.empty() ? rest : dotted);
    }
    places.push_back(name);
  }
  return places;
}

std::vector<std::string> parameters_by_place(const onnx::NodeProto& n, const std::vector<std::string>& inputs,
                                             const std::map<std::string, std::string>* components) {
  std::vector<std::string> places = placeholder_parameters(n, components);
  if (places.size() != inputs.size()) return {};
  bool evidence = false;  // a place named as an input is that input's place
  for (size_t k = 0; k < places.size(); ++k) {
    const std::string place = placeholder_spelling(places[k]);
    if (std::none_of(inputs.begin(), inputs.end(), [&](const std::string& in) { return placeholder_spelling(in) == place; })) continue;
    if (placeholder_spelling(inputs[k]) != place) return {};
    evidence = true;
  }
  // Or each place ends in its input's own last component, and those are distinct (a LayerNorm's
  // weight and bias under another layer's names).
  const auto last = [](const std::string& name) { return lower_ascii(name.substr(name.rfind('.') + 1)); };
  std::set<std::string> lasts;
  bool by_attribute = components != nullptr;
  for (size_t k = 0; k < places.size() && by_attribute; ++k) {
    by_attribute = !places[k].empty() && last(places[k]) == last(inputs[k]) && lasts.insert(last(inputs[k])).second;
  }
  const std::set<std::string> distinct(inputs.begin(), inputs.end());
  if (!evidence && !by_attribute && distinct.size() == inputs.size()) return {};  // one initializer read twice needs no more evidence
  // The attribute keeps the input's own spelling where it names the same one ("A_log").
  for (size_t i = 0; i < inputs.size(); ++i)
    if (placeholder_spelling(places[i]) == placeholder_spelling(inputs[i])) places[i] = inputs[i];
  return places;
}

std::string folded_value_read(const onnx::NodeProto& n, int input, const std::set<std::string>& computed) {
  const std::vector<std::string> values = fx_arguments(n);
  if (input < 0 || input >= n.input_size()) return "";
  // The one FX value at a known place, unless a placeholder, a value a node still computes, or the input's own name.
  const auto folded = [&](const std::string& value) {
    return placeholder_value(value) || computed.count(value) || value == n.input(input) ? "" : value;
  };
  // Where the FX arguments are the inputs one for one, the one at the input's place (one
  // initializer read at two places: timm's GRN, `addcmul(%view_1, %view, %mul)`).
  if (static_cast<int>(values.size()) == n.input_size()) return folded(values[input]);
  // addcmul(input, tensor1, tensor2), decomposed by the exporter to Add(input, Mul(tensor1, tensor2)),
  // both nodes with its FX node: the Mul reads tensor1, the Add input (timm's GRN reads its
  // weight and bias folded to views, merged when both are zeros).
  if (fx_target(n) == "addcmul.default" && (n.op_type() == "Mul" || n.op_type() == "Add")) {
    return values.size() == 3 ? folded(values[n.op_type() == "Mul" ? 1 : 0]) : "";
  }
  std::set<std::string> others;  // the node's other inputs: FX values keep their names in the export
  for (int k = 0; k < n.input_size(); ++k)
    if (k != input) others.insert(n.input(k));
  std::set<std::string> candidates;
  for (const std::string& value : values)
    if (!placeholder_value(value) && !others.count(value) && !computed.count(value)) candidates.insert(value);
  return candidates.size() == 1 ? *candidates.begin() : "";
}

std::string fx_value(const onnx::NodeProto& n) {
  const std::string fx = node_metadata(n, "pkg.torch.onnx.fx_node");
  size_t end = 1;
  while (end < fx.size() && is_ident(fx[end])) ++end;
  return fx.size() > 1 && fx[0] == '%' ? fx.substr(1, end - 1) : "";
}

std::vector<std::string> fx_arguments(const onnx::NodeProto& n) {
  const std::string fx = node_metadata(n, "pkg.torch.onnx.fx_node");
  std::vector<std::string> values;
  const size_t args = fx.find("](args = (");
  if (args == std::string::npos) return values;
  for (size_t at = fx.find('%', args); at != std::string::npos; at = fx.find('%', at + 1)) {
    size_t end = at + 1;
    while (end < fx.size() && is_ident(fx[end])) ++end;
    if (end > at + 1) values.push_back(fx.substr(at + 1, end - at - 1));
  }
  return values;
}

int64_t embedding_padding_index(const onnx::NodeProto& n) {
  if (fx_target(n) != "embedding.default") return -1;
  const std::string fx = node_metadata(n, "pkg.torch.onnx.fx_node");
  const size_t args = fx.find("](args = (");
  if (args == std::string::npos) return -1;
  // The arguments at the top level of the tuple, up to its closing parenthesis.
  std::vector<std::string> top;
  std::string current;
  int depth = 0;
  for (size_t i = args + 10; i < fx.size(); ++i) {
    const char c = fx[i];
    if (depth == 0 && (c == ',' || c == ')')) {
      top.push_back(current.substr(current.find_first_not_of(' ') == std::string::npos ? current.size() : current.find_first_not_of(' ')));
      current.clear();
      if (c == ')') break;
      continue;
    }
    depth += (c == '(' || c == '[') - (c == ')' || c == ']');
    current += c;
  }
  if (top.size() < 3 || top[2].empty() || top[2].find_first_not_of("0123456789") != std::string::npos || top[2].size() > 18) return -1;
  return std::stoll(top[2]);
}

bool all_elements_equal(const Tensor& t) {
  if (t.numel() < 1) return false;
  const double first = t.get_as_double(0);
  for (int64_t k = 1; k < t.numel(); ++k)
    if (!(t.get_as_double(k) == first)) return false;
  return true;
}

std::string single_parameter_read(const onnx::NodeProto& n, const std::set<std::string>& known) {
  const std::string fx = lower_ascii(node_metadata(n, "pkg.torch.onnx.fx_node"));
  std::vector<std::string> placeholders;
  for (size_t at = fx.find("%p_"); at != std::string::npos; at = fx.find("%p_", at + 1)) {
    size_t end = at + 3;
    while (end < fx.size() && is_ident(fx[end])) ++end;
    placeholders.push_back(fx.substr(at, end - at));
  }
  if (placeholders.empty()) return "";
  const std::vector<std::string> paths = quoted_names(node_metadata(n, "pkg.torch.onnx.name_scopes"));
  for (auto it = paths.rbegin(); it != paths.rend(); ++it) {
    if (it->empty()) continue;
    std::string prefix = lower_ascii("%p_" + *it + "_");
    std::replace(prefix.begin(), prefix.end(), '.', '_');
    std::set<std::string> attributes;
    for (const std::string& p : placeholders)
      if (p.size() > prefix.size() && p.rfind(prefix, 0) == 0 && !known.count(*it + "." + p.substr(prefix.size())))
        attributes.insert(p.substr(prefix.size()));
    if (attributes.size() > 1) return "";
    if (attributes.size() == 1) return *it + "." + *attributes.begin();
  }
  return "";
}

namespace {

bool all_rows_equal(const Tensor& t) {
  if (t.rank() < 1 || t.shape()[0] < 2) return false;
  const size_t row = t.nbytes() / static_cast<size_t>(t.shape()[0]);
  const char* data = static_cast<const char*>(t.raw());
  for (int64_t r = 1; r < t.shape()[0]; ++r)
    if (std::memcmp(data, data + r * row, row) != 0) return false;
  return true;
}

std::string node_label(const onnx::NodeProto& n) { return n.name().empty() ? n.op_type() : n.name(); }

// The value_info (or graph input) metadata of each named value, where the export wrote `key`.
std::map<std::string, std::string> value_metadata(const onnx::ModelProto& model, const std::string& key) {
  constexpr int kValueInfoMetadata = 4;
  std::map<std::string, std::string> found;
  for (const auto* list : {&model.graph().value_info(), &model.graph().input()}) {
    for (const auto& v : *list) {
      std::string value = unknown_metadata(v, kValueInfoMetadata, key);
      if (!value.empty()) found[v.name()] = std::move(value);
    }
  }
  return found;
}

constexpr const char* kFoldedFrom = "pkg.onnxscript.optimizer.folded_from";
constexpr const char* kSignatureKind = "pkg.torch.export.graph_signature.InputSpec.kind";
// How to keep a value computed from parameters out of the file, for the findings that name one.
constexpr const char* kRefold = "an export without constant folding trains the parameters themselves: dynamo's optimize=False, "
                                "TorchScript's do_constant_folding=False";

}  // namespace

// One input a line: "p_fc_weight: PARAMETER target='fc.weight'".
std::map<std::string, std::string> signature_kinds(const onnx::ModelProto& model) {
  constexpr int kGraphMetadata = 16;
  const std::string signature = unknown_metadata(model.graph(), kGraphMetadata, "pkg.torch.export.ExportedProgram.graph_signature");
  std::map<std::string, std::string> kinds;
  std::istringstream lines(signature);
  for (std::string line; std::getline(lines, line);) {
    const size_t colon = line.find(": "), target = line.find(" target='");
    if (colon == std::string::npos || target == std::string::npos || target < colon) continue;
    const size_t begin = target + 9, end = line.find('\'', begin);
    if (end == std::string::npos) continue;
    kinds[line.substr(begin, end - begin)] = line.substr(colon + 2, target - colon - 2);
  }
  return kinds;
}

// What the FX graph says of names, read from each node's pkg.torch.onnx.fx_node
// ("%index_1 : [num_users=1] = call_function[...](args = (%b_rotary_emb_embed_positions, ...))"):
// the placeholders it reads, by torch.export's prefixes ("p_" a parameter, "b_" a buffer, "c_" a
// lifted constant; the module path's dots become underscores), and the values its nodes define.
FxNames fx_names(const std::vector<onnx::NodeProto>& nodes) {
  FxNames names;
  for (const auto& n : nodes) {
    if (std::string value = fx_value(n); !value.empty()) names.defined.insert(std::move(value));
    for (const std::string& token : fx_arguments(n)) {
      if (token.rfind("p_", 0) == 0) names.parameters.insert(token.substr(2));
      else if (token.rfind("b_", 0) == 0 || token.rfind("c_", 0) == 0) names.constants.insert(token.substr(2));
    }
  }
  return names;
}

// An FX node's name that is an aten op's own (the first node of an op is named after it, a later
// one gets "_1", which op_output_name already knows): tensors made from no input ("arange",
// "full") and the ops that build masks and positions from them.
bool creation_op_name(const std::string& name) {
  static const std::set<std::string> ops = {"arange", "full", "ones", "zeros", "empty", "eye", "linspace", "scalar_tensor",
                                            "new_ones", "new_zeros", "new_full", "new_empty", "lift_fresh_copy",
                                            // the first FX node of an aten op is named after it: a mask built from
                                            // positions (HF BERT without an attention_mask: arange, ge, expand)
                                            "ge", "gt", "le", "lt", "eq", "ne", "logical_and", "logical_or", "logical_not",
                                            "bitwise_and", "bitwise_or", "bitwise_not", "where", "masked_fill", "expand",
                                            "unsqueeze", "squeeze", "view", "reshape", "slice", "select", "index", "cat",
                                            "add", "sub", "rsub", "mul", "div", "neg", "pow", "cumsum", "clone", "_to_copy",
                                            "to", "repeat", "permute", "transpose", "tril", "triu", "min", "max", "any", "all"};
  return ops.count(name) > 0;
}

namespace {

// The one name in onnxscript's "['name']" (folded_from); "" for none or several.
std::string single_source(const std::string& list) {
  if (list.size() < 4 || list.front() != '[' || list.back() != ']' || std::count(list.begin(), list.end(), '\'') != 2) return "";
  const size_t open = list.find('\''), close = list.rfind('\'');
  return list.substr(open + 1, close - open - 1);
}

// Each finding is printed once per process: compile imports the same model several times.
void warn_once(const std::string& line) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(line).second) warn(line);
}

// Folded copies of one parameter (ALBERT's shared feed-forward weights, folded once per layer
// that uses them): when they have one layout and equal values, the first stands for all, so the
// parameter trains as one tensor, as the module shares it.
template <class Report>
void tie_folded_copies(const onnx::ModelProto& model, const std::string& base_dir, ParamAudit& audit, Report&& report) {
  std::map<std::string, std::vector<std::string>> copies;  // parameter → its folded copies, in graph order
  for (const auto& init : model.graph().initializer()) {
    if (auto it = audit.folded_from.find(init.name()); it != audit.folded_from.end()) copies[it->second].push_back(init.name());
  }
  std::map<std::string, const onnx::TensorProto*> by_name;
  for (const auto& init : model.graph().initializer()) by_name[init.name()] = &init;
  for (const auto& [from, names] : copies) {
    if (names.size() < 2) continue;
    const onnx::TensorProto& first = *by_name.at(names[0]);
    Expected<Tensor> reference = tensor_proto_has_no_data(first) ? Expected<Tensor>(Status::BadInput("no data")) : tensor_from_proto(first, base_dir);
    std::vector<std::string> tied;
    for (size_t k = 1; k < names.size(); ++k) {
      const onnx::TensorProto& other = *by_name.at(names[k]);
      const bool same_layout = other.data_type() == first.data_type() &&
                               std::equal(other.dims().begin(), other.dims().end(), first.dims().begin(), first.dims().end());
      if (!same_layout) continue;
      if (reference.ok() && !tensor_proto_has_no_data(other)) {  // equal values, checked; a skeleton has none to check
        Expected<Tensor> value = tensor_from_proto(other, base_dir);
        if (!value.ok() || value->nbytes() != reference->nbytes() || std::memcmp(value->raw(), reference->raw(), value->nbytes()) != 0) continue;
      }
      audit.same_as[names[k]] = names[0];
      tied.push_back("'" + names[k] + "'");
      const std::string superseded = "initializer '" + names[k] + "' [";  // "memc trains it as '<copy>'" no longer holds
      std::erase_if(audit.findings, [&](const std::string& line) { return line.rfind(superseded, 0) == 0; });
    }
    if (tied.empty()) continue;
    std::string list;
    for (size_t i = 0; i < tied.size(); ++i) list += (i ? ", " : "") + tied[i];
    report(str_cat("initializers '", names[0], "' and ", list, " are the exporter's folded copies of one parameter '", from,
                   "' (equal values): memc trains them as one tensor, '", names[0], "', as the model shares it"));
  }
}

// The copy's values are the original's transposed, element for element (2-D, one dtype).
bool equals_transposed(const Tensor& copy, const Tensor& original) {
  if (original.rank() != 2 || copy.dtype() != original.dtype()) return false;
  const Tensor t = transpose_2d(original);
  return copy.shape() == t.shape() && std::memcmp(copy.raw(), t.raw(), t.nbytes()) == 0;
}

// A folded transpose of a parameter that the graph also reads under the parameter's own name
// (the dynamo exporter's optimizer folds a tied output projection's transpose and keeps the
// embedding): where the values agree (a skeleton has none to check), the copy reads the
// parameter's transpose, so the parameter trains as one tensor, as the module ties it.
template <class Report>
void tie_folded_transposes(const onnx::ModelProto& model, const std::set<std::string>& weights, const std::string& base_dir,
                           ParamAudit& audit, Report&& report) {
  std::map<std::string, const onnx::TensorProto*> by_name;
  for (const auto& init : model.graph().initializer()) by_name[init.name()] = &init;
  for (const auto& [name, from] : audit.folded_from) {
    const auto original = by_name.find(from);
    if (audit.same_as.count(name) || original == by_name.end() || !weights.count(from)) continue;
    const onnx::TensorProto& copy = *by_name.at(name);
    const bool transposed_layout = copy.data_type() == original->second->data_type() && copy.dims_size() == 2 &&
                                   original->second->dims_size() == 2 && copy.dims(0) == original->second->dims(1) &&
                                   copy.dims(1) == original->second->dims(0);
    if (!transposed_layout) continue;
    if (!tensor_proto_has_no_data(copy) && !tensor_proto_has_no_data(*original->second)) {
      const Expected<Tensor> a = tensor_from_proto(copy, base_dir), b = tensor_from_proto(*original->second, base_dir);
      if (!a.ok() || !b.ok() || !equals_transposed(*a, *b)) continue;
    }
    audit.transposed_of[name] = from;
    const std::string superseded = "initializer '" + name + "' [";  // "memc trains it as '<copy>'" no longer holds
    std::erase_if(audit.findings, [&](const std::string& line) { return line.rfind(superseded, 0) == 0; });
    report(str_cat("initializer '", name, "' [", copy.dims(0), "x", copy.dims(1), "] is the exporter's folded transpose of parameter '", from,
                   "', which the graph also reads (tied weights): memc trains them as one tensor, '", from, "', as the model ties them"));
  }
}

// The dynamo exporter's optimizer fuses a BatchNorm into the Conv (or Linear) before it: the
// node keeps the BatchNorm's FX node, and the weight and bias it reads, under the layer's own
// names, hold the layer scaled by the BatchNorm's statistics. Training them trains another
// parameterization than the module's, and in train() mode PyTorch would normalize with batch
// statistics besides: one line per fused node.
template <class Report>
void report_fused_batch_norms(const std::vector<onnx::NodeProto>& nodes, Report&& report) {
  for (const auto& n : nodes) {
    if (n.op_type() != "Conv" && n.op_type() != "Gemm" && n.op_type() != "MatMul") continue;
    const std::string op = fx_target(n);
    if (op.find("batch_norm") == std::string::npos) continue;
    std::string weights;
    for (int i = 1; i < n.input_size(); ++i) weights += str_cat(i > 1 ? ", '" : "'", n.input(i), "'");
    report(str_cat("node '", node_label(n), "' (", n.op_type(), ") is the exporter's fusion of a layer and the BatchNorm after it (",
                   op, "): its weights ", weights, " hold the layer scaled by the BatchNorm's statistics, not the module's parameters",
                   op.find("no_training") == std::string::npos ? ", and the module was in train() mode, where PyTorch uses batch statistics" : "",
                   "; memc trains the fused form: export", op.find("no_training") == std::string::npos ? " after .eval()" : "",
                   " with optimize=False to train the module's own"));
  }
}

}  // namespace

void warn_finding_once(const std::string& line) { warn_once(line); }

std::map<std::string, std::string> name_components(const onnx::ModelProto& model) {
  std::map<std::string, std::string> components;
  const auto add = [&](const std::string& name) {
    for (size_t at = 0; at <= name.size();) {
      const size_t end = std::min(name.find('.', at), name.size());
      const std::string component = name.substr(at, end - at);
      auto [it, added] = components.emplace(lower_ascii(component), component);
      if (!added && it->second != component) it->second.clear();
      at = end + 1;
    }
  };
  for (const auto& init : model.graph().initializer()) add(init.name());
  for (const auto& [value, sources] : value_metadata(model, kFoldedFrom))
    for (const std::string& name : quoted_names(sources)) add(name);
  return components;
}

std::set<std::string> exported_buffers(const onnx::ModelProto& model) {
  std::set<std::string> buffers;
  for (const auto& [name, kind] : value_metadata(model, kSignatureKind)) {
    if (kind == "BUFFER") buffers.insert(name);
  }
  return buffers;
}

std::map<std::string, FoldedSources> folded_sources(const onnx::ModelProto& model, const std::vector<onnx::NodeProto>& nodes) {
  const std::map<std::string, std::string> folded = value_metadata(model, kFoldedFrom);
  const std::map<std::string, std::string> kinds = value_metadata(model, kSignatureKind);
  const std::map<std::string, std::string> signature = signature_kinds(model);
  const FxNames fx = fx_names(nodes);
  std::set<std::string> activations;  // computed at run time: surviving nodes' outputs, the graph's inputs
  for (const auto& n : nodes) activations.insert(n.output().begin(), n.output().end());
  for (const auto& in : model.graph().input()) activations.insert(in.name());
  auto mangled = [](std::string name) {
    std::replace(name.begin(), name.end(), '.', '_');
    return name;
  };
  auto module_buffer = [&](const std::string& s) {
    auto kind = kinds.find(s);
    if (kind != kinds.end()) return kind->second == "BUFFER" || kind->second == "CONSTANT_TENSOR";
    return fx.constants.count(mangled(s)) > 0 && !fx.parameters.count(mangled(s));
  };
  auto exporter_value = [&](const std::string& s) {
    if (s.find('.') != std::string::npos || kinds.count(s) || fx.parameters.count(mangled(s))) return false;
    return synthesized_name(s) || op_output_name(s) || creation_op_name(s) || activations.count(s) || fx.defined.count(s);
  };
  std::map<std::string, FoldedSources> found;
  for (const auto& init : model.graph().initializer()) {
    auto it = folded.find(init.name());
    const auto dtype = dtype_from_onnx(init.data_type());
    if (it == folded.end() || !dtype.ok() || !is_float(*dtype)) continue;
    const int64_t count = std::accumulate(init.dims().begin(), init.dims().end(), int64_t{1}, std::multiplies<>());
    if (count <= 1 && synthesized_name(init.name())) continue;  // the importer never trains these anyway
    FoldedSources sources;
    for (const std::string& s : quoted_names(it->second)) {
      if (!signature.empty()) {  // exact: a name the signature does not list is the exporter's own value
        const auto kind = signature.find(s);
        (kind == signature.end() ? sources.values : kind->second == "PARAMETER" ? sources.parameters : sources.buffers).push_back(s);
        continue;
      }
      (module_buffer(s) ? sources.buffers : exporter_value(s) ? sources.values : sources.parameters).push_back(s);
    }
    // A scalar counts where the signature shows it folded from parameters (DiffLlama's
    // lambda_full): the exporter's other scalars are constants the importer keeps anyway.
    if (init.dims_size() > 0 || (!signature.empty() && !sources.parameters.empty())) found[init.name()] = std::move(sources);
  }
  return found;
}

std::map<std::string, std::string> folded_constants(const std::map<std::string, FoldedSources>& sources) {
  auto quoted = [](const std::vector<std::string>& names) {
    std::string list;
    for (size_t i = 0; i < names.size() && i < 3; ++i) list += (i ? ", '" : "'") + names[i] + "'";
    return list + (names.size() > 3 ? ", …" : "");
  };
  std::map<std::string, std::string> constants;
  for (const auto& [name, from] : sources) {
    if (!from.parameters.empty() || (from.buffers.empty() && from.values.empty())) continue;
    constants[name] = from.buffers.empty()             ? "values the exporter computed (" + quoted(from.values) + ")"
                      : from.buffers.size() == 1 ? "the module's buffer " + quoted(from.buffers)
                                                 : "the module's buffers " + quoted(from.buffers);
  }
  return constants;
}

Tensor first_row(const Tensor& t) {
  Shape shape = t.shape();
  shape[0] = 1;
  Tensor row = Tensor::zeros(t.dtype(), shape);
  if (row.nbytes()) std::memcpy(row.raw(), t.raw(), row.nbytes());
  return row;
}

Tensor transpose_2d(const Tensor& t) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  Tensor out = Tensor::zeros(t.dtype(), {cols, rows});
  const size_t size = dtype_size(t.dtype());
  const auto* in = static_cast<const char*>(t.raw());
  auto* to = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) std::memcpy(to + (j * rows + i) * size, in + (i * cols + j) * size, size);
  }
  return out;
}

namespace {

// The trained parameter whose transpose a folded copy holds, found by value where the export
// recorded no name (TorchScript's constant folding stores a tied output projection as a new
// `onnx::MatMul_N`, the embedding transposed): the one non-synthesized trained 2-D initializer of
// the transposed shape whose values, transposed, are the copy's, element for element. A copy
// whose elements are all equal matches by accident, not by tie, and is left alone.
std::string transposed_twin(const onnx::ModelProto& model, const onnx::TensorProto& copy, const std::set<std::string>& weights,
                            const std::string& base_dir) {
  if (copy.dims_size() != 2 || tensor_proto_has_no_data(copy)) return "";
  std::vector<const onnx::TensorProto*> candidates;
  for (const auto& init : model.graph().initializer()) {
    if (init.dims_size() == 2 && init.dims(0) == copy.dims(1) && init.dims(1) == copy.dims(0) && init.data_type() == copy.data_type() &&
        weights.count(init.name()) && !synthesized_name(init.name()) && !tensor_proto_has_no_data(init))
      candidates.push_back(&init);
  }
  if (candidates.empty()) return "";
  const Expected<Tensor> value = tensor_from_proto(copy, base_dir);
  if (!value.ok() || value->numel() < 2 || all_elements_equal(*value)) return "";
  std::string found;
  for (const auto* init : candidates) {
    const Expected<Tensor> original = tensor_from_proto(*init, base_dir);
    if (!original.ok() || !equals_transposed(*value, *original)) continue;
    if (!found.empty()) return "";  // two parameters hold these values: which one is unknown
    found = init->name();
  }
  return found;
}

}  // namespace

ParamAudit audit_parameters(const onnx::ModelProto& model, const std::vector<onnx::NodeProto>& nodes,
                            const std::map<std::string, FoldedSources>& sources, const std::set<std::string>& weights,
                            const std::set<std::string>& updated, int64_t fixed_batch, const std::string& base_dir,
                            const std::string& file, bool print_warnings) {
  std::map<std::string, std::vector<const onnx::NodeProto*>> uses;
  for (const auto& n : nodes) {
    if (reads_shape_only(n.op_type())) continue;
    std::set<std::string> seen;  // a node reading a weight twice is one use
    for (const auto& in : n.input())
      if (weights.count(in) && seen.insert(in).second) uses[in].push_back(&n);
  }
  ParamAudit audit;
  auto report = [&](const std::string& line) { audit.findings.push_back(line); };
  const std::map<std::string, std::string> folded = value_metadata(model, kFoldedFrom);
  for (const std::string& name : exported_buffers(model)) {
    if (updated.count(name)) continue;
    const auto& inits = model.graph().initializer();
    const auto init = std::find_if(inits.begin(), inits.end(), [&](const auto& i) { return i.name() == name; });
    if (init == inits.end()) continue;
    const auto dtype = dtype_from_onnx(init->data_type());
    if (!dtype.ok() || !is_float(*dtype)) continue;
    report(str_cat("initializer '", name, "' is a buffer of the PyTorch module (torch.export's graph signature says so): memc keeps it constant, as PyTorch does"));
  }
  for (const auto& [name, from] : folded_constants(sources)) {
    report(str_cat("initializer '", name, "' is a constant the exporter folded from ", from,
                   ", no parameter: memc keeps it constant, as PyTorch does"));
  }
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
      if (auto it = folded.find(name); it != folded.end()) from = single_source(it->second);  // onnxscript's own record
      for (const auto* n : users)
        if (from.empty()) from = parameter_behind(*n);
      if (from.empty()) from = transposed_twin(model, init, weights, base_dir);
      if (!from.empty()) {
        audit.folded_from[name] = from;
        report(str_cat("initializer '", name, "' [", shape_str(dims), "] is the exporter's folded transpose of parameter '", from,
                       "': memc trains it as '", name, "' in this layout (its gradient is that parameter's, transposed)"));
      } else {
        report(str_cat("initializer '", name, "' [", shape_str(dims),
                       "] is a weight the exporter computed (a folded transpose; the parameter's name is lost): memc trains it in this layout"));
      }
    } else if (auto from = sources.find(name);
               !audit.batch_expanded.count(name) && from != sources.end() && from->second.parameters.size() == 1) {
      report(str_cat("initializer '", name, "' [", shape_str(dims), "] is a value the exporter folded from parameter '",
                     from->second.parameters[0], "' alone: memc trains it in this form (the same as training '", from->second.parameters[0],
                     "' when that function is a reshape or a cast; ", kRefold, ")"));
    } else if (!audit.batch_expanded.count(name) && (synthesized_name(name) || op_output_name(name))) {
      report(str_cat("initializer '", name, "' [", shape_str(dims),
                     "] is a value the exporter computed from parameters (a folded constant): memc trains it as its own parameter (",
                     kRefold, ")"));
    }
  }
  report_fused_batch_norms(nodes, report);
  tie_folded_copies(model, base_dir, audit, report);
  tie_folded_transposes(model, weights, base_dir, audit, report);
  if (print_warnings) {
    for (const std::string& line : audit.findings) warn_once(file + ": " + line);
  }
  return audit;
}

}  // namespace memc
