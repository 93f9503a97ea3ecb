// The pass pipeline (passes/pipeline.h): built from the registry and the options, every pass
// reports in one shape, the verifier runs after every pass and names the pass whose output is
// broken, dumps see "import" and each pass in order, and strip_dropout (the example of a small
// pass, docs/PASSES.md) does what it says.
#include <gtest/gtest.h>

#include "frontend/onnx_import.h"
#include "ir/verifier.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "passes/strip_dropout.h"
#include "planner/compile.h"
#include "tests/test_util.h"

namespace memc {
namespace {

Module vit_tiny_forward(int64_t batch) {
  ImportOptions import;
  import.batch = batch;
  import.load_weights = false;
  import.fuse_attention = false;
  auto m = import_onnx(testing::source_path("models/vit_tiny.onnx"), import);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

TEST(Pipeline, IsTheEnabledRegisteredPassesInOrder) {
  PipelineOptions o;
  EXPECT_EQ(PassPipeline::build(PassStage::kForward, o).names(), (std::vector<std::string>{"attention", "precision"}));
  EXPECT_EQ(PassPipeline::build(PassStage::kTraining, o).names(), (std::vector<std::string>{"training_step", "schedule"}));
  o.dropout = false;
  o.attention = AttentionKernel::kNaive;
  o.offload = OffloadLevel::kOptimizer;
  o.reschedule = false;
  EXPECT_EQ(PassPipeline::build(PassStage::kForward, o).names(), (std::vector<std::string>{"strip_dropout", "precision"}));
  EXPECT_EQ(PassPipeline::build(PassStage::kTraining, o).names(), (std::vector<std::string>{"training_step", "offload"}));
  // The CLI's --print-ir-after names: "import", then the registry's.
  const std::vector<std::string> points = ir_dump_points();
  ASSERT_EQ(points.size(), registered_passes().size() + 1);
  EXPECT_EQ(points.front(), "import");
  for (size_t i = 0; i < registered_passes().size(); ++i) {
    EXPECT_EQ(points[i + 1], registered_passes()[i].name);
    EXPECT_EQ(find_pass(points[i + 1]), &registered_passes()[i]);
    EXPECT_EQ(registered_passes()[i].create(PipelineOptions{})->name(), registered_passes()[i].name);
  }
  EXPECT_EQ(find_pass("autodiff"), nullptr);
}

// A pass that breaks the module it is given: it reads a value no node defines.
class Corrupt : public Pass {
 public:
  std::string_view name() const override { return "corrupt"; }
  Expected<PassReport> run(Module& m) override {
    for (NodeId n : m.schedule()) {
      Node& node = m.node(n);
      if (node.inputs.empty()) continue;
      node.inputs[0] = node.outputs[0];  // reads its own result
      break;
    }
    return PassReport{.changed = true};
  }
};

TEST(Pipeline, VerifierNamesThePassWhoseOutputIsBroken) {
  Module m = vit_tiny_forward(2);
  PassPipeline pipeline = PassPipeline::build(PassStage::kForward, PipelineOptions{});
  pipeline.add(std::make_unique<Corrupt>());
  auto ran = pipeline.run(m, PassInstrumentation{});
  ASSERT_FALSE(ran.ok());
  EXPECT_EQ(ran.status().kind(), ErrorKind::kInternal);
  EXPECT_EQ(ran.status().message().rfind("after pass 'corrupt': verify:", 0), 0u) << ran.status().message();
  // Without verification the broken module goes through unnoticed: the check is the pipeline's.
  Module again = vit_tiny_forward(2);
  EXPECT_TRUE(pipeline.run(again, PassInstrumentation{.verify = false}).ok());
  EXPECT_FALSE(verify(again).ok());
}

TEST(Pipeline, ReportsOneShapeAndDumpsAfterEachPass) {
  Module m = vit_tiny_forward(4);
  std::vector<std::string> dumped;
  PassInstrumentation inst;
  inst.after_pass = [&](std::string_view pass, const Module&) { dumped.emplace_back(pass); };
  inst.peak = [](const Module& module) -> Expected<int64_t> {
    MEMC_ASSIGN_OR_RETURN(MemoryPlanResult r, MemoryPlan().run(module));
    return r.space(MemSpace::kDevice).arena_bytes;
  };
  PipelineOptions o;
  o.precision = PrecisionKind::kBf16Mixed;
  auto reports = PassPipeline::build(PassStage::kForward, o).run(m, inst);
  ASSERT_TRUE(reports.ok()) << reports.status().message();
  EXPECT_EQ(dumped, (std::vector<std::string>{"attention", "precision"}));
  ASSERT_EQ(reports->size(), 2u);
  const PassReport& attention = (*reports)[0];
  EXPECT_EQ(attention.pass, "attention");
  EXPECT_TRUE(attention.changed);
  EXPECT_EQ(attention.get("substituted"), 2);  // vit_tiny's two blocks
  // The score matrices are gone: fewer activation bytes, and the forward's planned arena (each
  // score matrix dies at once in a forward alone) does not grow.
  EXPECT_LT(attention.get("activation_bytes_after"), attention.get("activation_bytes_before"));
  EXPECT_GT(attention.peak_before, 0);
  EXPECT_LE(attention.peak_after, attention.peak_before);
  const PassReport& precision = (*reports)[1];
  EXPECT_TRUE(precision.changed);
  EXPECT_GT(precision.get("casts_inserted"), 0);
  EXPECT_EQ(precision.get("no_such_statistic", -7), -7);
  ASSERT_EQ(precision.lines.size(), 1u);
  EXPECT_EQ(precision.lines[0].rfind("precision bf16-mixed: ", 0), 0u) << precision.lines[0];
  EXPECT_EQ(ir_dump_banner("schedule"), "// -----// IR Dump After schedule //----- //");
}

TEST(StripDropout, ReplacesEveryDropoutByItsInput) {
  Module m = vit_tiny_forward(4);
  const int dropouts = testing::count_op(m, "dropout");
  ASSERT_GT(dropouts, 0);
  const size_t nodes = m.schedule().size();
  StripDropout pass;
  auto report = pass.run(m);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_TRUE(report->changed);
  EXPECT_EQ(report->get("removed"), dropouts);
  EXPECT_EQ(testing::count_op(m, "dropout"), 0);
  EXPECT_EQ(m.schedule().size(), nodes - dropouts);
  EXPECT_TRUE(verify(m).ok());
  auto again = pass.run(m);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->changed);
}

// A compile with --no-dropout runs it: the plan's forward and training step hold no dropout.
TEST(StripDropout, RunsInTheCompilePipelineOnlyWithoutDropout) {
  CompileOptions o;
  o.batch = 4;
  o.dropout = false;
  auto plan = compile_model(testing::source_path("models/vit_tiny.onnx"), "/tmp/memc_pipeline_test.plan", o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(testing::count_op(plan->eval, "dropout"), 0);
  EXPECT_EQ(testing::count_op(plan->train, "dropout"), 0);
  o.dropout = true;
  auto with = compile_model(testing::source_path("models/vit_tiny.onnx"), "/tmp/memc_pipeline_test.plan", o);
  ASSERT_TRUE(with.ok()) << with.status().message();
  EXPECT_GT(testing::count_op(with->eval, "dropout"), 0);
}

}  // namespace
}  // namespace memc
