#include "passes/remat.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>
#include <unordered_map>
#include <unordered_set>

#include "ir/op_registry.h"
#include "passes/repetition.h"
#include "support/log.h"
#include "support/size.h"

namespace memc {

// ---------------------------------------------------------------------------------------------
// The chain dynamic program.

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

class ChainSolver {
 public:
  ChainSolver(const Chain& chain, int64_t unit, int64_t limit_units) : c_(chain), unit_(unit), q_(limit_units) {
    n_ = static_cast<int>(chain.cost.size());
    MEMC_CHECK(n_ <= std::numeric_limits<int16_t>::max(), str_cat("remat: ", n_, " segments overflow the solver's choices"));
    cost_before_.assign(n_ + 1, 0.0);
    for (int s = 0; s < n_; ++s) cost_before_[s + 1] = cost_before_[s] + chain.cost[s];
    memo_.assign(static_cast<size_t>(chain_table_cells(n_, q_)), std::numeric_limits<float>::quiet_NaN());
    choice_.assign(memo_.size(), 0);
  }

  double solve(int s, int t, int64_t m) {
    if (m < 0) return kInf;
    float& slot = memo_[index(s, t, m)];
    if (!std::isnan(slot)) return slot;
    double best = kInf;
    int pick = -1;
    if (t - s == 1) {
      best = c_.cost[s];  // record at backward time; the tape is transient
    } else {
      // A state is held only while it will be returned to: the last segment of a range is
      // recorded as soon as its input is computed (its input is then transient, as in Revolve).
      const int64_t keep_next = held(s + 1, t);
      // record s: hold its tape (and x_{s+1}) while solving s+1..t
      const double rec = c_.cost[s] + solve(s + 1, t, m - units(c_.tape[s]) - keep_next);
      if (rec < best) best = rec, pick = -2;
      // partial s: hold the heavy outputs; recompute the cheap ops before backward of s
      if (c_.heavy[s] < c_.tape[s]) {
        const double part = c_.cost[s] + c_.cheap[s] + solve(s + 1, t, m - units(c_.heavy[s]) - keep_next);
        if (part < best) best = part, pick = -3;
      }
      // checkpoint j: advance s..j-1 keeping only x_j. Every segment of s..t runs again after
      // the advance, so advance + their cost bounds the move: once that cannot beat the best
      // (less a margin for the memo's float rounding), no later j can.
      const double rerun = cost_before_[t] - cost_before_[s];
      double advance = 0;
      for (int j = s + 1; j < t; ++j) {
        advance += c_.cost[j - 1];
        if ((advance + rerun) * (1 - 1e-4) >= best) break;
        const double right = solve(j, t, m - held(j, t));
        if (right == kInf) continue;
        const double ck = advance + right + solve(s, j, m);
        if (ck < best) best = ck, pick = j;
      }
    }
    slot = static_cast<float>(best);
    choice_[index(s, t, m)] = static_cast<int16_t>(pick);
    return slot;  // the memo's value, first call or not: choices do not depend on the order of calls
  }

  void actions(int s, int t, int64_t m, std::vector<ChainAction>& out) {
    solve(s, t, m);
    const int pick = choice_[index(s, t, m)];
    if (t - s == 1) {
      out.push_back({ChainAction::kRecord, s});
      out.push_back({ChainAction::kBackward, s});
    } else if (pick == -2 || pick == -3) {
      const int64_t held_units = units(pick == -2 ? c_.tape[s] : c_.heavy[s]) + held(s + 1, t);
      out.push_back({pick == -2 ? ChainAction::kRecord : ChainAction::kPartial, s});
      actions(s + 1, t, m - held_units, out);
      out.push_back({ChainAction::kBackward, s});
    } else {
      for (int k = s; k < pick; ++k) out.push_back({ChainAction::kAdvance, k});
      actions(pick, t, m - held(pick, t), out);
      actions(s, pick, m, out);
    }
  }

 private:
  int64_t units(int64_t bytes) const { return (bytes + unit_ - 1) / unit_; }
  int64_t held(int j, int t) const { return t - j > 1 ? units(c_.x[j]) : 0; }
  // Ranges s < t only: range (s, t) is row t(t−1)/2 + s of (q_ + 1) cells, one per m.
  size_t index(int s, int t, int64_t m) const {
    const size_t range = static_cast<size_t>(t) * static_cast<size_t>(t - 1) / 2 + static_cast<size_t>(s);
    return range * static_cast<size_t>(q_ + 1) + static_cast<size_t>(m);
  }

  const Chain& c_;
  std::vector<double> cost_before_;  // cost_before_[s]: the cost of segments 0..s-1
  int64_t unit_, q_;
  int n_ = 0;
  std::vector<float> memo_;      // best cost of (s, t, m); NaN: not solved yet
  std::vector<int16_t> choice_;  // its move: -2 record, -3 partial, j ≥ 1 checkpoint j
};

}  // namespace

int64_t chain_table_cells(int64_t segments, int64_t limit_units) { return segments * (segments + 1) / 2 * (limit_units + 1); }

ChainSolution solve_chain(const Chain& chain, int64_t limit, int64_t unit) {
  ChainSolution solution;
  if (chain.cost.empty()) {
    solution.cost = 0;
    return solution;
  }
  if (limit < 0) return solution;
  // Bytes are counted in units so that the table stays small: at most 256 units of limit.
  if (unit <= 0) unit = std::max<int64_t>(1, (limit + 255) / 256);
  const int n = static_cast<int>(chain.cost.size());
  solution.table_bytes = chain_table_cells(n, limit / unit) * kChainCellBytes;
  ChainSolver solver(chain, unit, limit / unit);
  const double best = solver.solve(0, n, limit / unit);
  if (best == kInf) return solution;
  solver.actions(0, n, limit / unit, solution.actions);
  solution.cost = best;
  return solution;
}

int64_t revolve_advances(int64_t n, int64_t c) {
  // β(c, r) = C(c + r, c); r is the unique integer with β(c, r−1) < n ≤ β(c, r); then
  // t(n, c) = r·n − β(c + 1, r − 1) (Griewank & Walther, ACM TOMS 26(1), 2000).
  auto binom = [](int64_t a, int64_t b) {
    if (b < 0 || b > a) return int64_t{0};
    double v = 1;
    for (int64_t i = 1; i <= b; ++i) v = v * static_cast<double>(a - b + i) / static_cast<double>(i);
    return static_cast<int64_t>(std::llround(v));
  };
  if (n <= 1) return 0;
  int64_t r = 0;
  while (binom(c + r, c) < n) ++r;
  return r * n - binom(c + 1 + r - 1, r - 1);
}

// ---------------------------------------------------------------------------------------------
// --remat

Expected<RematOptions> parse_remat(const std::string& spec) {
  RematOptions o;
  if (spec.empty() || spec == "none") return o;
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t end = std::min(spec.find(',', begin), spec.size());
    const std::string item = spec.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    if (item == "blocks") {
      o.policy = RematPolicy::kBlocks;
    } else if (item.rfind("save=", 0) == 0 && item.size() > 5) {
      o.must_save.push_back(item.substr(5));
    } else if (item.rfind("recompute=", 0) == 0 && item.size() > 10) {
      o.must_recompute.push_back(item.substr(10));
    } else if (auto bytes = parse_size(item); bytes.ok()) {
      o.policy = RematPolicy::kLimit;
      o.limit_bytes = *bytes;
    } else {
      return Status::BadInput("--remat: '" + item + "' is none, blocks, a size (2MB), save=NAME or recompute=NAME");
    }
    if (end == spec.size()) break;
  }
  if (o.policy == RematPolicy::kNone) o.policy = RematPolicy::kLimit, o.limit_bytes = std::numeric_limits<int64_t>::max() / 4;  // pins only
  return o;
}

// ---------------------------------------------------------------------------------------------
// The pass.

namespace {

bool heavy_op(const Node& node) { return node.def && (node.def->flags & kOpComputeHeavy); }

// Ops the registry flags as drawing from the counter RNG (dropout). Attention's optional
// dropout is not flagged (ir/ops/linalg.cc); it always reads activations, so never global.
bool random_op(const Node& node) { return node.def && (node.def->flags & kOpRandom); }

// Cost of executing a node once: FLOPs plus bytes written (a memory-bound op is not free).
double node_cost(const Module& m, const Node& n) {
  double bytes = 0;
  for (ValueId v : n.outputs) bytes += static_cast<double>(m.value(v).type.bytes());
  return static_cast<double>(node_flops(m, n)) + bytes;
}

// "/encoder/layers/encoder_layer_3/attention/MatMul" → "/encoder/layers/encoder_layer_3": the
// node's block, as the path up to the block's entry in the list; "" outside blocks. Exporters name
// each node after its module path (TorchScript's node names; the dynamo exporter's metadata,
// which the importer appends: "node_linear_3 (Gemm) in encoder.layers.encoder_layer_0.mlp"), and a
// transformer's blocks are a numbered list in it (torchvision "layers/encoder_layer_3", Hugging
// Face BERT "layer.3", GPT-2 "h.3", timm "blocks.3", CLIP "resblocks.3", DiT
// "transformer_blocks.3"). The list's name starts a path component, so neither the dynamo
// exporter's "node_layer_norm_1" nor "branch_1" reads as a block. Where lists nest, the block is
// the outer one (T5's "block.0.layer.1", a block's sublayers, is block 0), unless a list of
// layers holds a list of blocks: Swin's "layers.0.blocks.1" (a stage's blocks, each checkpointed
// as PyTorch's Swin checkpoints them) is block 1 of stage 0. Tests: RematBlocks.BlocksAreTheModulePathsInNodeNames,
// RematBlocks.NestedListsAreBlocksAsPyTorchCheckpointsThem.
std::string block_key(const std::string& source) {
  static const std::regex re(R"((?:^|[/. ])((layers?|(?:res|transformer_)?blocks?|h)[._/][A-Za-z_]*\d+))");
  std::string key;
  bool in_blocks = false;  // the key's list is named for blocks, not layers
  for (auto it = std::sregex_iterator(source.begin(), source.end(), re); it != std::sregex_iterator(); ++it) {
    const bool blocks = (*it)[2].str().rfind("layer", 0) != 0;
    if (!key.empty() && (in_blocks || !blocks)) continue;
    const size_t end = static_cast<size_t>(it->position(1) + it->length(1));
    const size_t space = source.rfind(' ', end - 1);
    const size_t path = space == std::string::npos ? 0 : space + 1;
    key = source.substr(path, end - path);
    in_blocks = blocks;
  }
  return key;
}

// The node ids of one micro-batch's forward (including the loss) and backward.
struct StepRange {
  NodeId forward_begin, backward_begin, backward_end;
  bool forward(NodeId id) const { return id >= forward_begin && id < backward_begin; }
  bool backward(NodeId id) const { return id >= backward_begin && id < backward_end; }
};

// Pinned values, by IR name or ONNX name.
struct Pins {
  std::unordered_set<ValueId> save, recompute;
  int unresolved = 0;  // pinned names that match no forward value
};

// Positions in the forward order: where a value is computed (an argument: first read) and
// where it is last read by a forward node; -1 where there is none.
struct LiveRanges {
  std::vector<int> first_pos, last_use;
};

struct Analysis {
  std::vector<NodeId> forward;            // schedule order
  std::vector<bool> global;               // by ValueId: kept for the step, never recomputed
  std::vector<int> segment_of_value;      // by ValueId: producing segment (-1: global)
  std::vector<std::vector<NodeId>> segments;
  std::vector<ValueId> boundary;          // boundary[s] = x_s (kNoValue for s = 0)
  std::vector<bool> tape;                 // by ValueId: read by backward
};

// The forward's nodes, in schedule order.
std::vector<NodeId> forward_nodes(const std::vector<NodeId>& order, const StepRange& range) {
  std::vector<NodeId> forward;
  for (NodeId n : order) {
    if (range.forward(n)) forward.push_back(n);
  }
  return forward;
}

// Each forward value whose IR or ONNX name is pinned; a name pinned both ways saves.
Pins resolve_pins(const Module& m, const std::vector<NodeId>& forward, const RematOptions& options) {
  const std::unordered_set<std::string> save_names(options.must_save.begin(), options.must_save.end());
  const std::unordered_set<std::string> recompute_names(options.must_recompute.begin(), options.must_recompute.end());
  std::unordered_set<std::string> matched;
  auto match = [&](const std::unordered_set<std::string>& names, const Value& value) {
    const std::string* name = names.count(value.name) ? &value.name : names.count(value.source_name) ? &value.source_name : nullptr;
    if (name) matched.insert(*name);
    return name != nullptr;
  };
  Pins pins;
  for (NodeId n : forward) {
    for (ValueId v : m.node(n).outputs) {
      if (match(save_names, m.value(v))) {
        pins.save.insert(v);
      } else if (match(recompute_names, m.value(v))) {
        pins.recompute.insert(v);
      }
    }
  }
  pins.unresolved = static_cast<int>(save_names.size() + recompute_names.size() - matched.size());
  return pins;
}

// Global values: parameters, scalars, values produced outside the forward, values computed
// from globals only (weight casts, constants), pinned saves and the step's outputs. Data inputs
// are not: what they feed is activation.
std::vector<bool> find_globals(const Module& m, const std::vector<NodeId>& forward, const Pins& pins) {
  std::vector<bool> global(m.values().size(), true);
  for (ValueId arg : m.arguments()) global[arg] = m.value(arg).role != Role::kInput;
  for (NodeId n : forward) {
    const Node& node = m.node(n);
    bool all_global = !random_op(node);  // a random op (dropout) draws per step: never global
    for (ValueId in : node.inputs) all_global = all_global && (in == kNoValue || global[in]);
    for (ValueId v : node.outputs) {
      if (pins.save.count(v)) continue;  // kept like a global
      global[v] = all_global && !pins.recompute.count(v);
    }
  }
  for (ValueId out : m.outputs()) global[out] = true;  // step outputs (logits) stay as they are
  return global;
}

// Live ranges of the non-global values in the forward order (data inputs from their first use).
LiveRanges live_ranges(const Module& m, const std::vector<NodeId>& forward, const std::vector<bool>& global) {
  std::vector<int> pos(m.nodes().size(), -1);
  for (size_t i = 0; i < forward.size(); ++i) pos[forward[i]] = static_cast<int>(i);
  LiveRanges live{std::vector<int>(m.values().size(), -1), std::vector<int>(m.values().size(), -1)};
  for (NodeId n : forward) {
    for (ValueId v : m.node(n).outputs) live.first_pos[v] = pos[n];
    for (ValueId in : m.node(n).inputs) {
      if (in == kNoValue || global[in]) continue;
      live.last_use[in] = std::max(live.last_use[in], pos[n]);
      if (live.first_pos[in] < 0) live.first_pos[in] = pos[n];  // an argument
    }
  }
  return live;
}

// A value read across more than a quarter of the forward is kept for the step like a global:
// treated as recomputable, it would cross every gap it spans and leave no cut there. It exists
// for an attention mask built once from the input and read by every layer (DistilBERT base at
// seq 512: val_81, 16 MB, read across 245 of 315 forward nodes; distilbert_ts: 52 of 92). On
// the committed 2-block models the quarter also keeps the block inputs that the attention
// residual reads (vit_tiny: 2 values, 27 of 82 nodes), which per-block checkpointing keeps
// anyway. The longest span left recomputable there is 7 nodes; on ViT-B/L, 32 of 537 and 1053.
// Tested by RematSegments.AValueReadByEveryLayerIsKeptSoTheLayersStillCut and
// RematSegments.ASkipOverAFewLayersIsAnActivationAndALongerOneIsKept.
void keep_long_lived(const Module& m, const LiveRanges& live, int forward_size, std::vector<bool>& global) {
  for (ValueId v = 0; v < static_cast<ValueId>(global.size()); ++v) {
    if (global[v] || live.first_pos[v] < 0) continue;
    const int span = live.last_use[v] - live.first_pos[v];
    if (span <= forward_size / 4 + 2) continue;  // + 2: under 8 nodes a quarter is 0 or 1 node
    global[v] = true;
    log(2, str_cat("remat: ", m.value(v).name, " is read across ", span, " of ", forward_size, " forward nodes: kept for the step"));
  }
}

// Tape: the non-global values backward reads.
std::vector<bool> find_tape(const Module& m, const std::vector<NodeId>& order, const StepRange& range, const std::vector<bool>& global) {
  std::vector<bool> tape(m.values().size(), false);
  for (NodeId n : order) {
    if (!range.backward(n)) continue;
    for (ValueId in : m.node(n).inputs) {
      if (in != kNoValue && !global[in]) tape[in] = true;
    }
  }
  return tape;
}

// Cuts the forward after position i when exactly one non-global value crosses the gap after
// i; that value is the next segment's input x_{s+1}.
void cut_segments(const Module& m, const LiveRanges& live, Analysis& a) {
  const int nf = static_cast<int>(a.forward.size());
  std::vector<int> crossing(nf + 1, 0);  // crossing[i]: values live across the gap after i
  std::vector<ValueId> crosser(nf + 1, kNoValue);
  for (ValueId v = 0; v < static_cast<ValueId>(m.values().size()); ++v) {
    if (a.global[v] || live.first_pos[v] < 0) continue;
    for (int i = live.first_pos[v]; i < live.last_use[v]; ++i) ++crossing[i], crosser[i] = v;
  }
  a.segment_of_value.assign(m.values().size(), -1);
  a.boundary.push_back(kNoValue);
  a.segments.emplace_back();
  for (int i = 0; i < nf; ++i) {
    const NodeId n = a.forward[i];
    const int s = static_cast<int>(a.segments.size()) - 1;
    a.segments.back().push_back(n);
    for (ValueId v : m.node(n).outputs) {
      if (!a.global[v]) a.segment_of_value[v] = s;
    }
    // (A value from an earlier segment alone crossing is that segment's boundary: no new cut.)
    if (i + 1 < nf && crossing[i] == 1 && a.segment_of_value[crosser[i]] == s) {
      a.boundary.push_back(crosser[i]);
      a.segments.emplace_back();
    }
  }
}

// Globals, tape and segments of the forward; every non-global forward value belongs to the
// one segment that computes it.
Analysis analyze(const Module& m, const std::vector<NodeId>& order, const StepRange& range, const Pins& pins) {
  Analysis a;
  a.forward = forward_nodes(order, range);
  a.global = find_globals(m, a.forward, pins);
  const LiveRanges live = live_ranges(m, a.forward, a.global);
  keep_long_lived(m, live, static_cast<int>(a.forward.size()), a.global);
  a.tape = find_tape(m, order, range, a.global);
  cut_segments(m, live, a);
  return a;
}

// Above `max_segments`, neighbouring segments merge (segment s joins s·max_segments/n) so that
// the solver's table stays within kMaxChainTableBytes; a merged boundary becomes an ordinary
// value of its segment, held in its tape if backward reads it.
void merge_segments(int max_segments, Analysis& a) {
  const int n = static_cast<int>(a.segments.size());
  if (n <= max_segments) return;
  log(2, str_cat("remat: ", n, " segments merged into ", max_segments, " (the solver's table bound)"));
  auto merged = [&](int s) { return static_cast<int>(int64_t{s} * max_segments / n); };
  std::vector<std::vector<NodeId>> segments(max_segments);
  std::vector<ValueId> boundary(max_segments, kNoValue);
  for (int s = 0; s < n; ++s) {
    std::vector<NodeId>& nodes = segments[merged(s)];
    if (nodes.empty()) boundary[merged(s)] = a.boundary[s];
    nodes.insert(nodes.end(), a.segments[s].begin(), a.segments[s].end());
  }
  for (int& s : a.segment_of_value) {
    if (s >= 0) s = merged(s);
  }
  a.segments = std::move(segments);
  a.boundary = std::move(boundary);
}

int64_t tape_bytes(const Module& m, const std::vector<bool>& tape) {
  int64_t bytes = 0;
  for (ValueId v = 0; v < static_cast<ValueId>(tape.size()); ++v) {
    if (tape[v] && m.value(v).producer != kNoNode) bytes += m.value(v).type.bytes();
  }
  return bytes;
}

// Bytes of the outputs of compute-heavy ops that recomputing segment s's cheap tape reads
// (through views and elementwise ops from `tape_values`): what a partial execution keeps.
int64_t heavy_bytes(const Module& m, const Analysis& a, int s, std::vector<ValueId> tape_values) {
  int64_t heavy = 0;
  std::unordered_set<ValueId> seen;
  while (!tape_values.empty()) {
    const ValueId v = tape_values.back();
    tape_values.pop_back();
    if (v == kNoValue || a.global[v] || a.segment_of_value[v] != s || !seen.insert(v).second) continue;
    const Node& p = m.node(m.value(v).producer);
    if (heavy_op(p)) {
      heavy += m.value(v).type.bytes();
      continue;
    }
    for (ValueId in : p.inputs) tape_values.push_back(in);
  }
  return heavy;
}

// The solver's view of the segments: x_s bytes, and per segment its cost, the cost of its
// cheap ops, its tape bytes (x_{s+1} aside: the next segment holds it) and heavy bytes.
Chain chain_of(const Module& m, const Analysis& a) {
  const int n = static_cast<int>(a.segments.size());
  Chain chain;
  chain.x.assign(n + 1, 0);
  for (int s = 1; s < n; ++s) chain.x[s] = m.value(a.boundary[s]).type.bytes();
  for (int s = 0; s < n; ++s) {
    double cost = 0, cheap = 0;
    int64_t tape = 0;
    std::vector<ValueId> tape_values;
    for (NodeId id : a.segments[s]) {
      const Node& node = m.node(id);
      cost += node_cost(m, node);
      if (!heavy_op(node)) cheap += node_cost(m, node);
      for (ValueId v : node.outputs) {
        if (!a.tape[v] || (s + 1 < n && v == a.boundary[s + 1])) continue;
        tape += m.value(v).type.bytes();
        tape_values.push_back(v);
      }
    }
    chain.cost.push_back(cost);
    chain.cheap.push_back(cheap);
    chain.tape.push_back(tape);
    chain.heavy.push_back(heavy_bytes(m, a, s, std::move(tape_values)));
  }
  return chain;
}

// The blocks' keys by segment, from a key per forward node ("" outside blocks). A segment
// belongs to the block of its first node inside one. A cut rarely falls on a block's edge (one
// block's ln_2 and the next one's ln_1 share a segment); comparing edge nodes alone saw no change
// of block on torchvision's ViT and recomputed the whole encoder after the head, holding every
// tape again (a higher peak than no remat). Segments outside any block after one (the head)
// join it, so the last block is not recomputed. Empty: fewer than two blocks among the segments
// (a stray name such as a hand-written "h_2", or a repeated run no cut divides, checkpoints nothing).
template <typename KeyOf>
std::vector<std::string> segment_keys(const Analysis& a, KeyOf key_of) {
  const int n = static_cast<int>(a.segments.size());
  std::vector<std::string> keys(n);
  std::unordered_set<std::string> blocks;
  for (int s = 0; s < n; ++s) {
    for (NodeId id : a.segments[s]) {
      if (!(keys[s] = key_of(id)).empty()) break;
    }
    if (!keys[s].empty()) blocks.insert(keys[s]);
    if (keys[s].empty() && s > 0) keys[s] = keys[s - 1];
  }
  return blocks.size() >= 2 ? keys : std::vector<std::string>{};
}

// Blocks from the graph itself, for exports whose node names carry no module path (a graph
// written node by node, names an optimizer replaced): a transformer emits the same ops in the
// same order once per layer. The unit is the run of p forward nodes whose ops repeat back to
// back over the most nodes (the shortest such p), and each repetition is a block. Nodes before
// the run are outside blocks (the embedding); after it, the head. A run that no segment cut
// divides into two blocks is not the layers (a language model's loss chunks repeat too, with
// the head's input live across them all): its nodes are set apart and the next run is tried.
// Empty: no unit repeats that way.
std::vector<std::string> repeated_block_keys(const Module& m, const Analysis& a) {
  const int n = static_cast<int>(a.forward.size());
  std::vector<int> op(n);
  std::unordered_map<std::string, int> ids;
  std::unordered_map<NodeId, int> position;
  for (int i = 0; i < n; ++i) {
    op[i] = ids.emplace(m.node(a.forward[i]).op, static_cast<int>(ids.size())).first->second;
    position[a.forward[i]] = i;
  }
  int unique = -1;  // set-apart nodes: each its own op, so no run crosses them
  for (int attempt = 0; attempt < 4; ++attempt) {
    const Repetition run = longest_run(op, 2);
    if (run.repeats == 0) return {};
    std::vector<std::string> keys = segment_keys(a, [&](NodeId id) {
      const int i = position.at(id) - static_cast<int>(run.start);
      return i >= 0 && i < static_cast<int>(run.covered()) ? str_cat("#", i / static_cast<int>(run.period)) : std::string();
    });
    log(2, str_cat("remat: a unit of ", run.period, " forward nodes repeats ", run.repeats, " times from node ", run.start, " of ", n,
                   keys.empty() ? ": no cut divides it, set apart" : ""));
    if (!keys.empty()) return keys;
    for (size_t i = run.start; i < run.start + run.covered(); ++i) op[i] = unique--;
  }
  return {};
}

// The blocks' keys by segment: from node names, else from the graph's repetition; `how` says
// which ("" where neither finds blocks: the whole forward is one block).
std::vector<std::string> block_keys(const Module& m, const Analysis& a, std::string& how) {
  std::vector<std::string> keys = segment_keys(a, [&](NodeId id) { return block_key(m.node(id).source); });
  how = "module paths in node names";
  if (keys.empty()) keys = repeated_block_keys(m, a), how = "the forward's repetition";
  if (keys.empty()) keys.assign(a.segments.size(), ""), how.clear();
  return keys;
}

// Per-block checkpointing: keep x at every change of transformer block; recompute each block,
// recording it whole, in one pass from its input (the last block: the originals).
std::vector<ChainAction> block_actions(const Module& m, const Analysis& a, RematReport& report) {
  const int n = static_cast<int>(a.segments.size());
  const std::vector<std::string> keys = block_keys(m, a, report.blocks_found_by);
  std::vector<int> starts = {0};
  for (int s = 1; s < n; ++s) {
    if (keys[s] != keys[s - 1]) starts.push_back(s);
  }
  starts.push_back(n);
  const size_t groups = starts.size() - 1;
  report.blocks = static_cast<int>(groups) - (keys.empty() || keys[0].empty() ? 1 : 0);  // the group before the first block aside
  std::vector<ChainAction> actions;
  for (size_t g = 0; g + 1 < groups; ++g) {
    for (int s = starts[g]; s < starts[g + 1]; ++s) actions.push_back({ChainAction::kAdvance, s});
  }
  for (size_t g = groups; g-- > 0;) {
    for (int s = starts[g]; s < starts[g + 1]; ++s) actions.push_back({ChainAction::kRecord, s});
    for (int s = starts[g + 1]; s-- > starts[g];) actions.push_back({ChainAction::kBackward, s});
  }
  return actions;
}

// The largest sum of held tapes (recorded) and heavy outputs (partial) along the actions;
// checkpoints are not counted.
int64_t held_tape_bytes(const std::vector<ChainAction>& actions, const Chain& chain) {
  int64_t held = 0, most = 0;
  std::vector<int64_t> holding(chain.tape.size(), 0);
  for (const ChainAction& act : actions) {
    const int s = act.segment;
    if (act.kind == ChainAction::kBackward) {
      held -= holding[s];
      holding[s] = 0;
    } else if (act.kind != ChainAction::kAdvance) {
      holding[s] = act.kind == ChainAction::kRecord ? chain.tape[s] : chain.heavy[s];
      held += holding[s];
    }
    most = std::max(most, held);
  }
  return most;
}

void log_segments(const Analysis& a, const Chain& chain) {
  if (verbosity() < 3) return;
  for (size_t i = 0; i < a.segments.size(); ++i) {
    log(3, str_cat("remat segment ", i, ": ", a.segments[i].size(), " nodes, cost ", chain.cost[i], ", x ", chain.x[i], " B, tape ",
                   chain.tape[i], " B, heavy ", chain.heavy[i], " B"));
  }
}

void log_actions(const std::vector<ChainAction>& actions) {
  if (verbosity() < 3) return;
  std::string line = "remat actions:";
  for (const ChainAction& act : actions) line += str_cat(" ", "ARPB"[act.kind], act.segment);
  log(3, line);
}

// Originals that backward still reads (kept from the forward), per segment.
void log_kept_originals(const Module& m, const Analysis& a, const std::vector<NodeId>& new_order, NodeId backward_begin) {
  if (verbosity() < 3) return;
  std::unordered_map<int, int64_t> kept;
  for (NodeId id : new_order) {
    for (ValueId in : m.node(id).inputs) {
      if (in != kNoValue && !a.global[in] && a.segment_of_value[in] >= 0 && m.value(in).producer < backward_begin) {
        kept[a.segment_of_value[in]] += m.value(in).type.bytes();
      }
    }
  }
  std::string line = "remat originals read by backward (segment: bytes, with repeats):";
  for (int s = 0; s < static_cast<int>(a.segments.size()); ++s) {
    if (kept.count(s)) line += str_cat(" ", s, ":", kept[s]);
  }
  log(3, line);
}

// Turns actions into nodes. The first execution of a segment is its original nodes; later ones
// clone what they need. tape_map_[s] maps a forward value to the copy backward of s reads.
class Materializer {
 public:
  Materializer(Module& m, const Analysis& a, const std::unordered_set<ValueId>& pinned_recompute)
      : m_(m), a_(a), pinned_recompute_(pinned_recompute) {
    const size_t n = a.segments.size();
    cur_x_.assign(n + 1, kNoValue);
    executed_.assign(n, 0);
    tape_map_.resize(n);
    heavy_map_.resize(n);
    ready_.assign(n, false);
    partial_.assign(n, false);
  }

  // Applies one action, appending clone nodes to `order`.
  void apply(const ChainAction& act, std::vector<NodeId>& order) {
    const int s = act.segment;
    if (act.kind != ChainAction::kBackward) {
      execute(act, executed_[s]++ == 0, order);
      return;
    }
    if (partial_[s]) recompute_cheap_ops(s, order);
    recompute_pinned(s, order);
    ready_[s] = true;
  }

  bool ready(int s) const { return ready_[s]; }

  // The value a backward node should read for forward value v, given that segment s is ready.
  ValueId lookup(int s, ValueId v) const {
    const auto& tape = tape_map_[s];
    auto it = tape.find(v);
    return it == tape.end() ? v : it->second;
  }

  int recomputed_nodes = 0;
  int64_t recompute_flops = 0;

 private:
  ValueId output_of(int s) const { return s + 1 < static_cast<int>(a_.boundary.size()) ? a_.boundary[s + 1] : kNoValue; }
  ValueId input_of(int s) const { return a_.boundary[s]; }
  ValueId current_input(int s) const {
    const ValueId x = a_.boundary[s];
    return x == kNoValue ? kNoValue : (cur_x_[s] == kNoValue ? x : cur_x_[s]);
  }

  // Advance, record or partial: x_{s+1} becomes current; a record keeps the whole tape, a
  // partial the heavy outputs. A first execution is the original forward and clones nothing.
  void execute(const ChainAction& act, bool first, std::vector<NodeId>& order) {
    const int s = act.segment;
    if (act.kind == ChainAction::kPartial) partial_[s] = true;
    const ValueId out = output_of(s);
    if (first) {
      if (out != kNoValue) cur_x_[s + 1] = out;
      return;  // originals: the tape (or the heavy outputs) is the forward's own values
    }
    std::unordered_map<ValueId, ValueId> map;
    std::vector<ValueId> targets;
    if (out != kNoValue) targets.push_back(out);
    if (act.kind != ChainAction::kAdvance) {
      for (NodeId n : a_.segments[s]) {
        for (ValueId v : m_.node(n).outputs) {
          if (a_.tape[v] && (act.kind == ChainAction::kRecord || heavy_op(m_.node(n)))) targets.push_back(v);
        }
      }
    }
    clone(s, targets, {}, map, order);
    if (out != kNoValue) cur_x_[s + 1] = map.at(out);
    if (act.kind == ChainAction::kRecord) {
      tape_map_[s] = map;
      if (input_of(s) != kNoValue) tape_map_[s][input_of(s)] = current_input(s);
    }
    if (act.kind == ChainAction::kPartial) keep_heavy_outputs(s, map);
  }

  // A partial execution keeps the clones of heavy ops' outputs (heavy_map_[s]), and marks
  // itself executed (the kNoValue key) even when the segment has no heavy op.
  void keep_heavy_outputs(int s, const std::unordered_map<ValueId, ValueId>& map) {
    for (NodeId n : a_.segments[s]) {
      if (!heavy_op(m_.node(n))) continue;
      for (ValueId v : m_.node(n).outputs) {
        if (map.count(v)) heavy_map_[s][v] = map.at(v);
      }
    }
    heavy_map_[s][kNoValue] = kNoValue;
  }

  // Before backward of a partially executed s: recompute the cheap tape from x_s; heavy
  // outputs come from the partial execution (or are the originals, if it was the first).
  void recompute_cheap_ops(int s, std::vector<NodeId>& order) {
    std::unordered_map<ValueId, ValueId> fixed = heavy_map_[s];
    fixed.erase(kNoValue);
    if (!heavy_map_[s].count(kNoValue)) {  // partial in the first sweep: the originals
      for (NodeId n : a_.segments[s]) {
        if (!heavy_op(m_.node(n))) continue;
        for (ValueId v : m_.node(n).outputs) fixed[v] = v;
      }
    }
    std::vector<ValueId> targets;
    for (NodeId n : a_.segments[s]) {
      for (ValueId v : m_.node(n).outputs) {
        if (a_.tape[v] && !fixed.count(v)) targets.push_back(v);
      }
    }
    std::unordered_map<ValueId, ValueId> map;
    clone(s, targets, fixed, map, order);
    for (auto& [k, v] : fixed) map[k] = v;
    tape_map_[s] = std::move(map);
    if (input_of(s) != kNoValue) tape_map_[s][input_of(s)] = current_input(s);
  }

  // Pinned values are never kept from the forward: recompute those the tape still takes from
  // it (an empty tape: the original execution recorded it, identity).
  void recompute_pinned(int s, std::vector<NodeId>& order) {
    std::unordered_map<ValueId, ValueId>& tape = tape_map_[s];
    std::vector<ValueId> targets;
    for (NodeId n : a_.segments[s]) {
      for (ValueId v : m_.node(n).outputs) {
        if (pinned_recompute_.count(v) && a_.tape[v] && (!tape.count(v) || tape.at(v) == v)) targets.push_back(v);
      }
    }
    if (targets.empty()) return;
    std::unordered_map<ValueId, ValueId> fixed;
    for (NodeId n : a_.segments[s]) {
      for (ValueId v : m_.node(n).outputs) {
        if (!pinned_recompute_.count(v)) fixed[v] = tape.count(v) ? tape.at(v) : v;
      }
    }
    std::unordered_map<ValueId, ValueId> map;
    clone(s, targets, fixed, map, order);
    for (ValueId v : targets) tape[v] = map.at(v);
  }

  // Clones the nodes of segment s needed for `targets`, reading x_s as its current value,
  // values in `fixed` as given, globals as themselves. Fills map (original → clone).
  void clone(int s, const std::vector<ValueId>& targets, const std::unordered_map<ValueId, ValueId>& fixed,
             std::unordered_map<ValueId, ValueId>& map, std::vector<NodeId>& order) {
    std::unordered_set<NodeId> needed;
    std::vector<ValueId> stack(targets.begin(), targets.end());
    while (!stack.empty()) {
      const ValueId v = stack.back();
      stack.pop_back();
      if (v == kNoValue || fixed.count(v) || v == a_.boundary[s] || a_.segment_of_value[v] != s) continue;
      const NodeId p = m_.value(v).producer;
      if (!needed.insert(p).second) continue;
      for (ValueId in : m_.node(p).inputs) stack.push_back(in);
    }
    for (NodeId n : a_.segments[s]) {
      if (!needed.count(n)) continue;
      const Node node = m_.node(n);  // a copy: adding nodes grows the table
      std::vector<ValueId> inputs;
      for (ValueId in : node.inputs) {
        if (in == kNoValue) {
          inputs.push_back(kNoValue);
        } else if (auto f = fixed.find(in); f != fixed.end()) {
          inputs.push_back(f->second);
        } else if (in == a_.boundary[s]) {
          inputs.push_back(current_input(s));
        } else if (auto c = map.find(in); c != map.end()) {
          inputs.push_back(c->second);
        } else {
          inputs.push_back(in);  // global
        }
      }
      std::vector<TensorType> types;
      std::vector<std::string> names;
      for (ValueId v : node.outputs) {
        types.push_back(m_.value(v).type);
        names.push_back("re." + m_.value(v).name);
      }
      const NodeId c = m_.add_node_typed(node.op, std::move(inputs), node.attrs, std::move(types), std::move(names), node.source + " (recomputed)");
      for (size_t k = 0; k < node.outputs.size(); ++k) map[node.outputs[k]] = m_.node(c).outputs[k];
      order.push_back(c);
      ++recomputed_nodes;
      recompute_flops += node_flops(m_, m_.node(c));
    }
  }

  Module& m_;
  const Analysis& a_;
  const std::unordered_set<ValueId>& pinned_recompute_;
  std::vector<ValueId> cur_x_;
  std::vector<int> executed_;
  std::vector<std::unordered_map<ValueId, ValueId>> tape_map_, heavy_map_;
  std::vector<bool> ready_, partial_;
};

// The actions of the policy: per-block checkpointing, or the solver's schedule under the limit
// (whose table size goes to the report).
Expected<std::vector<ChainAction>> choose_actions(const RematOptions& options, const Module& m, const Analysis& a, const Chain& chain,
                                                  RematReport& report) {
  if (options.policy == RematPolicy::kBlocks) return block_actions(m, a, report);
  ChainSolution solution = solve_chain(chain, options.limit_bytes);
  report.dp_table_bytes = solution.table_bytes;
  if (solution.cost < 0) {
    return Status::Budget(str_cat("remat: no schedule keeps the activations within ", format_size(options.limit_bytes)));
  }
  return std::move(solution.actions);
}

// The forward as is, then the backward nodes in their order, each preceded by the actions its
// inputs need and rewired to the copies its segments' backward reads. Every action is applied.
std::vector<NodeId> materialize(Module& m, const Analysis& a, const std::vector<ChainAction>& actions, const std::vector<NodeId>& order,
                                const StepRange& range, Materializer& mat) {
  const int n = static_cast<int>(a.segments.size());
  std::vector<NodeId> new_order;
  size_t next = 0;
  auto run_until = [&](auto&& done) {
    while (!done() && next < actions.size()) mat.apply(actions[next++], new_order);
  };
  // The first sweep (everything before the first backward) is the original forward.
  while (next < actions.size() && actions[next].kind != ChainAction::kBackward) mat.apply(actions[next++], new_order);
  MEMC_CHECK(new_order.empty(), "remat: the first sweep recomputed something");
  for (NodeId id : order) {
    if (!range.backward(id)) continue;
    // Segments this backward node reads (clones grow the node table: index, don't hold).
    for (size_t k = 0; k < m.node(id).inputs.size(); ++k) {
      const ValueId in = m.node(id).inputs[k];
      if (in == kNoValue || a.global[in]) continue;
      const int s = a.segment_of_value[in];
      if (s < 0) continue;
      // A boundary x_{s+1} is also the input of segment s+1: whichever is ready first serves.
      const bool is_boundary = s + 1 < n && a.boundary[s + 1] == in;
      run_until([&] { return mat.ready(s) || (is_boundary && mat.ready(s + 1)); });
      m.node(id).inputs[k] = is_boundary && mat.ready(s + 1) && !mat.ready(s) ? mat.lookup(s + 1, in) : mat.lookup(s, in);
    }
    new_order.push_back(id);
  }
  run_until([] { return false; });  // nothing may be left; keeps the action list honest
  return new_order;
}

// The schedule with the backward replaced by `new_order`; nodes before the backward (and after
// it) keep their places.
std::vector<NodeId> splice(const std::vector<NodeId>& order, const std::vector<NodeId>& new_order, const StepRange& range) {
  std::vector<NodeId> spliced;
  bool inserted = false;
  for (NodeId id : order) {
    if (range.backward(id)) {
      if (!inserted) spliced.insert(spliced.end(), new_order.begin(), new_order.end()), inserted = true;
      continue;
    }
    spliced.push_back(id);
  }
  if (!inserted) spliced.insert(spliced.end(), new_order.begin(), new_order.end());
  return spliced;
}

}  // namespace

Expected<RematReport> Remat::run(Module& m, NodeId forward_begin, NodeId backward_begin, NodeId backward_end) const {
  RematReport report;
  if (options_.policy == RematPolicy::kNone) return report;
  const StepRange range{forward_begin, backward_begin, backward_end};
  const std::vector<NodeId> order = m.schedule();
  const Pins pins = resolve_pins(m, forward_nodes(order, range), options_);
  Analysis a = analyze(m, order, range, pins);
  if (options_.policy == RematPolicy::kLimit) merge_segments(kMaxChainSegments, a);
  report.unresolved_pins = pins.unresolved;
  report.tape_bytes = tape_bytes(m, a.tape);
  report.segments = static_cast<int>(a.segments.size());

  const Chain chain = chain_of(m, a);
  log_segments(a, chain);
  MEMC_ASSIGN_OR_RETURN(const std::vector<ChainAction> actions, choose_actions(options_, m, a, chain, report));
  log_actions(actions);
  report.held_tape_bytes = held_tape_bytes(actions, chain);
  const bool pins_only = options_.limit_bytes >= std::numeric_limits<int64_t>::max() / 8;
  if (options_.policy == RematPolicy::kLimit && !pins_only) report.limit_met = report.held_tape_bytes <= options_.limit_bytes;

  Materializer mat(m, a, pins.recompute);
  const std::vector<NodeId> new_order = materialize(m, a, actions, order, range, mat);
  log_kept_originals(m, a, new_order, backward_begin);
  m.set_schedule(splice(order, new_order, range));
  report.recomputed_nodes = mat.recomputed_nodes;
  report.recompute_flops = mat.recompute_flops;
  return report;
}

std::string_view remat_policy_name(RematPolicy policy) {
  switch (policy) {
    case RematPolicy::kNone: return "none";
    case RematPolicy::kBlocks: return "blocks";
    case RematPolicy::kLimit: return "limit";
  }
  return "?";
}

std::string describe_remat(const RematOptions& r) {
  if (r.policy != RematPolicy::kLimit) return std::string(remat_policy_name(r.policy));
  if (r.limit_bytes >= std::numeric_limits<int64_t>::max() / 8) return "pins";
  return format_size(r.limit_bytes);
}

}  // namespace memc
