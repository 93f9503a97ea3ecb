// The verifier as a spec: one pass over the schedule with a "defined" bit per value. Ids are
// bounds-checked before use so a broken module yields a message, never a crash.
#include "ir/verifier.h"

#include <ostream>
#include <unordered_set>

#include "ir/op_registry.h"
#include "ir/printer.h"

namespace memc {
namespace {

constexpr size_t kMaxReported = 20;

// MLIR suffix-id, as the printer needs: digits, or [A-Za-z$._-][A-Za-z0-9$._-]*.
bool printable_name(const std::string& s) {
  if (s.empty()) return false;
  const auto ok = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '$' || c == '.' || c == '_' || c == '-'; };
  const bool all_digits = std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  return all_digits || (!std::isdigit(static_cast<unsigned char>(s[0])) && std::all_of(s.begin(), s.end(), ok));
}

// Where a problem is, for its message: "node <the node printed>" or "argument %x". Printing a
// node is most of the verifier's cost, so a node is printed only when it has a problem.
class Where {
 public:
  explicit Where(std::string text) : text_(std::move(text)) {}
  Where(const Module& m, const Node& node) : module_(&m), node_(&node) {}
  const std::string& str() const {
    if (text_.empty() && node_ != nullptr) text_ = "node " + print_node(*module_, *node_);
    return text_;
  }
  friend std::ostream& operator<<(std::ostream& os, const Where& w) { return os << w.str(); }

 private:
  const Module* module_ = nullptr;
  const Node* node_ = nullptr;
  mutable std::string text_;
};

class Verifier {
 public:
  explicit Verifier(const Module& m) : m_(m), defined_(m.values().size(), false) {}

  Status run() {
    check_arguments();
    std::vector<bool> scheduled(m_.nodes().size(), false);
    for (NodeId n : m_.schedule()) {
      if (n < 0 || static_cast<size_t>(n) >= m_.nodes().size()) {
        report(str_cat("schedule names node ", n, ", which does not exist"));
        continue;
      }
      if (scheduled[n]) report(str_cat("node ", n, " is scheduled twice: ", print_node(m_, m_.node(n))));
      scheduled[n] = true;
      check_node(m_.node(n));
    }
    for (ValueId v : m_.outputs()) {
      if (!valid(v)) report(str_cat("module output ", v, " is not a value"));
      else if (!defined_[v]) report(str_cat("module output %", m_.value(v).name, " is not defined by an argument or a live node"));
    }
    if (problems_.empty()) return Status::Ok();
    std::string message = str_cat("verify: ", problems_.size() == 1 ? "" : str_cat(problems_.size(), " problems:\n"));
    for (size_t i = 0; i < problems_.size(); ++i) message += (i ? "\n" : "") + problems_[i];
    if (dropped_) message += str_cat("\n(", dropped_, " more)");
    return Status::BadInput(message);
  }

 private:
  bool valid(ValueId v) const { return v >= 0 && static_cast<size_t>(v) < m_.values().size(); }
  void report(std::string problem) {
    if (problems_.size() < kMaxReported) problems_.push_back(std::move(problem));
    else ++dropped_;
  }
  // Defines `v`, reporting double definitions and names the text form cannot carry.
  bool define(ValueId v, const Where& where) {
    if (!valid(v)) {
      report(str_cat(where, ": defines value id ", v, ", which does not exist"));
      return false;
    }
    const Value& value = m_.value(v);
    if (defined_[v]) report(str_cat(where, ": %", value.name, " is defined twice"));
    if (value.id != v) report(str_cat(where, ": %", value.name, " has id ", value.id, " at index ", v));
    if (!type_fits_text(value.type)) {
      report(str_cat(where, ": %", value.name, " has type ", type_str(value.type), ", outside what the text form holds"));
    }
    if (!printable_name(value.name)) report(str_cat(where, ": value name '", value.name, "' is not an MLIR suffix-id"));
    else if (!names_.insert(value.name).second && !defined_[v]) report(str_cat(where, ": name %", value.name, " is used by two values"));
    defined_[v] = true;
    return true;
  }

  void check_arguments() {
    for (ValueId v : m_.arguments()) {
      const Where where(valid(v) ? "argument %" + m_.value(v).name : "argument");
      if (!define(v, where)) continue;
      const Value& value = m_.value(v);
      if (value.producer != kNoNode) report(str_cat(where, ": has producer node ", value.producer));
      // Arguments come from outside the step: data, weights, their states, scalars, constants.
      if (value.role == Role::kActivation || value.role == Role::kGrad) {
        report(str_cat(where, ": role ", role_name(value.role), " cannot be a function argument"));
      }
    }
  }

  void check_node(const Node& node) {
    const Where where(m_, node);
    for (const auto& [key, attr] : node.attrs.items()) {
      if (key == kAbsentAttr || key == kResultRolesAttr || key == kResultSpacesAttr || key == kSourceAttr) {
        report(str_cat(where, ": attribute ", key, " is reserved for the text form"));
      }
    }
    const OpDef* def = OpRegistry::get().find(node.op);
    if (!def) report(str_cat(where, ": unknown op memc.", node.op));
    else if (node.def != def) report(str_cat(where, ": holds the registry entry of ", node.def ? "memc." + node.def->name : "no op", ", not of memc.", node.op));
    std::vector<TensorType> input_types;
    std::vector<bool> present;
    bool inputs_ok = true;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId v = node.inputs[i];
      present.push_back(v != kNoValue);
      if (v == kNoValue) continue;
      if (!valid(v)) {
        report(str_cat(where, ": input ", i, " is value id ", v, ", which does not exist"));
        inputs_ok = false;
        continue;
      }
      const Value& value = m_.value(v);
      input_types.push_back(value.type);
      if (defined_[v]) continue;
      inputs_ok = false;
      const bool dead_producer = value.producer >= 0 && static_cast<size_t>(value.producer) < m_.nodes().size() &&
                                 m_.node(value.producer).dead;
      report(str_cat(where, ": input ", i, " %", value.name,
                     dead_producer ? " is produced by a dead node" : " is used before its definition (or never defined)"));
    }
    bool outputs_ok = true;
    for (ValueId v : node.outputs) {
      if (!define(v, where)) {
        outputs_ok = false;
        continue;
      }
      if (m_.value(v).producer != node.id) {
        report(str_cat(where, ": %", m_.value(v).name, " names producer ", m_.value(v).producer, ", not node ", node.id));
      }
    }
    if (inputs_ok && outputs_ok && node.def) check_types(node, where, input_types, present);
    if (inputs_ok && outputs_ok) check_spaces(node, where);
  }

  // A transfer moves its input into the other memory space; nothing else crosses spaces. Its
  // async pair: the start's x and result, the done's pending, x and result.
  void check_spaces(const Node& node, const Where& where) {
    if (!node.def || !(node.def->flags & kOpTransfer)) return;
    const MemSpace to = node.op.starts_with("copy_to_host") ? MemSpace::kHost : MemSpace::kDevice;
    const MemSpace from = to == MemSpace::kHost ? MemSpace::kDevice : MemSpace::kHost;
    const bool done = node.op.ends_with("_done");
    const size_t x = done ? 1 : 0;
    if (node.inputs.size() > x && m_.value(node.inputs[x]).space != from) {
      report(str_cat(where, ": input %", m_.value(node.inputs[x]).name, " is already in ", space_name(to), " memory"));
    }
    if (done && m_.value(node.inputs[0]).space != to) {
      report(str_cat(where, ": pending %", m_.value(node.inputs[0]).name, " is not in ", space_name(to), " memory"));
    }
    for (ValueId v : node.outputs) {
      if (m_.value(v).space != to) report(str_cat(where, ": result %", m_.value(v).name, " is not in ", space_name(to), " memory"));
    }
  }

  void check_types(const Node& node, const Where& where, const std::vector<TensorType>& input_types,
                   const std::vector<bool>& present) {
    std::vector<TensorType> inferred;
    Status st = infer_types(node, input_types, present, inferred);
    if (!st.ok()) {
      report(str_cat(where, ": ", st.message()));
      return;
    }
    if (inferred.size() != node.outputs.size()) {
      report(str_cat(where, ": has ", node.outputs.size(), " results, the op infers ", inferred.size()));
      return;
    }
    for (size_t i = 0; i < inferred.size(); ++i) {
      const Value& out = m_.value(node.outputs[i]);
      if (out.type != inferred[i]) {
        report(str_cat(where, ": result ", i, " %", out.name, " is declared ", type_str(out.type), " but the op infers ",
                       type_str(inferred[i])));
      }
    }
  }

  const Module& m_;
  std::vector<bool> defined_;
  std::unordered_set<std::string> names_;
  std::vector<std::string> problems_;
  size_t dropped_ = 0;
};

}  // namespace

Status verify(const Module& module) { return Verifier(module).run(); }

}  // namespace memc
