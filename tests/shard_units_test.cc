// Shard units from the graph's structure (passes/shard_units.h): the committed transformers'
// blocks, embedding and head are found without reading a name, and a model with no repeated
// block falls back to size buckets.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>

#include "frontend/onnx_import.h"
#include "passes/repetition.h"
#include "passes/shard.h"
#include "passes/shard_units.h"
#include "test_util.h"

namespace memc {
namespace {

struct Imported {
  Module m;
  std::vector<ValueId> params;
};

Imported import(const std::string& model, int64_t seq = -1) {
  ImportOptions options{.batch = 2, .seq = seq, .load_weights = false};
  auto m = import_onnx(testing::source_path("models/" + model), options);
  EXPECT_TRUE(m.ok()) << m.status().message();
  Imported out{std::move(*m), {}};
  for (ValueId a : out.m.arguments()) {
    if (out.m.value(a).role == Role::kParam) out.params.push_back(a);
  }
  return out;
}

// The source names of unit `u`'s parameters.
std::set<std::string> names(const Imported& x, const std::vector<size_t>& unit) {
  std::set<std::string> out;
  for (size_t i : unit) out.insert(x.m.value(x.params[i]).source_name);
  return out;
}

// Every parameter in exactly one unit.
void expect_partition(const Imported& x, const StructuralUnits& u) {
  std::vector<int> seen(x.params.size(), 0);
  for (const auto& unit : u.units) {
    for (size_t i : unit) ++seen[i];
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << x.m.value(x.params[i]).source_name;
}

// The repetition both shard units and remat's blocks read (passes/repetition.h), against runs
// worked out by hand: the run that covers most wins, ties go to the shorter period, then the
// earlier start; min_period skips shorter units.
TEST(LongestRun, CoversMostThenShortestPeriodThenEarliest) {
  auto run = [](const std::string& s, size_t min_period = 1) {
    const Repetition r = longest_run(std::vector<char>(s.begin(), s.end()), min_period);
    return std::vector<size_t>{r.start, r.period, r.repeats};
  };
  EXPECT_EQ(run("eababab h"), (std::vector<size_t>{1, 2, 3}));   // an embedding, 3 blocks of 2, a head
  EXPECT_EQ(run("xaaay"), (std::vector<size_t>{1, 1, 3}));
  EXPECT_EQ(run("abcabcab"), (std::vector<size_t>{0, 3, 2}));    // 6 covered, not "cab" ×2 from 2 (later)
  EXPECT_EQ(run("abab"), (std::vector<size_t>{0, 2, 2}));
  EXPECT_EQ(run("aaaa"), (std::vector<size_t>{0, 1, 4}));        // 4 covered by period 1 and by 2: the shorter
  EXPECT_EQ(run("aaaa", 2), (std::vector<size_t>{0, 2, 2}));
  EXPECT_EQ(run("abcd"), (std::vector<size_t>{0, 0, 0}));        // nothing repeats
  EXPECT_EQ(run(""), (std::vector<size_t>{0, 0, 0}));
  EXPECT_EQ(run("xabcabcabcaby"), (std::vector<size_t>{1, 3, 3}));
}

// Against the plain search it replaced (every period and start, repeats counted unit by unit),
// on random sequences of 0..40 items over 2 or 3 symbols, for min_period 1..3.
TEST(LongestRun, EqualsThePlainSearchOnRandomSequences) {
  auto plain = [](const std::vector<int>& s, size_t min_period) {
    Repetition best;
    for (size_t p = min_period; 2 * p <= s.size(); ++p) {
      for (size_t start = 0; start + 2 * p <= s.size(); ++start) {
        size_t k = 1;
        while (start + (k + 1) * p <= s.size() && std::equal(s.begin() + start, s.begin() + start + p, s.begin() + start + k * p)) ++k;
        if (k >= 2 && k * p > best.covered()) best = {start, p, k};
      }
    }
    return best;
  };
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int> s(rng() % 41);
    const int symbols = 2 + static_cast<int>(rng() % 2);
    for (int& x : s) x = static_cast<int>(rng() % symbols);
    for (size_t min_period = 1; min_period <= 3; ++min_period) {
      const Repetition want = plain(s, min_period), got = longest_run(s, min_period);
      ASSERT_EQ(std::make_tuple(got.start, got.period, got.repeats), std::make_tuple(want.start, want.period, want.repeats))
          << "trial " << trial << ", min_period " << min_period;
    }
  }
}

TEST(ShardUnits, VitBlocksEmbeddingAndHeadFromStructure) {
  const Imported x = import("vit_b_16_skeleton.onnx");
  const StructuralUnits u = find_structural_units(x.m, x.params);
  expect_partition(x, u);
  ASSERT_EQ(u.blocks, 12) << u.description;
  ASSERT_EQ(u.units.size(), 14u) << u.description;  // embedding, 12 blocks, head
  // Found by structure; the names only confirm it: block k holds encoder_layer_k's 12 tensors.
  for (int k = 0; k < 12; ++k) {
    const std::set<std::string> block = names(x, u.units[1 + k]);
    EXPECT_EQ(block.size(), 12u);
    for (const std::string& n : block) EXPECT_NE(n.find("encoder_layer_" + std::to_string(k) + "."), std::string::npos) << n;
  }
  const std::set<std::string> embedding = names(x, u.units.front());
  EXPECT_TRUE(embedding.count("conv_proj.weight") && embedding.count("class_token") && embedding.count("encoder.pos_embedding"))
      << u.description;
  const std::set<std::string> head = names(x, u.units.back());
  EXPECT_TRUE(head.count("heads.head.weight") && head.count("encoder.ln.weight")) << u.description;
}

TEST(ShardUnits, TextEncoderBlocksWithAMaskInput) {
  // Token embeddings and an attention-mask input read by every block: the mask is data only,
  // never an activation, so it cuts nothing and joins nothing.
  const Imported x = import("text_encoder.onnx", 32);
  const StructuralUnits u = find_structural_units(x.m, x.params);
  expect_partition(x, u);
  EXPECT_GE(u.blocks, 2) << u.description;
  EXPECT_EQ(u.units.size(), static_cast<size_t>(u.blocks) + 2) << u.description;
}

TEST(ShardUnits, NoRepeatedBlockFallsBackToSizeBuckets) {
  // x → linear → relu → linear: two different layers, nothing repeats.
  Module m;
  const ValueId x = m.add_argument("x", {DType::kF32, {2, 4}}, Role::kInput);
  const ValueId w1 = m.add_argument("w1", {DType::kF32, {4, 8}}, Role::kParam);
  const ValueId w2 = m.add_argument("w2", {DType::kF32, {8, 3}}, Role::kParam);
  auto h = m.add_node("matmul", {x, w1});
  auto r = m.add_node("relu", {(*h)[0]});
  auto y = m.add_node("matmul", {(*r)[0], w2});
  m.set_outputs({(*y)[0]});
  EXPECT_TRUE(find_structural_units(m, {w1, w2}).units.empty());
  const UnitGroups groups = plan_units(m, {w1, w2});
  ASSERT_EQ(groups.members.size(), 1u);  // both fit one 25 MiB bucket
  EXPECT_NE(groups.description.find("no repeated block"), std::string::npos) << groups.description;
}

}  // namespace
}  // namespace memc
