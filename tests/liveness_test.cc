// Liveness: ranges and buffers on small IR fixtures, one aliasing rule per test, with the byte
// arithmetic in comments. Every tensor<1024xf32> is 4 KiB.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "ir/printer.h"
#include "ir/verifier.h"
#include "tests/test_util.h"
#include "passes/heap_simulator.h"
#include "passes/liveness.h"
#include "passes/memory_plan.h"

namespace memc {
namespace {

constexpr int64_t kKiB = 1024;

using testing::parse_ok;

Liveness live_ok(const Module& m) {
  auto live = analyze_liveness(m);
  EXPECT_TRUE(live.ok()) << live.status().message();
  return live.ok() ? std::move(live).value() : Liveness();
}

LiveRange range_of(const Module& m, const Liveness& live, const char* name) { return live.ranges.at(m.find_value(name)); }
BufferId buffer_of(const Module& m, const Liveness& live, const char* name) { return live.buffer_of.at(m.find_value(name)); }

// pos 0: a = x·w   pos 1: b = exp a   pos 2: c = a + x   pos 3: d = c - b   (d is the output)
constexpr const char* kChain = R"(func.func @main(%x: tensor<1024xf32> {memc.role = "input", memc.name = "x"}, %w: tensor<1024xf32> {memc.role = "param", memc.name = "w"}) -> (tensor<1024xf32>) {
  %a = "memc.mul"(%x, %w) : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xf32>
  %b = "memc.exp"(%a) : (tensor<1024xf32>) -> tensor<1024xf32>
  %c = "memc.add"(%a, %x) : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xf32>
  %d = "memc.sub"(%c, %b) : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xf32>
  "func.return"(%d) : (tensor<1024xf32>) -> ()
}
)";

TEST(Liveness, RangesFollowTheContract) {
  Module m = parse_ok(kChain);
  Liveness live = live_ok(m);
  ASSERT_EQ(live.num_positions, 4);
  // Input x: from 0 to its last use (pos 2). Param w: persistent, the whole step [0, 3].
  EXPECT_EQ(range_of(m, live, "x").first, 0);
  EXPECT_EQ(range_of(m, live, "x").last, 2);
  EXPECT_EQ(range_of(m, live, "w").first, 0);
  EXPECT_EQ(range_of(m, live, "w").last, 3);
  EXPECT_EQ(live.last_use[m.find_value("w")], 0);  // read once; rule 2 stretched the range
  // Activations: definition to last use; the output d to the end.
  EXPECT_EQ(range_of(m, live, "a").first, 0);
  EXPECT_EQ(range_of(m, live, "a").last, 2);
  EXPECT_EQ(range_of(m, live, "b").first, 1);
  EXPECT_EQ(range_of(m, live, "b").last, 3);
  EXPECT_EQ(range_of(m, live, "d").first, 3);
  EXPECT_EQ(range_of(m, live, "d").last, 3);
}

TEST(Liveness, InPlaceChainsShareOneBuffer) {
  Module m = parse_ok(kChain);
  Liveness live = live_ok(m);
  // b = exp a cannot reuse a (a is read again at pos 2); c = a + x can (a ends at 2, x is not
  // first); d = c - b can (c ends at 3). Buffers: {x}, {w}, {a, c, d}, {b}.
  EXPECT_NE(buffer_of(m, live, "b"), buffer_of(m, live, "a"));
  EXPECT_EQ(buffer_of(m, live, "c"), buffer_of(m, live, "a"));
  EXPECT_EQ(buffer_of(m, live, "d"), buffer_of(m, live, "a"));
  EXPECT_EQ(live.alias[m.find_value("c")], AliasKind::kInplace);
  EXPECT_EQ(live.alias[m.find_value("d")], AliasKind::kInplace);
  EXPECT_EQ(live.buffers.size(), 4u);
  const Buffer& acd = live.buffer(m.find_value("a"));
  EXPECT_EQ(acd.range.first, 0);
  EXPECT_EQ(acd.range.last, 3);
  // pos 0: x, w, a = 12 KiB. pos 1 and 2: x, w, a, b = 16 KiB. pos 3 (x dead): w, acd, b = 12 KiB.
  EXPECT_EQ(live.live_bytes_at(0), 12 * kKiB);
  EXPECT_EQ(live.live_bytes_at(1), 16 * kKiB);
  EXPECT_EQ(live.live_bytes_at(2), 16 * kKiB);
  EXPECT_EQ(live.live_bytes_at(3), 12 * kKiB);
  // Without in-place, pos 3 would hold w, b, c, d = 16 KiB and pos 2 x, w, a, b, c = 20 KiB:
  // sharing saves 4 KiB at the peak. The plan reaches the 16 KiB bound exactly.
  auto plan = MemoryPlan().run(m);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const SpacePlan& d = plan->space(MemSpace::kDevice);
  EXPECT_EQ(d.lower_bound_bytes, 16 * kKiB);
  EXPECT_EQ(d.arena_bytes, 16 * kKiB);
  EXPECT_EQ(d.persistent_bytes, 4 * kKiB);          // w, at offset 0
  EXPECT_EQ(plan->slice_of(m.find_value("w")).offset, 0);
  EXPECT_EQ(d.breakdown[MemoryCategory::kParams], 4 * kKiB);
  EXPECT_EQ(d.breakdown[MemoryCategory::kActivations], 12 * kKiB);  // x, a, b at pos 1
}

// A view (reshape) is its input's bytes: one buffer whose range is the union. The view keeps
// the source alive: a = exp x cannot overwrite x's bytes while the view v is read at pos 2.
TEST(Liveness, ViewsShareTheirSourceAndExtendIt) {
  Module m = parse_ok(R"(func.func @main(%x: tensor<1024xf32> {memc.role = "input", memc.name = "x"}) -> (tensor<1024xf32>) {
  %v = "memc.reshape"(%x) {shape = array<i64: 32, 32>} : (tensor<1024xf32>) -> tensor<32x32xf32>
  %a = "memc.exp"(%x) : (tensor<1024xf32>) -> tensor<1024xf32>
  %n = "memc.neg"(%v) : (tensor<32x32xf32>) -> tensor<32x32xf32>
  %r = "memc.reshape"(%n) {shape = array<i64: 1024>} : (tensor<32x32xf32>) -> tensor<1024xf32>
  %o = "memc.add"(%r, %a) : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xf32>
  "func.return"(%o) : (tensor<1024xf32>) -> ()
}
)");
  Liveness live = live_ok(m);
  EXPECT_EQ(buffer_of(m, live, "v"), buffer_of(m, live, "x"));
  EXPECT_EQ(live.alias[m.find_value("v")], AliasKind::kView);
  EXPECT_NE(buffer_of(m, live, "a"), buffer_of(m, live, "x"));  // x's buffer is read at pos 2
  // n = neg v at pos 2 ends {x, v}: in place. r is a view of n; o = r + a ends {x, v, n, r}.
  EXPECT_EQ(buffer_of(m, live, "n"), buffer_of(m, live, "x"));
  EXPECT_EQ(buffer_of(m, live, "r"), buffer_of(m, live, "x"));
  EXPECT_EQ(buffer_of(m, live, "o"), buffer_of(m, live, "x"));
  // Two buffers of 4 KiB, both live at pos 1..3: 8 KiB.
  EXPECT_EQ(live.buffers.size(), 2u);
  EXPECT_EQ(live.live_bytes_at(2), 8 * kKiB);
}

// Updates share their argument's buffer: w and w.next are one 4 KiB buffer, counted once.
TEST(Liveness, OptimizerUpdatesReuseTheParameter) {
  Module m = parse_ok(R"(func.func @main(%x: tensor<1024xf32> {memc.role = "input", memc.name = "x"}, %w: tensor<1024xf32> {memc.role = "param", memc.name = "w"}, %buf: tensor<1024xf32> {memc.role = "optimizer_state", memc.name = "buf"}, %lr: tensor<f32> {memc.role = "scalar", memc.name = "lr"}, %step: tensor<f32> {memc.role = "scalar", memc.name = "step"}) -> (tensor<1024xf32>, tensor<1024xf32> {memc.updates = "w"}, tensor<1024xf32> {memc.updates = "buf"}) {
  %y = "memc.mul"(%x, %w) : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xf32>
  %g = "memc.mul"(%y, %x) {memc.result_roles = ["grad"]} : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xf32>
  %w.next, %buf.next = "memc.momentum_update"(%w, %g, %buf, %lr, %step) {dampening = 0.0 : f64, momentum = 0.9 : f64, nesterov = 0 : i64, weight_decay = 0.0 : f64} : (tensor<1024xf32>, tensor<1024xf32>, tensor<1024xf32>, tensor<f32>, tensor<f32>) -> (tensor<1024xf32>, tensor<1024xf32>)
  "func.return"(%y, %w.next, %buf.next) : (tensor<1024xf32>, tensor<1024xf32>, tensor<1024xf32>) -> ()
}
)");
  Liveness live = live_ok(m);
  EXPECT_EQ(buffer_of(m, live, "w.next"), buffer_of(m, live, "w"));
  EXPECT_EQ(buffer_of(m, live, "buf.next"), buffer_of(m, live, "buf"));
  EXPECT_EQ(live.alias[m.find_value("w.next")], AliasKind::kUpdate);
  EXPECT_TRUE(live.buffer(m.find_value("w")).persistent);
  // g = y·x cannot overwrite y (a module output) and x is not its first input: own buffer.
  EXPECT_NE(buffer_of(m, live, "g"), buffer_of(m, live, "y"));
  // pos 2 (the update): w, buf, y, g + the scalars (4 B each) = 16 KiB + 8 B. Without rule B,
  // w.next and buf.next would add 8 KiB.
  EXPECT_EQ(live.live_bytes_at(2), 16 * kKiB + 8);
  auto plan = MemoryPlan().run(m);
  ASSERT_TRUE(plan.ok());
  const SpacePlan& d = plan->space(MemSpace::kDevice);
  // Aligned: scalars take 64 B each; lower bound at pos 1 = x, w, buf, y, g + lr, step
  // = 20 KiB + 128 B (x is last read at pos 1, so it is gone at pos 2).
  EXPECT_EQ(d.lower_bound_bytes, 20 * kKiB + 128);
  EXPECT_EQ(d.breakdown[MemoryCategory::kParams], 4 * kKiB);
  EXPECT_EQ(d.breakdown[MemoryCategory::kOptimizerState], 4 * kKiB);
  EXPECT_EQ(d.breakdown[MemoryCategory::kGrads], 4 * kKiB);
  EXPECT_EQ(d.persistent_bytes, 8 * kKiB);
}

// Rule B cannot hold when the argument is still read after its update is written.
TEST(Liveness, UpdateReadAfterwardsIsAnError) {
  Module m = parse_ok(R"(func.func @main(%w: tensor<1024xf32> {memc.role = "param", memc.name = "w"}, %lr: tensor<f32> {memc.role = "scalar", memc.name = "lr"}) -> (tensor<1024xf32>, tensor<1024xf32> {memc.updates = "w"}) {
  %g = "memc.neg"(%w) : (tensor<1024xf32>) -> tensor<1024xf32>
  %w.next = "memc.sgd_update"(%w, %g, %lr) {weight_decay = 0.0 : f64} : (tensor<1024xf32>, tensor<1024xf32>, tensor<f32>) -> tensor<1024xf32>
  %late = "memc.exp"(%w) : (tensor<1024xf32>) -> tensor<1024xf32>
  "func.return"(%late, %w.next) : (tensor<1024xf32>, tensor<1024xf32>) -> ()
}
)");
  auto live = analyze_liveness(m);
  ASSERT_FALSE(live.ok());
  EXPECT_NE(live.status().message().find("%w.next updates argument %w"), std::string::npos) << live.status().message();
  EXPECT_FALSE(MemoryPlan().run(m).ok());
}

// Rule C's refusals: a persistent input, a different size (broadcast), a module output.
TEST(Liveness, InPlaceRefusals) {
  Module m = parse_ok(R"(func.func @main(%w: tensor<1024xf32> {memc.role = "param", memc.name = "w"}, %s: tensor<1xf32> {memc.role = "input", memc.name = "s"}, %x: tensor<1024xf32> {memc.role = "input", memc.name = "x"}) -> (tensor<1024xf32>, tensor<1024xf32>) {
  %a = "memc.neg"(%w) : (tensor<1024xf32>) -> tensor<1024xf32>
  %b = "memc.add"(%s, %x) : (tensor<1xf32>, tensor<1024xf32>) -> tensor<1024xf32>
  %c = "memc.exp"(%a) : (tensor<1024xf32>) -> tensor<1024xf32>
  "func.return"(%b, %a) : (tensor<1024xf32>, tensor<1024xf32>) -> ()
}
)");
  Liveness live = live_ok(m);
  EXPECT_NE(buffer_of(m, live, "a"), buffer_of(m, live, "w"));  // w persists into the next step
  EXPECT_NE(buffer_of(m, live, "b"), buffer_of(m, live, "s"));  // 4 B input, 4 KiB result
  EXPECT_NE(buffer_of(m, live, "c"), buffer_of(m, live, "a"));  // a is an output: read after the step
  for (AliasKind k : live.alias) EXPECT_EQ(k, AliasKind::kOwner);
  // c is never read: it lives only at its own position (2); s is read only at pos 1.
  EXPECT_EQ(range_of(m, live, "c").first, 2);
  EXPECT_EQ(range_of(m, live, "c").last, 2);
  EXPECT_EQ(range_of(m, live, "s").last, 1);
}

// Host values get their own arena; device figures do not count them.
TEST(Liveness, SpacesArePlannedSeparately) {
  Module m = parse_ok(R"(func.func @main(%x: tensor<1024xf32> {memc.role = "input", memc.name = "x"}, %m: tensor<1024xf32> {memc.role = "optimizer_state", memc.name = "m", memc.space = "host"}) -> (tensor<1024xf32>) {
  %a = "memc.exp"(%x) : (tensor<1024xf32>) -> tensor<1024xf32>
  "func.return"(%a) : (tensor<1024xf32>) -> ()
}
)");
  auto plan = MemoryPlan().run(m);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  // Device: x, then a in place over it = 4 KiB. Host: the 4 KiB state at offset 0.
  EXPECT_EQ(plan->space(MemSpace::kDevice).arena_bytes, 4 * kKiB);
  EXPECT_EQ(plan->space(MemSpace::kHost).arena_bytes, 4 * kKiB);
  EXPECT_EQ(plan->space(MemSpace::kHost).breakdown[MemoryCategory::kOptimizerState], 4 * kKiB);
  EXPECT_EQ(plan->slice_of(m.find_value("m")).offset, 0);
}

// Best-fit reuses a freed hole; greedy-by-size places the big buffer first. Both reach the
// bound on this staircase: 8 KiB (pos 0-1), then 4 KiB + 4 KiB.
TEST(HeapAlgorithms, ReachTheBoundOnASmallStaircase) {
  const std::vector<HeapBuffer> buffers = {{8 * kKiB, {0, 1}}, {4 * kKiB, {2, 3}}, {4 * kKiB, {1, 1}}, {4 * kKiB, {2, 2}}};
  // pos 1: 8 + 4 = 12 KiB; pos 2: 4 + 4 = 8 KiB. Bound 12 KiB.
  EXPECT_EQ(heap_lower_bound(buffers), 12 * kKiB);
  const BestFitHeap best_fit;
  const GreedyBySizeHeap by_size;
  const GreedyByAreaHeap by_area;
  for (const HeapAlgorithm* a : {static_cast<const HeapAlgorithm*>(&best_fit), static_cast<const HeapAlgorithm*>(&by_size),
                                 static_cast<const HeapAlgorithm*>(&by_area)}) {
    HeapPlacement p = a->place(buffers);
    EXPECT_TRUE(placement_is_valid(buffers, p)) << a->name();
    EXPECT_EQ(p.heap_bytes, 12 * kKiB) << a->name();
  }
}

// The greedy placement against its definition, checked by brute force: each buffer at the lowest
// offset (above the whole-span buffers) that shares no byte with an earlier-placed buffer live at
// the same time. Random steps with short and long ranges, whole-span buffers and empty ones;
// the indexed placement must give these offsets exactly.
TEST(HeapAlgorithms, GreedyPlacementIsTheLowestFreeOffsetInOrder) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    // Long spans too: a range then covers whole blocks of the placement's index by start.
    const int32_t span = 1 + static_cast<int32_t>(rng() % (trial % 2 ? 200 : 1000));
    std::vector<HeapBuffer> buffers(1 + rng() % 300);
    for (HeapBuffer& b : buffers) {
      b.size = (rng() % 10 == 0) ? 0 : 64 * static_cast<int64_t>(1 + rng() % 16);
      const int32_t first = static_cast<int32_t>(rng() % span);
      const int32_t length = rng() % 4 == 0 ? static_cast<int32_t>(rng() % span) : static_cast<int32_t>(rng() % 4);
      b.range = {first, std::min(span - 1, first + length)};
      if (rng() % 20 == 0) b.range = {0, span - 1};
    }
    std::vector<size_t> order(buffers.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const HeapPlacement p = place_in_order(buffers, order);
    ASSERT_TRUE(placement_is_valid(buffers, p)) << "trial " << trial;

    int32_t first = span, last = -1;
    for (const HeapBuffer& b : buffers) first = std::min(first, b.range.first), last = std::max(last, b.range.last);
    auto whole = [&](const HeapBuffer& b) { return b.range.first == first && b.range.last == last; };
    int64_t base = 0;
    for (size_t i : order) {
      if (buffers[i].size == 0 || !whole(buffers[i])) continue;
      EXPECT_EQ(p.offsets[i], base) << "trial " << trial << " buffer " << i;
      base += buffers[i].size;
    }
    std::vector<size_t> placed;
    for (size_t i : order) {
      const HeapBuffer& b = buffers[i];
      if (b.size == 0 || whole(b)) continue;
      auto clear_at = [&](int64_t offset) {
        return std::none_of(placed.begin(), placed.end(), [&](size_t j) {
          return buffers[j].range.overlaps(b.range) && p.offsets[j] < offset + b.size && offset < p.offsets[j] + buffers[j].size;
        });
      };
      // The lowest clear offset is the base or the end of a placed buffer.
      int64_t lowest = clear_at(base) ? base : std::numeric_limits<int64_t>::max();
      for (size_t j : placed) {
        const int64_t end = p.offsets[j] + buffers[j].size;
        if (end > base && end < lowest && clear_at(end)) lowest = end;
      }
      EXPECT_EQ(p.offsets[i], lowest) << "trial " << trial << " buffer " << i;
      placed.push_back(i);
    }
  }
}

}  // namespace
}  // namespace memc
