// Heap algorithms: place buffers with fixed live ranges in one linear address space so that no
// two buffers whose ranges overlap share a byte, keeping the heap (the arena) small. The same
// split as XLA's heap simulator: the caller extracts (size, range) per buffer for one memory
// space, an algorithm chooses offsets, and the caller checks and reports. Sizes handed to an
// algorithm are already aligned, so every offset an algorithm produces from aligned sizes is
// aligned too.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "passes/liveness.h"

namespace memc {

struct HeapBuffer {
  int64_t size = 0;  // bytes, already aligned
  LiveRange range;   // inclusive schedule positions
};

struct HeapPlacement {
  std::vector<int64_t> offsets;  // by index into the input
  int64_t heap_bytes = 0;        // max over buffers of offset + size
};

class HeapAlgorithm {
 public:
  virtual ~HeapAlgorithm() = default;
  virtual std::string name() const = 0;
  virtual HeapPlacement place(std::span<const HeapBuffer> buffers) const = 0;
};

// Replays allocations and frees in schedule order (frees of position p-1 before the allocations
// of p, larger allocations first); each allocation takes the smallest free interval that fits,
// else grows the heap (reusing a free interval at the top). Online: it cannot foresee the future,
// so long-lived buffers may land in the middle of short-lived ones.
class BestFitHeap : public HeapAlgorithm {
 public:
  std::string name() const override { return "best_fit"; }
  HeapPlacement place(std::span<const HeapBuffer> buffers) const override;
};

// XLA's global decreasing-size heap: sorts buffers by size (descending; ties: longer range,
// then earlier start), then places each at the lowest offset where it overlaps no already
// placed buffer whose range intersects its own. Each buffer meets only the placed buffers that
// overlap it in time, in offset order, up to the first gap that fits (place_in_order).
class GreedyBySizeHeap : public HeapAlgorithm {
 public:
  std::string name() const override { return "greedy_by_size"; }
  HeapPlacement place(std::span<const HeapBuffer> buffers) const override;
};

// The same placement as GreedyBySizeHeap, in order of size × range length (descending): big,
// long-lived buffers first (XLA's "spatial-temporal" order). Often wins when a few huge
// short-lived buffers would otherwise split the address space.
class GreedyByAreaHeap : public HeapAlgorithm {
 public:
  std::string name() const override { return "greedy_by_area"; }
  HeapPlacement place(std::span<const HeapBuffer> buffers) const override;
};

// The greedy heaps' placement: each buffer in `order` at the lowest offset where it shares no
// byte with a placed buffer whose range overlaps its own. Buffers live over the whole span go
// at the bottom first.
HeapPlacement place_in_order(std::span<const HeapBuffer> buffers, const std::vector<size_t>& order);
// max over positions of the sum of sizes of the buffers live there: no placement can beat it.
int64_t heap_lower_bound(std::span<const HeapBuffer> buffers);
// True when no two buffers with overlapping ranges share a byte (an O(n log n) sweep per
// position would be faster; this is the plain check used by tests and debug builds).
bool placement_is_valid(std::span<const HeapBuffer> buffers, const HeapPlacement& placement);

}  // namespace memc
