#include "passes/liveness.h"

#include <algorithm>
#include <numeric>

#include "ir/op_registry.h"

namespace memc {

std::string_view alias_kind_name(AliasKind kind) {
  switch (kind) {
    case AliasKind::kOwner: return "owner";
    case AliasKind::kView: return "view";
    case AliasKind::kUpdate: return "update";
    case AliasKind::kInplace: return "inplace";
  }
  return "?";
}

bool is_persistent_role(Role role) {
  return role == Role::kParam || role == Role::kOptimizerState || role == Role::kMasterWeight ||
         role == Role::kConstant || role == Role::kBuffer;
}

Role Buffer::role_at(int32_t position) const {
  Role role = role_changes.front().second;
  for (const auto& [start, r] : role_changes) {
    if (start > position) break;
    role = r;
  }
  return role;
}

int64_t Liveness::live_bytes_at(int32_t position) const {
  int64_t total = 0;
  for (const Buffer& b : buffers) {
    if (b.range.contains(position)) total += b.bytes;
  }
  return total;
}

namespace {

// Union-find over value ids; each root carries its set's union range and flags.
class BufferSets {
 public:
  BufferSets(const Module& m, const std::vector<LiveRange>& ranges, const std::vector<int32_t>& last_use,
             const std::vector<bool>& is_output)
      : parent_(m.values().size()), range_(ranges), last_read_(last_use), persistent_(m.values().size(), false),
        has_output_(is_output) {
    std::iota(parent_.begin(), parent_.end(), 0);
    for (ValueId a : m.arguments()) persistent_[a] = is_persistent_role(m.value(a).role);
  }
  ValueId find(ValueId v) {
    while (parent_[v] != v) v = parent_[v] = parent_[parent_[v]];
    return v;
  }
  // Keeps `keep`'s root as the root (so an argument stays its buffer's owner).
  void unite(ValueId keep, ValueId other) {
    const ValueId a = find(keep), b = find(other);
    if (a == b) return;
    parent_[b] = a;
    range_[a].first = std::min(range_[a].first, range_[b].first);
    range_[a].last = std::max(range_[a].last, range_[b].last);
    last_read_[a] = std::max(last_read_[a], last_read_[b]);
    persistent_[a] = persistent_[a] || persistent_[b];
    has_output_[a] = has_output_[a] || has_output_[b];
  }
  const LiveRange& range(ValueId v) { return range_[find(v)]; }
  int32_t last_read(ValueId v) { return last_read_[find(v)]; }
  bool persistent(ValueId v) { return persistent_[find(v)]; }
  bool has_output(ValueId v) { return has_output_[find(v)]; }

 private:
  std::vector<ValueId> parent_;
  std::vector<LiveRange> range_;  // valid at roots
  std::vector<int32_t> last_read_;
  std::vector<bool> persistent_;
  std::vector<bool> has_output_;
};

// Rules 1-4: per-value ranges and last reads.
void compute_ranges(const Module& m, Liveness& live, std::vector<bool>& is_output) {
  const size_t n_values = m.values().size();
  live.ranges.assign(n_values, LiveRange{});
  live.last_use.assign(n_values, -1);
  const int32_t end = live.num_positions - 1;
  for (ValueId a : m.arguments()) live.ranges[a] = {0, 0};
  for (int32_t p = 0; p < static_cast<int32_t>(live.schedule.size()); ++p) {
    const Node& node = m.node(live.schedule[p]);
    for (ValueId v : node.inputs) {
      if (v == kNoValue) continue;
      live.last_use[v] = p;
      live.ranges[v].last = std::max(live.ranges[v].last, p);
    }
    for (ValueId v : node.outputs) live.ranges[v] = {p, p};
  }
  for (ValueId a : m.arguments()) {
    if (is_persistent_role(m.value(a).role)) live.ranges[a] = {0, end};
  }
  is_output.assign(n_values, false);
  for (ValueId v : m.outputs()) {
    is_output[v] = true;
    if (live.ranges[v].first >= 0) live.ranges[v].last = end;
  }
}

// Rule B: the update `value` takes over `arg`'s buffer at `value`'s definition.
Status alias_update(const Module& m, const Liveness& live, BufferSets& sets, ValueId arg, ValueId value,
                    std::vector<AliasKind>& alias) {
  const Value &a = m.value(arg), &v = m.value(value);
  auto fail = [&](const std::string& why) {
    return Status::Internal(str_cat("output %", v.name, " updates argument %", a.name, " but ", why,
                                    ": it cannot be updated in place"));
  };
  if (sets.find(arg) == sets.find(value)) return Status::Ok();
  if (v.type.bytes() != a.type.bytes()) return fail(str_cat("their sizes differ (", v.type.bytes(), " vs ", a.type.bytes(), " bytes)"));
  if (v.space != a.space) return fail("they live in different memory spaces");
  if (sets.persistent(value)) return fail("it already holds a persistent argument");
  const int32_t defined = sets.range(value).first;
  const int32_t read = sets.last_read(arg);
  if (defined < 0) return fail("it is not computed in the step");
  if (read > defined) return fail(str_cat("the argument is read at position ", read, " after the update is written at ", defined));
  if (read == defined) {
    const OpDef* def = m.node(live.schedule[defined]).def;
    if (def == nullptr || !(def->flags & kOpInplaceOk)) {
      return fail(str_cat("memc.", m.node(live.schedule[defined]).op, " reads the argument while writing the update"));
    }
  }
  sets.unite(arg, value);
  alias[value] = AliasKind::kUpdate;
  return Status::Ok();
}

// Rule C, decided at the op's position `p`.
void alias_inplace(const Module& m, int32_t p, const Node& node, BufferSets& sets, std::vector<AliasKind>& alias) {
  if (node.inputs.empty() || node.outputs.empty() || node.inputs[0] == kNoValue) return;
  const ValueId in = node.inputs[0], out = node.outputs[0];
  if (sets.find(in) == sets.find(out)) return;
  const Value &vi = m.value(in), &vo = m.value(out);
  // Equal element counts too: an input of the output's bytes but fewer elements (f32 [N] read by a
  // fused node writing bf16 [2, N]) is broadcast, and element i's write would overwrite what a
  // later element still reads.
  if (vi.type.bytes() != vo.type.bytes() || vi.type.numel() != vo.type.numel() || vi.space != vo.space) return;
  if (sets.persistent(in) || sets.has_output(in) || sets.range(in).last != p) return;
  if (sets.persistent(out) || sets.range(out).first != p || alias[out] != AliasKind::kOwner) return;
  sets.unite(in, out);
  alias[out] = AliasKind::kInplace;
}

void build_buffers(const Module& m, BufferSets& sets, Liveness& live) {
  const size_t n_values = m.values().size();
  live.buffer_of.assign(n_values, kNoBuffer);
  std::vector<BufferId> of_root(n_values, kNoBuffer);
  for (ValueId v = 0; v < static_cast<ValueId>(n_values); ++v) {
    if (live.ranges[v].first < 0) continue;
    const ValueId root = sets.find(v);
    if (of_root[root] == kNoBuffer) {
      of_root[root] = static_cast<BufferId>(live.buffers.size());
      Buffer b;
      b.id = of_root[root];
      b.range = sets.range(root);
      b.persistent = sets.persistent(root);
      b.space = m.value(root).space;
      live.buffers.push_back(std::move(b));
    }
    live.buffer_of[v] = of_root[root];
    live.buffers[of_root[root]].values.push_back(v);
  }
  for (Buffer& b : live.buffers) {
    std::stable_sort(b.values.begin(), b.values.end(), [&](ValueId x, ValueId y) {
      const bool ox = live.alias[x] == AliasKind::kOwner, oy = live.alias[y] == AliasKind::kOwner;
      if (live.ranges[x].first != live.ranges[y].first) return live.ranges[x].first < live.ranges[y].first;
      return ox > oy;  // at equal positions the owner comes first
    });
    b.bytes = m.value(b.values[0]).type.bytes();
    for (ValueId v : b.values) {
      // A view relabels bytes; it names a new role only when it has one (a parameter's gradient
      // that is a reshape of an activation gradient), else it keeps its source's.
      if (live.alias[v] == AliasKind::kView && m.value(v).role == Role::kActivation) continue;
      const int32_t start = live.alias[v] == AliasKind::kOwner ? b.range.first : live.ranges[v].first;
      b.role_changes.emplace_back(start, m.value(v).role);
    }
  }
}

}  // namespace

Expected<Liveness> analyze_liveness(const Module& m) {
  Liveness live;
  live.schedule = m.schedule();
  live.num_positions = std::max<int32_t>(1, static_cast<int32_t>(live.schedule.size()));
  std::vector<bool> is_output;
  compute_ranges(m, live, is_output);
  live.alias.assign(m.values().size(), AliasKind::kOwner);
  BufferSets sets(m, live.ranges, live.last_use, is_output);
  const OpRegistry& registry = OpRegistry::get();

  // Rule A first: views belong to their source whatever else happens.
  for (NodeId n : live.schedule) {
    const Node& node = m.node(n);
    const OpDef* def = registry.find(node.op);
    if (def == nullptr || !(def->flags & kOpView) || node.inputs.empty() || node.inputs[0] == kNoValue) continue;
    for (ValueId out : node.outputs) {
      const Value &vi = m.value(node.inputs[0]), &vo = m.value(out);
      if (vi.space != vo.space) {
        return Status::Internal(str_cat("view %", vo.name, " of %", vi.name, " crosses memory spaces"));
      }
      if (vi.type.bytes() != vo.type.bytes()) continue;  // not a pure relabelling: own buffer
      sets.unite(node.inputs[0], out);
      live.alias[out] = AliasKind::kView;
    }
  }
  // Rule B: updates take over their argument's buffer.
  for (size_t i = 0; i < m.outputs().size() && i < m.output_updates().size(); ++i) {
    const ValueId arg = m.output_updates()[i];
    if (arg == kNoValue) continue;
    MEMC_RETURN_IF_ERROR(alias_update(m, live, sets, arg, m.outputs()[i], live.alias));
  }
  // Rule C, greedily in schedule order (a buffer's end is final once its position is reached).
  for (int32_t p = 0; p < static_cast<int32_t>(live.schedule.size()); ++p) {
    const Node& node = m.node(live.schedule[p]);
    const OpDef* def = registry.find(node.op);
    if (def != nullptr && (def->flags & kOpInplaceOk)) alias_inplace(m, p, node, sets, live.alias);
  }
  build_buffers(m, sets, live);
  return live;
}

}  // namespace memc
