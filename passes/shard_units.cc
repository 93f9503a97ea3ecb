#include "passes/shard_units.h"

#include <algorithm>
#include <map>

#include "passes/repetition.h"

namespace memc {
namespace {

struct Walk {
  std::vector<NodeId> order;
  std::vector<int64_t> position;  // by NodeId; -1 outside the schedule
};

Walk walk(const Module& m) {
  Walk w{m.schedule(), std::vector<int64_t>(m.nodes().size(), -1)};
  for (size_t i = 0; i < w.order.size(); ++i) w.position[w.order[i]] = static_cast<int64_t>(i);
  return w;
}

// segment[i]: the segment of the i-th scheduled node. A cut follows node i when at most one
// activation (a value computed from data and parameters) is live across the gap after it.
std::vector<int> segments(const Module& m, const Walk& w, const Users& users) {
  const size_t nv = m.values().size(), nn = w.order.size();
  std::vector<bool> from_data(nv, false), from_params(nv, false);
  for (ValueId a : m.arguments()) {
    from_data[a] = m.value(a).role == Role::kInput;
    from_params[a] = m.value(a).role == Role::kParam;
  }
  std::vector<int64_t> live(nn + 1, 0);  // difference array over gaps
  for (NodeId n : w.order) {
    bool data = false, params = false;
    for (ValueId v : m.node(n).inputs) {
      if (v == kNoValue) continue;
      data = data || from_data[v];
      params = params || from_params[v];
    }
    for (ValueId out : m.node(n).outputs) {
      from_data[out] = data;
      from_params[out] = params;
      if (!data || !params) continue;
      // A module output lives to the end; a result nobody reads (dropout's mask) dies at once.
      const bool output = std::find(m.outputs().begin(), m.outputs().end(), out) != m.outputs().end();
      int64_t last = output ? static_cast<int64_t>(nn) : w.position[n];
      for (NodeId u : users[out]) last = std::max(last, w.position[u]);
      ++live[w.position[n]];
      --live[last];
    }
  }
  std::vector<int> segment(nn, 0);
  int64_t crossing = 0;
  int current = 0;
  for (size_t i = 0; i < nn; ++i) {
    segment[i] = current;
    crossing += live[i];
    if (crossing <= 1) ++current;
  }
  return segment;
}

// Splits a unit by dtype (a unit is one flat buffer), each part in argument order.
void add_unit(const Module& m, const std::vector<ValueId>& params, std::vector<size_t> members, StructuralUnits& out) {
  std::sort(members.begin(), members.end());
  std::map<DType, std::vector<size_t>> by_dtype;
  std::vector<DType> first_seen;
  for (size_t i : members) {
    const DType d = m.value(params[i]).type.dtype;
    if (!by_dtype.count(d)) first_seen.push_back(d);
    by_dtype[d].push_back(i);
  }
  for (DType d : first_seen) out.units.push_back(by_dtype[d]);
}

}  // namespace

StructuralUnits find_structural_units(const Module& m, const std::vector<ValueId>& params) {
  const Walk w = walk(m);
  const auto users = m.users();
  const std::vector<int> segment = segments(m, w, users);
  // Each parameter belongs to the segment of its first reader (unread ones go with the last
  // unit); a segment's signature lists every parameter it reads, so a block whose weights an
  // exporter tied to an earlier block's (deduplicated initializers) still looks like the others.
  std::map<ValueId, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i]] = i;
  std::map<int, std::vector<size_t>> members, reads;  // segment → parameter indices, in reading order
  std::vector<bool> placed(params.size(), false);
  for (size_t k = 0; k < w.order.size(); ++k) {
    for (ValueId v : m.node(w.order[k]).inputs) {
      auto it = v == kNoValue ? index.end() : index.find(v);
      if (it == index.end()) continue;
      std::vector<size_t>& read = reads[segment[k]];
      if (std::find(read.begin(), read.end(), it->second) == read.end()) read.push_back(it->second);
      if (!placed[it->second]) members[segment[k]].push_back(it->second), placed[it->second] = true;
    }
  }
  std::vector<size_t> unread;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!placed[i]) unread.push_back(i);
  }
  std::vector<std::vector<size_t>> segs;
  std::vector<std::vector<std::pair<DType, Shape>>> sigs;
  for (const auto& [id, read] : reads) {
    segs.push_back(members[id]);
    sigs.emplace_back();
    for (size_t i : read) sigs.back().push_back({m.value(params[i]).type.dtype, m.value(params[i]).type.shape});
  }
  const Repetition run = longest_run(sigs);
  StructuralUnits out;
  if (run.repeats < 2) return out;
  auto gather = [&](size_t from, size_t to) {
    std::vector<size_t> members;
    for (size_t s = from; s < to; ++s) members.insert(members.end(), segs[s].begin(), segs[s].end());
    return members;
  };
  std::vector<size_t> head = gather(run.start + run.covered(), segs.size());
  head.insert(head.end(), unread.begin(), unread.end());
  const std::vector<size_t> embedding = gather(0, run.start);
  if (!embedding.empty()) add_unit(m, params, embedding, out);
  const size_t before_blocks = out.units.size();
  for (size_t r = 0; r < run.repeats; ++r) add_unit(m, params, gather(run.start + r * run.period, run.start + (r + 1) * run.period), out);
  out.blocks = static_cast<int64_t>(out.units.size() - before_blocks);
  if (!head.empty()) add_unit(m, params, head, out);
  out.description = str_cat(embedding.empty() ? "" : str_cat("embedding (", embedding.size(), " parameters), "), run.repeats, " blocks of ",
                            gather(run.start, run.start + run.period).size(), head.empty() ? "" : str_cat(", head (", head.size(), ")"));
  return out;
}

}  // namespace memc
