#include "passes/strip_dropout.h"

namespace memc {

Expected<PassReport> StripDropout::run(Module& m) {
  int64_t removed = 0;
  for (NodeId n : m.schedule()) {
    Node& node = m.node(n);
    if (node.op != "dropout") continue;
    m.replace_all_uses(node.outputs[0], node.inputs[0]);
    node.dead = true;
    ++removed;
  }
  m.compact();
  PassReport report;
  report.changed = removed > 0;
  report.set("removed", removed);
  report.lines.push_back(str_cat("strip_dropout: ", removed, " dropout nodes replaced by their inputs"));
  return report;
}

}  // namespace memc
