// Training end to end on the committed models: gradients equal PyTorch's, the first losses
// track a PyTorch run step for step, and a resumed run continues the identical sequence.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "planner/compile.h"
#include "runtime/npz.h"
#include "runtime/trainer.h"
#include "tests/test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;
using testing::source_path;

struct GradModel {
  std::string name;
  int64_t seq;
};

class GradientsVsPyTorch : public ::testing::TestWithParam<GradModel> {};

// Reference: models/<name>.ref.npz from models/export_models.py (dropout p = 0, batch 4).
TEST_P(GradientsVsPyTorch, EveryParameterGradientWithin1e4) {
  const GradModel& m = GetParam();
  const std::string model = source_path("models/" + m.name + ".onnx");
  auto ref = read_npz(source_path("models/" + m.name + ".ref.npz"));
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  CompileOptions options;
  options.batch = ref->at("labels").shape()[0];
  options.seq = m.seq;
  options.dropout = false;
  options.optimizer.kind = "sgd";
  const std::string plan_path = (fs::temp_directory_path() / (m.name + ".plan")).string();
  auto plan = compile_model(model, plan_path, options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  plan->model_path = model;  // absolute: the plan is not written in this test
  auto state = initial_state(plan_path, *plan);
  ASSERT_TRUE(state.ok()) << state.status().message();

  std::map<std::string, Tensor> batch;
  for (const auto& [key, t] : *ref) {
    if (key == "labels") batch[kLabelsArg] = t;
    else if (key != "logits" && key != "loss" && key.find('/') == std::string::npos) batch[key] = t;
  }
  auto grads = compute_gradients(*plan, *state, batch, 0, 1);
  ASSERT_TRUE(grads.ok()) << grads.status().message();
  EXPECT_NEAR(grads->at("loss").get_as_double(0), ref->at("loss").get_as_double(0), 1e-5 * std::abs(ref->at("loss").get_as_double(0)));
  // Gradients that are zero in exact arithmetic (attention key biases: softmax ignores a
  // per-row shift) hold only float noise (~1e-9) in both frameworks; they are compared
  // against 1e-3 of the model's largest gradient instead of their own magnitude.
  // An initializer the exporter merged by value from several parameters (a fresh model's
  // LayerNorm weights, all 1) is untied by memc: each parameter has its own gradient, the
  // reference's `untied_grad/<parameter>` (its `grad/<initializer>` is the group's sum).
  std::map<std::string, Tensor> wanted;
  for (const auto& [key, t] : *ref) {
    if (key.rfind("grad/", 0) == 0 && !wanted.count(key.substr(5))) wanted[key.substr(5)] = t;
    if (key.rfind("untied_grad/", 0) == 0) wanted[key.substr(12)] = t;
  }
  double largest = 0;
  for (const auto& [name, expected] : wanted) {
    for (int64_t i = 0; i < expected.numel(); ++i) largest = std::max(largest, std::abs(expected.get_as_double(i)));
  }
  int compared = 0;
  double worst = 0;
  for (const auto& [name, expected] : wanted) {
    auto it = grads->find(name);
    ASSERT_TRUE(it != grads->end()) << "memc computed no gradient for initializer " << name;
    const Tensor got = it->second.dtype() == DType::kF32 ? it->second : it->second.cast(DType::kF32);
    ASSERT_EQ(got.shape(), expected.shape()) << name;
    double max_ref = 0, max_diff = 0, max_got = 0;
    for (int64_t i = 0; i < expected.numel(); ++i) {
      max_ref = std::max(max_ref, std::abs(expected.get_as_double(i)));
      max_got = std::max(max_got, std::abs(got.get_as_double(i)));
      max_diff = std::max(max_diff, std::abs(got.get_as_double(i) - expected.get_as_double(i)));
    }
    // A bias right before a BatchNorm with batch statistics gets none in exact arithmetic (the
    // mean takes any per-channel shift away); the backward's cancellation leaves ~1e-7 of the
    // largest gradient in both frameworks. memc's must be as small.
    if (max_ref <= 1e-6 * largest) {
      EXPECT_LE(max_got, 1e-5 * largest) << "gradient of " << name << ", zero in PyTorch (max |ref| " << max_ref << ")";
      ++compared;
      continue;
    }
    EXPECT_LE(max_diff, 1e-4 * std::max(max_ref, 1e-3 * largest)) << "gradient of " << name << " (max |ref| " << max_ref << ")";
    worst = std::max(worst, max_diff / std::max(max_ref, 1e-3 * largest));
    ++compared;
  }
  std::printf("%s: %d parameter gradients, worst max|Δ|/max|ref| %.3g\n", m.name.c_str(), compared, worst);
  EXPECT_EQ(compared + 1, static_cast<int>(grads->size())) << "memc has gradients the reference lacks";
  EXPECT_GT(compared, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, GradientsVsPyTorch,
                         ::testing::Values(GradModel{"vit_tiny", -1}, GradModel{"vit_tiny_dynamo", -1},
                                           GradModel{"vit_tiny_ext", -1}, GradModel{"vit_tiny_eval_op14", -1},
                                           GradModel{"vit_tiny_eval_op14_tied", -1}, GradModel{"text_encoder", 32},
                                           GradModel{"bigbird_full", 32}, GradModel{"bigbird_sparse", 64},
                                           // Today's exports (models/export_t215.py): fixed batch 4.
                                           GradModel{"bigbird_sparse_t215", 64}, GradModel{"bigbird_full_t215", 32},
                                           GradModel{"distilbert_t215", 32}, GradModel{"distilbert_ts_t215", 32}, GradModel{"bert_t215", 32}, GradModel{"roberta_t215", 32},
                                           GradModel{"gpt2_t215", 32},  // causal mask, runtime GatherND
                                           // language models: logits [4, 32, 64], labels per position (-100: ignored), tied embeddings
                                           GradModel{"gpt2_lm_t215", 32}, GradModel{"bert_mlm_t215", 32}, GradModel{"gpt2_lm_ts_t215", 32},
                                           GradModel{"vit_tiny_dynamo_t215", -1}, GradModel{"vit_tiny_dynamo_t215_tied", -1},
                                           // GroupNorm, AvgPool (padded, ceil mode), MaxPool (2-D padded, 1-D), Hardswish, Hardsigmoid
                                           GradModel{"pool_net_t215", -1}, GradModel{"pool_net_ts_t215", -1},
                                           // BatchNorm with running statistics (eval-mode exports, eval-mode references)
                                           GradModel{"bn_net_noopt_t215", -1}, GradModel{"bn_net_ts_t215", -1},
                                           // BatchNorm in train(): batch statistics (train-mode exports and references)
                                           GradModel{"bn_net_train_t215", -1}, GradModel{"bn_net_train_ts_t215", -1},
                                           // a MoE router: TopK, OneHot
                                           GradModel{"moe_net_t215", -1}, GradModel{"moe_net_ts_t215", -1},
                                           // LSTM (bidirectional), GRU (batch first), RNN, unrolled
                                           GradModel{"rnn_net_ts_t215", -1},
                                           // reflect and edge padding, Col2Im of overlapping padded blocks
                                           GradModel{"pad_fold_net_t215", -1}),
                         [](const ::testing::TestParamInfo<GradModel>& info) { return info.param.name; });

Plan digits_plan(const std::string& optimizer, const std::string& schedule, double lr, int64_t epochs) {
  CompileOptions options;
  options.batch = 64;
  options.dropout = false;
  options.optimizer.kind = optimizer;
  options.optimizer.weight_decay = optimizer == "adamw" ? 0.01 : 0.0;
  options.optimizer.momentum = 0.9;
  options.schedule.kind = schedule;
  options.schedule.lr = lr;
  options.epochs = epochs;
  // Through the plan file, as memc run sees it: every decision and update must survive it.
  const std::string model = source_path("models/vit_tiny.onnx");
  const std::string plan_path = (fs::temp_directory_path() / ("digits_" + optimizer + ".plan")).string();
  auto plan = compile_model(model, plan_path, options);
  MEMC_CHECK(plan.ok(), plan.status().message());
  plan->model_path = model;
  MEMC_CHECK(write_plan(plan_path, *plan).ok());
  auto loaded = read_plan(plan_path);
  MEMC_CHECK(loaded.ok(), loaded.status().message());
  auto update_names = [](const Module& m) {
    std::vector<std::string> names;
    for (ValueId v : m.output_updates()) names.push_back(v == kNoValue ? "" : m.value(v).name);
    return names;
  };
  MEMC_CHECK(update_names(loaded->train) == update_names(plan->train), "plan file lost the state updates");
  return std::move(loaded).value();
}

std::vector<double> reference_losses(const std::string& file) {
  std::ifstream in(source_path("models/" + file));
  nlohmann::json j = nlohmann::json::parse(in);
  return j.at("losses").get<std::vector<double>>();
}

void expect_losses_track(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_GE(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-3 * std::abs(want[i])) << "step " << i + 1;
  }
}

// models/torch_train_reference.py trains the same weights on the same batches in PyTorch.
TEST(TrainingVsPyTorch, First20LossesAdamW) {
  const Plan plan = digits_plan("adamw", "constant", 1e-3, 1);
  RunOptions run{.data = source_path("data/digits_train.npz"), .steps = 20, .seed = 0, .quiet = true};
  auto report = run_plan("", plan, run);
  ASSERT_TRUE(report.ok()) << report.status().message();
  expect_losses_track(report->losses, reference_losses("vit_tiny.train_ref.json"));
}

TEST(TrainingVsPyTorch, First20LossesSgdMomentumCosine) {
  const Plan plan = digits_plan("momentum", "cosine", 0.05, 3);
  RunOptions run{.data = source_path("data/digits_train.npz"), .steps = 20, .seed = 0, .quiet = true};
  auto report = run_plan("", plan, run);
  ASSERT_TRUE(report.ok()) << report.status().message();
  expect_losses_track(report->losses, reference_losses("vit_tiny.train_ref_sgd.json"));
}

// 4 steps, checkpoint, then resume for 6: the 10 losses equal an uninterrupted run's bit for bit.
TEST(Checkpoint, ResumeContinuesTheIdenticalLossSequence) {
  const Plan plan = digits_plan("adamw", "constant", 1e-3, 1);
  const std::string dir = (fs::temp_directory_path() / "memc_resume_test").string();
  fs::remove_all(dir);
  RunOptions straight{.data = source_path("data/digits_train.npz"), .steps = 10, .seed = 3, .quiet = true};
  auto full = run_plan("", plan, straight);
  ASSERT_TRUE(full.ok()) << full.status().message();

  RunOptions first = straight;
  first.steps = 4;
  first.checkpoint_dir = dir;
  auto a = run_plan("", plan, first);
  ASSERT_TRUE(a.ok()) << a.status().message();
  RunOptions second = first;
  second.steps = 6;
  second.resume = true;
  auto b = run_plan("", plan, second);
  ASSERT_TRUE(b.ok()) << b.status().message();
  std::vector<double> joined = a->losses;
  joined.insert(joined.end(), b->losses.begin(), b->losses.end());
  EXPECT_EQ(joined, full->losses);
  EXPECT_EQ(b->total_steps, 10);
  fs::remove_all(dir);
}

TEST(Checkpoint, CorruptCheckpointIsOneLineBadInputAndNotOverwritten) {
  const Plan plan = digits_plan("adamw", "constant", 1e-3, 1);
  const std::string dir = (fs::temp_directory_path() / "memc_corrupt_ckpt").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = dir + "/checkpoint.safetensors";
  { std::ofstream(file) << "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":"; }
  const auto before = fs::file_size(file);
  RunOptions run{.data = source_path("data/digits_train.npz"), .steps = 1, .checkpoint_dir = dir, .resume = true, .quiet = true};
  auto report = run_plan("", plan, run);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().kind(), ErrorKind::kBadInput);
  EXPECT_EQ(report.status().message().find('\n'), std::string::npos);
  EXPECT_EQ(fs::file_size(file), before);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memc
