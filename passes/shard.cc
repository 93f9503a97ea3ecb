#include "passes/shard.h"

#include <algorithm>
#include <climits>
#include <map>

#include "ir/grad.h"
#include "ir/op_registry.h"
#include "passes/emit.h"
#include "passes/microbatch.h"
#include "passes/shard_units.h"

namespace memc {
namespace {

ValueId emit(Module& m, const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {}) {
  return emit_node(m, "shard", op, std::move(inputs), std::move(attrs));
}

Attrs group(const ShardOptions& o) { return make_attrs({{"ranks", o.devices}}); }

ValueId scalar_like(Module& m, DType dtype, double v) {
  Tensor t = Tensor::zeros(DType::kF64, {});
  t.data<double>()[0] = v;
  return m.add_constant(t.cast(dtype), "c");
}

// Consecutive parameters of one dtype, up to kUnitBytes each (a larger parameter is a unit alone).
std::vector<std::vector<size_t>> size_buckets(const Module& m, const std::vector<ValueId>& params) {
  std::vector<std::vector<size_t>> units;
  int64_t bytes = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorType& t = m.value(params[i]).type;
    const bool same_dtype = !units.empty() && m.value(params[units.back().front()]).type.dtype == t.dtype;
    if (units.empty() || !same_dtype || bytes + t.bytes() > kUnitBytes) {
      units.emplace_back();
      bytes = 0;
    }
    units.back().push_back(i);
    bytes += t.bytes();
  }
  return units;
}

// Unit `index` of the parameters `members` (indices into `params`): names, offsets and block.
ShardUnit make_unit(const Module& m, const std::vector<ValueId>& params, const std::vector<size_t>& members, size_t index,
                    const ShardOptions& o) {
  ShardUnit u;
  u.name = str_cat("shard.unit", index);
  std::vector<int64_t> numels;
  for (size_t i : members) {
    u.params.push_back(params[i]);
    u.param_names.push_back(m.value(params[i]).source_name);
    numels.push_back(m.value(params[i]).type.numel());
  }
  u.offsets = flat_offsets(numels, o.align);
  u.elements = u.offsets.back() + numels.back();
  u.block = flat_block(u.elements, o.devices, o.align);
  return u;
}

// concat(flatten(values) at `offsets`, zeros between and after) → [padded]: one flat buffer.
ValueId flatten_padded(Module& m, const std::vector<ValueId>& values, const std::vector<int64_t>& offsets, int64_t padded) {
  const DType dtype = m.value(values[0]).type.dtype;
  auto zeros = [&](int64_t n) { return m.add_constant(Tensor::zeros(dtype, {n}), "pad"); };
  std::vector<ValueId> parts;
  int64_t end = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t n = m.value(values[i]).type.numel();
    if (offsets[i] > end) parts.push_back(zeros(offsets[i] - end));
    parts.push_back(emit(m, "reshape", {values[i]}, make_attrs({{"shape", std::vector<int64_t>{n}}})));
    end = offsets[i] + n;
  }
  if (padded > end) parts.push_back(zeros(padded - end));
  return parts.size() == 1 ? parts[0] : emit(m, "concat", parts, make_attrs({{"axis", int64_t{0}}}));
}

// [copy_to_device →] [all_gather →] split_flat → one view per parameter with its shape: the
// unit's whole parameters on the device. Returns the views.
std::vector<ValueId> gather_unit(Module& m, ShardUnit& u, const std::vector<TensorType>& types, const ShardOptions& o) {
  std::vector<int64_t> sizes;
  for (const TensorType& t : types) sizes.push_back(t.numel());
  ValueId flat = u.weight;
  if (o.stream_params) {
    flat = emit(m, "copy_to_device", {flat});
    m.value(flat).space = MemSpace::kDevice;
  }
  if (o.devices > 1) {  // an async pair: prefetch_one_ahead() moves the start one unit ahead
    u.pending = emit(m, "all_gather_start", {flat}, group(o));
    flat = emit(m, "all_gather_done", {u.pending, flat}, group(o));
  }
  Attrs split = make_attrs({{"sizes", sizes}});
  if (o.align > 1) split.set("offsets", u.offsets);
  auto pieces = m.add_node("split_flat", {flat}, std::move(split), "shard", static_cast<int>(sizes.size()));
  MEMC_CHECK(pieces.ok(), pieces.status().message());
  if (u.pending != kNoValue) u.split = (*pieces)[0];
  std::vector<ValueId> views;
  for (size_t i = 0; i < types.size(); ++i) views.push_back(emit(m, "reshape", {(*pieces)[i]}, make_attrs({{"shape", types[i].shape}})));
  return views;
}

// Prefetch: unit k's all_gather_start moves to right after unit k−1's split (in the order the
// units' splits run) and reads its first piece as `after`, so the next unit's gather is in
// flight while this unit computes; the schedule pass issues such a start as soon as its `after`
// exists, and completes each gather (OP_done) right before its first reader. `split_of(u)` is
// the unit's first split piece, `start_of(u)` its start's pending result.
template <typename SplitOf, typename StartOf>
void prefetch_one_ahead(Module& m, const std::vector<ShardUnit>& all, SplitOf split_of, StartOf start_of) {
  std::vector<const ShardUnit*> units;
  for (const ShardUnit& u : all) units.push_back(&u);
  std::vector<NodeId> order = m.schedule();
  auto position = [&](ValueId v) { return std::find(order.begin(), order.end(), m.value(v).producer) - order.begin(); };
  std::erase_if(units, [&](const ShardUnit* u) { return split_of(*u) == kNoValue || start_of(*u) == kNoValue; });
  std::sort(units.begin(), units.end(), [&](const ShardUnit* a, const ShardUnit* b) { return position(split_of(*a)) < position(split_of(*b)); });
  for (size_t k = 1; k < units.size(); ++k) {
    const NodeId start = m.value(start_of(*units[k])).producer;
    const ValueId previous = split_of(*units[k - 1]);
    if (m.node(start).inputs.size() > 1) continue;
    m.node(start).inputs.push_back(previous);
    // The start moves with what feeds it: a streamed unit's copy_to_device comes along.
    std::vector<NodeId> moved = {start};
    const NodeId feed = m.value(m.node(start).inputs[0]).producer;
    if (feed != kNoNode && m.node(feed).def && (m.node(feed).def->flags & kOpTransfer)) moved.insert(moved.begin(), feed);
    for (NodeId n : moved) order.erase(std::find(order.begin(), order.end(), n));
    order.insert(std::find(order.begin(), order.end(), m.value(previous).producer) + 1, moved.begin(), moved.end());
  }
  m.set_schedule(order);
}

// Moves the nodes added since `first_new` to right before the first scheduled node that reads
// any of `values` (the end when none does).
void schedule_before_first_reader(Module& m, NodeId first_new, const std::vector<ValueId>& values) {
  std::vector<NodeId> order = m.schedule(), added, rest;
  for (NodeId n : order) (n >= first_new ? added : rest).push_back(n);
  auto reads = [&](NodeId n) {
    for (ValueId v : m.node(n).inputs) {
      if (std::find(values.begin(), values.end(), v) != values.end()) return true;
    }
    return false;
  };
  auto at = std::find_if(rest.begin(), rest.end(), reads);
  rest.insert(at, added.begin(), added.end());
  m.set_schedule(rest);
}

// Moves the nodes added since `first_new` to right after the last scheduled producer of any of
// `values` (a unit's gradients: its reduction starts as soon as the unit's backward is done).
void schedule_after_last_producer(Module& m, NodeId first_new, const std::vector<ValueId>& values) {
  std::vector<NodeId> order = m.schedule(), added, rest;
  for (NodeId n : order) (n >= first_new ? added : rest).push_back(n);
  auto last = rest.begin();
  for (auto it = rest.begin(); it != rest.end(); ++it) {
    for (ValueId out : m.node(*it).outputs) {
      if (std::find(values.begin(), values.end(), out) != values.end()) last = it + 1;
    }
  }
  rest.insert(last, added.begin(), added.end());
  m.set_schedule(rest);
}

}  // namespace

std::string shard_stage_name(ShardStage stage) {
  switch (stage) {
    case ShardStage::kNone: return "none";
    case ShardStage::kZero1: return "zero1";
    case ShardStage::kZero2: return "zero2";
    case ShardStage::kZero3: return "zero3";
  }
  return "?";
}

RankSlice rank_slice(int64_t batch, int64_t devices, int64_t rank) {
  const int64_t base = batch / devices, extra = batch % devices;
  return {.first = rank * base + std::min(rank, extra), .rows = base + (rank < extra ? 1 : 0)};
}

Expected<ShardOptions> parse_shard(const std::string& stage, int64_t devices) {
  if (devices < 1 || devices > 4096) return Status::BadInput(str_cat("--devices ", devices, " must be between 1 and 4096"));
  ShardOptions o{.devices = devices};
  if (stage == "none") {
    o.stage = ShardStage::kNone;
  } else if (stage == "zero1") {
    o.stage = ShardStage::kZero1;
  } else if (stage == "zero2") {
    o.stage = ShardStage::kZero2;
  } else if (stage == "zero3") {
    o.stage = ShardStage::kZero3;
  } else {
    return Status::BadInput("--shard '" + stage + "': none, zero1, zero2 or zero3");
  }
  if (devices > 1 && o.stage == ShardStage::kNone) o.stage = ShardStage::kZero1;  // data parallel shards the optimizer at least
  if (devices == 1) o.stage = ShardStage::kNone;  // one rank: nothing to split
  return o;
}

UnitGroups plan_units(const Module& forward, const std::vector<ValueId>& params) {
  StructuralUnits found = find_structural_units(forward, params);
  if (!found.units.empty()) return {std::move(found.units), found.description + ", from the graph's structure"};
  UnitGroups groups{size_buckets(forward, params), ""};
  groups.description = str_cat(groups.members.size(), " buckets of up to ", kUnitBytes >> 20, " MiB (no repeated block found)");
  return groups;
}

Expected<std::vector<ShardUnit>> shard_gradients(Module& m, const std::vector<ValueId>& params, const std::vector<ValueId>& grads,
                                                 const UnitGroups& groups, const ShardOptions& o) {
  std::vector<ShardUnit> units;
  std::vector<ValueId> dones, flats;  // each unit's reduction, and its flat gradient
  for (const std::vector<size_t>& members : groups.members) {
    ShardUnit u = make_unit(m, params, members, units.size(), o);
    std::vector<ValueId> unit_grads;
    for (size_t i : members) {
      unit_grads.push_back(grads[i]);
      if (m.value(grads[i]).type.dtype != m.value(params[i]).type.dtype) {
        return Status::Internal(str_cat("gradient of ", m.value(params[i]).name, " is not in its parameter's dtype"));
      }
    }
    const int64_t padded = u.block * o.devices;
    u.weight = emit(m, "shard_block", {flatten_padded(m, u.params, u.offsets, padded)}, group(o));
    m.rename(u.weight, u.name);
    const auto first_new = static_cast<NodeId>(m.nodes().size());
    const ValueId flat = flatten_padded(m, unit_grads, u.offsets, padded);
    const ValueId summed = reduce_async(m, o.stage == ShardStage::kZero2 ? "reduce_scatter" : "all_reduce", flat, o);
    schedule_after_last_producer(m, first_new, unit_grads);
    const ValueId reduced = o.stage == ShardStage::kZero2 ? summed : emit(m, "shard_block", {summed}, group(o));
    dones.push_back(summed);
    flats.push_back(flat);
    u.grad = mean_over_ranks(m, reduced, o);
    m.value(u.grad).role = Role::kGrad;
    m.rename(u.grad, "grad." + u.name);
    units.push_back(std::move(u));
  }
  overlap_reductions(m, dones, previous_unit(flats));
  return units;
}

ShardUnit gather_again(Module& m, const ShardUnit& u, const ShardOptions& o) {
  ShardUnit chain = u;  // its own pending and split values
  chain.pending = chain.split = kNoValue;
  std::vector<TensorType> types;
  for (ValueId p : u.params) types.push_back(m.value(p).type);
  chain.views = gather_unit(m, chain, types, o);
  return chain;
}

void prefetch_gathers(Module& m, const std::vector<ShardUnit>& chains) {
  prefetch_one_ahead(m, chains, [](const ShardUnit& u) { return u.split; }, [](const ShardUnit& u) { return u.pending; });
}

void prefetch_across_passes(Module& m) {
  const auto users = m.users();
  std::vector<ShardUnit> chains;
  for (NodeId n : m.schedule()) {
    const Node& start = m.node(n);
    if (start.dead || start.op != "all_gather_start") continue;
    ShardUnit chain;
    chain.pending = start.outputs[0];
    for (NodeId done : users[chain.pending]) {
      if (m.node(done).dead || m.node(done).op != "all_gather_done") continue;
      for (NodeId split : users[m.node(done).outputs[0]]) {
        if (!m.node(split).dead && m.node(split).op == "split_flat") chain.split = m.node(split).outputs[0];
      }
    }
    if (chain.split != kNoValue) chains.push_back(chain);
  }
  prefetch_gathers(m, chains);  // links only the starts that follow nothing yet
}

Expected<std::vector<ShardUnit>> shard_parameters(Module& m, std::vector<ValueId>& params, const UnitGroups& groups, const ShardOptions& o) {
  std::vector<ShardUnit> units;
  std::vector<ValueId> shards;
  for (const std::vector<size_t>& members : groups.members) {
    ShardUnit u = make_unit(m, params, members, units.size(), o);
    std::vector<TensorType> types;
    for (size_t i : members) types.push_back(m.value(params[i]).type);
    u.weight = m.add_argument(u.name, {types[0].dtype, {u.block}}, Role::kParam);
    if (o.stream_params) m.value(u.weight).space = MemSpace::kHost;
    const auto first_new = static_cast<NodeId>(m.nodes().size());
    u.views = gather_unit(m, u, types, o);
    schedule_before_first_reader(m, first_new, u.params);
    for (size_t k = 0; k < u.params.size(); ++k) {
      m.replace_all_uses(u.params[k], u.views[k]);
      MEMC_RETURN_IF_ERROR(m.remove_argument(u.params[k]));
    }
    shards.push_back(u.weight);
    units.push_back(std::move(u));
  }
  params = shards;
  prefetch_one_ahead(m, units, [](const ShardUnit& u) { return u.split; }, [](const ShardUnit& u) { return u.pending; });
  return units;
}

// Backward's reads of values the forward computed from shards alone (the gathered parameters
// and what was derived from them without data: casts to bf16, transposes, reshapes) are
// recomputed for backward — a second gather — so none of it lives from forward to backward.
class BackwardRegather {
 public:
  BackwardRegather(Module& m, const std::vector<ShardUnit>& units, NodeId backward_begin)
      : m_(m), units_(units), backward_begin_(backward_begin), derived_(m.values().size(), false) {
    for (const ShardUnit& u : units) shards_.push_back(u.weight);
    find_derived();
  }

  void run() {
    const auto first_new = static_cast<NodeId>(m_.nodes().size());
    for (NodeId n = backward_begin_; n < first_new; ++n) {
      if (m_.node(n).dead) continue;
      for (size_t i = 0; i < m_.node(n).inputs.size(); ++i) {
        const ValueId v = m_.node(n).inputs[i];
        if (v != kNoValue && v < static_cast<ValueId>(derived_.size()) && derived_[v]) {
          const ValueId again = clone(v);
          m_.node(n).inputs[i] = again;
        }
      }
    }
    schedule_clones(first_new);
    // Backward prefetches too, in backward's order of units (the last block first).
    auto clone_of = [&](ValueId v) {
      auto it = clones_.find(v);
      return v == kNoValue || it == clones_.end() ? kNoValue : it->second;
    };
    prefetch_one_ahead(m_, units_, [&](const ShardUnit& u) { return clone_of(u.split); }, [&](const ShardUnit& u) { return clone_of(u.pending); });
  }

 private:
  bool is_shard(ValueId v) const { return std::find(shards_.begin(), shards_.end(), v) != shards_.end(); }

  // Forward values computed from shards and constants only, without randomness.
  void find_derived() {
    const OpRegistry& registry = OpRegistry::get();
    for (NodeId n : m_.schedule()) {
      const Node& node = m_.node(n);
      if (n >= backward_begin_ || node.inputs.empty()) continue;
      const OpDef* def = registry.find(node.op);
      if (def == nullptr || (def->flags & kOpRandom)) continue;
      bool from_shards = false, only = true;
      for (ValueId v : node.inputs) {
        if (v == kNoValue) continue;
        if (is_shard(v) || derived_[v]) {
          from_shards = true;
        } else if (m_.value(v).role != Role::kConstant) {
          only = false;
        }
      }
      if (!from_shards || !only) continue;
      for (ValueId out : node.outputs) derived_[out] = true;
    }
  }

  // The value recomputed: its producer cloned over recomputed inputs (memoized).
  ValueId clone(ValueId v) {
    if (auto it = clones_.find(v); it != clones_.end()) return it->second;
    Node node = m_.node(m_.value(v).producer);  // a copy: cloning grows the node table
    if (node.op.ends_with("_start")) node.inputs.resize(1);  // backward's prefetch point is set after cloning
    std::vector<ValueId> inputs;
    for (ValueId in : node.inputs) inputs.push_back(in != kNoValue && in < static_cast<ValueId>(derived_.size()) && derived_[in] ? clone(in) : in);
    std::vector<TensorType> types;
    std::vector<std::string> names;
    for (ValueId out : node.outputs) {
      types.push_back(m_.value(out).type);
      names.push_back(m_.value(out).name + ".bwd");
    }
    const NodeId copy = m_.add_node_typed(node.op, inputs, node.attrs, types, names, node.source);
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const ValueId out = m_.node(copy).outputs[k];
      m_.value(out).role = m_.value(node.outputs[k]).role;
      clones_[node.outputs[k]] = out;
    }
    return clones_.at(v);
  }

  // Each clone right before the first node that reads it (its readers' earliest position), so
  // a unit's second gather happens when backward reaches the unit.
  void schedule_clones(NodeId first_new) {
    std::vector<NodeId> old_order;
    for (NodeId n : m_.schedule()) {
      if (n < first_new) old_order.push_back(n);
    }
    std::vector<int64_t> position(m_.nodes().size(), INT64_MAX);
    for (size_t i = 0; i < old_order.size(); ++i) position[old_order[i]] = static_cast<int64_t>(i);
    const auto users = m_.users();
    std::vector<int64_t> first_use(m_.nodes().size(), INT64_MAX);
    for (NodeId n = static_cast<NodeId>(m_.nodes().size()) - 1; n >= first_new; --n) {  // users were made after
      for (ValueId out : m_.node(n).outputs) {
        for (NodeId u : users[out]) first_use[n] = std::min(first_use[n], u >= first_new ? first_use[u] : position[u]);
      }
    }
    std::vector<std::pair<int64_t, NodeId>> added;
    for (NodeId n = first_new; n < static_cast<NodeId>(m_.nodes().size()); ++n) added.push_back({first_use[n], n});
    std::stable_sort(added.begin(), added.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<NodeId> order;
    size_t k = 0;
    for (size_t i = 0; i < old_order.size(); ++i) {
      for (; k < added.size() && added[k].first <= static_cast<int64_t>(i); ++k) order.push_back(added[k].second);
      order.push_back(old_order[i]);
    }
    for (; k < added.size(); ++k) order.push_back(added[k].second);
    m_.set_schedule(order);
  }

  Module& m_;
  const std::vector<ShardUnit>& units_;
  NodeId backward_begin_;
  std::vector<bool> derived_;
  std::vector<ValueId> shards_;
  std::map<ValueId, ValueId> clones_;
};

Status regather_for_backward(Module& m, const std::vector<ShardUnit>& units, NodeId backward_begin, const ShardOptions&) {
  BackwardRegather(m, units, backward_begin).run();
  return Status::Ok();
}

ValueId all_reduce_value(Module& m, ValueId v, const ShardOptions& o, const std::string& reduce) {
  if (o.devices == 1) return v;
  Attrs a = group(o);
  a.set("reduce", reduce);
  return emit(m, "all_reduce", {v}, std::move(a));
}

std::vector<ValueId> previous_unit(const std::vector<ValueId>& values) {
  std::vector<ValueId> previous(values.size(), kNoValue);
  for (size_t k = 1; k < values.size(); ++k) previous[k] = values[k - 1];
  return previous;
}

ValueId reduce_async(Module& m, const std::string& op, ValueId x, const ShardOptions& o) {
  if (o.devices == 1 && op == "all_reduce") return x;
  Attrs a = group(o);
  a.set("reduce", std::string("sum"));
  const ValueId pending = emit(m, op + "_start", {x}, a);
  return emit(m, op + "_done", {pending, x}, a);
}

void overlap_reductions(Module& m, const std::vector<ValueId>& dones, const std::vector<ValueId>& after) {
  std::vector<NodeId> order = m.schedule();
  auto position = [&](NodeId n) { return std::find(order.begin(), order.end(), n) - order.begin(); };
  for (size_t k = 0; k < dones.size() && k < after.size(); ++k) {
    if (dones[k] == kNoValue || after[k] == kNoValue) continue;
    const NodeId done = m.value(dones[k]).producer, feed = m.value(after[k]).producer;
    if (done == kNoNode || feed == kNoNode || !m.node(done).op.ends_with("_done") || m.node(done).inputs.size() > 2) continue;
    const auto at = position(done), ready = position(feed);
    if (ready > at) {  // the done moves to right after `after`'s producer, unless its result is read before
      bool read_before = false;
      for (auto i = at + 1; i <= ready && !read_before; ++i) {
        const std::vector<ValueId>& in = m.node(order[i]).inputs;
        read_before = std::find(in.begin(), in.end(), dones[k]) != in.end();
      }
      if (read_before) continue;
      order.erase(order.begin() + at);
      order.insert(order.begin() + position(feed) + 1, done);
    }
    m.node(done).inputs.push_back(after[k]);
  }
  m.set_schedule(order);
}

ValueId mean_over_ranks(Module& m, ValueId v, const ShardOptions& o) {
  if (o.devices == 1 || o.global_divisor()) return v;
  return emit(m, "mul", {v, scalar_like(m, m.value(v).type.dtype, 1.0 / static_cast<double>(o.devices))});
}

namespace {

// Elements [offset, offset + numel of `t`) of a flat buffer, shaped as `t`.
ValueId unflatten(Module& m, ValueId flat, int64_t offset, TensorType t) {  // t by value: emit() grows the value table
  const int64_t n = t.numel();
  return emit(m, "reshape", {emit_rows(m, "shard", flat, offset, offset + n)}, make_attrs({{"shape", t.shape}}));
}

}  // namespace

std::vector<ValueId> all_reduce_gradients(Module& m, const std::vector<ValueId>& params, const std::vector<ValueId>& grads,
                                          const UnitGroups& groups, const ShardOptions& o) {
  std::vector<ValueId> mean(params.size(), kNoValue);
  std::vector<ValueId> dones, flats;  // each unit's reduction, and its flat gradient
  for (const std::vector<size_t>& members : groups.members) {
    std::vector<ValueId> unit_grads;
    std::vector<int64_t> numels;
    for (size_t i : members) {
      unit_grads.push_back(grads[i]);
      numels.push_back(m.value(grads[i]).type.numel());
    }
    const std::vector<int64_t> offsets = flat_offsets(numels, 1);
    const auto first_new = static_cast<NodeId>(m.nodes().size());
    const ValueId flat = flatten_padded(m, unit_grads, offsets, offsets.back() + numels.back());
    const ValueId summed = reduce_async(m, "all_reduce", flat, o);
    schedule_after_last_producer(m, first_new, unit_grads);
    dones.push_back(summed);
    flats.push_back(flat);
    const ValueId reduced = mean_over_ranks(m, summed, o);
    for (size_t k = 0; k < members.size(); ++k) {
      const size_t i = members[k];
      mean[i] = unflatten(m, reduced, offsets[k], m.value(grads[i]).type);
      m.value(mean[i]).role = Role::kGrad;
      const std::string name = m.value(params[i]).name;  // "grad.<param>" is the mean's (--dump-grads reads it)
      m.rename(grads[i], "rank_grad." + name);
      m.rename(mean[i], "grad." + name);
    }
  }
  overlap_reductions(m, dones, previous_unit(flats));
  return mean;
}

Status gather_updated_params(Module& m, const ShardUnit& u, ValueId updated, const ShardOptions& o) {
  const ValueId flat = emit(m, "all_gather", {updated}, group(o));
  for (size_t i = 0; i < u.params.size(); ++i) {
    const ValueId p = u.params[i];
    const ValueId next = unflatten(m, flat, u.offsets[i], m.value(p).type);
    m.value(next).role = m.value(p).role;
    m.rename(next, m.value(p).name + ".next");
    m.add_update(p, next);
  }
  return Status::Ok();
}

void mark_rank_draws(Module& m, const std::vector<int64_t>& batches) {
  for (NodeId n : m.schedule()) {
    Node& node = m.node(n);
    for (int64_t batch : batches) {
      if (const int64_t per_sample = random_draws_per_sample(m, node, batch); per_sample > 0) {
        node.attrs.set("rng_row_stride", per_sample);
        break;
      }
    }
  }
}

void record_shard_layout(Module& m, const std::vector<ShardUnit>& units, const ShardOptions& o) {
  m.metadata().set("memc.shard.devices", o.devices);
  m.metadata().set("memc.shard.stage", static_cast<int64_t>(o.stage));
  std::vector<std::string> names;
  std::vector<int64_t> blocks;
  for (const ShardUnit& u : units) {
    names.push_back(u.name);
    blocks.push_back(u.block);
    m.metadata().set("memc.shard.params." + u.name, u.param_names);
  }
  m.metadata().set("memc.shard.units", names);
  if (o.flat_params()) m.metadata().set("memc.shard.flat_params", int64_t{1});
  if (o.align > 1) m.metadata().set("memc.shard.align", o.align);
  m.metadata().set("memc.shard.blocks", blocks);
}

Expected<ShardLayout> shard_layout(const Module& m) {
  ShardLayout layout;
  layout.devices = m.metadata().get_int("memc.shard.devices", 1);
  const int64_t stage = m.metadata().get_int("memc.shard.stage", 0);
  if (layout.devices < 1 || stage < 0 || stage > 3) return Status::BadInput(str_cat("shard layout: devices ", layout.devices, ", stage ", stage));
  layout.stage = static_cast<ShardStage>(stage);
  layout.flat_params = m.metadata().get_int("memc.shard.flat_params", stage == 3 ? 1 : 0) != 0;
  layout.align = m.metadata().get_int("memc.shard.align", 1);
  if (layout.align < 1) return Status::BadInput(str_cat("shard layout: align ", layout.align));
  const Attr* names = m.metadata().find("memc.shard.units");
  if (!names) return layout;
  const auto* unit_names = std::get_if<std::vector<std::string>>(names);
  const std::vector<int64_t> blocks = m.metadata().get_ints("memc.shard.blocks");
  if (!unit_names || unit_names->size() != blocks.size()) return Status::BadInput("shard layout: units and blocks differ in number");
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Attr* params = m.metadata().find("memc.shard.params." + (*unit_names)[i]);
    const auto* list = params ? std::get_if<std::vector<std::string>>(params) : nullptr;
    if (!list) return Status::BadInput("shard layout: no parameters for " + (*unit_names)[i]);
    layout.units.push_back({(*unit_names)[i], *list, blocks[i]});
  }
  return layout;
}

}  // namespace memc
