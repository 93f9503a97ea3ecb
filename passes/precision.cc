#include "passes/precision.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "ir/grad.h"
#include "ir/op_registry.h"
#include "support/size.h"

namespace memc {
namespace {

// What dtype a node's float inputs should have under a mixed mode (autocast's op lists).
enum class Policy { kLow, kF32, kPromote };

Policy mixed_policy(const Node& node) {
  static const std::set<std::string> low = {"matmul", "linear", "conv", "attention"};
  // Range-hungry ops: softmax and layernorm statistics, reductions, exp/log family.
  static const std::set<std::string> f32 = {"softmax", "log_softmax", "layernorm", "softmax_cross_entropy", "exp",
                                            "log", "pow", "rsqrt", "reciprocal", "softplus"};
  if (low.count(node.op)) return Policy::kLow;
  if (f32.count(node.op)) return Policy::kF32;
  const OpDef* def = node.def;
  if (def && (def->flags & kOpReduction) && node.op != "argmax" && node.op != "argmin") return Policy::kF32;
  return Policy::kPromote;
}

bool is_f32_or(DType t, DType low) { return t == DType::kF32 || t == low; }

int64_t float_bytes(const Module& m) {
  std::set<ValueId> live;
  for (ValueId a : m.arguments()) live.insert(a);
  for (NodeId n : m.schedule()) {
    for (ValueId v : m.node(n).outputs) live.insert(v);
  }
  int64_t bytes = 0;
  for (ValueId v : live) {
    if (is_float(m.value(v).type.dtype)) bytes += m.value(v).type.bytes();
  }
  return bytes;
}

// Re-runs a node's shape function on its (possibly retyped) inputs and stores the results.
Status reinfer(Module& m, NodeId id, int64_t& retyped) {
  Node& node = m.node(id);
  std::vector<TensorType> types;
  std::vector<bool> present;
  for (ValueId v : node.inputs) {
    present.push_back(v != kNoValue);
    if (v != kNoValue) types.push_back(m.value(v).type);
  }
  std::vector<TensorType> out;
  MEMC_RETURN_IF_ERROR(infer_types(node, types, present, out).with_context(
      str_cat("precision: node '", node.op, "' (", node.source, "): ")));
  MEMC_CHECK(out.size() == node.outputs.size(), "precision: ", node.op, " output count changed");
  for (size_t i = 0; i < out.size(); ++i) {
    Value& v = m.value(node.outputs[i]);
    if (v.type != out[i]) ++retyped, v.type = out[i];
  }
  return Status::Ok();
}

// An f32 constant in `low`, finite values clamped to its finite range: exporters bake
// torch.finfo(f32).min into attention masks, which would round to -inf (and 0·-inf = NaN);
// torch under bf16-true computes finfo(bf16).min instead, the value this yields.
Tensor narrow_constant(const Tensor& t, DType low) {
  const float max_finite = low == DType::kF16 ? 65504.0f : bf16_to_f32(0x7F7F);
  Tensor clamped = t.clone();
  float* data = clamped.data<float>();
  for (int64_t i = 0; i < clamped.numel(); ++i) {
    if (std::isfinite(data[i])) data[i] = std::clamp(data[i], -max_finite, max_finite);
  }
  return clamped.cast(low);
}

// *-true: f32 sources (arguments, constants, full, casts to f32) become `low`; every node's
// types then follow from its inputs.
Status make_pure(Module& m, DType low, PrecisionReport& report) {
  const std::string low_name(dtype_name(low));
  for (ValueId a : m.arguments()) {
    Value& v = m.value(a);
    if (v.type.dtype != DType::kF32 || (v.role != Role::kParam && v.role != Role::kInput)) continue;
    v.type.dtype = low;
    ++report.values_retyped;
    if (auto w = m.weights().find(a); w != m.weights().end()) w->second = w->second.cast(low);
  }
  for (NodeId id : m.schedule()) {
    Node& node = m.node(id);
    if (node.op == "constant") {
      const Tensor* t = node.attrs.get_tensor("value");
      if (t && t->dtype() == DType::kF32) node.attrs.set("value", narrow_constant(*t, low));
    } else if (node.op == "cast" && node.attrs.get_string("to", "") == "f32") {
      node.attrs.set("to", low_name);
    } else if (node.op == "full" && node.attrs.get_string("dtype", "f32") == "f32") {
      node.attrs.set("dtype", low_name);
    }
    MEMC_RETURN_IF_ERROR(reinfer(m, id, report.values_retyped));
  }
  return Status::Ok();
}

// A scalar or a vector along one axis ([C], [C, 1, 1]: a per-channel scale or shift, a bias) in
// f32 meets a larger 16-bit activation: the node computes in the 16-bit type, the vector cast
// to it (a scalar does not promote in PyTorch either, and a BatchNorm reads f32 statistics with
// 16-bit data), rather than promoting the activation to an f32 copy.
bool f32_inputs_are_vectors(const Module& m, const Node& node, DType low) {
  int64_t largest_low = 0;
  for (ValueId v : node.inputs)
    if (v != kNoValue && m.value(v).type.dtype == low) largest_low = std::max(largest_low, m.value(v).type.numel());
  for (ValueId v : node.inputs) {
    if (v == kNoValue || m.value(v).type.dtype != DType::kF32) continue;
    const Shape& s = m.value(v).type.shape;
    if (std::count_if(s.begin(), s.end(), [](int64_t d) { return d != 1; }) > 1 || m.value(v).type.numel() >= largest_low) return false;
  }
  return true;
}

// Mixed: casts in front of each node whose inputs want another dtype, one cast per (value,
// dtype), placed right before its first user.
Status make_mixed(Module& m, DType low, PrecisionReport& report) {
  std::map<std::pair<ValueId, DType>, ValueId> casts;
  std::vector<NodeId> order;
  for (NodeId id : m.schedule()) {
    const Policy policy = mixed_policy(m.node(id));
    bool has_low = false, has_f32 = false;
    for (ValueId v : m.node(id).inputs) {
      if (v == kNoValue) continue;
      has_low |= m.value(v).type.dtype == low;
      has_f32 |= m.value(v).type.dtype == DType::kF32;
    }
    std::optional<DType> want;
    if (policy == Policy::kLow) want = low;
    if (policy == Policy::kF32) want = DType::kF32;
    if (policy == Policy::kPromote && has_low && has_f32) want = f32_inputs_are_vectors(m, m.node(id), low) ? low : DType::kF32;
    // attention's additive bias (masks of -finfo.max) keeps its dtype: the kernel reads it as is.
    const size_t cast_inputs = m.node(id).op == "attention" ? 3 : m.node(id).inputs.size();
    for (size_t i = 0; want && i < std::min(cast_inputs, m.node(id).inputs.size()); ++i) {
      const ValueId v = m.node(id).inputs[i];
      if (v == kNoValue || m.value(v).type.dtype == *want || !is_f32_or(m.value(v).type.dtype, low)) continue;
      auto [it, fresh] = casts.try_emplace({v, *want}, kNoValue);
      if (fresh) {
        // An f32 constant becomes a 16-bit constant, clamped as in *-true (a mask's
        // finfo(f32).min cast at run time is -inf, and a fully masked row's softmax NaN).
        const NodeId producer = m.value(v).producer;
        const Tensor* constant = producer != kNoNode && m.node(producer).op == "constant" ? m.node(producer).attrs.get_tensor("value") : nullptr;
        std::vector<ValueId> out;
        if (constant && constant->dtype() == DType::kF32 && *want == low) {
          out = {m.add_constant(narrow_constant(*constant, low), "")};
          m.node(m.value(out[0]).producer).source = "precision";
        } else {
          MEMC_ASSIGN_OR_RETURN(out, m.add_node("cast", {v}, make_attrs({{"to", std::string(dtype_name(*want))}}), "precision"));
        }
        it->second = out[0];
        m.rename(out[0], m.value(v).name + "." + std::string(dtype_name(*want)));
        order.push_back(m.value(out[0]).producer);
        ++report.casts_inserted;
      }
      m.node(id).inputs[i] = it->second;
    }
    MEMC_RETURN_IF_ERROR(reinfer(m, id, report.values_retyped));
    order.push_back(id);
  }
  m.set_schedule(order);
  return Status::Ok();
}

// Module outputs keep their f32 interface.
Status restore_outputs(Module& m, PrecisionReport& report) {
  std::vector<ValueId> outputs = m.outputs();
  const std::vector<ValueId> updates = m.output_updates();
  for (ValueId& v : outputs) {
    const DType t = m.value(v).type.dtype;
    if (t != DType::kBF16 && t != DType::kF16) continue;
    MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> out, m.add_node("cast", {v}, make_attrs({{"to", std::string("f32")}}), "precision"));
    m.rename(out[0], m.value(v).name + ".f32");
    v = out[0];
    ++report.casts_inserted;
  }
  m.set_outputs(outputs);
  for (size_t i = 0; i < updates.size(); ++i) {
    if (updates[i] != kNoValue) m.set_output_update(i, updates[i]);
  }
  return Status::Ok();
}

}  // namespace

namespace {
struct PrecisionSpelling {
  PrecisionKind kind;
  std::string_view name;
};
constexpr PrecisionSpelling kPrecisions[] = {{PrecisionKind::kFp32, "fp32"},
                                             {PrecisionKind::kBf16Mixed, "bf16-mixed"},
                                             {PrecisionKind::kFp16Mixed, "fp16-mixed"},
                                             {PrecisionKind::kBf16True, "bf16-true"},
                                             {PrecisionKind::kFp16True, "fp16-true"}};
}  // namespace

Expected<PrecisionKind> parse_precision(std::string_view name) {
  for (const PrecisionSpelling& p : kPrecisions) {
    if (p.name == name) return p.kind;
  }
  return Status::BadInput(str_cat("unknown --precision '", name, "' (fp32, bf16-mixed, fp16-mixed, bf16-true, fp16-true)"));
}

std::string_view precision_name(PrecisionKind kind) {
  for (const PrecisionSpelling& p : kPrecisions) {
    if (p.kind == kind) return p.name;
  }
  return "?";
}

std::optional<PrecisionMode> precision_mode(PrecisionKind kind) {
  switch (kind) {
    case PrecisionKind::kFp32: return std::nullopt;
    case PrecisionKind::kBf16True: return PrecisionMode{DType::kBF16, true};
    case PrecisionKind::kFp16True: return PrecisionMode{DType::kF16, true};
    case PrecisionKind::kBf16Mixed: return PrecisionMode{DType::kBF16, false};
    case PrecisionKind::kFp16Mixed: return PrecisionMode{DType::kF16, false};
  }
  return std::nullopt;
}

std::string precision_summary(PrecisionKind kind, const PrecisionReport& r) {
  return str_cat("precision ", precision_name(kind), ": ", r.casts_inserted, " casts inserted, ", r.values_retyped, " values retyped, float values ",
                 format_size(r.float_bytes_before), " -> ", format_size(r.float_bytes_after));
}

Expected<PassReport> Precision::run(Module& module) {
  const std::optional<PrecisionMode> mode = precision_mode(options_.mode);
  PrecisionReport& r = details_;
  r = {};
  r.float_bytes_before = r.float_bytes_after = float_bytes(module);
  if (mode) {
    if (mode->pure) {
      MEMC_RETURN_IF_ERROR(make_pure(module, mode->low, r));
    } else {
      MEMC_RETURN_IF_ERROR(make_mixed(module, mode->low, r));
    }
    MEMC_RETURN_IF_ERROR(restore_outputs(module, r));
    r.float_bytes_after = float_bytes(module);
  }
  PassReport report;
  report.changed = r.casts_inserted > 0 || r.values_retyped > 0;
  report.set("casts_inserted", r.casts_inserted);
  report.set("values_retyped", r.values_retyped);
  report.set("float_bytes_before", r.float_bytes_before);
  report.set("float_bytes_after", r.float_bytes_after);
  report.lines.push_back(precision_summary(options_.mode, r));
  return report;
}

}  // namespace memc
