// The longest run of a repeating unit in a sequence: how memc finds a transformer's blocks where
// names do not say. Shard units read it from the forward's segments (their parameters' shapes,
// passes/shard_units.h); remat from the forward's ops (passes/remat.cc).
#pragma once
#include <cstddef>
#include <vector>

namespace memc {

// `period` consecutive items from `start`, repeated `repeats` times back to back.
struct Repetition {
  size_t start = 0, period = 0, repeats = 0;
  size_t covered() const { return period * repeats; }
};

// The run repeated at least twice, with period ≥ min_period, that covers the most items; ties
// keep the shorter period, then the earlier start. {0, 0, 0} when nothing repeats. For each
// period, same[i] counts how many items from i on equal the item a period later, so a unit from
// `start` repeats same[start] / period + 1 times: O(n²) comparisons in all.
template <typename T>
Repetition longest_run(const std::vector<T>& items, size_t min_period = 1) {
  Repetition best;
  const size_t n = items.size();
  std::vector<size_t> same(n + 1, 0);
  for (size_t period = min_period > 0 ? min_period : 1; 2 * period <= n; ++period) {
    same[n - period] = 0;
    for (size_t i = n - period; i-- > 0;) same[i] = items[i] == items[i + period] ? same[i + 1] + 1 : 0;
    for (size_t start = 0; start + 2 * period <= n; ++start) {
      const Repetition run{start, period, same[start] / period + 1};
      if (run.repeats >= 2 && run.covered() > best.covered()) best = run;
    }
  }
  return best;
}

}  // namespace memc
