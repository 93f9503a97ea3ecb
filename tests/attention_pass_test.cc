// The attention pass: memory-efficient tiled attention against the exported
// MatMul→Softmax→MatMul on every committed model with attention (dropout on: both draw the
// same counter-based mask): loss and every gradient within 1e-5 relative, a lower planned
// peak, and measured peak = planned peak.
#include <gtest/gtest.h>

#include <cstdio>

#include "passes/attention.h"
#include "frontend/onnx_import.h"
#include "tests/pass_compare.h"
#include "tests/test_util.h"

namespace memc {
namespace {

struct Case {
  std::string model, data;
  int64_t batch, seq;
};

CompileOptions options_for(const Case& c, const std::string& attention) {
  CompileOptions o;
  o.batch = c.batch;
  o.seq = c.seq;
  o.attention = *parse_attention_kernel(attention);
  return o;
}

using testing::count_op;

class AttentionVsNaive : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionVsNaive, LossGradientsAndPeak) {
  const Case& c = GetParam();
  const Plan naive = testing::compile_committed(c.model, options_for(c, "naive"));
  const Plan tiled = testing::compile_committed(c.model, options_for(c, "tiled"));
  EXPECT_EQ(count_op(naive.eval, "attention"), 0);
  EXPECT_GT(count_op(tiled.eval, "attention"), 0);
  const auto diff = testing::compare_gradients(testing::first_step_gradients(tiled, c.data), testing::first_step_gradients(naive, c.data));
  const int64_t p_naive = naive.memory.predicted_peak_bytes, p_tiled = tiled.memory.predicted_peak_bytes;
  std::printf("[attention] %s b%lld: loss rel %.2e, grads rel L2 %.2e (worst %s %.2e); planned peak %lld vs naive %lld (%.3fx)\n",
              c.model.c_str(), static_cast<long long>(c.batch), diff.loss_rel, diff.grad_rel_l2, diff.worst_param.c_str(),
              diff.worst_param_rel, static_cast<long long>(p_tiled), static_cast<long long>(p_naive),
              static_cast<double>(p_tiled) / static_cast<double>(p_naive));
  EXPECT_EQ(diff.missing, "");
  EXPECT_LE(diff.loss_rel, 1e-5);
  EXPECT_LE(diff.worst_param_rel, 1e-5);
  EXPECT_LT(p_tiled, p_naive);
  EXPECT_EQ(testing::measured_peak(tiled, c.data, 1), p_tiled);
  EXPECT_EQ(testing::measured_peak(naive, c.data, 1), p_naive);
}

INSTANTIATE_TEST_SUITE_P(Models, AttentionVsNaive,
                         ::testing::Values(Case{"vit_tiny", "digits_train.npz", 16, -1}, Case{"text_encoder", "text_train.npz", 16, 32},
                                           Case{"bigbird_full", "text_train.npz", 16, 32}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.model; });

TEST(AttentionPass, ReportsSubstitutionsAndBytes) {
  const std::string path = testing::source_path("models/bigbird_full.onnx");
  ImportOptions import;
  import.batch = 4;
  import.seq = 32;
  import.load_weights = false;
  import.fuse_attention = false;
  auto forward = import_onnx(path, import);
  ASSERT_TRUE(forward.ok()) << forward.status().message();
  AttentionPass pass;
  auto report = pass.run(*forward);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->get("substituted"), 2);  // two layers
  // Each layer drops its scores and probabilities: 2 × [4, heads, 32, 32] f32 at least.
  EXPECT_GE(report->get("activation_bytes_before") - report->get("activation_bytes_after"), 2 * 2 * 4 * 32 * 32 * 4);
  auto again = pass.run(*forward);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get("substituted"), 0);
  EXPECT_FALSE(again->changed);
}

}  // namespace
}  // namespace memc
