// fp16-mixed with dynamic loss scaling (torch.cuda.amp.GradScaler): the step's gradients
// against fp32, overflowing steps skipped (parameters unchanged bit for bit) with the scale
// halved each time, training proceeding afterwards, and resume carrying the scaler's state.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "planner/compile.h"
#include "runtime/dataset.h"
#include "runtime/trainer.h"
#include "tests/pass_compare.h"
#include "tests/test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;
using testing::source_path;

Plan compile(const std::string& precision, int64_t batch = 16) {
  CompileOptions options;
  options.batch = batch;
  options.epochs = 1;
  options.schedule.lr = 1e-3;
  options.dropout = false;
  options.optimizer.kind = "adamw";
  options.precision = *parse_precision(precision);
  const std::string plan_path = (fs::temp_directory_path() / ("vit_tiny.ls." + precision + ".plan")).string();
  auto plan = compile_model(source_path("models/vit_tiny.onnx"), plan_path, options);
  MEMC_CHECK(plan.ok(), plan.status().message());
  plan->model_path = source_path("models/vit_tiny.onnx");
  return std::move(plan).value();
}

std::map<std::string, Tensor> gradients(const Plan& plan) { return testing::first_step_gradients(plan, "digits_train.npz"); }

bool has_argument(const Module& m, const std::string& name) {
  for (ValueId a : m.arguments()) {
    if (m.value(a).source_name == name) return true;
  }
  return false;
}

TEST(LossScaling, Fp16MixedPlanHasTheScalerInterface) {
  const Plan plan = compile("fp16-mixed");
  EXPECT_TRUE(has_argument(plan.train, kLossScaleArg));
  EXPECT_FALSE(has_argument(compile("bf16-mixed").train, kLossScaleArg));
  bool found = false;
  for (ValueId o : plan.train.outputs()) found |= plan.train.value(o).name == kFoundInfOutput;
  EXPECT_TRUE(found);
  for (NodeId n : plan.train.schedule()) {
    const Node& node = plan.train.node(n);
    if (node.op == "adam_update") {
      EXPECT_EQ(node.inputs.size(), 7u);  // w, g, m, v, lr, step, skip
    }
  }
}

// Step 1 at the initial scale 2^16: unscaled gradients within fp16 tolerances of fp32 (as
// tests/precision_test.cc's fp16 cases: loss 2e-3, gradients 1e-2 in global relative L2).
TEST(LossScaling, Fp16MixedStepOneMatchesFp32) {
  const auto want = gradients(compile("fp32"));
  const auto got = gradients(compile("fp16-mixed"));
  const double loss32 = want.at("loss").get_as_double(0), loss = got.at("loss").get_as_double(0);
  double d = 0, r = 0;
  for (const auto& [name, g32] : want) {
    if (name == "loss") continue;
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.shape(), g32.shape()) << name;
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double a = g.get_as_double(i), b = g32.get_as_double(i);
      ASSERT_TRUE(std::isfinite(a)) << name << "[" << i << "]";
      d += (a - b) * (a - b), r += b * b;
    }
  }
  const double loss_rel = std::abs(loss - loss32) / std::abs(loss32), grad_rel = std::sqrt(d / r);
  std::printf("[loss scaling] vit_tiny fp16-mixed: loss %.6f vs fp32 %.6f (rel %.2e); grads rel L2 %.2e\n", loss, loss32, loss_rel, grad_rel);
  EXPECT_LE(loss_rel, 2e-3);
  EXPECT_LE(grad_rel, 1e-2);
}

// A scale of 2^40 overflows f16 in the backward pass: the step is skipped (everything bit for
// bit as loaded) and the scale halves, until it fits; then training proceeds.
TEST(LossScaling, OverflowSkipsHalvesAndRecovers) {
  const Plan plan = compile("fp16-mixed");
  const double init = std::ldexp(1.0, 40);
  RunOptions one{.data = source_path("data/digits_train.npz"), .steps = 1, .seed = 0, .quiet = true};
  one.initial_loss_scale = init;
  StateMap after;
  auto first = run_plan("", plan, one, &after);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_TRUE(first->loss_scaling);
  EXPECT_EQ(first->skipped_steps, 1);
  EXPECT_EQ(first->loss_scale, init / 2);
  auto before = initial_state("", plan);
  ASSERT_TRUE(before.ok()) << before.status().message();
  ASSERT_EQ(before->size(), after.size());
  for (const auto& [name, t] : *before) {
    ASSERT_TRUE(after.count(name)) << name;
    ASSERT_EQ(t.nbytes(), after.at(name).nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), after.at(name).raw(), t.nbytes()), 0) << name << " changed by a skipped step";
  }

  RunOptions run = one;
  run.steps = 200;
  run.epochs = 20;
  auto report = run_plan("", plan, run);
  ASSERT_TRUE(report.ok()) << report.status().message();
  const int64_t k = report->skipped_steps;
  std::printf("[loss scaling] 2^40 start: %lld skipped, final scale %g, loss %.4f -> %.4f\n", static_cast<long long>(k),
              report->loss_scale, report->losses.front(), report->losses.back());
  EXPECT_GE(k, 2);
  EXPECT_LT(k, 40);
  EXPECT_EQ(report->loss_scale, std::ldexp(init, static_cast<int>(-k)));  // halved per skip; no growth in 200 steps
  ASSERT_EQ(report->losses.size(), 200u);
  // The skipped steps see the weights as loaded; the last ones must have learned.
  double head = 0, tail = 0;
  for (int i = 0; i < 10; ++i) head += report->losses[i] / 10, tail += report->losses[190 + i] / 10;
  for (double l : report->losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(tail, head - 0.1);
}

// Growth: with a short interval the scale doubles after that many clean steps.
TEST(LossScaling, ScaleGrowsAfterCleanSteps) {
  const Plan plan = compile("fp16-mixed");
  RunOptions run{.data = source_path("data/digits_train.npz"), .steps = 6, .seed = 0, .quiet = true};
  run.initial_loss_scale = 1024;
  run.growth_interval = 2;
  auto report = run_plan("", plan, run);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->skipped_steps, 0);
  EXPECT_EQ(report->loss_scale, 1024.0 * 8);
}

// Resume mid-recovery (scale, clean-step counter and applied-update count from the
// checkpoint): the joined losses equal an uninterrupted run's bit for bit.
TEST(LossScaling, ResumeContinuesTheIdenticalLossSequence) {
  const Plan plan = compile("fp16-mixed");
  const std::string dir = (fs::temp_directory_path() / "memc_loss_scaling_resume").string();
  fs::remove_all(dir);
  RunOptions straight{.data = source_path("data/digits_train.npz"), .steps = 40, .seed = 3, .quiet = true};
  straight.initial_loss_scale = std::ldexp(1.0, 30);
  straight.growth_interval = 7;
  auto full = run_plan("", plan, straight);
  ASSERT_TRUE(full.ok()) << full.status().message();
  ASSERT_GE(full->skipped_steps, 1);

  RunOptions first = straight;
  first.steps = 12;
  first.checkpoint_dir = dir;
  auto a = run_plan("", plan, first);
  ASSERT_TRUE(a.ok()) << a.status().message();
  RunOptions second = first;
  second.steps = 28;
  second.resume = true;
  auto b = run_plan("", plan, second);
  ASSERT_TRUE(b.ok()) << b.status().message();
  std::vector<double> joined = a->losses;
  joined.insert(joined.end(), b->losses.begin(), b->losses.end());
  EXPECT_EQ(joined, full->losses);
  EXPECT_EQ(a->skipped_steps + b->skipped_steps, full->skipped_steps);
  EXPECT_EQ(b->loss_scale, full->loss_scale);
  EXPECT_EQ(b->total_steps, 40);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memc
