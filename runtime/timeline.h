// `memc inspect PLAN --timeline OUT.html`: one self-contained HTML page (inline SVG and CSS,
// no script, no network) showing the planned memory over the schedule — the picture
// PyTorch's memory snapshot viewer gives after the fact, here before the first step.
//   - a stacked area of live bytes by role at every schedule step, with the peak marked;
//   - the arena map: each buffer a rectangle from its first to its last step at its planned
//     offset, coloured by role; hovering shows its name, role, size, offset and live range.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace memc {

struct TimelineBuffer {
  std::string name;  // value name(s) sharing the buffer
  std::string role;  // params, grads, optimizer_state, master_weights, activations, workspace
  int start = 0;     // first schedule step it is live
  int end = 0;       // last schedule step it is live (inclusive)
  int64_t bytes = 0;
  int64_t offset = 0;
};

struct TimelineInput {
  std::string title;
  std::vector<std::string> steps;  // op at each schedule step ("memc.matmul"), for tooltips
  std::vector<TimelineBuffer> buffers;
  int64_t arena_bytes = 0;        // the planned peak
  int64_t lower_bound_bytes = 0;  // max over steps of the live bytes
  int64_t budget_bytes = 0;       // 0: none given
};

std::string render_timeline_html(const TimelineInput& input);

}  // namespace memc
