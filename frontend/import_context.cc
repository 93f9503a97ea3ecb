#include "frontend/import_context.h"

#include <cmath>
#include <limits>

#include "frontend/fold.h"
#include "frontend/onnx_tensor.h"
#include "frontend/param_audit.h"
#include "ir/op_registry.h"

namespace memc {

ValueId ImportContext::lookup(const std::string& onnx_name) const {
  auto it = names_.find(onnx_name);
  return it == names_.end() ? kNoValue : it->second;
}

const Tensor* ImportContext::constant_of(ValueId v) const {
  auto it = constants_.find(v);
  return it == constants_.end() ? nullptr : &it->second;
}

ValueId ImportContext::constant(Tensor value, const std::string& name_hint) {
  Tensor copy = value;
  ValueId id = module_.add_constant(std::move(value), name_hint);
  constants_[id] = std::move(copy);
  return id;
}

ValueId ImportContext::scalar(double v, DType dtype) {
  Tensor t = Tensor::zeros(dtype, {});
  t.set_from_double(0, v);
  return constant(std::move(t));
}

void ImportContext::begin_node(const onnx::NodeProto* node, int index) {
  node_ = node;
  node_index_ = index;
  // The dynamo exporter's node names say nothing of where a node is ("node_linear_3"); its
  // metadata names the module, which -v, errors and remat's blocks (passes/remat.cc) read.
  const std::string scope = module_scope(*node);
  source_ = str_cat(node->name().empty() ? str_cat("#", index) : node->name(), " (", node->op_type(), ")", scope.empty() ? "" : " in " + scope);
}

Status ImportContext::error(const std::string& msg) const {
  if (!node_) return Status::BadInput(str_cat(file_, ": ", msg));
  const std::string name = node_->name().empty() ? str_cat("#", node_index_) : node_->name();
  return Status::BadInput(str_cat(file_, ": node '", name, "' (", node_->op_type(), ", opset ", opset_, "): ", msg));
}

Expected<ValueId> ImportContext::input(int i) const {
  if (!has_input(i)) return error(str_cat("missing input ", i));
  ValueId v = lookup(node_->input(i));
  if (v == kNoValue) return error(str_cat("input '", node_->input(i), "' is not defined"));
  return v;
}

const Tensor* ImportContext::input_constant(int i) const {
  if (!has_input(i)) return nullptr;
  ValueId v = lookup(node_->input(i));
  return v == kNoValue ? nullptr : constant_of(v);
}

Expected<std::vector<int64_t>> ImportContext::input_ints(int i, const char* what) const {
  MEMC_ASSIGN_OR_RETURN(ValueId v, input(i));
  const Tensor* t = constant_of(v);
  if (!t) return error(str_cat(what, " ('", node_->input(i), "') depends on runtime data; memc needs it static"));
  if (!is_integer(t->dtype())) return error(str_cat(what, " must be an integer tensor"));
  if (t->rank() > 1) return error(str_cat(what, " must be a scalar or 1-D"));
  std::vector<int64_t> out;
  for (int64_t k = 0; k < t->numel(); ++k) out.push_back(t->get_as_int(k));
  return out;
}

Expected<double> ImportContext::input_scalar(int i, const char* what) const {
  MEMC_ASSIGN_OR_RETURN(ValueId v, input(i));
  const Tensor* t = constant_of(v);
  if (!t) return error(str_cat(what, " depends on runtime data; memc needs it static"));
  if (t->numel() != 1) return error(str_cat(what, " must hold one value"));
  return t->get_as_double(0);
}

const onnx::AttributeProto* ImportContext::attr(const std::string& name) const {
  for (const auto& a : node_->attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

int64_t ImportContext::attr_int(const std::string& name, int64_t fallback) const {
  const auto* a = attr(name);
  if (!a) return fallback;
  if (a->type() == onnx::AttributeProto::FLOAT || (!a->has_i() && a->has_f())) {
    const double f = a->f();
    return std::isfinite(f) && std::abs(f) < 9e18 ? static_cast<int64_t>(f) : fallback;
  }
  return a->i();
}

double ImportContext::attr_float(const std::string& name, double fallback) const {
  const auto* a = attr(name);
  if (!a) return fallback;
  if (a->type() == onnx::AttributeProto::INT) return static_cast<double>(a->i());
  return a->f();
}

std::string ImportContext::attr_string(const std::string& name, const std::string& fallback) const {
  const auto* a = attr(name);
  return a ? a->s() : fallback;
}

Expected<DType> ImportContext::attr_dtype(const std::string& name, DType fallback) const {
  const auto* a = attr(name);
  if (!a) return fallback;
  auto dtype = dtype_from_onnx(static_cast<int>(a->i()));
  if (!dtype.ok()) return error(dtype.status().message());
  return *dtype;
}

std::vector<int64_t> ImportContext::attr_ints(const std::string& name, std::vector<int64_t> fallback) const {
  const auto* a = attr(name);
  if (!a) return fallback;
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

Expected<std::vector<ValueId>> ImportContext::emit_multi(const std::string& op, std::vector<ValueId> inputs,
                                                         Attrs attrs, int num_outputs) {
  auto outs = module_.add_node(op, inputs, attrs, source_, num_outputs);
  if (!outs.ok()) return error(outs.status().message());
  const NodeId producer = module_.value(outs->front()).producer;
  // Fold when every input is known (never the random ops).
  const OpDef* def = OpRegistry::get().find(op);
  bool all_known = !inputs.empty() && def && !(def->flags & kOpRandom);
  std::vector<const Tensor*> known;
  for (ValueId v : inputs) {
    const Tensor* t = v == kNoValue ? nullptr : constant_of(v);
    if (v != kNoValue && !t) all_known = false;
    known.push_back(t);
  }
  if (!all_known) return outs;
  std::vector<TensorType> types;
  for (ValueId v : *outs) types.push_back(module_.value(v).type);
  auto folded = fold_node(module_.node(producer), known, types);
  if (!folded.ok()) return outs;  // stays a runtime node
  module_.node(producer).dead = true;
  std::vector<ValueId> result;
  for (Tensor& t : *folded) result.push_back(constant(std::move(t)));
  return result;
}

Expected<ValueId> ImportContext::emit(const std::string& op, std::vector<ValueId> inputs, Attrs attrs) {
  MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> outs, emit_multi(op, std::move(inputs), std::move(attrs), -1));
  return outs.front();
}

Expected<ValueId> ImportContext::reshape(ValueId x, const Shape& shape) {
  if (type(x).shape == shape) return x;
  Attrs a;
  a.set("shape", std::vector<int64_t>(shape));
  return emit("reshape", {x}, std::move(a));
}

Expected<ValueId> ImportContext::transpose(ValueId x, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity && perm.size() == type(x).shape.size()) return x;
  Attrs a;
  a.set("perm", std::vector<int64_t>(perm));
  return emit("transpose", {x}, std::move(a));
}

Expected<ValueId> ImportContext::cast(ValueId x, DType to) {
  if (type(x).dtype == to) return x;
  Attrs a;
  a.set("to", std::string(dtype_name(to)));
  return emit("cast", {x}, std::move(a));
}

Expected<ValueId> ImportContext::ones(const Shape& shape, DType dtype) {
  Attrs fill;
  fill.set("shape", shape);
  fill.set("dtype", std::string(dtype_name(dtype)));
  fill.set("value", 1.0);
  return emit("full", {}, std::move(fill));
}

Status ImportContext::bind(int i, ValueId v) {
  if (!has_output(i)) return Status::Ok();
  const std::string& name = node_->output(i);
  if (lookup(name) != kNoValue) return error(str_cat("output '", name, "' is defined twice"));
  Value& value = module_.value(v);
  if (value.source_name.empty() && value.producer != kNoNode && value.role != Role::kConstant) {
    module_.rename(v, name);
    module_.value(v).source_name = name;
  }
  define(name, v);
  return Status::Ok();
}

int64_t ImportContext::normalize_axis(int64_t axis, int64_t rank, bool* ok) const {
  if (axis < 0) axis += rank;
  *ok = axis >= 0 && axis < rank;
  return axis;
}

Expected<int64_t> checked_axis(const ImportContext& ctx, int64_t axis, int64_t rank) {
  bool ok = false;
  const int64_t a = ctx.normalize_axis(axis, rank, &ok);
  if (!ok) return ctx.error(str_cat("axis ", axis, " out of range for rank ", rank));
  return a;
}

Expected<std::vector<int64_t>> checked_axes(const ImportContext& ctx, std::vector<int64_t> axes, int64_t rank) {
  for (int64_t& a : axes) {
    MEMC_ASSIGN_OR_RETURN(a, checked_axis(ctx, a, rank));
  }
  for (size_t i = 0; i < axes.size(); ++i) {
    for (size_t j = i + 1; j < axes.size(); ++j) {
      if (axes[i] == axes[j]) return ctx.error(str_cat("axis ", axes[i], " repeated"));
    }
  }
  return axes;
}

}  // namespace memc
