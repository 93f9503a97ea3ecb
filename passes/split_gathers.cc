#include "passes/split_gathers.h"

#include <algorithm>
#include <optional>
#include <string_view>

#include "frontend/fusion_util.h"

namespace memc {
namespace {

// The value of a scalar integer constant (a gather's single index), made non-negative for an
// axis of `n`.
std::optional<int64_t> scalar_index(const Module& m, ValueId v, int64_t n) {
  const Node* c = fusion::producer_if(m, v, "constant");
  if (!c) return std::nullopt;
  const Tensor* t = c->attrs.get_tensor("value");
  if (!t || t->rank() != 0 || (t->dtype() != DType::kI64 && t->dtype() != DType::kI32)) return std::nullopt;
  int64_t i = static_cast<int64_t>(t->get_as_double(0));
  if (i < 0) i += n;
  if (i < 0 || i >= n) return std::nullopt;
  return i;
}

// The dims of `shape` other than those of size 1, as (axis, size).
std::vector<std::pair<int64_t, int64_t>> non_unit(const Shape& shape) {
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] != 1) dims.push_back({static_cast<int64_t>(d), shape[d]});
  }
  return dims;
}
bool same_non_unit_sizes(const Shape& a, const Shape& b) {
  const auto x = non_unit(a), y = non_unit(b);
  return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin(), [](auto p, auto q) { return p.second == q.second; });
}

// For gather `g` (axis a, one scalar index) of R: where R is a transpose T of U, through reshapes
// that only add or drop dims of size 1, and the slice's axis of R is U's axis p with the other
// non-unit dims in U's order, returns p. The gather of U along p is then R's slice reshaped.
std::optional<int64_t> source_axis(const Module& m, const Node& g, ValueId& u) {
  ValueId r = g.inputs[0];
  const Shape& r_shape = m.value(r).type.shape;
  int64_t axis = g.attrs.get_int("axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(r_shape.size());
  if (axis < 0 || axis >= static_cast<int64_t>(r_shape.size()) || r_shape[axis] == 1) return std::nullopt;
  // The slice axis as the k-th non-unit dim: reshapes of unit dims keep that count.
  const auto r_dims = non_unit(r_shape);
  const auto k = std::find_if(r_dims.begin(), r_dims.end(), [&](auto d) { return d.first == axis; }) - r_dims.begin();
  ValueId v = r;
  while (const Node* reshape = fusion::producer_if(m, v, "reshape")) {
    if (!same_non_unit_sizes(m.value(reshape->inputs[0]).type.shape, m.value(v).type.shape)) return std::nullopt;
    v = reshape->inputs[0];
  }
  const Node* t = fusion::producer_if(m, v, "transpose");
  if (!t) return std::nullopt;
  const std::vector<int64_t> perm = t->attrs.get_ints("perm");
  const auto t_dims = non_unit(m.value(v).type.shape);
  if (t_dims.size() != r_dims.size() || perm.size() != m.value(v).type.shape.size()) return std::nullopt;
  int64_t previous = -1;
  for (size_t j = 0; j < t_dims.size(); ++j) {
    if (static_cast<int64_t>(j) == k) continue;
    const int64_t source = perm[t_dims[j].first];
    if (source < previous) return std::nullopt;  // the rest would come out in another order
    previous = source;
  }
  u = t->inputs[0];
  return perm[t_dims[k].first];
}

// The gather_grad leaves of an add tree rooted at `add` (adds of one shape and dtype, each read
// only by its parent), and the tree's nodes; `ok` false when any leaf is something else.
void collect_leaves(const Module& m, const Users& users, const Node& add, const TensorType& type,
                    std::vector<const Node*>& leaves, std::vector<NodeId>& tree, bool& ok) {
  tree.push_back(add.id);
  for (ValueId in : add.inputs) {
    if (!ok) return;
    const Node* p = fusion::producer(m, in);
    if (!p || m.value(in).type != type || fusion::only_reader(m, users, in) != &add) {
      ok = false;
      return;
    }
    if (p->op == "add") {
      collect_leaves(m, users, *p, type, leaves, tree, ok);
    } else if (p->op == "gather_grad") {
      leaves.push_back(p);
      tree.push_back(p->id);
    } else {
      ok = false;
    }
  }
}

// Rewrites the add tree at `root` when its leaves fill every slice of one axis once: returns the
// gather_grads it replaced (0: left as it was, or waiting for the walk's next round).
int64_t concat_slices(Module& m, fusion::Walk& walk, NodeId root) {
  const Users& users = walk.users();
  const Node& add = m.node(root);
  const TensorType type = m.value(add.outputs[0]).type;
  std::vector<const Node*> leaves;
  std::vector<NodeId> tree;
  if (!walk.fresh(m, root)) {
    walk.defer();
    return 0;
  }
  bool ok = true;
  collect_leaves(m, users, add, type, leaves, tree, ok);
  if (!ok || leaves.size() < 2) return 0;
  if (std::any_of(tree.begin(), tree.end(), [&](NodeId n) { return !walk.fresh(m, n); })) {
    walk.defer();
    return 0;
  }
  const int64_t axis = leaves[0]->attrs.get_int("axis", 0);
  const Shape& shape = type.shape;
  if (axis < 0 || axis >= static_cast<int64_t>(shape.size()) || shape[axis] != static_cast<int64_t>(leaves.size())) return 0;
  std::vector<ValueId> slices(leaves.size(), kNoValue);
  for (const Node* leaf : leaves) {
    if (leaf->attrs.get_int("axis", 0) != axis || leaf->attrs.get_ints("input_shape") != std::vector<int64_t>(shape.begin(), shape.end())) return 0;
    const std::optional<int64_t> i = scalar_index(m, leaf->inputs[1], shape[axis]);
    if (!i || slices[*i] != kNoValue) return 0;
    slices[*i] = leaf->inputs[0];
  }
  Shape piece = shape;
  piece[axis] = 1;
  const std::string source = add.source;
  std::vector<ValueId> pieces;
  for (ValueId dy : slices) {
    Attrs a;
    a.set("shape", std::vector<int64_t>(piece.begin(), piece.end()));
    const std::vector<ValueId> out = fusion::add_before(m, root, "reshape", {dy}, std::move(a), source);
    if (out.empty()) return 0;
    pieces.push_back(out[0]);
  }
  Attrs a;
  a.set("axis", axis);
  const std::vector<ValueId> joined = fusion::add_before(m, root, "concat", pieces, std::move(a), source);
  if (joined.empty() || m.value(joined[0]).type != type) return 0;
  const ValueId old = m.node(root).outputs[0];
  fusion::take_identity(m, old, joined[0], users[old]);
  // The tree's nodes are read by nothing now (a later walk must not join them again).
  for (NodeId n : tree) walk.touch(m, n), m.node(n).dead = true;
  for (ValueId p : pieces) walk.touch(m, m.value(p).producer);
  walk.touch(m, m.value(joined[0]).producer);
  return static_cast<int64_t>(leaves.size());
}

}  // namespace

Expected<PassReport> GatherTransposes::run(Module& m) {
  const int64_t transposes_before = count_op(m, "transpose");
  int64_t rewritten = 0;
  for (NodeId id : m.schedule()) {
    const Node& g = m.node(id);
    if (g.dead || g.op != "gather" || g.attrs.get_int("padding_idx", -1) >= 0) continue;  // an embedding's lookup stays as it is
    ValueId u = kNoValue;
    const std::optional<int64_t> p = source_axis(m, g, u);
    if (!p || !scalar_index(m, g.inputs[1], m.value(u).type.shape[*p])) continue;
    const ValueId y = g.outputs[0], index = g.inputs[1];
    const Shape y_shape = m.value(y).type.shape;
    const std::string source = g.source;
    Attrs a;
    a.set("axis", *p);
    const std::vector<ValueId> slice = fusion::add_before(m, id, "gather", {u, index}, std::move(a), source);
    if (slice.empty()) continue;
    Attrs r;
    r.set("shape", std::vector<int64_t>(y_shape.begin(), y_shape.end()));
    const std::vector<ValueId> shaped = fusion::add_before(m, id, "reshape", {slice[0]}, std::move(r), source);
    if (shaped.empty()) continue;
    m.replace_all_uses(y, shaped[0]);
    m.node(id).dead = true;
    ++rewritten;
  }
  m.eliminate_dead_nodes();
  m.compact();
  const int64_t removed = transposes_before - count_op(m, "transpose");
  return rewrite_report(m, {{"rewritten", rewritten}, {"transposes_removed", removed}},
                        str_cat("gather_transposes: ", rewritten, " gathers read the tensor a transpose moved, ", removed,
                                " transposes removed"));
}

Expected<PassReport> ConcatGatherGrads::run(Module& m) {
  int64_t concats = 0, removed = 0;
  // Every add, in schedule order: a sum of some of the slices fails (too few leaves) and the sum
  // of all of them then joins, whatever reads it (another gradient's add included).
  for (bool again = true; again;) {
    fusion::Walk walk(m);
    for (NodeId id : m.schedule()) {
      const Node& n = m.node(id);
      if (n.dead || n.op != "add") continue;
      if (const int64_t leaves = concat_slices(m, walk, id)) ++concats, removed += leaves;
    }
    again = walk.deferred();
  }
  m.eliminate_dead_nodes();
  m.compact();
  return rewrite_report(m, {{"concats", concats}, {"gather_grads_removed", removed}},
                        str_cat("concat_gather_grads: ", removed, " gather gradients as ", concats, " concats of their slices"));
}

}  // namespace memc
