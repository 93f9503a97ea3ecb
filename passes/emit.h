// Adding nodes from inside a pass. Each node is labelled with the pass that made it (its source:
// what -v, dumps and the profile show); a node that cannot be added is a bug in the pass, so it
// stops with an internal error, as GradBuilder does for a gradient rule (ir/grad.h). The passes
// that build whole subgraphs (training_step, microbatch, loss_chunks, shard) wrap these with
// their own label.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace memc {

// One node of `op`; its first output. `outputs`: how many it has, -1 for the op's own count.
ValueId emit_node(Module& m, std::string_view source, const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {}, int outputs = -1);
// v as `to` (v itself when it already is).
ValueId emit_cast(Module& m, std::string_view source, ValueId v, DType to);
// Rows [begin, end) of v along axis 0.
ValueId emit_rows(Module& m, std::string_view source, ValueId v, int64_t begin, int64_t end);
// A float32 scalar constant, named after `name`.
ValueId f32_scalar(Module& m, double v, const std::string& name = "c");

}  // namespace memc
