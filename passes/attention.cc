#include "passes/attention.h"

#include <array>

#include "frontend/fusion.h"
#include "frontend/fusion_util.h"
#include "ir/attention_layout.h"
#include "support/log.h"
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

int count_attention(const Module& m) {
  int n = 0;
  for (NodeId id : m.schedule()) n += m.node(id).op == "attention";
  return n;
}

// ---- layouts: attention reads its operands where the projections wrote them -----------------
// A chain of transposes and reshapes moves elements without changing them. Whether it turns a
// tensor laid out as [B, T, H, E] (or [T, B, H, E]) into the [B, H, T, E] operand is checked
// element by element: each operand coordinate is walked up the chain to the source's, and
// compared with where the layout keeps that element. Exact for any chain, including reshapes
// that merge transposed dims (transformers' [B·H, T, E] views), which no strided view describes.
constexpr size_t kMaxRank = 8;
constexpr int64_t kMaxCheckedElements = int64_t{1} << 24;  // beyond it the chain is left as it is
using Coords = std::array<int64_t, kMaxRank>;

// Coordinates in the input of `n` (a transpose or reshape) of the element at `c` in its output.
void walk_up(const Module& m, const Node& n, Coords& c) {
  const Shape& out = m.value(n.outputs[0]).type.shape;
  const Shape& in = m.value(n.inputs[0]).type.shape;
  if (n.op == "transpose") {
    const std::vector<int64_t> perm = n.attrs.get_ints("perm");
    Coords up{};
    for (size_t i = 0; i < perm.size(); ++i) up[static_cast<size_t>(perm[i])] = c[i];
    c = up;
    return;
  }
  int64_t flat = 0;  // a reshape keeps the row-major order
  for (size_t i = 0; i < out.size(); ++i) flat = flat * out[i] + c[i];
  for (size_t i = in.size(); i-- > 0;) c[i] = flat % in[i], flat /= in[i];
}

int64_t row_major_index(const Shape& shape, const Coords& c) {
  int64_t flat = 0;
  for (size_t i = 0; i < shape.size(); ++i) flat = flat * shape[i] + c[i];
  return flat;
}

// Whether, for every element of value `bottom`, walking `chain` (its producer first, each next
// node producing the previous one's input) up to the top value lands where top_index(top
// coordinates) = expected(bottom coordinates).
template <typename TopIndex, typename ExpectedIndex>
bool chain_maps(const Module& m, const std::vector<const Node*>& chain, ValueId bottom, TopIndex&& top_index, ExpectedIndex&& expected) {
  const Shape& shape = m.value(bottom).type.shape;
  if (shape.size() > kMaxRank) return false;
  for (const Node* n : chain) {
    if (m.value(n->inputs[0]).type.shape.size() > kMaxRank) return false;
  }
  const int64_t count = numel(shape);
  if (count > kMaxCheckedElements || count != m.value(chain.back()->inputs[0]).type.numel()) return false;
  Coords c{};
  for (int64_t f = 0; f < count; ++f) {
    Coords up = c;
    for (const Node* n : chain) walk_up(m, *n, up);
    if (top_index(up) != expected(c)) return false;
    for (size_t i = shape.size(); i-- > 0;) {  // the next coordinates, row-major
      if (++c[i] < shape[i]) break;
      c[i] = 0;
    }
  }
  return true;
}

// Where element (b, h, t, e) of a [B, H, T, E] operand sits in a dense tensor of `layout`.
int64_t layout_index(AttentionLayout layout, const Shape& bhte, const Coords& c) {
  const int64_t b = bhte[0], h = bhte[1], t = bhte[2], e = bhte[3];
  if (layout == AttentionLayout::kBTHD) return ((c[0] * t + c[2]) * h + c[1]) * e + c[3];
  return ((c[2] * b + c[0]) * h + c[1]) * e + c[3];  // tbhd
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
  for (size_t top = chain.size(); top > 0; --top) {
    const std::vector<const Node*> part(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(top));
    const Shape& source = m.value(part.back()->inputs[0]).type.shape;
    if (chain_maps(m, part, x, [&](const Coords& c) { return row_major_index(source, c); },
                   [&](const Coords& c) { return layout_index(layout, bhte, c); })) {
      return part.back()->inputs[0];
    }
  }
  return kNoValue;
}

// The last value of a chain of transposes and reshapes hanging off y (each value's only user)
// that holds y's elements in the order y laid out in `layout` would, or kNoValue.
ValueId output_target(const Module& m, const std::vector<std::vector<NodeId>>& users, ValueId y, AttentionLayout layout) {
  const Shape& bhte = m.value(y).type.shape;
  std::vector<const Node*> chain;  // walking up: the newest value's producer first
  ValueId found = kNoValue;
  for (ValueId v = y; users[v].size() == 1;) {
    const Node& n = m.node(users[v][0]);
    if ((n.op != "transpose" && n.op != "reshape") || n.outputs.size() != 1) break;
    chain.insert(chain.begin(), &n);
    v = n.outputs[0];
    const Shape& shape = m.value(v).type.shape;
    if (chain_maps(m, chain, v, [&](const Coords& c) { return layout_index(layout, bhte, c); },
                   [&](const Coords& c) { return row_major_index(shape, c); })) {
      found = v;
    }
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
bool lay_out(Module& m, NodeId id) {
  const Node& node = m.node(id);
  if (attention_layout_of(node.attrs) != AttentionLayout::kBHTD) return false;
  const Shape& y_shape = m.value(node.outputs[0]).type.shape;
  if (y_shape.size() != 4) return false;
  for (int i = 0; i < 3; ++i) {
    const Shape& s = m.value(node.inputs[i]).type.shape;
    if (s.size() != 4 || s[0] != y_shape[0] || s[1] != y_shape[1]) return false;  // broadcasting stays in bhtd
  }
  const std::vector<std::vector<NodeId>> users = m.users();
  for (const AttentionLayout layout : {AttentionLayout::kBTHD, AttentionLayout::kTBHD}) {
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

int lay_out_attention(Module& forward) {
  const auto transposes = [&] {
    int n = 0;
    for (NodeId id : forward.schedule()) n += forward.node(id).op == "transpose";
    return n;
  };
  const int before = transposes();
  for (NodeId id : forward.schedule()) {
    if (!forward.node(id).dead && forward.node(id).op == "attention") lay_out(forward, id);
  }
  forward.eliminate_dead_nodes();
  forward.compact();
  return before - transposes();
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
  const int before = count_attention(forward);
  make_attention_fusion()->run(forward);
  forward.eliminate_dead_nodes();
  forward.compact();
  r.substituted = count_attention(forward) - before;
  if (layouts_) r.transposes_removed = lay_out_attention(forward);
  r.bytes_after = activation_bytes(forward);
  PassReport report;
  report.changed = r.substituted != 0;
  report.set("substituted", r.substituted);
  report.set("activation_bytes_before", r.bytes_before);
  report.set("activation_bytes_after", r.bytes_after);
  if (layouts_) report.set("transposes_removed", r.transposes_removed);
  report.lines.push_back(str_cat("attention: ", r.substituted, " MatMul→Softmax→MatMul patterns → tiled attention",
                                 layouts_ ? str_cat(", ", r.transposes_removed, " transposes read in place") : std::string(),
                                 "; forward activations ", format_size(r.bytes_before), " → ", format_size(r.bytes_after)));
  return report;
}

}  // namespace memc
