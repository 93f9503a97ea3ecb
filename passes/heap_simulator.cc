#include "passes/heap_simulator.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <queue>

namespace memc {

namespace {

// Free intervals of a heap, coalesced: offset → size. The top of the heap is `top`.
class FreeList {
 public:
  int64_t allocate(int64_t size) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= size && (best == free_.end() || it->second < best->second)) best = it;
    }
    if (best != free_.end()) {
      const int64_t offset = best->first, rest = best->second - size;
      free_.erase(best);
      if (rest > 0) free_[offset + size] = rest;
      return offset;
    }
    // Nothing fits: grow the heap, starting inside a free interval that touches the top.
    int64_t offset = top_;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == top_) {
        offset = last->first;
        free_.erase(last);
      }
    }
    top_ = offset + size;
    peak_ = std::max(peak_, top_);
    return offset;
  }
  void release(int64_t offset, int64_t size) {
    auto [it, inserted] = free_.emplace(offset, size);
    MEMC_CHECK(inserted, "double free at offset ", offset);
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
        it = prev;
      }
    }
    if (it->first + it->second == top_) {  // keep the top tight so growth starts low
      top_ = it->first;
      free_.erase(it);
    }
  }
  int64_t peak() const { return peak_; }

 private:
  std::map<int64_t, int64_t> free_;
  int64_t top_ = 0;
  int64_t peak_ = 0;
};

// The placed buffers by time, so that a new buffer meets only the placed ones whose ranges
// overlap its own rather than scanning them all (a micro-batched step has tens of thousands of
// buffers, and that scan made placement quadratic). A placed range overlaps [f, l] where it
// contains f, or where it starts inside (f, l]: a segment tree over the buffers' distinct starts
// answers the first (a stabbing query: the lists on one leaf-to-root path), and the placed
// ranges bucketed by start the second: per start, and per block of kBlock consecutive starts, so
// a long range meets whole blocks and at most 2 × kBlock single starts. Each overlapping range is
// met once. Every list is kept in offset order with the highest end so far beside each entry, so
// the lowest gap is found by merging them, each list passing at once over all its entries that
// start below the gap tried (their highest end moves the gap up), stopping at the gap.
class PlacedByTime {
 public:
  using Span = std::pair<int64_t, int64_t>;  // [offset, end) of a placed buffer

  explicit PlacedByTime(std::vector<int32_t> starts) : starts_(std::move(starts)) {
    std::sort(starts_.begin(), starts_.end());
    starts_.erase(std::unique(starts_.begin(), starts_.end()), starts_.end());
    while (leaves_ < starts_.size()) leaves_ *= 2;
    tree_.resize(2 * leaves_);
    by_start_.resize(starts_.size());
    by_block_.resize(starts_.size() / kBlock + 1);
  }
  // `range.first` must be one of the starts given.
  void insert(const LiveRange& range, Span span) {
    const size_t first = index_of(range.first), last = covered_end(range.last);  // [first, last)
    auto add = [&](std::vector<Entry>& list) {
      auto at = std::upper_bound(list.begin(), list.end(), span, [](const Span& x, const Entry& e) { return x < Span{e.offset, e.end}; });
      at = list.insert(at, Entry{span.first, span.second, 0});
      for (int64_t highest = at == list.begin() ? 0 : std::prev(at)->highest_end; at != list.end(); ++at) {
        at->highest_end = highest = std::max(highest, at->end);
      }
    };
    for (size_t lo = first + leaves_, hi = last + leaves_; lo < hi; lo /= 2, hi /= 2) {
      if (lo & 1) add(tree_[lo++]);
      if (hi & 1) add(tree_[--hi]);
    }
    add(by_start_[first]);
    add(by_block_[first / kBlock]);
  }
  // The lowest offset at or above `base` where `size` bytes meet no placed buffer whose range
  // overlaps `range` (whose first is one of the starts).
  int64_t lowest_gap(const LiveRange& range, int64_t base, int64_t size) {
    const size_t first = index_of(range.first), end = covered_end(range.last);
    // One cursor per sorted list; a min-heap on each cursor's next span. Spans at one offset
    // may come in any order: the gap found is the same.
    cursors_.clear();
    auto add = [&](const std::vector<Entry>& list) {
      if (!list.empty()) cursors_.push_back({list.data(), list.data() + list.size()});
    };
    for (size_t i = first + 1; i < end;) {  // the ranges starting inside (first, end)
      if (i % kBlock == 0 && i + kBlock <= end) {
        add(by_block_[i / kBlock]);
        i += kBlock;
      } else {
        add(by_start_[i++]);
      }
    }
    for (size_t node = first + leaves_; node >= 1; node /= 2) add(tree_[node]);
    auto later = [](const Cursor& x, const Cursor& y) { return x.next->offset > y.next->offset; };
    std::make_heap(cursors_.begin(), cursors_.end(), later);
    int64_t offset = base;
    while (!cursors_.empty()) {
      std::pop_heap(cursors_.begin(), cursors_.end(), later);
      Cursor& c = cursors_.back();
      if (c.next->offset >= offset + size) break;  // the gap below this entry fits
      // Every entry of this list that starts below the gap's end sits across the gap or under
      // it: the gap moves above the highest end among them (the lower entries' ends are
      // already under `offset`).
      c.next = std::partition_point(c.next, c.end, [&](const Entry& e) { return e.offset < offset + size; });
      offset = std::max(offset, std::prev(c.next)->highest_end);
      if (c.next == c.end) {
        cursors_.pop_back();
      } else {
        std::push_heap(cursors_.begin(), cursors_.end(), later);
      }
    }
    return offset;
  }

 private:
  static constexpr size_t kBlock = 64;
  struct Entry {
    int64_t offset, end;   // a placed buffer's bytes [offset, end)
    int64_t highest_end;   // the highest end of this entry and those before it in its list
  };
  struct Cursor {
    const Entry *next, *end;
  };
  size_t index_of(int32_t position) const { return std::lower_bound(starts_.begin(), starts_.end(), position) - starts_.begin(); }
  // One past the last start at or before `position`.
  size_t covered_end(int32_t position) const { return std::upper_bound(starts_.begin(), starts_.end(), position) - starts_.begin(); }

  std::vector<int32_t> starts_;              // sorted, distinct
  size_t leaves_ = 1;
  std::vector<std::vector<Entry>> tree_;      // node → the ranges covering its whole span of starts, by offset
  std::vector<std::vector<Entry>> by_start_;  // start index → the ranges starting there, by offset
  std::vector<std::vector<Entry>> by_block_;  // start index / kBlock → the ranges starting in that block, by offset
  std::vector<Cursor> cursors_;              // lowest_gap's scratch
};

int64_t length(const LiveRange& r) { return int64_t{r.last} - r.first + 1; }

}  // namespace

// Places buffers in `order` at the lowest offset clear of every placed, time-overlapping one.
// Buffers live over the whole span (parameters, optimizer state) overlap every other buffer:
// they are stacked at the bottom first, in `order`, and left out of every later conflict scan.
// The rest meet only the placed buffers that overlap them in time (PlacedByTime), in offset
// order, the lowest gap first.
HeapPlacement place_in_order(std::span<const HeapBuffer> buffers, const std::vector<size_t>& order) {
  HeapPlacement result;
  result.offsets.assign(buffers.size(), 0);
  int32_t first = std::numeric_limits<int32_t>::max(), last = std::numeric_limits<int32_t>::min();
  for (const HeapBuffer& b : buffers) first = std::min(first, b.range.first), last = std::max(last, b.range.last);
  auto whole_span = [&](const HeapBuffer& b) { return b.range.first == first && b.range.last == last; };
  int64_t base = 0;
  std::vector<int32_t> starts;
  for (size_t i : order) {
    if (buffers[i].size == 0) continue;
    if (!whole_span(buffers[i])) {
      starts.push_back(buffers[i].range.first);
      continue;
    }
    result.offsets[i] = base;
    base += buffers[i].size;
  }
  result.heap_bytes = base;
  PlacedByTime placed(std::move(starts));
  for (size_t i : order) {
    const HeapBuffer& b = buffers[i];
    if (b.size == 0 || whole_span(b)) continue;
    const int64_t offset = placed.lowest_gap(b.range, base, b.size);
    result.offsets[i] = offset;
    result.heap_bytes = std::max(result.heap_bytes, offset + b.size);
    placed.insert(b.range, {offset, offset + b.size});
  }
  return result;
}

HeapPlacement BestFitHeap::place(std::span<const HeapBuffer> buffers) const {
  HeapPlacement result;
  result.offsets.assign(buffers.size(), 0);
  std::vector<size_t> by_start(buffers.size());
  std::iota(by_start.begin(), by_start.end(), 0);
  std::stable_sort(by_start.begin(), by_start.end(), [&](size_t a, size_t b) {
    if (buffers[a].range.first != buffers[b].range.first) return buffers[a].range.first < buffers[b].range.first;
    return buffers[a].size > buffers[b].size;
  });
  using Live = std::pair<int32_t, size_t>;  // (last position, buffer), earliest end on top
  std::priority_queue<Live, std::vector<Live>, std::greater<Live>> live;
  FreeList heap;
  for (size_t i : by_start) {
    const HeapBuffer& b = buffers[i];
    if (b.size == 0) continue;
    while (!live.empty() && live.top().first < b.range.first) {
      const size_t done = live.top().second;
      live.pop();
      heap.release(result.offsets[done], buffers[done].size);
    }
    result.offsets[i] = heap.allocate(b.size);
    live.emplace(b.range.last, i);
  }
  result.heap_bytes = heap.peak();
  return result;
}

HeapPlacement GreedyBySizeHeap::place(std::span<const HeapBuffer> buffers) const {
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const HeapBuffer &x = buffers[a], &y = buffers[b];
    if (x.size != y.size) return x.size > y.size;
    if (length(x.range) != length(y.range)) return length(x.range) > length(y.range);
    return x.range.first < y.range.first;
  });
  return place_in_order(buffers, order);
}

HeapPlacement GreedyByAreaHeap::place(std::span<const HeapBuffer> buffers) const {
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const HeapBuffer &x = buffers[a], &y = buffers[b];
    // size × length can pass 2^63 (sizes near 2^50 bytes, lengths near 2^31): long double.
    const long double ax = static_cast<long double>(x.size) * length(x.range);
    const long double ay = static_cast<long double>(y.size) * length(y.range);
    if (ax != ay) return ax > ay;
    if (x.size != y.size) return x.size > y.size;
    return x.range.first < y.range.first;
  });
  return place_in_order(buffers, order);
}

int64_t heap_lower_bound(std::span<const HeapBuffer> buffers) {
  std::vector<std::pair<int32_t, int64_t>> changes;  // (position, change of live bytes)
  changes.reserve(2 * buffers.size());
  for (const HeapBuffer& b : buffers) {
    changes.emplace_back(b.range.first, b.size);
    changes.emplace_back(b.range.last + 1, -b.size);
  }
  std::sort(changes.begin(), changes.end());
  int64_t live = 0, best = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    live += changes[i].second;
    // The live bytes at a position count once all of its changes are in.
    if (i + 1 == changes.size() || changes[i + 1].first != changes[i].first) best = std::max(best, live);
  }
  return best;
}

bool placement_is_valid(std::span<const HeapBuffer> buffers, const HeapPlacement& placement) {
  if (placement.offsets.size() != buffers.size()) return false;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size == 0) continue;
    const int64_t oi = placement.offsets[i];
    if (oi < 0 || oi + buffers[i].size > placement.heap_bytes) return false;
    for (size_t j = i + 1; j < buffers.size(); ++j) {
      if (buffers[j].size == 0 || !buffers[i].range.overlaps(buffers[j].range)) continue;
      const int64_t oj = placement.offsets[j];
      if (oi < oj + buffers[j].size && oj < oi + buffers[i].size) return false;
    }
  }
  return true;
}

}  // namespace memc
