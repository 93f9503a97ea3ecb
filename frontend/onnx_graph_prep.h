// Graph preparation before lowering: inlining model-local functions (FunctionProto, as the
// dynamo exporter writes them), checking every op is known, and ordering nodes
// topologically with every input defined.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"
#include "support/status.h"

namespace memc {

// Replaces calls of model-local functions in `nodes` by their bodies (recursively, with
// fresh internal names and attribute references resolved). `error` builds node errors.
Status inline_functions(const onnx::ModelProto& model, std::vector<onnx::NodeProto>& nodes,
                        const std::string& file);

// Stochastic depth's per-sample draws, as the exporters write them, become Bernoulli nodes of a
// probability shaped like the draw: floor(RandomUniformLike(t) + keep) (transformers' DropPath),
// and a comparison then a cast: RandomUniformLike(t) < keep (timm's bernoulli_) or ≥ drop
// (LeViT's rand.ge_), where the mask then scales a product divided by the keep probability. Other
// uses of RandomUniformLike (AlphaDropout's) are left for check_ops to refuse.
void rewrite_random_masks(std::vector<onnx::NodeProto>& nodes);

// Reorders `nodes` so each runs after the producers of its inputs; `defined` holds the graph
// inputs and initializers. Fails naming the first node whose input is never defined.
Status topological_sort(std::vector<onnx::NodeProto>& nodes, const std::vector<std::string>& defined,
                        const std::string& file, int64_t opset);

}  // namespace memc
