// Scaled dot-product attention as exporters write it:
//   S = (Q·c1)·(Kᵀ·c2) or (Q·Kᵀ)·c (mul or div by constants, torch puts √scale on each side)
//   P = softmax(S [+ bias], last axis) [→ dropout(ratio, seed)]
//   Y = P·V                                → attention(q, k, v, [bias]) {scale, dropout_ratio, seed}
// Kᵀ may be a transpose of the last two dims (folded here) or matmul's transpose_b; the
// transposes producing Q, K, V otherwise stay.
#include <cmath>

#include "frontend/fusion.h"
#include "frontend/fusion_util.h"
#include "support/log.h"

namespace memc {
namespace {

using namespace fusion;

struct Scores {
  ValueId q = kNoValue, k = kNoValue;  // k as [..., Tk, D]
  ValueId k_source = kNoValue;        // otherwise K = transpose(k_source, k_perm)
  std::vector<int64_t> k_perm;
  double scale = 1.0;
};

// Peels mul/div by scalar constants off `v`, multiplying them into `scale`.
ValueId peel_scale(const Module& m, ValueId v, double& scale) {
  for (int guard = 0; guard < 4; ++guard) {
    const Node* n = producer(m, v);
    if (!n || n->inputs.size() != 2) return v;
    if (n->op == "mul") {
      if (auto c = constant_value(m, n->inputs[1]); c && m.value(n->inputs[1]).type.numel() == 1) {
        scale *= *c;
        v = n->inputs[0];
        continue;
      }
      if (auto c = constant_value(m, n->inputs[0]); c && m.value(n->inputs[0]).type.numel() == 1) {
        scale *= *c;
        v = n->inputs[1];
        continue;
      }
    }
    if (n->op == "div") {
      if (auto c = constant_value(m, n->inputs[1]); c && *c != 0 && m.value(n->inputs[1]).type.numel() == 1) {
        scale /= *c;
        v = n->inputs[0];
        continue;
      }
    }
    return v;
  }
  return v;
}

bool swaps_last_two(const std::vector<int64_t>& perm) {
  const size_t r = perm.size();
  if (r < 2) return false;
  for (size_t i = 0; i + 2 < r; ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return false;
  }
  return perm[r - 2] == static_cast<int64_t>(r - 1) && perm[r - 1] == static_cast<int64_t>(r - 2);
}

// torch's SDPA decomposition (the dynamo exporter, torch ≥ 2.5) zeroes the probabilities of
// rows whose every key is masked: where(isnan(P), 0, P), isnan lowered to not(equal(P, P)). The
// attention op already gives those rows 0, so the guard is P itself.
ValueId peel_nan_guard(const Module& m, ValueId p) {
  const Node* where = producer_if(m, p, "where");
  if (!where || where->inputs.size() != 3) return p;
  const ValueId x = where->inputs[2];
  const Node* isnan = producer_if(m, where->inputs[0], "not");
  const Node* eq = isnan ? producer_if(m, isnan->inputs[0], "equal") : nullptr;
  if (!eq || eq->inputs[0] != x || eq->inputs[1] != x) return p;
  const std::optional<double> zero = constant_value(m, where->inputs[1]);
  if (!zero || *zero != 0.0 || m.value(where->inputs[1]).type.numel() != 1) return p;
  return x;
}

bool match_scores(const Module& m, ValueId s, Scores& out) {
  double scale = 1.0;
  const Node* mm = producer_if(m, peel_scale(m, s, scale), "matmul");
  if (!mm || mm->attrs.get_int("transpose_a", 0)) return false;
  out.q = peel_scale(m, mm->inputs[0], scale);
  const ValueId kt = peel_scale(m, mm->inputs[1], scale);
  if (mm->attrs.get_int("transpose_b", 0)) {
    out.k = kt;
  } else if (const Node* t = producer_if(m, kt, "transpose"); t && swaps_last_two(t->attrs.get_ints("perm"))) {
    out.k = t->inputs[0];
  } else if (const Node* t = producer_if(m, kt, "transpose")) {
    // Kᵀ = transpose(x, p): K = transpose(x, p with its last two entries swapped).
    out.k_source = t->inputs[0];
    out.k_perm = t->attrs.get_ints("perm");
    if (out.k_perm.size() < 2) return false;
    std::swap(out.k_perm[out.k_perm.size() - 1], out.k_perm[out.k_perm.size() - 2]);
  } else {
    out.k_source = kt;
    const int64_t rank = static_cast<int64_t>(m.value(kt).type.shape.size());
    for (int64_t i = 0; i < rank; ++i) out.k_perm.push_back(i);
    if (rank < 2) return false;
    std::swap(out.k_perm[rank - 1], out.k_perm[rank - 2]);
  }
  out.scale = scale;
  return std::isfinite(scale) && scale != 0;
}

// The attention op reads K as [.., Tk, d]. When the export holds only Kᵀ in a layout no
// transpose folds into (BigBird's block-sparse path gathers keys already transposed), the op
// needs a transposed copy of K, kept until backward. If Kᵀ stays alive for other readers too,
// that copy is extra memory, and it pays only when the score matrix the op never stores is
// larger: on bigbird_sparse_t215 a global block's 4 query rows against all 64 keys (256 scores
// per head) would cost a 64×16 key copy (1,024), and the plan rose by 33,280 B. Such a pattern
// stays as exported.
bool key_copy_pays(const Module& m, const Scores& scores, ValueId score_matrix) {
  if (m.users()[scores.k_source].size() <= 1) return true;  // the copy replaces the only reader's input
  return m.value(score_matrix).type.numel() > m.value(scores.k_source).type.numel();
}

class AttentionFusion : public FusionPass {
 public:
  std::string_view name() const override { return "attention"; }
  bool run(Module& m) override {
    int fused = 0;
    for (NodeId id : m.schedule()) {
      if (m.node(id).dead || m.node(id).op != "matmul") continue;
      fused += try_fuse(m, id) ? 1 : 0;
    }
    log(1, str_cat("fusion attention: ", fused, " fused"));
    return fused > 0;
  }

 private:
  bool try_fuse(Module& m, NodeId pv_id) {
    const Node& pv = m.node(pv_id);
    if (pv.attrs.get_int("transpose_a", 0) || pv.attrs.get_int("transpose_b", 0)) return false;
    const ValueId v = pv.inputs[1];
    ValueId p = pv.inputs[0];
    double dropout_ratio = 0;
    int64_t seed = 0;
    if (const Node* drop = producer_if(m, p, "dropout")) {
      if (drop->outputs.size() > 1 && !m.users()[drop->outputs[1]].empty()) return false;  // mask used elsewhere
      dropout_ratio = drop->attrs.get_float("ratio", 0.5);
      seed = drop->attrs.get_int("seed", 0);
      p = drop->inputs[0];
    }
    p = peel_nan_guard(m, p);
    const Node* softmax = producer_if(m, p, "softmax");
    if (!softmax) return false;
    const ValueId s = softmax->inputs[0];
    const int64_t rank = static_cast<int64_t>(m.value(s).type.shape.size());
    if (softmax->attrs.get_int("axis", -1) != rank - 1) return false;
    Scores scores;
    ValueId bias = kNoValue;
    if (!match_scores(m, s, scores)) {
      const Node* add = producer_if(m, s, "add");
      if (!add) return false;
      if (match_scores(m, add->inputs[0], scores)) bias = add->inputs[1];
      else if (match_scores(m, add->inputs[1], scores)) bias = add->inputs[0];
      else return false;
    }
    if (scores.k == kNoValue && !key_copy_pays(m, scores, s)) return false;
    const std::string source = m.node(pv_id).source;
    const ValueId old_out = m.node(pv_id).outputs[0];
    ValueId k = scores.k;
    if (k == kNoValue) {
      Attrs t;
      t.set("perm", scores.k_perm);
      auto kt = add_before(m, pv_id, "transpose", {scores.k_source}, std::move(t), source);
      if (kt.empty()) return false;
      k = kt[0];
    }
    std::vector<ValueId> inputs = {scores.q, k, v};
    if (bias != kNoValue) inputs.push_back(bias);
    Attrs attrs;
    attrs.set("scale", scores.scale);
    attrs.set("dropout_ratio", dropout_ratio);
    attrs.set("seed", seed);
    auto outs = add_before(m, pv_id, "attention", inputs, std::move(attrs), source);
    if (outs.empty()) return false;
    if (m.value(outs[0]).type != m.value(old_out).type) {
      m.node(m.value(outs[0]).producer).dead = true;
      return false;
    }
    m.replace_all_uses(old_out, outs[0]);
    m.node(pv_id).dead = true;
    return true;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_attention_fusion() { return std::make_unique<AttentionFusion>(); }

}  // namespace memc
