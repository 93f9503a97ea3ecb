// Liveness: live ranges of every value over a Module's schedule, and the buffers (sets of
// values sharing storage) that the memory planner places. An analysis: it never changes the
// module. Run it last, on the final schedule: any pass that reorders, adds or removes nodes
// afterwards invalidates the result.
//
// Positions. Node k of Module::schedule() runs at position k (0 ≤ k < N). A range [first, last]
// is inclusive: the value's bytes are reserved while nodes first..last run, so the inputs and
// outputs of a node are live together at its position (a kernel reads and writes at once).
//
// Value ranges (the contract):
//  1. A node output is defined at its node's position; it lives to its last use, or only at
//     its own position when nothing reads it (the kernel still writes it).
//  2. Persistent arguments (roles param, optimizer_state, master_weight, constant) live for the
//     whole step, [0, N-1]: they must survive into the next step.
//  3. Other arguments (data inputs, runtime scalars) live from 0 to their last use ([0, 0] when
//     unread: the runtime still writes them).
//  4. Module outputs live to the end, N-1: the runtime reads them after the step.
//  `last_use` is the last position that reads the value (-1 when none), before rules 2 and 4
//  stretch the range; the aliasing rules below are stated in terms of it.
//
// Buffers. Values that share storage form one buffer whose range is the union of theirs:
//  A. View: the output of a kOpView op (reshape) is its input's bytes relabelled, always.
//  B. Update: output i of the module with output_updates()[i] = arg shares arg's buffer, always
//     (the optimizer updates parameters and states in place, so each is counted once). This needs
//     every read of arg's buffer to happen no later than the update's definition, and at that
//     same position only by a kOpInplaceOk op; otherwise analysis fails naming both values.
//  C. In place: output 0 of a kOpInplaceOk op shares its first input's buffer when (a) that
//     buffer's range ends at this op, (b) the byte sizes, element counts and memory spaces are equal, (c) the
//     buffer holds no persistent argument and no module output, (d) the output has no buffer
//     of its own yet (rule B did not claim it). Decided greedily in schedule order.
//  A buffer never mixes memory spaces; a view across spaces is an error.
//  Zero-byte values still get a (zero-byte) buffer so every value has one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace memc {

using BufferId = int32_t;
constexpr BufferId kNoBuffer = -1;

struct LiveRange {
  int32_t first = -1;  // inclusive schedule positions; first = -1 for values not in the step
  int32_t last = -1;
  bool overlaps(const LiveRange& o) const { return first <= o.last && o.first <= last; }
  bool contains(int32_t position) const { return first <= position && position <= last; }
};

// Why a value sits in its buffer.
enum class AliasKind : uint8_t {
  kOwner,    // first value of the buffer (defines the storage)
  kView,     // rule A: relabels another member's bytes
  kUpdate,   // rule B: the new value of a persistent argument
  kInplace,  // rule C: overwrites a dead input of its elementwise op
};
std::string_view alias_kind_name(AliasKind kind);

struct Buffer {
  BufferId id = kNoBuffer;
  std::vector<ValueId> values;  // members, by (range.first, value id); values[0] is the owner
  int64_t bytes = 0;            // unaligned size in bytes (equal for every member)
  MemSpace space = MemSpace::kDevice;
  LiveRange range;              // union of the members' ranges
  bool persistent = false;      // holds a persistent argument (rule 2): lives the whole step
  // Who occupies the bytes over time: (position, role) each time a non-view member (owner,
  // update or in-place result) takes over; a view keeps the role of the member it relabels
  // unless it has a role of its own (not activation): a parameter's gradient made by a reshape.
  std::vector<std::pair<int32_t, Role>> role_changes;
  Role role_at(int32_t position) const;
};

struct Liveness {
  std::vector<NodeId> schedule;       // the order the positions refer to
  int32_t num_positions = 0;          // N (at least 1, so an empty step still has a position)
  std::vector<LiveRange> ranges;      // by ValueId
  std::vector<int32_t> last_use;      // by ValueId: last reading position, -1 when unread
  std::vector<BufferId> buffer_of;    // by ValueId; kNoBuffer for values outside the step
  std::vector<AliasKind> alias;       // by ValueId
  std::vector<Buffer> buffers;        // by BufferId

  const Buffer& buffer(ValueId v) const { return buffers.at(buffer_of.at(v)); }
  // Sum of the (unaligned) bytes of the buffers live at `position`.
  int64_t live_bytes_at(int32_t position) const;
};

// Roles whose arguments persist across steps (rule 2).
bool is_persistent_role(Role role);

// Fails (internal error naming the values) when an update cannot be made in place (rule B) or
// a view crosses memory spaces.
Expected<Liveness> analyze_liveness(const Module& module);

}  // namespace memc
