#include "passes/attention.h"

#include <optional>

#include "frontend/fusion.h"
#include "frontend/fusion_util.h"
#include "ir/attention_layout.h"
#include "support/size.h"

namespace memc {
namespace {

int64_t activation_bytes(const Module& m) {
  int64_t total = 0;
  for (NodeId n : m.schedule()) {
    for (ValueId v : m.node(n).outputs) total += m.value(v).role == Role::kActivation ? m.value(v).type.bytes() : 0;
  }
  return total;
}

// ---- layouts: attention reads its operands where the projections wrote them -----------------
// Which elements a chain of transposes and reshapes moves where is tracked symbolically: each
// dim of a value is a list of digits (size, step in the source tensor), major first, as in a
// mixed-radix number. A transpose permutes dims; a reshape regroups the digits in order,
// splitting a digit where a new dim ends inside it (a digit of n steps of s splits into n/k steps
// of k·s and k steps of s). So reshapes that merge transposed dims (transformers' [B·H, T, E]
// views) and split them again are followed exactly; a chain whose sizes do not divide is left
// as it is.
struct Digit {
  int64_t size, step;
};
using Dims = std::vector<std::vector<Digit>>;  // per dim, its digits, major first

Dims dense_dims(const Shape& shape, const std::vector<int64_t>& steps) {
  Dims dims;
  for (size_t i = 0; i < shape.size(); ++i) dims.push_back({Digit{shape[i], steps[i]}});
  return dims;
}

// Applies a transpose or reshape node; false for any other node or sizes that do not divide.
bool apply_view(Dims& dims, const Node& n) {
  if (n.op == "transpose") {
    const std::vector<int64_t> perm = n.attrs.get_ints("perm");
    if (perm.size() != dims.size()) return false;
    Dims out;
    for (int64_t p : perm) out.push_back(dims[static_cast<size_t>(p)]);
    dims = std::move(out);
    return true;
  }
  if (n.op != "reshape") return false;
  std::vector<Digit> digits;  // in order, major first; digits of one element have no step
  for (const auto& dim : dims) {
    for (const Digit& d : dim) {
      if (d.size != 1) digits.push_back(d);
    }
  }
  Dims out;
  size_t i = 0;
  for (const int64_t size : n.attrs.get_ints("shape")) {
    std::vector<Digit> dim;
    for (int64_t need = size; need > 1;) {
      if (i == digits.size()) return false;
      Digit& d = digits[i];
      if (d.size <= need) {
        if (need % d.size != 0) return false;
        dim.push_back(d);
        need /= d.size;
        ++i;
      } else {  // the dim ends inside d: its major part goes here, the rest stays
        if (d.size % need != 0) return false;
        dim.push_back(Digit{need, d.step * (d.size / need)});
        d.size /= need;
        need = 1;
      }
    }
    out.push_back(std::move(dim));
  }
  if (i != digits.size()) return false;
  dims = std::move(out);
  return true;
}

// A dim's digits as one step (0 for a dim of one element), when they form one.
std::optional<int64_t> single_step(const std::vector<Digit>& dim) {
  std::optional<int64_t> step;
  int64_t next = 0;  // the step the next (more major) digit must have
  for (size_t k = dim.size(); k-- > 0;) {
    const Digit& d = dim[k];
    if (d.size == 1) continue;
    if (step && d.step != next) return std::nullopt;
    if (!step) step = d.step;
    next = d.step * d.size;
  }
  return step.value_or(0);
}

// The steps of [B, H, T, E]'s dims when the tensor is laid out densely in `layout`.
std::vector<int64_t> layout_steps(AttentionLayout layout, const Shape& bhte) {
  const std::array<int64_t, 4> s = attention_steps(layout, bhte[0], bhte[1], bhte[2], bhte[3]);
  return {s.begin(), s.end()};
}

// Whether dims has these steps (dims of one element match any).
bool has_steps(const Dims& dims, const Shape& shape, const std::vector<int64_t>& steps) {
  for (size_t i = 0; i < dims.size(); ++i) {
    const std::optional<int64_t> step = single_step(dims[i]);
    if (!step || (shape[i] != 1 && *step != steps[i])) return false;
  }
  return true;
}

// An operand [B, H, T, E] that a chain of transposes and reshapes made from a tensor holding it
// densely in `layout`: that tensor (the longest such chain's top), or kNoValue.
ValueId operand_source(const Module& m, ValueId x, AttentionLayout layout) {
  std::vector<const Node*> chain;  // producers from x upwards
  for (ValueId v = x; const Node* n = fusion::producer(m, v);) {
    if (n->op != "transpose" && n->op != "reshape") break;
    chain.push_back(n);
    v = n->inputs[0];
  }
  const Shape& bhte = m.value(x).type.shape;
  const std::vector<int64_t> want = layout_steps(layout, bhte);
  for (size_t top = chain.size(); top > 0; --top) {
    const ValueId source = chain[top - 1]->inputs[0];
    const Shape& shape = m.value(source).type.shape;
    if (numel(shape) != numel(bhte)) continue;
    Dims dims = dense_dims(shape, row_major_strides(shape));
    bool ok = true;
    for (size_t i = top; ok && i > 0; --i) ok = apply_view(dims, *chain[i - 1]);
    if (ok && has_steps(dims, bhte, want)) return source;
  }
  return kNoValue;
}

// The last value of a chain of transposes and reshapes hanging off y (each value's only user)
// that holds y's elements in the order y laid out in `layout` would, or kNoValue.
ValueId output_target(const Module& m, const Users& users, ValueId y, AttentionLayout layout) {
  const Shape& bhte = m.value(y).type.shape;
  Dims dims = dense_dims(bhte, layout_steps(layout, bhte));
  ValueId found = kNoValue;
  for (ValueId v = y; users[v].size() == 1;) {
    const Node& n = m.node(users[v][0]);
    if (n.outputs.size() != 1 || !apply_view(dims, n)) break;
    v = n.outputs[0];
    const Shape& shape = m.value(v).type.shape;
    if (has_steps(dims, shape, row_major_strides(shape))) found = v;
  }
  return found;
}

// `value` as `shape`: itself when it has that shape, else a reshape scheduled before `anchor`.
ValueId reshaped(Module& m, ValueId value, const Shape& shape, NodeId anchor, const std::string& source) {
  if (m.value(value).type.shape == shape) return value;
  Attrs a;
  a.set("shape", std::vector<int64_t>(shape.begin(), shape.end()));
  const std::vector<ValueId> out = fusion::add_before(m, anchor, "reshape", {value}, std::move(a), source);
  return out.empty() ? kNoValue : out[0];
}

// Rewrites attention node `id` (default layout, [B, H, T, E] operands of its own) to read q, k
// and v where transposes came from, in the one layout all three share, and to write its output
// where the transposes after it lead. False: left as it was.
bool lay_out(Module& m, NodeId id, AttentionLayouts allowed) {
  const Node& node = m.node(id);
  if (attention_layout_of(node.attrs) != AttentionLayout::kBHTD) return false;
  const Shape& y_shape = m.value(node.outputs[0]).type.shape;
  if (y_shape.size() != 4) return false;
  for (int i = 0; i < 3; ++i) {
    const Shape& s = m.value(node.inputs[i]).type.shape;
    if (s.size() != 4 || s[0] != y_shape[0] || s[1] != y_shape[1]) return false;  // broadcasting stays in bhtd
  }
  const Users users = m.users();
  for (const AttentionLayout layout : {AttentionLayout::kBTHD, AttentionLayout::kTBHD}) {
    if (layout == AttentionLayout::kBTHD && allowed != AttentionLayouts::kAll) continue;
    ValueId sources[3];
    bool all = true;
    for (int i = 0; i < 3 && all; ++i) all = (sources[i] = operand_source(m, node.inputs[i], layout)) != kNoValue;
    if (!all) continue;
    const std::string source = node.source;
    const Shape batch{y_shape[0], y_shape[1]};
    std::vector<ValueId> inputs;
    for (int i = 0; i < 3; ++i) {
      const AttentionOperand x = attention_operand_of(AttentionLayout::kBHTD, m.value(m.node(id).inputs[i]).type.shape);
      inputs.push_back(reshaped(m, sources[i], attention_operand_shape(layout, batch, x.t, x.e), id, source));
      if (inputs.back() == kNoValue) return false;
    }
    if (m.node(id).inputs.size() >= 4) inputs.push_back(m.node(id).inputs[3]);
    Attrs attrs = m.node(id).attrs;
    attrs.set("layout", std::string(attention_layout_name(layout)));
    const std::vector<ValueId> out = fusion::add_before(m, id, "attention", inputs, std::move(attrs), source);
    if (out.empty()) return false;
    const ValueId y = m.node(id).outputs[0];
    if (const ValueId target = output_target(m, users, y, layout); target != kNoValue) {
      const ValueId r = reshaped(m, out[0], m.value(target).type.shape, m.value(target).producer, source);
      if (r == kNoValue) return false;
      m.replace_all_uses(target, r);
    } else {  // the consumers read y in the default layout
      Attrs t;
      t.set("perm", layout == AttentionLayout::kBTHD ? std::vector<int64_t>{0, 2, 1, 3} : std::vector<int64_t>{1, 2, 0, 3});
      const std::vector<ValueId> back = fusion::add_before(m, id, "transpose", {out[0]}, std::move(t), source);
      if (back.empty()) return false;
      m.replace_all_uses(y, back[0]);
    }
    m.node(id).dead = true;
    return true;
  }
  return false;
}

}  // namespace

int lay_out_attention(Module& forward, AttentionLayouts layouts) {
  if (layouts == AttentionLayouts::kNone) return 0;
  const int before = count_op(forward, "transpose");
  for (NodeId id : forward.schedule()) {
    if (!forward.node(id).dead && forward.node(id).op == "attention") lay_out(forward, id, layouts);
  }
  forward.eliminate_dead_nodes();
  forward.compact();
  return before - count_op(forward, "transpose");
}

Expected<AttentionKernel> parse_attention_kernel(std::string_view name) {
  if (name == "tiled") return AttentionKernel::kTiled;
  if (name == "naive") return AttentionKernel::kNaive;
  return Status::BadInput(str_cat("--attention '", name, "': tiled (memory-efficient, the default) or naive"));
}

std::string_view attention_kernel_name(AttentionKernel kernel) { return kernel == AttentionKernel::kTiled ? "tiled" : "naive"; }

Expected<PassReport> AttentionPass::run(Module& forward) {
  AttentionReport r;
  r.bytes_before = activation_bytes(forward);
  const int before = count_op(forward, "attention");
  make_attention_fusion()->run(forward);
  forward.eliminate_dead_nodes();
  forward.compact();
  r.substituted = count_op(forward, "attention") - before;
  const bool layouts = layouts_ != AttentionLayouts::kNone;
  if (layouts) r.transposes_removed = lay_out_attention(forward, layouts_);
  r.bytes_after = activation_bytes(forward);
  PassReport report;
  report.changed = r.substituted != 0;
  report.set("substituted", r.substituted);
  report.set("activation_bytes_before", r.bytes_before);
  report.set("activation_bytes_after", r.bytes_after);
  if (layouts) report.set("transposes_removed", r.transposes_removed);
  report.lines.push_back(str_cat("attention: ", r.substituted, " MatMul→Softmax→MatMul patterns → tiled attention",
                                 layouts ? str_cat(", ", r.transposes_removed, " transposes read in place") : std::string(),
                                 "; forward activations ", format_size(r.bytes_before), " → ", format_size(r.bytes_after)));
  return report;
}

}  // namespace memc
