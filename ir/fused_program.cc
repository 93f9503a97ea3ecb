#include "ir/fused_program.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "ir/graph.h"
#include "ir/op_registry.h"
#include "ir/ops/ops.h"

namespace memc {

bool is_fusable_op(const std::string& op) {
  static const std::set<std::string> ops = {
      "neg", "abs", "sign", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu", "leaky_relu",
      "erf", "gelu", "floor", "ceil", "round", "sin", "cos", "asin", "acos", "atan", "softplus",
      "add", "sub", "mul", "div", "pow", "max", "min",
      "equal", "less", "less_equal", "greater", "greater_equal", "and", "or", "xor", "not",
      "where", "cast", "gelu_grad", "dropout"};
  return ops.count(op) != 0;
}

bool fused_step_reads_i1(const std::string& op) {
  static const std::set<std::string> ops = {"cast", "where", "not", "equal", "less", "less_equal", "greater", "greater_equal",
                                            "and", "or", "xor"};
  return ops.count(op) != 0;
}

const std::vector<std::string>& fusable_attr_keys(const std::string& op) {
  static const std::vector<std::string> none, gelu = {"approximate"}, leaky = {"alpha"}, cast = {"to"},
                                         dropout = {"ratio", "seed", "rng_offset", "rng_row_stride"};
  if (op == "gelu" || op == "gelu_grad") return gelu;
  if (op == "leaky_relu") return leaky;
  if (op == "cast") return cast;
  if (op == "dropout") return dropout;
  return none;
}

std::string fused_step_attr_text(const std::string& op, const Attrs& attrs) {
  std::string text;
  for (const std::string& key : fusable_attr_keys(op)) {
    const Attr* a = attrs.find(key);
    std::string value;
    if (a == nullptr) continue;
    if (const auto* d = std::get_if<double>(a)) {
      char digits[32];
      std::snprintf(digits, sizeof digits, "%.17g", *d);
      value = digits;
    } else if (const auto* i = std::get_if<int64_t>(a)) {
      value = std::to_string(*i);
    } else if (const auto* str = std::get_if<std::string>(a)) {
      value = *str;
    } else {
      continue;
    }
    text += str_cat(text.empty() ? "" : ";", key, "=", value);
  }
  return text;
}

namespace {

// "key=value;..." into the step's attributes: numbers where the op's kernel reads numbers.
Status parse_step_attr(FusedStep& step) {
  const std::vector<std::string>& keys = fusable_attr_keys(step.op);
  size_t begin = 0;
  while (begin < step.attr_text.size()) {
    size_t end = step.attr_text.find(';', begin);
    if (end == std::string::npos) end = step.attr_text.size();
    const std::string item = step.attr_text.substr(begin, end - begin);
    begin = end + 1;
    const size_t eq = item.find('=');
    const std::string key = eq == std::string::npos ? "" : item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key.empty() || std::find(keys.begin(), keys.end(), key) == keys.end()) {
      return Status::BadInput(str_cat("step ", step.op, ": attribute '", item, "' is not ", step.op, "'s"));
    }
    if (key == "approximate" || key == "to") {
      step.attrs.set(key, value);
      continue;
    }
    char* stop = nullptr;
    const bool integer = key != "alpha" && key != "ratio";
    const double number = std::strtod(value.c_str(), &stop);
    const long long whole = integer ? std::strtoll(value.c_str(), &stop, 10) : 0;
    if (value.empty() || *stop != '\0') return Status::BadInput(str_cat("step ", step.op, ": ", key, " '", value, "' is no number"));
    if (integer) {
      step.attrs.set(key, static_cast<int64_t>(whole));
    } else {
      step.attrs.set(key, number);
    }
  }
  return Status::Ok();
}

}  // namespace

bool fusable_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kBool; }

Expected<FusedProgram> read_fused_program(const Attrs& attrs, int inputs) {
  FusedProgram p;
  p.inputs = inputs;
  const std::vector<std::string> ops = attrs.get_strings("ops"), step_attrs = attrs.get_strings("step_attrs", std::vector<std::string>(ops.size()));
  const std::vector<int64_t> args = attrs.get_ints("args"), results = attrs.get_ints("results");
  if (inputs < 1 || inputs > kFusedMaxInputs) return Status::BadInput(str_cat(inputs, " inputs; a fused node takes 1 to ", kFusedMaxInputs));
  if (ops.empty() || ops.size() > static_cast<size_t>(kFusedMaxSteps)) {
    return Status::BadInput(str_cat(ops.size(), " steps; a fused node has 1 to ", kFusedMaxSteps));
  }
  if (args.size() != 3 * ops.size() || step_attrs.size() != ops.size()) {
    return Status::BadInput(str_cat("args (", args.size(), ") and step_attrs (", step_attrs.size(), ") do not fit ", ops.size(), " steps"));
  }
  for (size_t s = 0; s < ops.size(); ++s) {
    FusedStep step{ops[s], {}, {}, step_attrs[s]};
    if (!is_fusable_op(step.op)) return Status::BadInput(str_cat("step ", s, ": memc.", step.op, " is not fusable"));
    for (int k = 0; k < 3; ++k) {
      const int64_t a = args[3 * s + k];
      if (a < -1 || a >= inputs + static_cast<int64_t>(s)) return Status::BadInput(str_cat("step ", s, " (", step.op, ") reads slot ", a));
      if (a >= 0 && static_cast<int>(step.args.size()) != k) {
        return Status::BadInput(str_cat("step ", s, " (", step.op, "): operand ", k, " follows an unused one"));
      }
      if (a >= 0) step.args.push_back(static_cast<int>(a));
    }
    MEMC_RETURN_IF_ERROR(parse_step_attr(step));
    p.steps.push_back(std::move(step));
  }
  if (std::count(ops.begin(), ops.end(), "dropout") > kFusedMaxDropouts) {
    return Status::BadInput(str_cat("more than ", kFusedMaxDropouts, " dropout steps"));
  }
  if (results.empty() || results.size() > static_cast<size_t>(kFusedMaxResults)) {
    return Status::BadInput(str_cat(results.size(), " results; a fused node has 1 to ", kFusedMaxResults));
  }
  for (int64_t r : results) {
    if (r < inputs || r >= p.slots()) return Status::BadInput(str_cat("result slot ", r, " is no step's"));
    p.results.push_back(static_cast<int>(r));
  }
  return p;
}

void write_fused_program(const FusedProgram& program, Attrs& attrs) {
  std::vector<std::string> ops, step_attrs;
  std::vector<int64_t> args;
  for (const FusedStep& s : program.steps) {
    ops.push_back(s.op);
    step_attrs.push_back(s.attr_text);
    for (int k = 0; k < 3; ++k) args.push_back(k < static_cast<int>(s.args.size()) ? s.args[k] : -1);
  }
  attrs.set("ops", ops);
  attrs.set("args", args);
  attrs.set("step_attrs", step_attrs);
  attrs.set("results", std::vector<int64_t>(program.results.begin(), program.results.end()));
}

Expected<FusedProgram> read_typed_fused_program(const Attrs& attrs, const std::vector<TensorType>& inputs) {
  MEMC_ASSIGN_OR_RETURN(FusedProgram program, read_fused_program(attrs, static_cast<int>(inputs.size())));
  std::vector<TensorType>& types = program.types;
  types = inputs;
  for (size_t s = 0; s < program.steps.size(); ++s) {
    const FusedStep& step = program.steps[s];
    Node node;
    node.op = step.op;
    node.def = OpRegistry::get().find(step.op);
    node.attrs = step.attrs;
    std::vector<TensorType> operands, out;
    for (int a : step.args) {
      if (types[a].dtype == DType::kBool && !fused_step_reads_i1(step.op)) {
        return Status::BadInput(str_cat("step ", s, " (", step.op, ") reads i1 slot ", a, "; it computes on f32, bf16 or f16"));
      }
      operands.push_back(types[a]);
    }
    Status st = infer_types(node, operands, std::vector<bool>(operands.size(), true), out);
    if (!st.ok()) return st.with_context(str_cat("step ", s, ": "));
    if (out.size() != 1) return Status::BadInput(str_cat("step ", s, " (", step.op, ") has ", out.size(), " results"));
    types.push_back(out[0]);
  }
  const Shape& shape = types[program.results[0]].shape;
  for (size_t i = 0; i < types.size(); ++i) {
    if (!fusable_dtype(types[i].dtype)) return Status::BadInput(str_cat("slot ", i, " is ", dtype_name(types[i].dtype), ", not f32, bf16, f16 or i1"));
    auto b = broadcast_shapes(types[i].shape, shape);
    if (!b.ok() || *b != shape) return Status::BadInput(str_cat("slot ", i, " (", type_str(types[i]), ") does not broadcast to ", shape_str(shape)));
  }
  for (int r : program.results) {
    if (types[r].shape != shape) return Status::BadInput(str_cat("result slot ", r, " is ", shape_str(types[r].shape), ", not ", shape_str(shape)));
  }
  // A dropout step draws the counter of the node's element i for its own element i.
  for (size_t s = 0; s < program.steps.size(); ++s) {
    const FusedStep& step = program.steps[s];
    if (step.op == "dropout" && types[step.args[0]].shape != shape) {
      return Status::BadInput(str_cat("step ", s, " (dropout) reads ", shape_str(types[step.args[0]].shape), ", not the node's ", shape_str(shape)));
    }
  }
  return program;
}

std::string fused_program_text(const FusedProgram& program) {
  std::string text;
  for (size_t s = 0; s < program.steps.size(); ++s) {
    const FusedStep& step = program.steps[s];
    if (s) text += "; ";
    text += str_cat("%", program.inputs + static_cast<int>(s), " = ", step.op, step.attr_text.empty() ? "" : "{" + step.attr_text + "}", "(");
    for (size_t k = 0; k < step.args.size(); ++k) text += str_cat(k ? ", %" : "%", step.args[k]);
    text += ")";
  }
  return text;
}

}  // namespace memc
