// The Session (runtime/session.h): a caller's own loop over a plan. Stepping the batches `memc run`
// would take gives its losses and weights bit for bit; predictions and the first loss match
// PyTorch's reference; bad batches are one-line errors and leave the session usable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "planner/compile.h"
#include "runtime/dataset.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;
using testing::source_path;

// vit_tiny through a plan file, as a session opens it.
std::string write_vit_tiny_plan(const std::string& name, int64_t batch, const std::string& schedule, bool dropout) {
  CompileOptions options;
  options.batch = batch;
  options.dropout = dropout;
  options.optimizer.kind = "adamw";
  options.schedule.kind = schedule;
  options.schedule.lr = 2e-3;
  options.schedule.warmup_steps = 5;
  const std::string plan_path = (fs::temp_directory_path() / (name + ".plan")).string();
  auto plan = compile_model(source_path("models/vit_tiny.onnx"), plan_path, options);
  MEMC_CHECK(plan.ok(), plan.status().message());
  plan->model_path = source_path("models/vit_tiny.onnx");
  MEMC_CHECK(write_plan(plan_path, *plan).ok());
  return plan_path;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(Session, StepsTheBatchesOfMemcRunToTheSameLossesAndWeights) {
  const std::string plan_path = write_vit_tiny_plan("session_vs_run", 32, "warmup-cosine", true);
  auto plan = read_plan(plan_path);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const std::string data_path = source_path("data/digits_train.npz");
  constexpr int64_t kSteps = 12;
  StateMap after_run;
  RunOptions run{.data = data_path, .steps = kSteps, .seed = 3, .quiet = true};
  auto report = run_plan(plan_path, *plan, run, &after_run);
  ASSERT_TRUE(report.ok()) << report.status().message();

  // The same batches in the same order: epoch 0's permutation of the file, 32 rows at a time.
  const std::vector<InputSpec> specs = {{"x", plan->train.value(plan->train.find_value("x")).type}};
  auto data = load_dataset(data_path, specs, label_spec(plan->train, plan->num_classes));
  ASSERT_TRUE(data.ok()) << data.status().message();
  const std::vector<int64_t> order = epoch_order(data->size, 3, 0);
  // memc run's horizon: 1 epoch of the file's 44 batches.
  auto session = Session::open(plan_path, SessionOptions{.seed = 3, .total_steps = batches_per_epoch(data->size, 32)});
  ASSERT_TRUE(session.ok()) << session.status().message();
  for (int64_t b = 0; b < kSteps; ++b) {
    auto batch = make_batch(*data, order, b * 32, 32, specs, "y");
    ASSERT_TRUE(batch.ok()) << batch.status().message();
    auto loss = (*session)->step(*batch);
    ASSERT_TRUE(loss.ok()) << loss.status().message();
    EXPECT_EQ(*loss, report->losses[b]) << "step " << b + 1;
  }
  EXPECT_EQ((*session)->steps(), kSteps);
  EXPECT_EQ((*session)->measured_peak_bytes(), plan->memory.predicted_peak_bytes);
  auto state = (*session)->state();
  ASSERT_TRUE(state.ok()) << state.status().message();
  ASSERT_EQ(state->size(), after_run.size());
  for (const auto& [name, t] : after_run) EXPECT_TRUE(same_bits(state->at(name), t)) << name;
}

TEST(Session, PredictionsAndTheFirstLossMatchPyTorch) {
  // models/vit_tiny.ref.npz: PyTorch's logits and loss for 4 samples (models/README.md).
  auto ref = read_npz(source_path("models/vit_tiny.ref.npz"));
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  auto session = Session::open(write_vit_tiny_plan("session_ref", 4, "constant", false));
  ASSERT_TRUE(session.ok()) << session.status().message();
  auto logits = (*session)->predict({{"x", ref->at("x")}});
  ASSERT_TRUE(logits.ok()) << logits.status().message();
  EXPECT_LT(testing::rel_error(*logits, ref->at("logits")), 1e-5);
  auto loss = (*session)->step({{"x", ref->at("x")}, {"y", ref->at("labels")}});
  ASSERT_TRUE(loss.ok()) << loss.status().message();
  EXPECT_NEAR(*loss, ref->at("loss").get_as_double(0), 1e-5 * std::abs(ref->at("loss").get_as_double(0)));
  // The step moved the weights: the same inputs now predict otherwise.
  auto after = (*session)->predict({{"x", ref->at("x")}});
  ASSERT_TRUE(after.ok());
  EXPECT_GT(testing::rel_error(*after, *logits), 1e-6);
}

// A BatchNorm exported in train() (models/export_t215.py, both exporters): one step normalizes
// with the batch's statistics (PyTorch's loss) and leaves the running statistics PyTorch's
// forward leaves (its unbiased variance); predictions then read them, as the module in eval().
// The learning rate is 0, so the weights stay the reference's.
TEST(Session, BatchNormInTrainModeUpdatesTheRunningStatisticsAsPyTorch) {
  for (const std::string name : {"bn_net_train_t215", "bn_net_train_ts_t215"}) {
    SCOPED_TRACE(name);
    auto ref = read_npz(source_path("models/" + name + ".ref.npz"));
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    CompileOptions options;
    options.batch = 4;
    options.optimizer.kind = "sgd";
    options.schedule.lr = 0.0;
    const std::string model = source_path("models/" + name + ".onnx");
    const std::string plan_path = (fs::temp_directory_path() / (name + ".plan")).string();
    auto plan = compile_model(model, plan_path, options);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    plan->model_path = model;
    ASSERT_TRUE(write_plan(plan_path, *plan).ok());
    auto session = Session::open(plan_path, SessionOptions{.total_steps = 1});
    ASSERT_TRUE(session.ok()) << session.status().message();
    auto loss = (*session)->step({{"x", ref->at("x")}, {"y", ref->at("labels")}});
    ASSERT_TRUE(loss.ok()) << loss.status().message();
    EXPECT_NEAR(*loss, ref->at("loss").get_as_double(0), 1e-5 * std::abs(ref->at("loss").get_as_double(0)));
    EXPECT_EQ((*session)->measured_peak_bytes(), plan->memory.predicted_peak_bytes);
    auto state = (*session)->state();
    ASSERT_TRUE(state.ok()) << state.status().message();
    int buffers = 0;
    for (const auto& [key, expected] : *ref) {
      if (key.rfind("buffer/", 0) != 0) continue;
      ++buffers;
      auto it = state->find(key.substr(7));
      ASSERT_TRUE(it != state->end()) << key;
      EXPECT_LT(testing::rel_error(it->second, expected), 1e-5) << key;
    }
    EXPECT_EQ(buffers, 6);
    auto logits = (*session)->predict({{"x", ref->at("x")}});
    ASSERT_TRUE(logits.ok()) << logits.status().message();
    EXPECT_LT(testing::rel_error(*logits, ref->at("eval/logits")), 1e-5);
  }
}

// Every step's batch passes check_finite, which scans f32 a block at a time: the first bad
// element is found wherever it lies (block edges, the tail, the very last), and -0, the largest
// finite float and subnormals pass.
TEST(CheckFinite, FindsTheFirstNonFiniteElementAcrossBlocks) {
  const int64_t samples = 3, per_sample = 4099;  // 12,297 elements: 3 blocks of 4,096 and a tail of 9
  Tensor clean = Tensor::zeros(DType::kF32, {samples, per_sample});
  float* p = clean.data<float>();
  p[0] = -0.0f, p[1] = 3.4028235e38f, p[2] = -3.4028235e38f, p[3] = 1e-45f;
  EXPECT_TRUE(check_finite("f.npz", "x", clean).ok());
  const struct { int64_t at; float v; const char* says; } cases[] = {
      {0, std::nanf(""), "sample 0 holds NaN (element 0 of"},
      {4095, INFINITY, "sample 0 holds +inf (element 4095 of"},
      {4096, -INFINITY, "sample 0 holds -inf (element 4096 of"},
      {8192, std::nanf(""), "sample 1 holds NaN (element 4093 of"},
      {samples * per_sample - 1, INFINITY, "sample 2 holds +inf (element 4098 of"},
  };
  for (const auto& c : cases) {
    Tensor t = clean.clone();
    t.data<float>()[c.at] = c.v;
    t.data<float>()[samples * per_sample - 1] = c.at == samples * per_sample - 1 ? c.v : 0.0f;
    if (c.at + 5000 < samples * per_sample) t.data<float>()[c.at + 5000] = INFINITY;  // a later one is not the first
    const Status st = check_finite("f.npz", "x", t);
    ASSERT_FALSE(st.ok()) << c.says;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
  }
  Tensor doubles = Tensor::zeros(DType::kF64, {2, 3});
  doubles.data<double>()[4] = -INFINITY;
  const Status st = check_finite("f.npz", "x", doubles);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sample 1 holds -inf (element 1 of"), std::string::npos) << st.message();
}

TEST(Session, BadBatchesAreOneLineErrorsAndTheSessionGoesOn) {
  auto ref = read_npz(source_path("models/vit_tiny.ref.npz"));
  ASSERT_TRUE(ref.ok());
  auto session = Session::open(write_vit_tiny_plan("session_bad", 4, "constant", false));
  ASSERT_TRUE(session.ok()) << session.status().message();
  const Tensor x = ref->at("x"), y = ref->at("labels");
  Tensor nan_x = x.clone();
  nan_x.data<float>()[70] = std::nanf("");
  Tensor bad_y = y.clone();
  bad_y.data<int64_t>()[2] = 10;
  const struct {
    TensorMap batch;
    const char* says;
  } cases[] = {
      {{{"x", x}}, "no 'y'"},
      {{{"y", y}}, "no array for model input 'x'"},
      {{{"x", Tensor::zeros(DType::kF32, {4, 1, 8, 9})}, {"y", y}}, "has shape [4x1x8x9], expected [4x1x8x8]"},
      {{{"x", Tensor::zeros(DType::kF32, {3, 1, 8, 8})}, {"y", Tensor::zeros(DType::kI64, {3})}}, "the plan's batch is 4"},
      {{{"x", Tensor::zeros(DType::kI64, {4, 1, 8, 8})}, {"y", y}}, "is i64, model input 'x' needs f32"},
      {{{"x", x}, {"y", x}}, "array 'y' is f32[4x1x8x8], expected int64 [N]"},
      {{{"x", x}, {"y", bad_y}}, "label y[2] = 10 is outside [0, 10)"},
      {{{"x", nan_x}, {"y", y}}, "sample 1 holds NaN"},
  };
  for (const auto& c : cases) {
    auto loss = (*session)->step(c.batch);
    ASSERT_FALSE(loss.ok()) << c.says;
    EXPECT_EQ(loss.status().kind(), ErrorKind::kBadInput) << loss.status().message();
    EXPECT_NE(loss.status().message().find(c.says), std::string::npos) << loss.status().message();
    EXPECT_EQ(loss.status().message().find('\n'), std::string::npos);
  }
  EXPECT_EQ((*session)->steps(), 0);
  auto loss = (*session)->step({{"x", x}, {"y", y}});
  ASSERT_TRUE(loss.ok()) << loss.status().message();
  EXPECT_EQ((*session)->steps(), 1);
}

TEST(Session, ASchedulesLengthIsNeededToStep) {
  auto ref = read_npz(source_path("models/vit_tiny.ref.npz"));
  ASSERT_TRUE(ref.ok());
  const TensorMap batch = {{"x", ref->at("x")}, {"y", ref->at("labels")}};
  auto session = Session::open(write_vit_tiny_plan("session_cosine", 4, "cosine", false));
  ASSERT_TRUE(session.ok()) << session.status().message();
  EXPECT_TRUE((*session)->predict({{"x", ref->at("x")}}).ok());  // predicting needs no schedule
  auto loss = (*session)->step(batch);
  ASSERT_FALSE(loss.ok());
  EXPECT_NE(loss.status().message().find("needs its length"), std::string::npos) << loss.status().message();
  auto with_length = Session::open(write_vit_tiny_plan("session_cosine", 4, "cosine", false), SessionOptions{.total_steps = 10});
  ASSERT_TRUE(with_length.ok());
  EXPECT_TRUE((*with_length)->step(batch).ok());
  auto missing = Session::open((fs::temp_directory_path() / "no_such.plan").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().kind(), ErrorKind::kBadInput);
}

// A session continues where `memc run --checkpoint` stopped: its weights and step count.
TEST(Session, RestoresWhatMemcRunCheckpointed) {
  const std::string plan_path = write_vit_tiny_plan("session_restore", 32, "constant", false);
  auto plan = read_plan(plan_path);
  ASSERT_TRUE(plan.ok());
  const std::string dir = (fs::temp_directory_path() / "session_restore_ck").string();
  fs::remove_all(dir);
  StateMap after_run;
  RunOptions run{.data = source_path("data/digits_train.npz"), .steps = 7, .checkpoint_dir = dir, .quiet = true};
  ASSERT_TRUE(run_plan(plan_path, *plan, run, &after_run).ok());
  auto session = Session::open(plan_path);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->restore(dir).ok());
  EXPECT_EQ((*session)->steps(), 7);
  auto state = (*session)->state();
  ASSERT_TRUE(state.ok());
  for (const auto& [name, t] : after_run) EXPECT_TRUE(same_bits(state->at(name), t)) << name;
  const Status bad = (*session)->restore((fs::temp_directory_path() / "no_such_checkpoint").string());
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.kind(), ErrorKind::kBadInput);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memc
