#include "passes/add_layernorm.h"

#include "frontend/fusion_util.h"

namespace memc {
namespace {

bool row_kernel_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// `v` is read by `reader` alone (live nodes, once), and is no output of the step.
bool read_only_by(const Module& m, const Users& users, ValueId v, NodeId reader) {
  return fusion::only_reader(m, users, v) == &m.node(reader);
}

// An add of two operands of its own type (no broadcast), in a dtype the row kernels take.
bool plain_add(const Module& m, const Node& n) {
  if (n.dead || n.op != "add" || n.inputs.size() != 2 || n.outputs.size() != 1 || n.inputs[0] == n.inputs[1]) return false;
  const TensorType& t = m.value(n.outputs[0]).type;
  return row_kernel_dtype(t.dtype) && m.value(n.inputs[0]).type == t && m.value(n.inputs[1]).type == t;
}

// add_layernorm's (x, r) for the add `a`: r is a cast's input where only the add reads that cast
// (the kernel rounds r as the cast did), and x first is an operand computed in the step that
// nothing else reads, so the sum may take its buffer. `absorbed` is the cast's node, or kNoNode.
std::pair<ValueId, ValueId> operands(const Module& m, const Users& users, const Node& a, NodeId& absorbed) {
  absorbed = kNoNode;
  for (int i = 0; i < 2; ++i) {
    const Node* c = fusion::producer_if(m, a.inputs[i], "cast");
    if (c && c->inputs.size() == 1 && row_kernel_dtype(m.value(c->inputs[0]).type.dtype) &&
        m.value(c->inputs[0]).type.shape == m.value(a.inputs[i]).type.shape && read_only_by(m, users, a.inputs[i], a.id)) {
      absorbed = c->id;
      return {a.inputs[1 - i], c->inputs[0]};
    }
  }
  auto reusable = [&](ValueId v) { return m.value(v).producer != kNoNode && read_only_by(m, users, v, a.id); };
  if (!reusable(a.inputs[0]) && reusable(a.inputs[1])) return {a.inputs[1], a.inputs[0]};
  return {a.inputs[0], a.inputs[1]};
}

// The cast that alone reads y (f32) and narrows it to bf16 or f16 (a 16-bit GEMM's input), or
// kNoNode: add_layernorm then stores y as the cast would, and no f32 y is written.
NodeId narrowing_reader(const Module& m, const Users& users, ValueId y) {
  const Node* cast = fusion::only_reader(m, users, y);
  if (!cast || cast->op != "cast" || cast->inputs.size() != 1 || m.value(y).type.dtype != DType::kF32) return kNoNode;
  return is_16bit_float(m.value(cast->outputs[0]).type.dtype) ? cast->id : kNoNode;
}

// Whether every node of a match is fresh in the walk; where one is not, the match waits for the
// next walk.
bool all_fresh(fusion::Walk& walk, const Module& m, std::initializer_list<NodeId> nodes) {
  for (NodeId n : nodes) {
    if (n != kNoNode && !walk.fresh(m, n)) {
      walk.defer();
      return false;
    }
  }
  return true;
}

// s = add(x, r) normalized by layernorm `l` (whose mean and 1/std nothing reads) → add_layernorm.
bool fuse_forward(Module& m, fusion::Walk& walk, NodeId l) {
  const Node& ln = m.node(l);
  if (ln.dead || ln.op != "layernorm" || ln.inputs.empty()) return false;
  if (!all_fresh(walk, m, {l})) return false;
  const Users& users = walk.users();
  for (size_t i = 1; i < ln.outputs.size(); ++i) {
    for (NodeId u : users[ln.outputs[i]]) {
      if (!m.node(u).dead) return false;
    }
    if (fusion::is_output(m, ln.outputs[i])) return false;
  }
  const Node* add = fusion::producer(m, ln.inputs[0]);
  if (!add || !plain_add(m, *add)) return false;
  if (!all_fresh(walk, m, {add->id, m.value(add->inputs[0]).producer, m.value(add->inputs[1]).producer})) return false;
  NodeId cast = kNoNode;
  const auto [x, r] = operands(m, users, *add, cast);
  std::vector<ValueId> inputs = {x, r};
  inputs.insert(inputs.end(), ln.inputs.begin() + 1, ln.inputs.end());
  const NodeId narrow = narrowing_reader(m, users, ln.outputs[0]);
  if (!all_fresh(walk, m, {cast, narrow})) return false;
  const NodeId a = add->id, at = walk.fused_place(m, a, l, inputs);
  if (at == kNoNode) return false;
  Attrs attrs = ln.attrs;  // copies: adding a node may move `ln`
  const std::string source = ln.source;
  if (narrow != kNoNode) attrs.set("y_dtype", std::string(dtype_name(m.value(m.node(narrow).outputs[0]).type.dtype)));
  const std::vector<ValueId> out = fusion::add_before(m, at, "add_layernorm", inputs, std::move(attrs), source);
  if (out.size() != 2) return false;
  const NodeId y = narrow != kNoNode ? narrow : l;
  fusion::take_identity(m, m.node(a).outputs[0], out[0], users[m.node(a).outputs[0]]);
  fusion::take_identity(m, m.node(y).outputs[0], out[1], users[m.node(y).outputs[0]]);
  for (NodeId n : {a, l, cast, narrow, m.value(out[0]).producer}) {
    if (n == kNoNode) continue;
    walk.touch(m, n);
    if (n != m.value(out[0]).producer) m.node(n).dead = true;
  }
  return true;
}

// (dx, dscale) = layernorm_grad(dy, x, scale) whose dx only add(dx, d) reads → layernorm_grad
// with the addend d.
bool fuse_backward(Module& m, fusion::Walk& walk, NodeId g) {
  const Node& grad = m.node(g);
  if (grad.dead || grad.op != "layernorm_grad" || grad.inputs.size() != 3) return false;
  if (!all_fresh(walk, m, {g})) return false;
  const Users& users = walk.users();
  const ValueId dx = grad.outputs[0];
  const Node* reader = fusion::only_reader(m, users, dx);
  if (!reader || !plain_add(m, *reader)) return false;
  const NodeId add = reader->id;
  if (!all_fresh(walk, m, {add})) return false;
  std::vector<ValueId> inputs = grad.inputs;
  inputs.push_back(fusion::other_operand(m.node(add), dx));
  const NodeId at = walk.fused_place(m, g, add, inputs);
  if (at == kNoNode) return false;
  Attrs attrs = grad.attrs;  // copies: adding a node may move `grad`
  const std::string source = grad.source;
  const std::vector<ValueId> out = fusion::add_before(m, at, "layernorm_grad", inputs, std::move(attrs), source);
  if (out.size() != 2) return false;
  fusion::take_identity(m, m.node(add).outputs[0], out[0], users[m.node(add).outputs[0]]);
  fusion::take_identity(m, m.node(g).outputs[1], out[1], users[m.node(g).outputs[1]]);
  for (NodeId n : {g, add, m.value(out[0]).producer}) walk.touch(m, n);
  m.node(g).dead = m.node(add).dead = true;
  return true;
}

}  // namespace

Expected<PassReport> AddLayernorm::run(Module& m) {
  int64_t forward = 0, backward = 0;
  for (bool again = true; again;) {
    fusion::Walk walk(m);
    for (NodeId n : m.schedule()) {
      if (m.node(n).dead) continue;
      if (m.node(n).op == "layernorm") forward += fuse_forward(m, walk, n);
      else if (m.node(n).op == "layernorm_grad") backward += fuse_backward(m, walk, n);
    }
    again = walk.deferred();
  }
  return rewrite_report(m, {{"forward", forward}, {"backward", backward}},
                        str_cat("add_layernorm: ", forward, " residual adds inside their layernorm, ", backward,
                                " gradient adds inside their layernorm_grad"));
}

}  // namespace memc
