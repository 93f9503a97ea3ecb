// One pass interface, in the manner of MLIR's pass manager: every transformation of the
// pipeline (passes/pipeline.h) is a Pass with a registered name, an options struct of its own,
// and one entry point, run(Module&), which returns a PassReport.
//
// Not passes in this sense: Autodiff and Remat (called by TrainingStep for each micro-batch,
// with node ranges only it knows) and MemoryPlan (an analysis: it reads a module and changes
// nothing).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace memc {

struct PassStatistic {
  std::string name;  // "casts_inserted", "remat.held_tape_bytes", ...
  int64_t value = 0;
};

// What a pass did, the same shape for every pass.
struct PassReport {
  std::string pass;  // the pass's name (set by the pipeline)
  bool changed = false;
  // The device arena's planned bytes (MemoryPlan) before and after, when the pass measured
  // them or the pipeline was asked to (PassInstrumentation::peak); -1: not measured.
  int64_t peak_before = -1;
  int64_t peak_after = -1;
  std::vector<PassStatistic> statistics;
  std::vector<std::string> lines;     // -v report, each printed as "pass <line>"
  std::vector<std::string> warnings;  // printed when the pipeline reports (not for search candidates)

  void set(std::string name, int64_t value);
  // The named statistic, or `fallback` when the pass did not record it.
  int64_t get(std::string_view name, int64_t fallback = 0) const;
};

// The end of a rewriting pass (the fusions): when any statistic is nonzero the module changed, and
// the nodes it replaced (marked dead) leave it (eliminate_dead_nodes, compact); the report holds
// the statistics and the pass's line.
PassReport rewrite_report(Module& module, std::vector<PassStatistic> statistics, std::string line);

// The live nodes of op `op` (the passes' before-and-after counts).
int count_op(const Module& m, std::string_view op);

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  virtual Expected<PassReport> run(Module& module) = 0;
};

}  // namespace memc
