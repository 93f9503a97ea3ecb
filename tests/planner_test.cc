// The budget planner: cost-model profiles and monotonicity, the search (every budget met,
// optimizer and numerics untouched, deterministic, pins respected, the floor named when
// infeasible), and the offload pass (bit-identical training, the device drop it predicts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "ir/grad.h"
#include "ir/op_registry.h"
#include "passes/offload.h"
#include "planner/cost_model.h"
#include "passes/memory_plan.h"
#include "planner/search.h"
#include "support/size.h"
#include "runtime/trainer.h"
#include "tests/pass_compare.h"
#include "tests/test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;

CompileOptions vit_options(int64_t batch) {
  CompileOptions o;
  o.batch = batch;
  o.optimizer.kind = "adamw";
  return o;
}

TEST(CostModel, ProfilesAndFiles) {
  for (const char* t : {"cpu", "a100", "h100", "h200"}) {
    auto p = device_profile(t);
    ASSERT_TRUE(p.ok()) << t;
    EXPECT_GT(p->f32_flops, 0);
    EXPECT_GE(p->low_flops, p->name == "cpu" ? 0 : p->f32_flops);  // tensor cores
  }
  EXPECT_FALSE(device_profile("tpu9").ok());
  const std::string path = testing::scratch_path("profile_test.json");
  DeviceProfile p = *device_profile("h100");
  p.name = "mine";
  p.f32_flops = 1.5e12;
  ASSERT_TRUE(write_profile(path, p).ok());
  auto back = device_profile(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->name, "mine");
  EXPECT_EQ(back->f32_flops, 1.5e12);
  std::FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("{\"f32_flops\": -1}", f);
  std::fclose(f);
  EXPECT_EQ(device_profile(path).status().kind(), ErrorKind::kBadInput);
}

TEST(CostModel, MoreMicroBatchesAndRecomputeCostTimeAndTensorCoresFavorBf16) {
  CompileOptions o = vit_options(32);
  o.target = "h200";
  const double base = testing::compile_committed("vit_tiny", o).estimated_step_ms;
  o.micro_batches = 4;
  const double micro = testing::compile_committed("vit_tiny", o).estimated_step_ms;
  o.micro_batches = 1;
  o.remat.policy = RematPolicy::kBlocks;
  const double remat = testing::compile_committed("vit_tiny", o).estimated_step_ms;
  o.remat = {};
  EXPECT_GT(micro, base);
  EXPECT_GT(remat, base);
  // ViT-B/16 at batch 8 is GEMM-bound: bf16 tensor cores beat f32 on an H200.
  CompileOptions b = vit_options(8);
  b.target = "h200";
  const double f32 = testing::compile_committed("vit_b_16_skeleton", b).estimated_step_ms;
  b.precision = PrecisionKind::kBf16Mixed;
  const double bf16 = testing::compile_committed("vit_b_16_skeleton", b).estimated_step_ms;
  std::printf("[planner] vit_tiny b32 h200: %.3f ms, 4 micro-batches %.3f, remat blocks %.3f; vit_b_16 b8: fp32 %.2f, bf16-mixed %.2f ms\n",
              base, micro, remat, f32, bf16);
  EXPECT_LT(bf16, f32);
}

// A CPU plan for T threads is estimated faster by the profile's gains per extra thread: without
// a per-node overhead (which does not shrink), between the rest's speedup and the GEMMs'. A
// GPU's estimate does not depend on threads; a profile file keeps its gains and refuses gains
// outside [0, 1].
TEST(CostModel, CpuThreadsSpeedTheEstimateByTheProfileGains) {
  const Expected<DeviceProfile> cpu = device_profile("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_GT(cpu->heavy_thread_gain, 0);
  EXPECT_GT(cpu->other_thread_gain, 0);
  CompileOptions o = vit_options(32);
  auto estimate = [&](int64_t threads) {
    o.threads = threads;
    return testing::compile_committed("vit_tiny", o).estimated_step_ms;
  };
  EXPECT_LT(estimate(2), estimate(1));
  const std::string path = ::testing::TempDir() + "/threads_profile.json";
  DeviceProfile p = *cpu;
  p.node_overhead_s = 0;
  p.heavy_thread_gain = 0.5;
  p.other_thread_gain = 0.2;
  ASSERT_TRUE(write_profile(path, p).ok());
  EXPECT_EQ(device_profile(path)->heavy_thread_gain, 0.5);
  o.target = path;
  const double one = estimate(1), four = estimate(4);
  EXPECT_LE(four, one / (1 + 3 * 0.2) * (1 + 1e-9)) << one << " → " << four;
  EXPECT_GE(four, one / (1 + 3 * 0.5) * (1 - 1e-9)) << one << " → " << four;
  o.target = "h200";
  EXPECT_EQ(estimate(4), estimate(1));
  std::FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("{\"heavy_thread_gain\": 1.5}", f);
  std::fclose(f);
  EXPECT_EQ(device_profile(path).status().kind(), ErrorKind::kBadInput);
}

// On a CPU a node whose bytes fit the per-core cache moves them at the cache's rate: a faster
// cache tier makes the small model's estimate smaller, a tier of 0 bytes or no faster than
// streaming is none, the profile file keeps both fields (one without them has no tier), and the
// GPU profiles have none. A gather or slice counts the bytes it
// reads (its output's size), not its whole input.
TEST(CostModel, SmallNodesRunFromTheCacheTierAndGathersCountWhatTheyRead) {
  DeviceProfile p = *device_profile("cpu");
  EXPECT_GT(p.cache_bytes, 0);
  EXPECT_EQ(device_profile("h200")->cache_bytes, 0);
  const std::string path = ::testing::TempDir() + "/cache_profile.json";
  CompileOptions o = vit_options(32);
  o.target = path;
  auto estimate = [&](int64_t cache_bytes, double cache_bandwidth) {
    p.cache_bytes = cache_bytes;
    p.cache_bandwidth = cache_bandwidth;
    EXPECT_TRUE(write_profile(path, p).ok());
    EXPECT_EQ(device_profile(path)->cache_bytes, cache_bytes);
    return testing::compile_committed("vit_tiny", o).estimated_step_ms;
  };
  const double streaming = p.mem_bandwidth * p.bandwidth_efficiency;
  const double none = estimate(0, 10 * streaming), same = estimate(int64_t{1} << 30, streaming),
               fast = estimate(int64_t{1} << 30, 10 * streaming);
  EXPECT_DOUBLE_EQ(none, same);
  EXPECT_LT(fast, none);
  std::FILE* f = std::fopen(path.c_str(), "w");  // a profile written before the tier has none
  std::fputs("{\"name\": \"cpu\"}", f);
  std::fclose(f);
  EXPECT_EQ(device_profile(path)->cache_bytes, 0);

  Module m;
  const ValueId data = m.add_argument("data", TensorType{DType::kF32, {1000, 64}}, Role::kInput);
  const ValueId index = m.add_argument("index", TensorType{DType::kI64, {2}}, Role::kInput);
  const auto gathered = m.add_node("gather", {data, index}, make_attrs({{"axis", int64_t{0}}}));
  ASSERT_TRUE(gathered.ok()) << gathered.status().message();
  const auto added = m.add_node("add", {data, data});
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(node_bytes(m, m.node(m.value((*gathered)[0]).producer)), 2 * (2 * 64 * 4) + 2 * 8);
  EXPECT_EQ(node_bytes(m, m.node(m.value((*added)[0]).producer)), 3 * 1000 * 64 * 4);
}

TEST(Search, EveryBudgetMetWithoutChangingOptimizerOrNumerics) {
  const std::string path = testing::source_path("models/vit_tiny.onnx");
  const int64_t unconstrained = testing::compile_committed("vit_tiny", vit_options(32)).memory.predicted_peak_bytes;
  for (double fraction : {0.75, 0.5, 0.25, 0.15}) {
    ModelCompiler compiler(path, path + ".plan");
    CompileOptions o = vit_options(32);
    o.budget_bytes = static_cast<int64_t>(fraction * static_cast<double>(unconstrained));
    auto found = search_plan(compiler, o, SearchSpace{});
    ASSERT_TRUE(found.ok()) << found.status().message();
    auto plan = compiler.compile(found->chosen);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    std::printf("[planner] vit_tiny b32 budget %.0f%% (%lld B): %s, planned %lld B, %.2f ms, %d candidates\n", fraction * 100,
                static_cast<long long>(o.budget_bytes), found->best.label().c_str(), static_cast<long long>(plan->memory.predicted_peak_bytes),
                plan->estimated_step_ms, found->compiles);
    EXPECT_LE(plan->memory.predicted_peak_bytes, o.budget_bytes);
    EXPECT_EQ(plan->optimizer.kind, "adamw");
    EXPECT_EQ(plan->decisions.precision.find("-true"), std::string::npos);
    // Deterministic: a second search picks the same plan.
    ModelCompiler again(path, path + ".plan");
    auto second = search_plan(again, o, SearchSpace{});
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(second->best.label(), found->best.label());
    // The Pareto front: peaks rise while times fall.
    for (size_t i = 1; i < found->pareto.size(); ++i) {
      EXPECT_GE(found->pareto[i].peak_bytes, found->pareto[i - 1].peak_bytes);
      EXPECT_LT(found->pareto[i].step_ms, found->pareto[i - 1].step_ms);
    }
  }
}

TEST(Search, PinsAreKeptAndTheFloorIsNamed) {
  const std::string path = testing::source_path("models/vit_tiny.onnx");
  ModelCompiler compiler(path, path + ".plan");
  CompileOptions o = vit_options(32);
  o.precision = PrecisionKind::kBf16True;  // pinned by the user: allowed, and kept
  o.budget_bytes = 600'000;
  SearchSpace space;
  space.precision = false;
  auto found = search_plan(compiler, o, space);
  ASSERT_TRUE(found.ok()) << found.status().message();
  EXPECT_EQ(found->chosen.precision, PrecisionKind::kBf16True);
  o.precision = PrecisionKind::kFp32;
  o.budget_bytes = 10'000;
  auto refused = search_plan(compiler, o, SearchSpace{});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().kind(), ErrorKind::kBudget);
  EXPECT_NE(refused.status().message().find("below the smallest peak memc can plan"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("largest at that peak"), std::string::npos);
  // What dominates the floor is a part of the floor's own peak ("…: 586 MB (586238912 bytes)
  // with …; largest at that peak: activations 495 MB"), not of the unscheduled candidate's.
  const std::string& m = refused.status().message();
  const size_t peak_at = m.find(" bytes) with ");
  const size_t open = m.rfind('(', peak_at);
  ASSERT_NE(peak_at, std::string::npos) << m;
  const int64_t peak = std::stoll(m.substr(open + 1, peak_at - open - 1));
  std::string largest = m.substr(m.find("largest at that peak: ") + 22);
  largest = largest.substr(largest.find(' ') + 1);
  largest.erase(std::remove(largest.begin(), largest.end(), ' '), largest.end());
  auto largest_bytes = parse_size(largest);
  ASSERT_TRUE(largest_bytes.ok()) << m;
  EXPECT_LE(*largest_bytes, peak) << m;
}

// Per-block checkpointing is not the least memory on vit_tiny at b16: the floor is a plan with
// finer checkpoints (a remat limit) below the per-block plan of the same other settings, budgets
// between the two are met, and the floor's own peak is a budget the search meets.
TEST(Search, BelowPerBlockCheckpointingFinerCheckpointsMeetTheBudget) {
  const std::string path = testing::source_path("models/vit_tiny.onnx");
  auto search = [&](int64_t budget) {
    ModelCompiler compiler(path, path + ".plan");
    CompileOptions o = vit_options(16);
    o.budget_bytes = budget;
    return search_plan(compiler, o, SearchSpace{});
  };
  auto refused = search(10'000);
  ASSERT_FALSE(refused.ok());
  const std::string& m = refused.status().message();
  const size_t peak_at = m.find(" bytes) with ");
  ASSERT_NE(peak_at, std::string::npos) << m;
  const int64_t floor = std::stoll(m.substr(m.rfind('(', peak_at) + 1, peak_at - m.rfind('(', peak_at) - 1));
  // The floor's settings with per-block checkpointing instead.
  auto at_floor = search(floor);
  ASSERT_TRUE(at_floor.ok()) << at_floor.status().message();
  EXPECT_LE(at_floor->best.peak_bytes, floor);
  CompileOptions blocks = at_floor->chosen;
  ASSERT_EQ(blocks.remat.policy, RematPolicy::kLimit) << m;
  blocks.remat.policy = RematPolicy::kBlocks;
  blocks.budget_bytes = 0;
  const int64_t per_block = testing::compile_committed("vit_tiny", blocks).memory.predicted_peak_bytes;
  std::printf("[planner] vit_tiny b16 floor %lld B (%s), the same with remat blocks %lld B\n", static_cast<long long>(floor),
              at_floor->best.label().c_str(), static_cast<long long>(per_block));
  EXPECT_LT(floor, per_block);
  auto between = search((floor + per_block) / 2);
  ASSERT_TRUE(between.ok()) << between.status().message();
  EXPECT_LE(between->best.peak_bytes, (floor + per_block) / 2);
}

// Offload: the same training to the bit, and the device keeps what the pass says it keeps.
class OffloadVsNone : public ::testing::TestWithParam<std::string> {};

TEST_P(OffloadVsNone, BitIdenticalAfterTenStepsAndPredictedDeviceDrop) {
  CompileOptions o = vit_options(16);
  o.precision = *parse_precision(GetParam());
  const Plan none = testing::compile_committed("vit_tiny", o);
  o.offload = OffloadLevel::kOptimizer;
  const Plan off = testing::compile_committed("vit_tiny", o);
  int64_t moved = 0;
  for (ValueId a : off.train.arguments()) moved += off.train.value(a).space == MemSpace::kHost ? off.train.value(a).type.bytes() : 0;
  int64_t states = 0;
  for (ValueId a : none.train.arguments()) states += none.train.value(a).role == Role::kOptimizerState ? none.train.value(a).type.bytes() : 0;
  EXPECT_GE(moved, states);
  // The host arena's persistent region holds them (each slice 64-byte aligned), and the device
  // drops by that region plus at most one 64-byte slot per runtime scalar (lr, step): the host
  // updates read their host copies, so on the device each dies at the first update, not the last.
  // Less at most one gradient: each gradient's copy to the host completes once the next gradient
  // exists, so the device holds one more while the copy runs.
  auto host_plan = MemoryPlan().run(off.train);
  ASSERT_TRUE(host_plan.ok());
  const SpacePlan& host = host_plan->space(MemSpace::kHost);
  EXPECT_EQ(host.arena_bytes, off.memory.host_bytes);
  EXPECT_GE(host.persistent_bytes, moved);
  EXPECT_LT(host.persistent_bytes - moved, 64 * static_cast<int64_t>(off.train.arguments().size()));
  int64_t device_scalars = 0;
  for (ValueId a : off.train.arguments()) device_scalars += off.train.value(a).role == Role::kScalar && off.train.value(a).space == MemSpace::kDevice;
  const int64_t drop = none.memory.predicted_peak_bytes - off.memory.predicted_peak_bytes;
  int64_t largest_grad = 0;
  for (ValueId a : off.train.arguments()) {
    if (off.train.value(a).role == Role::kParam) largest_grad = std::max(largest_grad, off.train.value(a).type.bytes());
  }
  EXPECT_GE(drop, host.persistent_bytes - largest_grad);
  EXPECT_LE(drop, host.persistent_bytes + 64 * device_scalars);
  // Above it, the staging of the explicit transfers: every host update reads its gradient (and
  // under fp32 its weight, and writes the new weight) through an async pair,
  // copy_to_host_start/_done or copy_to_device_start/_done. A gradient's copy starts as soon as
  // the gradient exists, so the staging holds the gradients in flight; a weight's is staged
  // right before its update.
  int64_t largest_param = 0, updates = 0, to_host = 0, to_device = 0, starts = 0, grads = 0;
  for (ValueId a : off.train.arguments()) {
    if (off.train.value(a).role == Role::kParam) largest_param = std::max(largest_param, off.train.value(a).type.bytes());
  }
  for (NodeId n : off.train.schedule()) {
    updates += off.train.node(n).op == "adam_update";
    to_host += off.train.node(n).op == "copy_to_host_done";
    to_device += off.train.node(n).op == "copy_to_device_done";
    starts += off.train.node(n).op.ends_with("_start");
    EXPECT_NE(off.train.node(n).op, "copy_to_host");  // every transfer is a pair
    EXPECT_NE(off.train.node(n).op, "copy_to_device");
  }
  EXPECT_EQ(starts, to_host + to_device);
  EXPECT_GE(to_host, updates);                           // each gradient crosses
  // Weights that stay on the device (all of them under fp32; under mixed precision those that
  // are not f32 masters of a bf16 copy) come back by copy_to_device.
  int64_t device_weights = 0;
  for (ValueId arg : off.train.output_updates()) {
    device_weights += arg != kNoValue && off.train.value(arg).role == Role::kParam && off.train.value(arg).space == MemSpace::kDevice;
  }
  EXPECT_EQ(to_device, device_weights);
  if (GetParam() == "fp32") {
    EXPECT_EQ(to_device, updates);
  }
  const int64_t staging = host.arena_bytes - host.persistent_bytes;
  for (ValueId a : none.train.arguments()) grads += none.train.value(a).role == Role::kParam ? none.train.value(a).type.bytes() : 0;
  EXPECT_GT(staging, 0);
  EXPECT_LE(staging, grads + 2 * largest_param + 1024);
  std::printf("[planner] vit_tiny b16 %s: device peak %lld -> %lld B with offload (%lld B to host; optimizer state %lld B)\n",
              GetParam().c_str(), static_cast<long long>(none.memory.predicted_peak_bytes),
              static_cast<long long>(off.memory.predicted_peak_bytes), static_cast<long long>(moved), static_cast<long long>(states));

  StateMap a, b;
  RunOptions run{.data = testing::source_path("data/digits_train.npz"), .steps = 10, .seed = 0, .quiet = true};
  auto ra = run_plan("", none, run, &a);
  auto rb = run_plan("", off, run, &b);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(rb->measured_peak_bytes, off.memory.predicted_peak_bytes);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(std::memcmp(t.raw(), b.at(name).raw(), t.nbytes()), 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, OffloadVsNone, ::testing::Values("fp32", "bf16-mixed"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param == "fp32" ? "fp32" : "bf16_mixed"; });

// Heavy nodes (GEMMs, attention) scheduled strictly between each transfer's start and its done:
// the compute its copy overlaps on a GPU's copy stream. Keyed by the done.
std::map<NodeId, int> compute_under_copies(const Module& m) {
  std::map<ValueId, int> open;  // pending value → heavy nodes since its start
  std::map<NodeId, int> under;
  for (NodeId n : m.schedule()) {
    const Node& node = m.node(n);
    const bool transfer = node.def && (node.def->flags & kOpTransfer);
    if (transfer && node.op.ends_with("_start")) {
      open[node.outputs[0]] = 0;
    } else if (transfer && node.op.ends_with("_done")) {
      EXPECT_TRUE(open.count(node.inputs[0])) << node.op << " of %" << m.value(node.outputs[0]).name << " before its start";
      under[n] = open[node.inputs[0]];
      open.erase(node.inputs[0]);
    } else if (node.def && (node.def->flags & kOpComputeHeavy)) {
      for (auto& [pending, count] : open) ++count;
    }
  }
  EXPECT_TRUE(open.empty()) << open.size() << " copies never completed";
  return under;
}

// Offload's copies run on the copy stream as async pairs, and the schedule gives them compute
// to hide behind: a gradient's copy to the host starts as soon as the gradient exists and
// completes right before its update; a weight's new value goes back as soon as the update has
// run and completes at the end of the step; a streamed unit's copy to the device starts one
// unit ahead (after the previous unit's split), as zero3's gathers do.
TEST(Offload, TransfersAreAsyncPairsThatOverlapCompute) {
  CompileOptions o = vit_options(16);
  o.offload = OffloadLevel::kOptimizer;
  const Plan opt = testing::compile_committed("vit_tiny", o);
  int grads = 0, grads_hidden = 0, weights = 0, weights_hidden = 0;
  for (const auto& [done, heavy] : compute_under_copies(opt.train)) {
    const Value& source = opt.train.value(opt.train.node(done).inputs[1]);
    if (source.role == Role::kGrad) ++grads, grads_hidden += heavy > 0;
    if (opt.train.node(done).op == "copy_to_device_done") ++weights, weights_hidden += heavy > 0;
  }
  std::printf("[planner] vit_tiny b16 fp32 offload optimizer: %d of %d gradient copies and %d of %d weight copies overlap a GEMM\n",
              grads_hidden, grads, weights_hidden, weights);
  EXPECT_EQ(grads, 32);
  EXPECT_EQ(weights, 32);
  // A gradient's copy completes once the next gradient exists; those one node computes together
  // (a layernorm's weight and bias) have no GEMM between them, nor has the step's last.
  EXPECT_GE(3 * grads_hidden, 2 * grads);
  EXPECT_GE(weights_hidden, weights * 3 / 4);

  o.offload = OffloadLevel::kParams;
  const Plan streamed = testing::compile_committed("vit_tiny", o);
  int starts = 0, prefetched = 0;
  for (NodeId n : streamed.train.schedule()) {
    const Node& node = streamed.train.node(n);
    if (node.op != "copy_to_device_start") continue;
    ++starts;
    prefetched += node.inputs.size() == 2;  // its `after`: the previous unit's split
  }
  int units_hidden = 0;
  for (const auto& [done, heavy] : compute_under_copies(streamed.train)) {
    units_hidden += streamed.train.node(done).op == "copy_to_device_done" && heavy > 0;
  }
  std::printf("[planner] vit_tiny b16 fp32 offload params: %d unit copies to the device, %d prefetched, %d overlap a GEMM\n", starts,
              prefetched, units_hidden);
  EXPECT_GT(starts, 4);                  // each unit before its forward and again before its backward
  EXPECT_EQ(prefetched, starts - 1);     // all but the step's first
  EXPECT_GE(units_hidden, starts - 2);
}

}  // namespace
}  // namespace memc
