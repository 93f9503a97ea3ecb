#include "passes/accumulate_gemm.h"

#include <optional>
#include <unordered_map>

#include "frontend/fusion_util.h"
#include "ir/op_registry.h"
#include "passes/microbatch.h"
#include "passes/pipeline.h"

namespace memc {
namespace {

// A term of a sum: the product that writes it, and the widening cast between them when the sum
// is f32 and the product 16-bit. Each value on the way is read only by the next node. The
// product is a matmul by a 2-D b whose a is 2-D or folds its rows (no transpose_a), or a linear
// without a bias (a linear layer's input gradient: dy·w).
struct Term {
  NodeId product = kNoNode, cast = kNoNode;
};

// Whether `n` is a product matmul_acc computes: see Term.
bool is_product(const Module& m, const Node& n) {
  const bool linear = n.op == "linear" && (n.inputs.size() == 2 || n.inputs[2] == kNoValue);
  if (!linear && !(n.op == "matmul" && n.inputs.size() == 2)) return false;
  const size_t a_rank = m.value(n.inputs[0]).type.shape.size();
  const bool transposed_a = !linear && n.attrs.get_int("transpose_a", 0);
  return m.value(n.inputs[1]).type.shape.size() == 2 && (a_rank == 2 || (a_rank > 2 && !transposed_a));
}

// `v` as a term of a sum of type `sum` read by `reader`, or nullopt.
std::optional<Term> term_of(const Module& m, const Users& users, ValueId v, const TensorType& sum,
                            const Node& reader) {
  // Values made after `users` (this pass's own sums) are no products.
  if (v >= static_cast<ValueId>(users.size()) || fusion::only_reader(m, users, v) != &reader) return std::nullopt;
  Term t;
  const Node* p = fusion::producer(m, v);
  if (p != nullptr && p->op == "cast") {
    if (sum.dtype != DType::kF32 || !fusion::is_16bit_cast(m, p, /*narrowing=*/false)) return std::nullopt;
    t.cast = m.value(v).producer;
    v = p->inputs[0];
    if (v >= static_cast<ValueId>(users.size()) || fusion::only_reader(m, users, v) != p) return std::nullopt;
    p = fusion::producer(m, v);
  }
  if (p == nullptr || !is_product(m, *p)) return std::nullopt;
  if (m.value(v).type.shape != sum.shape || (t.cast == kNoNode && m.value(v).type.dtype != sum.dtype)) return std::nullopt;
  t.product = m.value(v).producer;
  return t;
}

// Whether `v` is `acc` or a view of it (a reshape shares its buffer): a GEMM adding into acc's
// buffer must not read it as an operand.
bool views(const Module& m, ValueId v, ValueId acc) {
  const OpRegistry& registry = OpRegistry::get();
  while (v != kNoValue) {
    if (v == acc) return true;
    const Node* p = fusion::producer(m, v);
    const OpDef* def = p == nullptr ? nullptr : registry.find(p->op);
    if (def == nullptr || !(def->flags & kOpView) || p->inputs.empty()) return false;
    v = p->inputs[0];
  }
  return false;
}

// The product's transposes as matmul_acc's (a linear's weight is b, transposed by default).
Attrs gemm_attrs(const Node& product) {
  const bool linear = product.op == "linear";
  Attrs attrs;
  attrs.set("transpose_a", linear ? int64_t{0} : product.attrs.get_int("transpose_a", 0));
  attrs.set("transpose_b", linear ? product.attrs.get_int("transpose_w", 1) : product.attrs.get_int("transpose_b", 0));
  return attrs;
}

// Replaces `term` and the add `r` (sum' = sum + term) by one matmul_acc(sum, a, b) at the
// product's place; returns the matmul_acc. `users` is the pass's snapshot: no node made since
// reads the add's result (new nodes read sums and products made before it).
Expected<NodeId> fuse_term(Module& m, const Users& users, NodeId r, ValueId sum, const Term& term) {
  const Node product = m.node(term.product);
  const std::vector<ValueId> out =
      fusion::add_before(m, term.product, "matmul_acc", {sum, product.inputs[0], product.inputs[1]}, gemm_attrs(product), product.source);
  const ValueId was = m.node(r).outputs[0];
  if (out.size() != 1 || m.value(out[0]).type != m.value(was).type) {
    return Status::Internal(str_cat("accumulate_gemm: could not add ", product.source, " into its sum"));
  }
  fusion::take_identity(m, was, out[0], users[was]);
  m.node(r).dead = true;
  m.node(term.product).dead = true;
  if (term.cast != kNoNode) m.node(term.cast).dead = true;
  return m.value(out[0]).producer;
}

// Replaces the first term `start` (an f32 cast of a 16-bit product, read only by the matmul_acc
// that adds the next) by a matmul_acc without an accumulator that writes the product as f32.
Status fuse_start(Module& m, const Users& users, ValueId start, const Term& term) {
  const Node product = m.node(term.product);
  Attrs attrs = gemm_attrs(product);
  attrs.set("dtype", std::string(dtype_name(m.value(start).type.dtype)));
  const std::vector<ValueId> out =
      fusion::add_before(m, term.product, "matmul_acc", {kNoValue, product.inputs[0], product.inputs[1]}, std::move(attrs), product.source);
  if (out.size() != 1 || m.value(out[0]).type != m.value(start).type) {
    return Status::Internal(str_cat("accumulate_gemm: could not start ", product.source, "'s sum"));
  }
  fusion::take_identity(m, start, out[0], users[start]);
  m.node(term.product).dead = true;
  m.node(term.cast).dead = true;
  return Status::Ok();
}

}  // namespace

Expected<PassReport> AccumulateGemm::run(Module& m) {
  int64_t terms = 0, starts = 0;
  const Users users = m.users();
  std::vector<NodeId> sums;  // the matmul_accs made, whose sums may start with a product
  // Positions in the order given; a matmul_acc takes its product's (it is placed right before it).
  std::unordered_map<NodeId, int64_t> position;
  for (NodeId n : m.schedule()) position.emplace(n, static_cast<int64_t>(position.size()));
  for (NodeId r : m.schedule()) {
    const Node& add = m.node(r);
    if (add.dead || add.op != "add" || add.inputs.size() != 2 || add.inputs[0] == add.inputs[1]) continue;
    const TensorType& type = m.value(add.outputs[0]).type;
    for (int side : {1, 0}) {
      const ValueId sum = add.inputs[1 - side];
      if (sum == kNoValue || m.value(sum).type != type) continue;
      const std::optional<Term> term = term_of(m, users, add.inputs[side], type, add);
      if (!term) continue;
      const Node& product = m.node(term->product);
      if (views(m, product.inputs[0], sum) || views(m, product.inputs[1], sum)) continue;
      // Only where the sum exists when the product is computed: a GEMM held back until the sum
      // is ready would hold its operands that long (a tied head's dlogits until the embedding's
      // gradient, at the end of the backward: +69,568 B on the sweep's GPT-2 LM, b8 × 64).
      const NodeId made = m.value(sum).producer;
      if (made != kNoNode && !(position.contains(made) && position.at(made) < position.at(term->product))) continue;
      // A sum over micro-batches holds its first term across a whole micro-batch, where the
      // 16-bit product (half the f32 sum's bytes) is the cheaper form to hold: its start stays.
      const bool across_micro_batches = m.node(r).source == kMicroBatchSource;
      MEMC_ASSIGN_OR_RETURN(const NodeId fused, fuse_term(m, users, r, sum, *term));
      position[fused] = position.at(term->product);
      if (!across_micro_batches) sums.push_back(fused);
      ++terms;
      break;
    }
  }
  const Users now = m.users();
  for (NodeId s : sums) {
    const ValueId start = m.node(s).inputs[0];
    const std::optional<Term> term = term_of(m, now, start, m.value(start).type, m.node(s));
    if (!term || term->cast == kNoNode) continue;  // a product already written at the sum's type
    MEMC_RETURN_IF_ERROR(fuse_start(m, now, start, *term));
    ++starts;
  }
  return rewrite_report(m, {{"terms", terms}, {"starts", starts}},
                        str_cat("accumulate_gemm: ", terms, " of the gradient sums' terms added by their GEMMs, ", starts, " sums started in f32 by one"));
}

}  // namespace memc
