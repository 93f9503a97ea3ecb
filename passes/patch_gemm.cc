#include "passes/patch_gemm.h"

#include <algorithm>
#include <optional>

#include "frontend/fusion_util.h"
#include "ir/ops/ops.h"

namespace memc {
namespace {

// The conv's geometry when it is a patch embedding: kernel k per spatial dim, o outputs per dim,
// and the input exactly o·k long in each (nothing left over, nothing padded).
struct Patches {
  int64_t batch = 0, channels = 0, out_channels = 0, positions = 1, taps = 1;
  Shape kernel, out;
};

std::optional<Patches> patches_of(const Module& m, const Node& conv) {
  if (conv.inputs.size() < 2 || conv.outputs.size() != 1) return std::nullopt;
  const Shape& x = m.value(conv.inputs[0]).type.shape;
  const Shape& w = m.value(conv.inputs[1]).type.shape;
  const Shape& y = m.value(conv.outputs[0]).type.shape;
  const size_t spatial = x.size() >= 3 ? x.size() - 2 : 0;
  // 2 + 2·spatial dims after the split: within every backend's transpose (CUDA's 8).
  if (spatial < 1 || spatial > 3 || w.size() != x.size() || y.size() != x.size()) return std::nullopt;
  if (!is_float(m.value(conv.inputs[0]).type.dtype)) return std::nullopt;
  if (conv.attrs.get_int("group", 1) != 1) return std::nullopt;
  const auto strides = conv.attrs.get_ints("strides", std::vector<int64_t>(spatial, 1));
  const auto dilations = conv.attrs.get_ints("dilations", std::vector<int64_t>(spatial, 1));
  const auto pads = conv.attrs.get_ints("pads", std::vector<int64_t>(2 * spatial, 0));
  if (strides.size() != spatial || dilations.size() != spatial || pads.size() != 2 * spatial) return std::nullopt;
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; })) return std::nullopt;
  Patches p;
  p.batch = x[0], p.channels = x[1], p.out_channels = w[0], p.taps = w[1];
  if (w[1] != x[1]) return std::nullopt;
  for (size_t d = 0; d < spatial; ++d) {
    const int64_t k = w[2 + d], o = y[2 + d];
    if (strides[d] != k || dilations[d] != 1 || o * k != x[2 + d]) return std::nullopt;
    p.kernel.push_back(k), p.out.push_back(o);
    p.positions *= o, p.taps *= k;
  }
  return p;
}

// Adds x → patches → linear → the conv's layout before the conv `id`; returns the linear's output
// [N, P, Co] and, in `out`, the value in the conv's layout that replaces its output.
Expected<ValueId> add_patch_gemm(Module& m, NodeId id, const Patches& p, ValueId& out) {
  const Node& conv = m.node(id);
  const size_t spatial = p.kernel.size();
  const ValueId x = conv.inputs[0], w = conv.inputs[1], bias = conv.inputs.size() > 2 ? conv.inputs[2] : kNoValue;
  const std::string source = conv.source;
  auto add = [&](const std::string& op, std::vector<ValueId> inputs, const char* key, auto value) -> Expected<ValueId> {
    Attrs attrs;
    attrs.set(key, std::move(value));
    const std::vector<ValueId> outs = fusion::add_before(m, id, op, std::move(inputs), std::move(attrs), source);
    if (outs.empty()) return Status::Internal(str_cat("patch_gemm: could not add ", op, " for ", source));
    return outs[0];
  };
  // x [N, C, o1·k1, …] → [N, C, o1, k1, …] → [N, o1, …, C, k1, …] → [N, P, C·k1·…]
  Shape split = {p.batch, p.channels};
  std::vector<int64_t> perm = {0};
  for (size_t d = 0; d < spatial; ++d) {
    split.push_back(p.out[d]), split.push_back(p.kernel[d]);
    perm.push_back(static_cast<int64_t>(2 + 2 * d));
  }
  perm.push_back(1);
  for (size_t d = 0; d < spatial; ++d) perm.push_back(static_cast<int64_t>(3 + 2 * d));
  using Ints = std::vector<int64_t>;
  MEMC_ASSIGN_OR_RETURN(const ValueId split_x, add("reshape", {x}, "shape", split));
  MEMC_ASSIGN_OR_RETURN(const ValueId moved, add("transpose", {split_x}, "perm", perm));
  MEMC_ASSIGN_OR_RETURN(const ValueId patches, add("reshape", {moved}, "shape", Ints{p.batch, p.positions, p.taps}));
  MEMC_ASSIGN_OR_RETURN(const ValueId w2, add("reshape", {w}, "shape", Ints{p.out_channels, p.taps}));
  std::vector<ValueId> linear_inputs = {patches, w2};
  if (bias != kNoValue) linear_inputs.push_back(bias);
  MEMC_ASSIGN_OR_RETURN(const ValueId y, add("linear", std::move(linear_inputs), "transpose_w", int64_t{1}));
  // [N, P, Co] → [N, Co, P] → [N, Co, o1, …], the conv's own layout, for whatever reads it so.
  MEMC_ASSIGN_OR_RETURN(const ValueId channels_first, add("transpose", {y}, "perm", Ints{0, 2, 1}));
  Shape conv_shape = {p.batch, p.out_channels};
  conv_shape.insert(conv_shape.end(), p.out.begin(), p.out.end());
  MEMC_ASSIGN_OR_RETURN(out, add("reshape", {channels_first}, "shape", conv_shape));
  return y;
}

// flatten(2) then transpose(1, 2) of the conv's layout `out` is the linear's output y itself:
// those transposes' readers read y. Returns how many were cancelled.
int64_t cancel_token_transposes(Module& m, ValueId out, ValueId y, const Patches& p) {
  const auto users = m.users();
  const Shape flat = {p.batch, p.out_channels, p.positions};
  std::vector<ValueId> tokens_first;  // [N, Co, P]: the output itself in one spatial dim, else its flattening
  if (m.value(out).type.shape == flat) tokens_first.push_back(out);
  for (NodeId r : users[out]) {
    const Node& reshape = m.node(r);
    if (reshape.op == "reshape" && m.value(reshape.outputs[0]).type.shape == flat) tokens_first.push_back(reshape.outputs[0]);
  }
  int64_t cancelled = 0;
  for (ValueId flattened : tokens_first) {
    for (NodeId t : users[flattened]) {
      Node& transpose = m.node(t);
      if (transpose.op != "transpose" || transpose.attrs.get_ints("perm") != std::vector<int64_t>{0, 2, 1}) continue;
      m.replace_all_uses(transpose.outputs[0], y);
      transpose.dead = true;
      ++cancelled;
    }
  }
  return cancelled;
}

}  // namespace

Expected<PassReport> PatchGemm::run(Module& m) {
  int64_t rewritten = 0, cancelled = 0;
  for (NodeId id : m.schedule()) {
    if (m.node(id).dead || m.node(id).op != "conv") continue;
    const std::optional<Patches> p = patches_of(m, m.node(id));
    if (!p) continue;
    const ValueId old_out = m.node(id).outputs[0];
    ValueId out = kNoValue;
    MEMC_ASSIGN_OR_RETURN(const ValueId y, add_patch_gemm(m, id, *p, out));
    if (m.value(out).type != m.value(old_out).type) {
      return Status::Internal(str_cat("patch_gemm: ", m.node(id).source, " rewritten as ", type_str(m.value(out).type), ", not ",
                                      type_str(m.value(old_out).type)));
    }
    m.replace_all_uses(old_out, out);
    m.node(id).dead = true;
    ++rewritten;
    cancelled += cancel_token_transposes(m, out, y, *p);
  }
  return rewrite_report(m, {{"rewritten", rewritten}, {"transposes_cancelled", cancelled}},
                        str_cat("patch_gemm: ", rewritten, " convolutions as patches and one GEMM, ", cancelled,
                                " transposes back to tokens cancelled"));
}

}  // namespace memc
