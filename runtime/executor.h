// Runs a Module on the CPU backend, node by node in schedule order.
// For now each value gets its own buffer, freed after its last use; the memory-planning
// work replaces this with one planned arena per memory space.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace memc {

struct ExecOptions {
  bool training = false;  // dropout active
  uint64_t seed = 0;
  int64_t step = 0;
};

// Feeds are keyed by argument: IR name or source (ONNX) name. Params come from the module's
// weights unless fed. Returns the module outputs in order.
Expected<std::vector<Tensor>> execute(const Module& module, const std::map<std::string, Tensor>& feeds,
                                      const ExecOptions& options = {});

}  // namespace memc
