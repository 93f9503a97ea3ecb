// Planned peak = measured peak: the runtime allocates the planned arena and workspace through
// the device accountant and nothing else, for every committed model at several batch sizes
// and with each optimizer; and the training it runs is the same as without the plan.
#include <gtest/gtest.h>

#include <filesystem>

#include "planner/compile.h"
#include "runtime/trainer.h"
#include "tests/test_util.h"

namespace memc {
namespace {

using testing::source_path;

struct Case {
  std::string model, data;
  int64_t batch, seq;
  std::string optimizer;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* opt : {"sgd", "momentum", "adam", "adamw"}) {
    for (int64_t batch : {8, 32}) {
      out.push_back({"vit_tiny", "digits_train", batch, -1, opt});
      out.push_back({"text_encoder", "text_train", batch, 32, opt});
      out.push_back({"bigbird_full", "text_train", batch, 32, opt});
    }
    out.push_back({"bigbird_sparse", "text64_train", 4, 64, opt});  // the export fixes batch 4, seq 64
  }
  return out;
}

class PlannedPeak : public ::testing::TestWithParam<Case> {};

TEST_P(PlannedPeak, MeasuredEqualsPredicted) {
  const Case& c = GetParam();
  CompileOptions options;
  options.batch = c.batch;
  options.seq = c.seq;
  options.optimizer.kind = c.optimizer;
  const std::string model = source_path("models/" + c.model + ".onnx");
  auto plan = compile_model(model, model + ".plan", options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  plan->model_path = model;
  RunOptions run{.data = source_path("data/" + c.data + ".npz"), .steps = 2, .quiet = true};
  auto report = run_plan("", *plan, run);
  ASSERT_TRUE(report.ok()) << report.status().message();
  ASSERT_EQ(report->steps, 2);
  EXPECT_EQ(report->measured_peak_bytes, plan->memory.predicted_peak_bytes);
  // The breakdown accounts for the whole lower bound (workspace included).
  int64_t sum = 0;
  for (const auto& [name, bytes] : plan->memory.breakdown) sum += bytes;
  EXPECT_EQ(sum, plan->memory.lower_bound_bytes);
  EXPECT_LE(plan->memory.lower_bound_bytes, plan->memory.predicted_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, PlannedPeak, ::testing::ValuesIn(cases()), [](const ::testing::TestParamInfo<Case>& info) {
  return info.param.model + "_b" + std::to_string(info.param.batch) + "_" + info.param.optimizer;
});

}  // namespace
}  // namespace memc
