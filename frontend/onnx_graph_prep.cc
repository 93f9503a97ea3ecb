#include "frontend/onnx_graph_prep.h"

#include <map>
#include <unordered_map>
#include <unordered_set>

namespace memc {
namespace {

constexpr int kMaxInlineDepth = 8;
constexpr size_t kMaxInlinedNodes = 1 << 20;

bool is_default_domain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

const onnx::FunctionProto* find_function(const onnx::ModelProto& model, const onnx::NodeProto& node) {
  for (const auto& f : model.functions()) {
    if (f.name() == node.op_type() && f.domain() == node.domain()) return &f;
  }
  return nullptr;
}

Status inline_into(const onnx::ModelProto& model, const onnx::NodeProto& call, const onnx::FunctionProto& fn,
                   int depth, int& counter, std::vector<onnx::NodeProto>& out, const std::string& file) {
  if (depth > kMaxInlineDepth) return Status::BadInput(str_cat(file, ": function '", fn.name(), "' nests too deeply"));
  const std::string prefix = str_cat("__fn", counter++, "_", fn.name(), "/");
  std::unordered_map<std::string, std::string> rename;
  for (int i = 0; i < fn.input_size(); ++i) rename[fn.input(i)] = i < call.input_size() ? call.input(i) : "";
  for (int i = 0; i < fn.output_size(); ++i) rename[fn.output(i)] = i < call.output_size() ? call.output(i) : prefix + fn.output(i);
  auto mapped = [&](const std::string& name) {
    if (name.empty()) return name;
    auto it = rename.find(name);
    return it != rename.end() ? it->second : prefix + name;
  };
  // Attribute values come from the caller (unset ones are dropped).
  std::map<std::string, const onnx::AttributeProto*> attr_values;
  for (const auto& a : call.attribute()) attr_values[a.name()] = &a;
  for (const auto& body : fn.node()) {
    onnx::NodeProto node = body;
    for (auto& in : *node.mutable_input()) in = mapped(in);
    for (auto& o : *node.mutable_output()) o = mapped(o);
    node.set_name(prefix + body.name());
    google::protobuf::RepeatedPtrField<onnx::AttributeProto> attrs;
    for (const auto& a : body.attribute()) {
      if (a.ref_attr_name().empty()) {
        *attrs.Add() = a;
        continue;
      }
      auto it = attr_values.find(a.ref_attr_name());
      if (it == attr_values.end()) continue;  // unset optional attribute
      onnx::AttributeProto resolved = *it->second;
      resolved.set_name(a.name());
      *attrs.Add() = resolved;
    }
    *node.mutable_attribute() = attrs;
    if (!is_default_domain(node.domain())) {
      if (const auto* inner = find_function(model, node)) {
        MEMC_RETURN_IF_ERROR(inline_into(model, node, *inner, depth + 1, counter, out, file));
        continue;
      }
    }
    if (out.size() > kMaxInlinedNodes) return Status::BadInput(str_cat(file, ": too many nodes after inlining functions"));
    out.push_back(std::move(node));
  }
  return Status::Ok();
}

}  // namespace

Status inline_functions(const onnx::ModelProto& model, std::vector<onnx::NodeProto>& nodes, const std::string& file) {
  if (model.functions_size() == 0) return Status::Ok();
  std::vector<onnx::NodeProto> out;
  int counter = 0;
  for (auto& node : nodes) {
    const onnx::FunctionProto* fn = is_default_domain(node.domain()) ? nullptr : find_function(model, node);
    if (!fn) {
      out.push_back(std::move(node));
      continue;
    }
    MEMC_RETURN_IF_ERROR(inline_into(model, node, *fn, 0, counter, out, file));
  }
  nodes = std::move(out);
  return Status::Ok();
}

namespace {

onnx::NodeProto make_node(const std::string& op, std::vector<std::string> inputs, const std::string& output, const std::string& name) {
  onnx::NodeProto n;
  n.set_op_type(op);
  n.set_name(name);
  for (const auto& in : inputs) n.add_input(in);
  n.add_output(output);
  return n;
}

// A uniform draw in [0, 1): the form stochastic depth's masks start from.
bool unit_uniform(const onnx::NodeProto& n) {
  if (n.op_type() != "RandomUniformLike" || !is_default_domain(n.domain()) || n.input_size() != 1) return false;
  for (const auto& a : n.attribute()) {
    if ((a.name() == "low" && a.f() != 0.0f) || (a.name() == "high" && a.f() != 1.0f)) return false;
  }
  return true;
}

// A comparison of a uniform draw u with c as a Bernoulli: +1 where it is 1 with probability c
// (u < c, u ≤ c), −1 where with probability 1 − c (u > c, u ≥ c), 0 for other ops. `draw_first`:
// u is the comparison's first operand.
int comparison_keeps(const std::string& op, bool draw_first) {
  const bool below = op == "Less" || op == "LessOrEqual", above = op == "Greater" || op == "GreaterOrEqual";
  if (!below && !above) return 0;
  return below == draw_first ? 1 : -1;
}

// Whether `mask` only scales a product that is divided by the keep probability: mask/k · y,
// (x/k) · mask or (x · mask)/k, as stochastic depth and channel dropout use it. In evaluation the
// mask is its expectation, keep, which makes only such a product the identity; a mask used any
// other way (AlphaDropout's affine mix) is not rewritten, and the draw is refused.
bool scales_a_product(const std::vector<onnx::NodeProto>& nodes, std::unordered_map<std::string, std::vector<int>>& users,
                      const std::unordered_map<std::string, int>& producer, const std::string& mask) {
  // The one user of v past Identity nodes (detach()), and the value it reads.
  auto user_of = [&](std::string v, std::string& read) -> const onnx::NodeProto* {
    while (users[v].size() == 1 && nodes[users[v][0]].op_type() == "Identity") v = nodes[users[v][0]].output(0);
    read = v;
    return users[v].size() == 1 ? &nodes[users[v][0]] : nullptr;
  };
  std::string m, scaled;
  const onnx::NodeProto* u = user_of(mask, m);
  if (!u || u->input_size() != 2) return false;
  if (u->op_type() == "Div" && u->input(0) == m) {  // mask/k, then the product
    const onnx::NodeProto* next = user_of(u->output(0), scaled);
    return next && next->op_type() == "Mul";
  }
  if (u->op_type() != "Mul") return false;
  const std::string& other = u->input(0) == m ? u->input(1) : u->input(0);
  if (auto it = producer.find(other); it != producer.end() && nodes[it->second].op_type() == "Div") return true;  // (x/k) · mask
  const onnx::NodeProto* next = user_of(u->output(0), scaled);
  return next && next->op_type() == "Div" && next->input(0) == scaled;  // (x · mask)/k
}

}  // namespace

void rewrite_random_masks(std::vector<onnx::NodeProto>& nodes) {
  // Uses of each value; a CastLike reading it for its dtype alone (input 1) does not count.
  std::unordered_map<std::string, std::vector<int>> users;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    for (int k = 0; k < nodes[i].input_size(); ++k) {
      if (!(nodes[i].op_type() == "CastLike" && k == 1)) users[nodes[i].input(k)].push_back(i);
    }
  }
  auto only_user = [&](const std::string& value) { return users[value].size() == 1 ? users[value][0] : -1; };
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    for (const auto& o : nodes[i].output()) producer[o] = i;
  }
  std::vector<bool> dropped(nodes.size(), false);
  std::vector<std::pair<int, std::vector<onnx::NodeProto>>> inserted;  // before node index
  for (int r = 0; r < static_cast<int>(nodes.size()); ++r) {
    if (!unit_uniform(nodes[r])) continue;
    const std::string& draw = nodes[r].output(0);
    const int first = only_user(draw);
    if (first < 0 || nodes[first].input_size() != 2) continue;
    const onnx::NodeProto& op = nodes[first];
    const int second = only_user(op.output(0));
    if (second < 0) continue;
    const bool draw_first = op.input(0) == draw;
    const std::string c = draw_first ? op.input(1) : op.input(0);
    const bool floor_of_sum = op.op_type() == "Add" && nodes[second].op_type() == "Floor";
    const int compared = comparison_keeps(op.op_type(), draw_first);
    const bool cast = nodes[second].op_type() == "Cast" || nodes[second].op_type() == "CastLike";
    if (!floor_of_sum && !(compared && cast)) continue;
    if (!scales_a_product(nodes, users, producer, nodes[second].output(0))) continue;
    // The probability of a 1, broadcast to the draw's shape: c, or 1 − c where the draw must
    // exceed c (LeViT's rand.ge_(drop_rate)); the cast after a comparison stays.
    const std::string base = draw + "_memc_bernoulli";
    std::vector<onnx::NodeProto> nodes_in;
    std::string keep = c;
    if (compared < 0) {
      onnx::NodeProto one = make_node("Constant", {}, base + "_one", base + "_one");
      onnx::AttributeProto* value = one.add_attribute();
      value->set_name("value_float");
      value->set_type(onnx::AttributeProto::FLOAT);
      value->set_f(1.0f);
      nodes_in.push_back(std::move(one));
      nodes_in.push_back(make_node("Sub", {base + "_one", c}, base + "_keep", base + "_keep"));
      keep = base + "_keep";
    }
    nodes_in.push_back(make_node("Shape", {nodes[r].input(0)}, base + "_shape", base + "_shape"));
    nodes_in.push_back(make_node("Expand", {keep, base + "_shape"}, base + "_p", base + "_expand"));
    const std::string out = floor_of_sum ? nodes[second].output(0) : op.output(0);
    nodes_in.push_back(make_node("Bernoulli", {base + "_p"}, out, base));
    for (const auto& a : nodes[r].attribute()) {
      if (a.name() == "dtype" && floor_of_sum) *nodes_in.back().add_attribute() = a;
    }
    for (auto& n : nodes) {  // a dtype reference to the draw reads its input's (same dtype) instead
      if (n.op_type() == "CastLike" && n.input_size() == 2 && n.input(1) == draw) n.set_input(1, nodes[r].input(0));
    }
    dropped[r] = dropped[first] = true;
    if (floor_of_sum) dropped[second] = true;
    inserted.emplace_back(r, std::move(nodes_in));
  }
  if (inserted.empty()) return;
  std::vector<onnx::NodeProto> out;
  size_t next = 0;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    for (; next < inserted.size() && inserted[next].first == i; ++next) {
      for (auto& n : inserted[next].second) out.push_back(std::move(n));
    }
    if (!dropped[i]) out.push_back(std::move(nodes[i]));
  }
  nodes = std::move(out);
}

Status topological_sort(std::vector<onnx::NodeProto>& nodes, const std::vector<std::string>& defined_names,
                        const std::string& file, int64_t opset) {
  std::unordered_map<std::string, int> producer;  // value name → node index
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    for (const auto& o : nodes[i].output()) {
      if (!o.empty()) producer.emplace(o, i);
    }
  }
  std::unordered_set<std::string> defined(defined_names.begin(), defined_names.end());
  // Kahn's algorithm, keeping the file's order among ready nodes.
  std::vector<int> missing(nodes.size(), 0);
  std::vector<std::vector<int>> consumers(nodes.size());
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    std::unordered_set<int> waits;
    for (const auto& in : nodes[i].input()) {
      if (in.empty() || defined.count(in)) continue;
      auto it = producer.find(in);
      if (it == producer.end()) {
        const std::string name = nodes[i].name().empty() ? str_cat("#", i) : nodes[i].name();
        return Status::BadInput(str_cat(file, ": node '", name, "' (", nodes[i].op_type(), ", opset ", opset,
                                        "): input '", in, "' is not defined"));
      }
      if (it->second != i && waits.insert(it->second).second) consumers[it->second].push_back(i);
      if (it->second == i) missing[i] = 1 << 30;  // consumes its own output: a cycle
    }
    missing[i] += static_cast<int>(waits.size());
  }
  std::vector<int> order, ready;
  for (int i = static_cast<int>(nodes.size()) - 1; i >= 0; --i) {
    if (missing[i] == 0) ready.push_back(i);
  }
  while (!ready.empty()) {
    // Pop the smallest index so an already-sorted graph keeps its order.
    auto it = std::min_element(ready.begin(), ready.end());
    const int n = *it;
    ready.erase(it);
    order.push_back(n);
    for (int c : consumers[n]) {
      if (--missing[c] == 0) ready.push_back(c);
    }
  }
  if (order.size() != nodes.size()) {
    for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
      if (missing[i] > 0) {
        const std::string name = nodes[i].name().empty() ? str_cat("#", i) : nodes[i].name();
        return Status::BadInput(str_cat(file, ": node '", name, "' (", nodes[i].op_type(), ", opset ", opset,
                                        "): the graph has a cycle through this node"));
      }
    }
  }
  std::vector<onnx::NodeProto> sorted;
  sorted.reserve(nodes.size());
  for (int n : order) sorted.push_back(std::move(nodes[n]));
  nodes = std::move(sorted);
  return Status::Ok();
}

}  // namespace memc
