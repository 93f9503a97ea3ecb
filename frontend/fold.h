// Import-time evaluation of nodes whose inputs are all known (shape subgraphs, constant
// arithmetic). A small reference evaluator independent of the backends, so folding works
// before any kernel exists; integers are computed exactly in int64, floats in double.
#pragma once
#include <vector>

#include "ir/graph.h"

namespace memc {

// Largest tensor (elements) the importer materializes as a folded constant.
constexpr int64_t kMaxFoldElements = int64_t{1} << 22;

// Evaluates `node` on `inputs` (nullptr for absent optional inputs). Fails for ops it does
// not evaluate and for results over kMaxFoldElements; the caller then keeps the node.
Expected<std::vector<Tensor>> fold_node(const Node& node, const std::vector<const Tensor*>& inputs,
                                        const std::vector<TensorType>& out_types);

}  // namespace memc
