// The remat pass: the chain solver against the Revolve formula; on an IR chain the recomputed
// layer count equals the binomial optimum, gradients are bit-identical and the planned peak
// falls with the slots; on the committed models (dropout on) every gradient is bit-identical
// to the plan without remat, measured peak = planned peak, and the solver does at least as
// well as per-block checkpointing at the same planned peak.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "ir/grad.h"
#include "passes/autodiff.h"
#include "passes/memory_plan.h"
#include "passes/remat.h"
#include "runtime/executor.h"
#include "tests/pass_compare.h"
#include "tests/test_util.h"

namespace memc {
namespace {

TEST(RevolveFormula, KnownValues) {
  // One slot (x_0 only): every step is re-advanced from the start: n(n−1)/2.
  for (int64_t n = 1; n <= 12; ++n) EXPECT_EQ(revolve_advances(n, 1), n * (n - 1) / 2) << n;
  // Enough slots for every state: one forward sweep of n−1 advances.
  for (int64_t n = 1; n <= 12; ++n) EXPECT_EQ(revolve_advances(n, n), std::max<int64_t>(n - 1, 0)) << n;
  // Two slots, 10 steps: r = 3 (C(4,2) = 6 < 10 ≤ C(5,2)), t = 3·10 − C(5, 3) = 20.
  EXPECT_EQ(revolve_advances(10, 2), 20);
}

// A uniform chain whose tapes never fit: only checkpoints are possible, as in Revolve.
Chain uniform_chain(int n) {
  Chain c;
  c.cost.assign(n, 1.0);
  c.cheap.assign(n, 1.0);
  c.x.assign(n + 1, 1);
  c.x[0] = 0;
  c.tape.assign(n, 1'000'000);
  c.heavy.assign(n, 1'000'000);
  return c;
}

TEST(ChainSolver, MatchesTheBinomialOptimumOnUniformChains) {
  for (int n = 1; n <= 30; ++n) {
    for (int c = 1; c <= 7; ++c) {
      std::vector<ChainAction> actions;
      const double total = solve_chain(uniform_chain(n), c - 1, &actions, 1);  // x_0 is one of the c slots
      ASSERT_GE(total, 0) << n << " " << c;
      // Each step is recorded once for its backward; the rest are advances.
      EXPECT_EQ(static_cast<int64_t>(total) - n, revolve_advances(n, c)) << "n=" << n << " c=" << c;
      int advances = 0, backwards = 0;
      for (const ChainAction& a : actions) advances += a.kind == ChainAction::kAdvance, backwards += a.kind == ChainAction::kBackward;
      EXPECT_EQ(advances, revolve_advances(n, c)) << "n=" << n << " c=" << c;
      EXPECT_EQ(backwards, n);
    }
  }
}

TEST(ChainSolver, HoldsTapesWhenTheyFitAndPrefersPartialForCheapOps) {
  Chain c = uniform_chain(4);
  c.tape.assign(4, 2);
  // Room for every tape and boundary: nothing is recomputed (total = one execution each).
  EXPECT_EQ(solve_chain(c, 100, nullptr, 1), 4.0);
  // Heavy outputs fit, whole tapes do not: keep matmul outputs, recompute the cheap rest.
  c.tape.assign(4, 10);
  c.heavy.assign(4, 1);
  c.cheap.assign(4, 0.1);
  std::vector<ChainAction> actions;
  const double total = solve_chain(c, 8, &actions, 1);
  EXPECT_NEAR(total, 4.0 + 3 * 0.1, 1e-6);  // the last segment records in the first sweep
  int partial = 0;
  for (const ChainAction& a : actions) partial += a.kind == ChainAction::kPartial;
  EXPECT_EQ(partial, 3);
}

// h₀ = x (the input), then n layers
//   h ← Σ_k tanh(expand(h)·w)[k] + h    (backward reads expand(h) and tanh's output: a tape 16×
//                                        the state)
// the last one ending in the scalar loss, so the chain is exactly n segments and only
// checkpoints fit: Revolve's setting.
struct IrChain {
  Module m;
  ValueId w, loss;
  NodeId backward_begin = 0, backward_end = 0;
};

ValueId emit(Module& m, const std::string& op, std::vector<ValueId> in, Attrs a = {}) {
  auto out = m.add_node(op, std::move(in), std::move(a));
  MEMC_CHECK(out.ok(), out.status().message());
  return (*out)[0];
}

Attrs sum_axes(std::vector<int64_t> axes) { return make_attrs({{"axes", std::move(axes)}, {"keepdims", int64_t{0}}}); }

IrChain build_chain(int n) {
  IrChain c;
  Module& m = c.m;
  const ValueId x = m.add_argument("x", TensorType{DType::kF32, {2, 4}}, Role::kInput);
  c.w = m.add_argument("w", TensorType{DType::kF32, {4}}, Role::kParam);
  ValueId h = x;
  for (int i = 0; i < n; ++i) {
    const ValueId e = emit(m, "expand", {h}, make_attrs({{"shape", std::vector<int64_t>{8, 2, 4}}}));
    const ValueId t = emit(m, "tanh", {emit(m, "mul", {e, c.w})});
    if (i + 1 < n) {
      h = emit(m, "add", {emit(m, "reduce_sum", {t}, sum_axes({0})), h});
    } else {
      c.loss = emit(m, "add", {emit(m, "reduce_sum", {t}, sum_axes({})), emit(m, "reduce_sum", {h}, sum_axes({}))});
    }
  }
  c.backward_begin = static_cast<NodeId>(m.nodes().size());
  auto grads = Autodiff().run(m, c.loss, {c.w});
  MEMC_CHECK(grads.ok(), grads.status().message());
  c.backward_end = static_cast<NodeId>(m.nodes().size());
  m.set_outputs({c.loss, (*grads)[0]});
  return c;
}

using testing::count_op;

std::vector<Tensor> run(const Module& m) {
  std::mt19937 rng(7);
  auto out = execute(m, {{"x", testing::random_tensor(DType::kF32, {2, 4}, rng)}, {"w", testing::random_tensor(DType::kF32, {4}, rng)}});
  MEMC_CHECK(out.ok(), out.status().message());
  return std::move(out).value();
}

int64_t planned_arena(const Module& m) {
  auto plan = MemoryPlan().run(m);
  MEMC_CHECK(plan.ok(), plan.status().message());
  return plan->space(MemSpace::kDevice).arena_bytes;
}

TEST(RematOnIrChain, RecomputesTheBinomialOptimumBitIdentically) {
  const int n = 10;
  IrChain base = build_chain(n);
  const std::vector<Tensor> want = run(base.m);
  const int64_t state = 2 * 4 * 4;
  int64_t previous_peak = planned_arena(base.m);
  for (int c = 7; c >= 1; --c) {
    IrChain chain = build_chain(n);
    RematOptions o{.policy = "limit", .limit_bytes = (c - 1) * state};
    auto report = Remat(o).run(chain.m, 0, chain.backward_begin, chain.backward_end);
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->segments, n);
    // Every extra tanh is one recomputed layer.
    EXPECT_EQ(count_op(chain.m, "tanh") - n, revolve_advances(n, c)) << "c=" << c;
    const std::vector<Tensor> got = run(chain.m);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(std::memcmp(got[i].raw(), want[i].raw(), want[i].nbytes()), 0) << "output " << i << " differs at c=" << c;
    }
    const int64_t peak = planned_arena(chain.m);
    std::printf("[remat] chain n=%d c=%d: %d recomputed layers (binomial optimum %lld), planned arena %lld bytes\n", n, c,
                count_op(chain.m, "tanh") - n, static_cast<long long>(revolve_advances(n, c)), static_cast<long long>(peak));
    EXPECT_LE(peak, previous_peak) << "c=" << c;
    previous_peak = peak;
  }
  EXPECT_LT(previous_peak, planned_arena(base.m));
}

TEST(RematOnIrChain, PinsAndLimitsThatCannotBeMet) {
  IrChain chain = build_chain(4);
  // The limit admits no schedule: a budget error naming it.
  auto refused = Remat({.policy = "limit", .limit_bytes = 0}).run(chain.m, 0, chain.backward_begin, chain.backward_end);
  EXPECT_TRUE(refused.ok());  // x₀ is global: zero bytes of checkpoints still work (n(n−1)/2)
  // must_recompute a value that would otherwise be kept, with an unlimited budget.
  IrChain pinned = build_chain(4);
  const std::string tanh_name = pinned.m.value(pinned.m.node(2).outputs[0]).name;
  RematOptions o{.policy = "limit", .limit_bytes = int64_t{1} << 40, .must_recompute = {tanh_name, "no_such_value"}};
  auto report = Remat(o).run(pinned.m, 0, pinned.backward_begin, pinned.backward_end);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->unresolved_pins, 1);
  EXPECT_EQ(count_op(pinned.m, "tanh"), 5);  // only the pinned one is recomputed
  IrChain unpinned = build_chain(4);
  const std::vector<Tensor> want = run(unpinned.m), got = run(pinned.m);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(std::memcmp(got[i].raw(), want[i].raw(), want[i].nbytes()), 0);
}

TEST(ParseRemat, Spellings) {
  EXPECT_EQ(parse_remat("none")->policy, "none");
  EXPECT_EQ(parse_remat("blocks")->policy, "blocks");
  auto limit = parse_remat("2MB,save=a,recompute=b");
  ASSERT_TRUE(limit.ok());
  EXPECT_EQ(limit->policy, "limit");
  EXPECT_EQ(limit->limit_bytes, 2'000'000);
  EXPECT_EQ(limit->must_save, std::vector<std::string>{"a"});
  EXPECT_EQ(limit->must_recompute, std::vector<std::string>{"b"});
  EXPECT_FALSE(parse_remat("sometimes").ok());
}

// Committed models, dropout on.
struct Case {
  std::string model, data;
  int64_t batch, seq;
};

CompileOptions options_for(const Case& c, RematOptions remat) {
  CompileOptions o;
  o.batch = c.batch;
  o.seq = c.seq;
  o.optimizer.kind = "adamw";
  o.remat = std::move(remat);
  return o;
}

class RematOnModels : public ::testing::TestWithParam<Case> {};

// Every remat plan, per-block checkpointing and the solver at limits from the whole tape down
// to the smallest feasible, gives the no-remat gradients bit for bit (dropout on), and its
// measured peak is its planned peak.
TEST_P(RematOnModels, BitIdenticalGradientsAndMeasuredPeak) {
  const Case& c = GetParam();
  const Plan base = testing::compile_committed(c.model, options_for(c, {}));
  const auto want = testing::first_step_gradients(base, c.data);
  std::vector<RematOptions> variants = {{.policy = "blocks"}};
  int64_t tape = 0;
  for (const Value& v : base.train.values()) tape += v.role == Role::kActivation ? v.type.bytes() : 0;
  for (int64_t limit = tape / 2; limit > 1000; limit /= 4) variants.push_back({.policy = "limit", .limit_bytes = limit});
  for (const RematOptions& r : variants) {
    const std::string path = testing::source_path("models/" + c.model + ".onnx");
    Expected<Plan> plan = compile_model(path, path + ".plan", options_for(c, r));
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().kind(), ErrorKind::kBudget) << plan.status().message();
      continue;
    }
    plan->model_path = path;
    const int recomputed = static_cast<int>(plan->train.metadata().get_int("memc.remat_recomputed_nodes", 0));
    const auto diff = testing::compare_gradients(testing::first_step_gradients(*plan, c.data), want);
    std::printf("[remat] %s %s: %d nodes recomputed, planned peak %lld (no remat %lld), bit-identical %d\n", c.model.c_str(),
                plan->decisions.remat.c_str(), recomputed, static_cast<long long>(plan->memory.predicted_peak_bytes),
                static_cast<long long>(base.memory.predicted_peak_bytes), diff.bit_identical);
    EXPECT_TRUE(diff.bit_identical) << plan->decisions.remat;
    EXPECT_EQ(testing::measured_peak(*plan, c.data, 1), plan->memory.predicted_peak_bytes) << plan->decisions.remat;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RematOnModels,
                         ::testing::Values(Case{"vit_tiny", "digits_train.npz", 16, -1}, Case{"text_encoder", "text_train.npz", 16, 32},
                                           Case{"bigbird_full", "text_train.npz", 16, 32}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.model; });

// torchvision's 2-block ViT at batch 8 with SGD: 550,976 B planned without remat. Per-block
// checkpointing once saw no block change (cuts fall inside blocks: one block's ln_2 and the
// next one's ln_1 share a segment), recomputed the whole encoder after the head and planned
// 576,960 B; now each block is its own group and the last one runs once (369,088 B). Some
// limit plans below the no-remat peak, and none above it.
TEST(RematVitTiny, BlocksAndSomeLimitPlanBelowNoRemat) {
  CompileOptions o;
  o.batch = 8;
  o.optimizer.kind = "sgd";
  const Plan none = testing::compile_committed("vit_tiny", o);
  o.remat.policy = "blocks";
  const Plan blocks = testing::compile_committed("vit_tiny", o);
  EXPECT_LT(blocks.memory.predicted_peak_bytes, none.memory.predicted_peak_bytes);
  EXPECT_FALSE(blocks.remat_outcome.kept_without_remat);
  EXPECT_EQ(blocks.decisions.remat, "blocks");
  int64_t lowest = none.memory.predicted_peak_bytes;
  for (int64_t limit = none.memory.category_peak_bytes.at("activations"); limit > 1000; limit /= 2) {
    o.remat = {.policy = "limit", .limit_bytes = limit};
    const Plan plan = testing::compile_committed("vit_tiny", o);
    EXPECT_LE(plan.memory.predicted_peak_bytes, none.memory.predicted_peak_bytes) << limit;
    if (!plan.remat_outcome.kept_without_remat) lowest = std::min(lowest, plan.memory.predicted_peak_bytes);
  }
  std::printf("[remat] vit_tiny b8 sgd: no remat %lld B, blocks %lld B, lowest limit %lld B\n",
              static_cast<long long>(none.memory.predicted_peak_bytes), static_cast<long long>(blocks.memory.predicted_peak_bytes),
              static_cast<long long>(lowest));
  EXPECT_LT(lowest, none.memory.predicted_peak_bytes);
}

// A limit below what the solver can hold (the largest segment's tape) is answered with the
// least it can do and reported as not met; a generous one is met.
TEST(RematVitTiny, UnmetLimitIsReported) {
  CompileOptions o;
  o.batch = 8;
  o.optimizer.kind = "sgd";
  o.remat = {.policy = "limit", .limit_bytes = 1000};
  const Plan tight = testing::compile_committed("vit_tiny", o);
  EXPECT_TRUE(tight.remat_outcome.has_limit);
  EXPECT_FALSE(tight.remat_outcome.limit_met);
  EXPECT_GT(tight.remat_outcome.held_tape_bytes, 1000);
  o.remat.limit_bytes = 100'000'000;
  const Plan generous = testing::compile_committed("vit_tiny", o);
  EXPECT_TRUE(generous.remat_outcome.limit_met);
}

// On ViT-B/16 (skeleton, planned): the solver, at the least recompute whose planned peak is at
// most per-block checkpointing's, recomputes no more than per-block checkpointing does.
TEST(RematVitB16, SolverNoWorseThanPerBlockCheckpointing) {
  const Case c{"vit_b_16_skeleton", "", 2, -1};
  auto flops = [](const Plan& p) { return p.train.metadata().get_int("memc.remat_recompute_flops", 0); };
  const Plan base = testing::compile_committed(c.model, options_for(c, {}));
  const Plan blocks = testing::compile_committed(c.model, options_for(c, {.policy = "blocks"}));
  EXPECT_LT(blocks.memory.predicted_peak_bytes, base.memory.predicted_peak_bytes);
  int64_t best = -1, best_peak = 0;
  int64_t limit = base.memory.category_peak_bytes.at("activations");
  for (int i = 0; i < 40 && limit > 0; ++i, limit = limit * 7 / 8) {
    const std::string path = testing::source_path("models/" + c.model + ".onnx");
    Expected<Plan> plan = compile_model(path, path + ".plan", options_for(c, {.policy = "limit", .limit_bytes = limit}));
    if (!plan.ok()) break;
    const int64_t peak = plan->memory.predicted_peak_bytes;
    if (peak <= blocks.memory.predicted_peak_bytes && (best < 0 || flops(*plan) < best)) best = flops(*plan), best_peak = peak;
  }
  std::printf("[remat] vit_b_16 b2: no remat %lld B; blocks %lld B, %lld recompute FLOP; solver %lld B, %lld FLOP\n",
              static_cast<long long>(base.memory.predicted_peak_bytes), static_cast<long long>(blocks.memory.predicted_peak_bytes),
              static_cast<long long>(flops(blocks)), static_cast<long long>(best_peak), static_cast<long long>(best));
  ASSERT_GE(best, 0) << "no solver plan reaches per-block checkpointing's peak";
  EXPECT_LE(best, flops(blocks));
}

}  // namespace
}  // namespace memc
