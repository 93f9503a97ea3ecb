// Pattern-matching helpers shared by the fusions.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace memc::fusion {

// The live node producing `v`, or nullptr for arguments.
const Node* producer(const Module& m, ValueId v);
// The producer when it has op `op`.
const Node* producer_if(const Module& m, ValueId v, const std::string& op);
// The single value of a constant whose elements are all equal (scalars, broadcast fills).
std::optional<double> constant_value(const Module& m, ValueId v);
bool is_constant_near(const Module& m, ValueId v, double expected, double tolerance = 1e-4);
// `v` is one of the module's outputs.
bool is_output(const Module& m, ValueId v);
// The one live node that reads `v`, reading it once, where `v` is no output of the module;
// nullptr otherwise (no reader, several, or a reader taking it twice).
const Node* only_reader(const Module& m, const Users& users, ValueId v);
// `n` is a live cast of one input between f32 and bf16/f16: narrowing (f32 → 16 bits) or widening
// (16 bits → f32), as asked.
bool is_16bit_cast(const Module& m, const Node* n, bool narrowing);
// For a binary node with `known` as one operand, the other operand (kNoValue otherwise).
ValueId other_operand(const Node& n, ValueId known);
// Adds a node scheduled immediately before `anchor`; returns its outputs (empty on a shape error).
std::vector<ValueId> add_before(Module& m, NodeId anchor, const std::string& op, std::vector<ValueId> inputs,
                                Attrs attrs, const std::string& source);
// One walk of a rewriting pass over the schedule, for passes that rewrite many matches (the GPU
// rewrites on a step of many micro-batches): the readers of each value and each node's place in
// the schedule, taken once per walk, not once per match. A rewrite changes the readers of the
// values its nodes read and write, and `touch` records them; a match that would look at one waits
// (`fresh` is false: the pass calls `defer`) for the next walk, which takes the index again. The
// pass walks until a walk defers nothing; a walk that defers has rewritten something, so the walks
// end. Readers of an untouched value are nodes the walk began with, whose order no rewrite changed.
class Walk {
 public:
  explicit Walk(const Module& m);
  const Users& users() const { return users_; }
  // `n` was in the schedule when the walk began, and no rewrite since read or wrote its inputs or
  // outputs, so `users()` holds their readers and `place` its position.
  bool fresh(const Module& m, NodeId n) const;
  // Records that the readers of `n`'s inputs and outputs changed (`n` made, killed, or rewired).
  void touch(const Module& m, NodeId n);
  void defer() { deferred_ = true; }
  bool deferred() const { return deferred_; }
  // Where one node reading `inputs` can replace fresh nodes `a` and `b`: the earlier one's place
  // when every input is made before it; else the later one's, when no other node reads the earlier
  // one's outputs before it; kNoNode when neither holds.
  NodeId fused_place(const Module& m, NodeId a, NodeId b, const std::vector<ValueId>& inputs) const;

 private:
  bool touched(ValueId v) const { return v == kNoValue || v >= static_cast<ValueId>(touched_.size()) || touched_[v]; }
  Users users_;
  std::vector<int32_t> place_;  // by NodeId: position in the schedule the walk began with, or -1
  std::vector<char> touched_;   // by ValueId
  bool deferred_ = false;
};

// `to` takes `from`'s place: its name (a gradient's "grad.W", which the runtime and the sharding
// passes look up), role and memory space, and every use; `from` is renamed NAME_unfused.
void take_identity(Module& m, ValueId from, ValueId to);
// The same, visiting only `readers` (Module::replace_uses): every live reader of `from`.
void take_identity(Module& m, ValueId from, ValueId to, std::span<const NodeId> readers);

}  // namespace memc::fusion
