// The remat pass: the chain solver against the Revolve formula; on an IR chain the recomputed
// layer count equals the binomial optimum, gradients are bit-identical and the planned peak
// falls with the slots; on the committed models (dropout on) every gradient is bit-identical
// to the plan without remat, measured peak = planned peak, and the solver does at least as
// well as per-block checkpointing at the same planned peak.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>

#include "ir/grad.h"
#include "onnx/onnx_pb.h"
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
      const ChainSolution solution = solve_chain(uniform_chain(n), c - 1, 1);  // x_0 is one of the c slots
      const double total = solution.cost;
      const std::vector<ChainAction>& actions = solution.actions;
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
  EXPECT_EQ(solve_chain(c, 100, 1).cost, 4.0);
  // Heavy outputs fit, whole tapes do not: keep matmul outputs, recompute the cheap rest.
  c.tape.assign(4, 10);
  c.heavy.assign(4, 1);
  c.cheap.assign(4, 0.1);
  const ChainSolution solution = solve_chain(c, 8, 1);
  EXPECT_NEAR(solution.cost, 4.0 + 3 * 0.1, 1e-6);  // the last segment records in the first sweep
  int partial = 0;
  for (const ChainAction& a : solution.actions) partial += a.kind == ChainAction::kPartial;
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

using testing::emit;

Attrs sum_axes(std::vector<int64_t> axes) { return make_attrs({{"axes", std::move(axes)}, {"keepdims", int64_t{0}}}); }

// Appends the backward of c.loss with respect to c.w, records where it starts and ends, and
// makes (loss, grad w) the outputs.
void differentiate(IrChain& c) {
  Module& m = c.m;
  c.backward_begin = static_cast<NodeId>(m.nodes().size());
  auto grads = Autodiff().run(m, c.loss, {c.w});
  MEMC_CHECK(grads.ok(), grads.status().message());
  c.backward_end = static_cast<NodeId>(m.nodes().size());
  m.set_outputs({c.loss, (*grads)[0]});
}

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
  differentiate(c);
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
    RematOptions o{.policy = RematPolicy::kLimit, .limit_bytes = (c - 1) * state};
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
  auto refused = Remat({.policy = RematPolicy::kLimit, .limit_bytes = 0}).run(chain.m, 0, chain.backward_begin, chain.backward_end);
  EXPECT_TRUE(refused.ok());  // x₀ is global: zero bytes of checkpoints still work (n(n−1)/2)
  // must_recompute a value that would otherwise be kept, with an unlimited budget.
  IrChain pinned = build_chain(4);
  const std::string tanh_name = pinned.m.value(pinned.m.node(2).outputs[0]).name;
  RematOptions o{.policy = RematPolicy::kLimit, .limit_bytes = int64_t{1} << 40, .must_recompute = {tanh_name, "no_such_value"}};
  auto report = Remat(o).run(pinned.m, 0, pinned.backward_begin, pinned.backward_end);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->unresolved_pins, 1);
  EXPECT_EQ(count_op(pinned.m, "tanh"), 5);  // only the pinned one is recomputed
  IrChain unpinned = build_chain(4);
  const std::vector<Tensor> want = run(unpinned.m), got = run(pinned.m);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(std::memcmp(got[i].raw(), want[i].raw(), want[i].nbytes()), 0);
}

// A forward of 600 layers cuts into 600 segments. The solver sees at most kMaxChainSegments
// (neighbours merged, 600 → 256), so its table stays within kMaxChainTableBytes (50,725,632 B;
// the full square of 600 segments with 32-bit moves took 600·601·257·8 B = 741 MB), and the
// merged schedule still recomputes the gradients bit for bit.
TEST(RematOnIrChain, ManySegmentsMergeToKeepTheSolverTableBounded) {
  const int n = 600;
  IrChain base = build_chain(n);
  const std::vector<Tensor> want = run(base.m);
  IrChain chain = build_chain(n);
  auto report = Remat({.policy = RematPolicy::kLimit, .limit_bytes = 200 * 1024}).run(chain.m, 0, chain.backward_begin, chain.backward_end);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->segments, kMaxChainSegments);
  EXPECT_EQ(report->dp_table_bytes, chain_table_cells(kMaxChainSegments, 256) * kChainCellBytes);
  EXPECT_LE(report->dp_table_bytes, kMaxChainTableBytes);
  EXPECT_GT(count_op(chain.m, "tanh"), n);  // the limit is below the 600 tapes: some layers rerun
  const std::vector<Tensor> got = run(chain.m);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(std::memcmp(got[i].raw(), want[i].raw(), want[i].nbytes()), 0);
}

// build_chain's layers with what the segmenter has to see through:
//   mask    y [2, 4] is a second input and mask = sigmoid(y) is added to every layer's
//           expand(h)·w: one value read across the whole forward, as a BERT attention mask
//   skip    layer skip + span also adds layer skip's Σ_k (a skip connection over span layers)
//   source  each node of layer i is named source + i + "/op", as exporters name module paths
//   path    if set, each node of layer i is named path(i) + "/op" instead
struct LayerOptions {
  bool mask = false;
  int skip = -1, span = 1;
  std::string source;
  std::function<std::string(int)> path;
};

IrChain build_layers(int n, const LayerOptions& o) {
  IrChain c;
  Module& m = c.m;
  auto node = [&](int layer, const std::string& op, std::vector<ValueId> in, Attrs a = {}) {
    const std::string prefix = o.path ? o.path(layer) : o.source.empty() ? "" : o.source + std::to_string(layer);
    auto out = m.add_node(op, std::move(in), std::move(a), prefix.empty() ? "" : prefix + "/" + op);
    MEMC_CHECK(out.ok(), out.status().message());
    return (*out)[0];
  };
  const ValueId x = m.add_argument("x", TensorType{DType::kF32, {2, 4}}, Role::kInput);
  c.w = m.add_argument("w", TensorType{DType::kF32, {4}}, Role::kParam);
  ValueId mask = kNoValue, skipped = kNoValue;
  if (o.mask) mask = emit(m, "sigmoid", {m.add_argument("y", TensorType{DType::kF32, {2, 4}}, Role::kInput)});
  ValueId h = x;
  for (int i = 0; i < n; ++i) {
    const ValueId e = node(i, "expand", {h}, make_attrs({{"shape", std::vector<int64_t>{8, 2, 4}}}));
    ValueId product = node(i, "mul", {e, c.w});
    if (o.mask) product = node(i, "add", {product, mask});
    const ValueId t = node(i, "tanh", {product});
    if (i + 1 < n) {
      const ValueId summed = node(i, "reduce_sum", {t}, sum_axes({0}));
      if (i == o.skip) skipped = summed;
      h = node(i, "add", {summed, h});
      if (o.skip >= 0 && i == o.skip + o.span) h = node(i, "add", {h, skipped});
    } else {
      c.loss = node(i, "add", {node(i, "reduce_sum", {t}, sum_axes({})), node(i, "reduce_sum", {h}, sum_axes({}))});
    }
  }
  differentiate(c);
  return c;
}

// Runs m on random values of every argument (the same for modules with the same arguments).
std::vector<Tensor> run_all(const Module& m) {
  std::mt19937 rng(7);
  std::map<std::string, Tensor> args;
  for (ValueId a : m.arguments()) args.emplace(m.value(a).name, testing::random_tensor(m.value(a).type.dtype, m.value(a).type.shape, rng));
  auto out = execute(m, args);
  MEMC_CHECK(out.ok(), out.status().message());
  return std::move(out).value();
}

bool bit_identical(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i].nbytes() != want[i].nbytes() || std::memcmp(got[i].raw(), want[i].raw(), want[i].nbytes()) != 0) return false;
  }
  return true;
}

Expected<RematReport> remat(IrChain& c, RematOptions o) { return Remat(std::move(o)).run(c.m, 0, c.backward_begin, c.backward_end); }

// Why a value read across more than a quarter of the forward is kept like a global. Ten layers
// (62 forward nodes with the mask's sigmoid; the mask spans 57 > 62/4 + 2): the mask crosses every gap between
// layers, so if it were an activation no gap would have a single crosser and the forward would
// be one segment, leaving the solver nothing to checkpoint. Kept, the layers cut as without it
// (10 segments) and the mask is never recomputed (one sigmoid) at the tightest limit.
TEST(RematSegments, AValueReadByEveryLayerIsKeptSoTheLayersStillCut) {
  const int n = 10;
  IrChain base = build_layers(n, {.mask = true});
  const std::vector<Tensor> want = run_all(base.m);
  IrChain chain = build_layers(n, {.mask = true});
  auto report = remat(chain, {.policy = RematPolicy::kLimit, .limit_bytes = 0});
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->segments, n);
  EXPECT_EQ(count_op(chain.m, "sigmoid"), 1);
  EXPECT_EQ(count_op(chain.m, "tanh") - n, revolve_advances(n, 1));  // x₀ is the only slot
  EXPECT_TRUE(bit_identical(run_all(chain.m), want));
}

// The other side of the quarter (52 forward nodes: 52/4 + 2 = 15): a skip connection over one
// layer (span 7 nodes) is an activation like the residual stream, so the gap it crosses is not
// cut (9 segments); one over three layers (17 nodes) is kept for the step like the mask: every gap between
// layers cuts, and so does the one after the kept value, where only the state crosses (11).
TEST(RematSegments, ASkipOverAFewLayersIsAnActivationAndALongerOneIsKept) {
  const int n = 10;
  IrChain short_skip = build_layers(n, {.skip = 4, .span = 1});
  auto report = remat(short_skip, {.policy = RematPolicy::kLimit, .limit_bytes = 0});
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->segments, n - 1);
  IrChain long_skip = build_layers(n, {.skip = 4, .span = 3});
  report = remat(long_skip, {.policy = RematPolicy::kLimit, .limit_bytes = 0});
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->segments, n + 1);
}

// --remat blocks finds a transformer block by the module path exporters write into node names
// (torchvision "encoder/layers/encoder_layer_3", Hugging Face BERT "encoder/layer.3", GPT-2
// "h.3", timm "blocks.3"; the dynamo exporter's metadata, which the importer appends after " in ").
// Each of 4 layers is a block here: blocks 0..2 are recomputed once from their inputs (3 extra
// tanh) and the last runs once.
TEST(RematBlocks, BlocksAreTheModulePathsInNodeNames) {
  const int n = 4;
  for (const std::string source : {"/encoder/layers/encoder_layer_", "/bert/encoder/layer.", "/transformer/h.", "/blocks.",
                                   "node_linear_1 (Gemm) in encoder.layers.encoder_layer_", "node_add (Add) in h."}) {
    IrChain chain = build_layers(n, {.source = source});
    auto report = remat(chain, {.policy = RematPolicy::kBlocks});
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(count_op(chain.m, "tanh"), 2 * n - 1) << source;
    EXPECT_EQ(report->blocks, n) << source;
    EXPECT_EQ(report->blocks_found_by, "module paths in node names") << source;
  }
}

// Lists of modules nest. Swin's stages are "layers" whose "blocks" PyTorch checkpoints one by
// one: 6 layers as stages of 2 and 4 blocks are 6 blocks (5 recomputed), not 2 stages; the same
// block index in two stages is two blocks. T5's "block.B/layer.L" are a block's sublayers: 4
// layers as 2 blocks of 2 sublayers are 2 blocks (1 recomputed, 2 extra tanh), as the dynamo
// scope spells them too.
TEST(RematBlocks, NestedListsAreBlocksAsPyTorchCheckpointsThem) {
  struct Case {
    int layers;
    std::function<std::string(int)> path;
    int blocks;
  };
  const std::vector<Case> cases = {
      {6, [](int i) { return str_cat("/swin/encoder/layers.", i < 2 ? 0 : 1, "/blocks.", i < 2 ? i : i - 2); }, 6},
      {6, [](int i) { return str_cat("node_add (Add) in swin.encoder.layers.", i < 2 ? 0 : 1, ".blocks.", i < 2 ? i : i - 2, ".mlp"); }, 6},
      {4, [](int i) { return str_cat("/encoder/block.", i / 2, "/layer.", i % 2); }, 2},
      {4, [](int i) { return str_cat("node_mul (Mul) in encoder.block.", i / 2, ".layer.", i % 2, ".DenseReluDense"); }, 2},
  };
  for (const Case& c : cases) {
    IrChain chain = build_layers(c.layers, {.path = c.path});
    const std::vector<Tensor> want = run_all(build_layers(c.layers, {.path = c.path}).m);
    auto report = remat(chain, {.policy = RematPolicy::kBlocks});
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->blocks, c.blocks) << c.path(0);
    EXPECT_EQ(report->blocks_found_by, "module paths in node names") << c.path(0);
    EXPECT_EQ(count_op(chain.m, "tanh"), c.layers + c.layers / c.blocks * (c.blocks - 1)) << c.path(0);
    EXPECT_TRUE(bit_identical(run_all(chain.m), want)) << c.path(0);
  }
}

// Without a layer path in the node names (a graph written node by node, names an optimizer
// replaced: models/export_gpt_skeleton.py's; "node_layer_norm_1" and "branch_1" are not paths of
// blocks), the blocks are the unit of forward ops that repeats.
// Layers 0..2 of 4 are the same 5 ops; the last one also computes the loss, so it differs and
// joins layer 2's block, which runs once: layers 0 and 1 are recomputed (2 extra tanh), bit for
// bit. Two layers are two different runs of ops: nothing repeats, nothing is recomputed, and the
// report says no blocks were found.
TEST(RematBlocks, WithoutModulePathsTheBlocksAreTheRepeatedOps) {
  for (const std::string source : {"", "/encoder/mlp_", "/stage", "node_layer_norm_", "/branch_"}) {
    IrChain chain = build_layers(4, {.source = source});
    const std::vector<Tensor> want = run_all(build_layers(4, {.source = source}).m);
    auto report = remat(chain, {.policy = RematPolicy::kBlocks});
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->blocks, 3) << source;  // layers 0, 1 and 2 + 3
    EXPECT_EQ(report->blocks_found_by, "the forward's repetition") << source;
    EXPECT_EQ(count_op(chain.m, "tanh"), 4 + 2) << source;
    EXPECT_TRUE(bit_identical(run_all(chain.m), want)) << source;
  }
  IrChain two = build_layers(2, {});
  auto report = remat(two, {.policy = RematPolicy::kBlocks});
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->recomputed_nodes, 0);
  EXPECT_EQ(report->blocks, 0);
  EXPECT_EQ(report->blocks_found_by, "");
  EXPECT_EQ(count_op(two.m, "tanh"), 2);
}

TEST(ParseRemat, Spellings) {
  EXPECT_EQ(parse_remat("none")->policy, RematPolicy::kNone);
  EXPECT_EQ(parse_remat("blocks")->policy, RematPolicy::kBlocks);
  auto limit = parse_remat("2MB,save=a,recompute=b");
  ASSERT_TRUE(limit.ok());
  EXPECT_EQ(limit->policy, RematPolicy::kLimit);
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
  std::vector<RematOptions> variants = {{.policy = RematPolicy::kBlocks}};
  int64_t tape = 0;
  for (const Value& v : base.train.values()) tape += v.role == Role::kActivation ? v.type.bytes() : 0;
  for (int64_t limit = tape / 2; limit > 1000; limit /= 4) variants.push_back({.policy = RematPolicy::kLimit, .limit_bytes = limit});
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
  o.remat.policy = RematPolicy::kBlocks;
  const Plan blocks = testing::compile_committed("vit_tiny", o);
  EXPECT_LT(blocks.memory.predicted_peak_bytes, none.memory.predicted_peak_bytes);
  EXPECT_FALSE(blocks.remat_outcome.kept_without_remat);
  EXPECT_EQ(blocks.decisions.remat, "blocks");
  int64_t lowest = none.memory.predicted_peak_bytes;
  for (int64_t limit = none.memory.category_peak_bytes.at("activations"); limit > 1000; limit /= 2) {
    o.remat = {.policy = RematPolicy::kLimit, .limit_bytes = limit};
    const Plan plan = testing::compile_committed("vit_tiny", o);
    EXPECT_LE(plan.memory.predicted_peak_bytes, none.memory.predicted_peak_bytes) << limit;
    if (!plan.remat_outcome.kept_without_remat) lowest = std::min(lowest, plan.memory.predicted_peak_bytes);
  }
  std::printf("[remat] vit_tiny b8 sgd: no remat %lld B, blocks %lld B, lowest limit %lld B\n",
              static_cast<long long>(none.memory.predicted_peak_bytes), static_cast<long long>(blocks.memory.predicted_peak_bytes),
              static_cast<long long>(lowest));
  EXPECT_LT(lowest, none.memory.predicted_peak_bytes);
}

// `model` (under models/) with every node name cleared, and the dynamo exporter's metadata with
// them, at a scratch path of this process: what an optimizer that renames nodes leaves.
std::string without_node_names(const std::string& model) {
  onnx::ModelProto proto;
  std::ifstream in(testing::source_path("models/" + model + ".onnx"), std::ios::binary);
  MEMC_CHECK(in && proto.ParseFromIstream(&in), "cannot read ", model);
  for (onnx::NodeProto& node : *proto.mutable_graph()->mutable_node()) {
    node.clear_name();
    node.GetReflection()->MutableUnknownFields(&node)->Clear();  // metadata_props (field 9)
  }
  const std::string path = testing::scratch_path(model + "_unnamed.onnx");
  std::ofstream out(path, std::ios::binary);
  MEMC_CHECK(proto.SerializeToOstream(&out), "cannot write ", path);
  return path;
}

Plan compile_unnamed(const std::string& path, const CompileOptions& options) {
  Expected<Plan> plan = compile_model(path, path + ".plan", options);
  MEMC_CHECK(plan.ok(), plan.status().message());
  plan->model_path = path;
  return std::move(plan).value();
}

int64_t recomputed_nodes(const Plan& plan) { return plan.train.metadata().get_int("memc.remat_recomputed_nodes", 0); }

// vit_tiny with every node name cleared: the blocks come from the forward's repetition: the same
// 37 nodes recomputed and the same peak as the named export's plan, the first step's gradients
// bit for bit those without remat (dropout on), and measured peak = planned.
TEST(RematVitTiny, BlocksOfAnExportWithoutNodeNamesTrainBitIdentically) {
  const std::string path = without_node_names("vit_tiny");
  const Case c{"vit_tiny", "digits_train.npz", 16, -1};
  const Plan base = compile_unnamed(path, options_for(c, {}));
  const Plan blocks = compile_unnamed(path, options_for(c, {.policy = RematPolicy::kBlocks}));
  const Plan named = testing::compile_committed(c.model, options_for(c, {.policy = RematPolicy::kBlocks}));
  std::printf("[remat] vit_tiny without node names, blocks: %lld nodes recomputed (named: %lld), planned peak %lld (no remat %lld, named %lld)\n",
              static_cast<long long>(recomputed_nodes(blocks)), static_cast<long long>(recomputed_nodes(named)),
              static_cast<long long>(blocks.memory.predicted_peak_bytes), static_cast<long long>(base.memory.predicted_peak_bytes),
              static_cast<long long>(named.memory.predicted_peak_bytes));
  EXPECT_EQ(recomputed_nodes(blocks), recomputed_nodes(named));
  EXPECT_EQ(blocks.memory.predicted_peak_bytes, named.memory.predicted_peak_bytes);
  EXPECT_LT(blocks.memory.predicted_peak_bytes, base.memory.predicted_peak_bytes);
  const auto diff = testing::compare_gradients(testing::first_step_gradients(blocks, c.data), testing::first_step_gradients(base, c.data));
  EXPECT_TRUE(diff.bit_identical);
  EXPECT_EQ(testing::measured_peak(blocks, c.data, 1), blocks.memory.predicted_peak_bytes);
}

// A language model in 16 loss chunks, its node names cleared: the chunks' nodes repeat too, 15
// times over more nodes than the two layers, but no segment cut divides them (the head's input
// is live across all of them), so they are set apart and the layers are the blocks: the plan
// equals the named export's, and trains as the one without remat, bit for bit.
TEST(RematBlocks, ALanguageModelsLossChunksAreNotItsBlocks) {
  const std::string path = without_node_names("gpt2_lm_ts_t215");
  CompileOptions o;
  o.batch = 4;
  o.seq = 32;
  o.loss_chunks = 16;
  o.optimizer.kind = "adamw";
  const Plan base = compile_unnamed(path, o);
  o.remat.policy = RematPolicy::kBlocks;
  const Plan blocks = compile_unnamed(path, o);
  const Plan named = testing::compile_committed("gpt2_lm_ts_t215", o);
  std::printf("[remat] gpt2_lm_ts without node names, 16 loss chunks, blocks: %lld nodes recomputed (named: %lld), planned peak %lld (no remat %lld)\n",
              static_cast<long long>(recomputed_nodes(blocks)), static_cast<long long>(recomputed_nodes(named)),
              static_cast<long long>(blocks.memory.predicted_peak_bytes), static_cast<long long>(base.memory.predicted_peak_bytes));
  EXPECT_GT(recomputed_nodes(blocks), 0);
  EXPECT_EQ(recomputed_nodes(blocks), recomputed_nodes(named));
  EXPECT_EQ(blocks.memory.predicted_peak_bytes, named.memory.predicted_peak_bytes);
  const auto diff = testing::compare_gradients(testing::first_step_gradients(blocks, "lm_test.npz"), testing::first_step_gradients(base, "lm_test.npz"));
  EXPECT_TRUE(diff.bit_identical);
  EXPECT_EQ(testing::measured_peak(blocks, "lm_test.npz", 1), blocks.memory.predicted_peak_bytes);
}

// A limit below what the solver can hold (the largest segment's tape) is answered with the
// least it can do and reported as not met; a generous one is met.
TEST(RematVitTiny, UnmetLimitIsReported) {
  CompileOptions o;
  o.batch = 8;
  o.optimizer.kind = "sgd";
  o.remat = {.policy = RematPolicy::kLimit, .limit_bytes = 1000};
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
  const Plan blocks = testing::compile_committed(c.model, options_for(c, {.policy = RematPolicy::kBlocks}));
  EXPECT_LT(blocks.memory.predicted_peak_bytes, base.memory.predicted_peak_bytes);
  int64_t best = -1, best_peak = 0;
  int64_t limit = base.memory.category_peak_bytes.at("activations");
  for (int i = 0; i < 40 && limit > 0; ++i, limit = limit * 7 / 8) {
    const std::string path = testing::source_path("models/" + c.model + ".onnx");
    Expected<Plan> plan = compile_model(path, path + ".plan", options_for(c, {.policy = RematPolicy::kLimit, .limit_bytes = limit}));
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
