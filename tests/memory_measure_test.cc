// Planned peak = measured peak: the runtime allocates the planned arena and workspace through
// the device accountant and nothing else, for every committed model at several batch sizes
// and with each optimizer; and the training it runs is the same as without the plan.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>

#include "planner/compile.h"
#include "runtime/device_memory.h"
#include "runtime/planned_executor.h"
#include "runtime/train_step.h"
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

// The CPU arena is mapped lazily, so loading writes the optimizer states' zeros itself: were the
// first update to read an untouched state page (the shared zero page) and then write it, each
// 4 KiB would take a copy-on-write fault with a TLB shootdown across the compute threads (ViT-B/16's
// first AdamW step took 1.35 s that way, 45 ms once written at load). Every page wholly inside a
// state is resident after loading.
TEST(ArenaLoad, OptimizerStatesAreWrittenWhenLoaded) {
  CompileOptions options;
  options.batch = 2;
  options.optimizer.kind = "adamw";
  const std::string model = source_path("models/vit_small32.onnx");
  auto plan = compile_model(model, model + ".plan", options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  plan->model_path = model;
  DeviceMemory memory(cpu_backend());
  auto exec = PlannedExecutor::create(plan->train, memory);
  ASSERT_TRUE(exec.ok()) << exec.status().message();
  ASSERT_GE(exec->arena_bytes(), int64_t{1} << 20);  // a mapped arena (CpuBackend::allocate_zeroed), not a zeroed heap block
  auto state = load_into_arena("", *plan, *exec, 0);
  ASSERT_TRUE(state.ok()) << state.status().message();
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  int64_t pages = 0, resident = 0;
  for (ValueId a : plan->train.arguments()) {
    if (plan->train.value(a).role != Role::kOptimizerState) continue;
    const Tensor& t = state->at(plan->train.value(a).source_name);
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(t.raw()) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(t.raw()) + t.nbytes()) / page * page;
    if (end <= begin) continue;
    std::vector<unsigned char> in_core((end - begin) / page);
    ASSERT_EQ(::mincore(reinterpret_cast<void*>(begin), end - begin, in_core.data()), 0);
    pages += static_cast<int64_t>(in_core.size());
    for (unsigned char c : in_core) resident += c & 1;
  }
  EXPECT_GT(pages, 1000);  // vit_small32's AdamW moments: about 6.8 MB
  EXPECT_EQ(resident, pages);
}

}  // namespace
}  // namespace memc
