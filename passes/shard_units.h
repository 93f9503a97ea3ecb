// Shard units from the forward's structure (passes/shard.h): a transformer's blocks, plus what
// comes before them (the embedding) and after them (the head), found without reading names.
//
//   1. Cuts. Walking the forward in schedule order, an activation is a value computed from both
//      data and parameters (the residual stream, a block's branches; not a weight's cast, not a
//      mask built from the input alone). Between two nodes where at most one activation is live,
//      the graph is cut: in a pre-LN block that happens after each residual add, in a post-LN
//      one after each add and each layernorm, never inside a branch (the residual waits there).
//   2. Segments. Each parameter belongs to the segment of its first reader; a segment's
//      signature is its parameters' dtypes and shapes, in reading order.
//   3. The period. The longest run of a repeating sequence of signatures is the blocks (the
//      shortest period on ties, the earliest start next): ViT-B/16's 12 blocks each repeat
//      (attention, MLP). Segments before the run are the embedding unit, after it the head.
//
// A forward without a repeated block (fewer than two repetitions) has no structural units; the
// caller then groups parameters by size.
#pragma once
#include <string>
#include <vector>

#include "ir/graph.h"

namespace memc {

struct StructuralUnits {
  std::vector<std::vector<size_t>> units;  // indices into `params`, each unit in argument order
  int64_t blocks = 0;                      // how many of the units are repeated blocks
  std::string description;                 // "embedding (4 parameters), 12 blocks of 12, head (4)"
};

// Units of `params` (the forward's parameter arguments) in the order the forward first reads
// them; no units when no block repeats. Parameters of one unit with different dtypes are split
// into one unit per dtype (a unit is one flat buffer).
StructuralUnits find_structural_units(const Module& forward, const std::vector<ValueId>& params);

}  // namespace memc
