// The pass pipeline (passes/pipeline.h): built from the registry and the options, every pass
// reports in one shape, the verifier runs after every pass and names the pass whose output is
// broken, dumps see "import" and each pass in order, and strip_dropout (the example of a small
// pass, docs/PASSES.md) does what it says.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

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
  EXPECT_EQ(PassPipeline::build(PassStage::kTraining, o).names(), (std::vector<std::string>{"training_step", "accumulate_gemm", "schedule"}));
  o.dropout = false;
  o.attention = AttentionKernel::kNaive;
  o.offload = OffloadLevel::kOptimizer;
  o.reschedule = false;
  EXPECT_EQ(PassPipeline::build(PassStage::kForward, o).names(), (std::vector<std::string>{"strip_dropout", "precision"}));
  EXPECT_EQ(PassPipeline::build(PassStage::kTraining, o).names(), (std::vector<std::string>{"training_step", "accumulate_gemm", "offload"}));
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

// The optional rewrites (a plan is correct without them) turn off by name: the registry's optional
// passes and two choices inside other passes; nothing else may be named.
TEST(Pipeline, OptionalRewritesTurnOffByName) {
  std::vector<std::string> optional;
  for (const auto& [name, description] : optional_rewrites()) optional.push_back(name);
  std::vector<std::string> expected;
  for (const PassInfo& p : registered_passes()) {
    if (p.optional) expected.emplace_back(p.name);
  }
  EXPECT_EQ(expected.size(), 11u);
  expected.insert(expected.end(), {"attention_layouts", "group_updates"});
  EXPECT_EQ(optional, expected);
  for (const char* required : {"precision", "training_step", "schedule", "attention", "offload", "strip_dropout"}) {
    ASSERT_NE(find_pass(required), nullptr);
    EXPECT_FALSE(find_pass(required)->optional) << required;
    const Status st = check_disabled_passes({"fuse_elementwise", required}, "--disable-pass");
    EXPECT_EQ(st.kind(), ErrorKind::kBadInput) << required;
    EXPECT_NE(st.message().find(str_cat("--disable-pass: '", required, "' is not an optional pass; these are: patch_gemm, ")), std::string::npos)
        << st.message();
  }
  EXPECT_TRUE(check_disabled_passes(std::set<std::string>(optional.begin(), optional.end()), "--disable-pass").ok());

  PipelineOptions o;
  o.add_layernorm = o.fuse_elementwise = true;
  EXPECT_EQ(PassPipeline::build(PassStage::kTraining, o).names(),
            (std::vector<std::string>{"training_step", "accumulate_gemm", "add_layernorm", "fuse_elementwise", "schedule"}));
  o.disabled_passes = {"fuse_elementwise", "accumulate_gemm"};
  EXPECT_EQ(PassPipeline::build(PassStage::kTraining, o).names(), (std::vector<std::string>{"training_step", "add_layernorm", "schedule"}));
}

// Every GPU-specific rewrite is one of them: an h200 plan with all of them off is the CPU
// target's plan, op for op (fp32, whose CPU plan takes no attention layouts); one off by name
// or by MEMC_DISABLE_PASSES goes, and an unknown name in either is refused.
TEST(Pipeline, AGpuPlanWithoutItsOptionalRewritesIsTheCpuPlan) {
  const std::string model = testing::source_path("models/vit_tiny.onnx");
  CompileOptions options;
  options.batch = 4;
  options.optimizer.kind = "adamw";
  auto ops = [&](const CompileOptions& o) {
    auto plan = compile_model(model, model + ".plan", o);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    std::map<std::string, int> counts;
    if (!plan.ok()) return counts;
    for (NodeId n : plan->train.schedule()) ++counts[plan->train.node(n).op];
    return counts;
  };
  const auto cpu = ops(options);
  options.target = "h200";
  const auto gpu = ops(options);
  EXPECT_GT(gpu.count("fused_elementwise"), 0u);
  EXPECT_NE(gpu, cpu);
  for (const auto& [name, description] : optional_rewrites()) options.disabled_passes.insert(name);
  EXPECT_EQ(ops(options), cpu);
  options.disabled_passes = {"fuse_elementwise"};
  const auto without_fusion = ops(options);
  EXPECT_EQ(without_fusion.count("fused_elementwise"), 0u);
  EXPECT_GT(without_fusion.count("layernorm_grad"), 0u);
  options.disabled_passes.clear();
  ::setenv("MEMC_DISABLE_PASSES", ",fuse_elementwise,", 1);
  EXPECT_EQ(ops(options), without_fusion);
  ::setenv("MEMC_DISABLE_PASSES", "fuse_elementwise,nope", 1);
  auto refused = compile_model(model, model + ".plan", options);
  ::unsetenv("MEMC_DISABLE_PASSES");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().kind(), ErrorKind::kBadInput);
  EXPECT_NE(refused.status().message().find("MEMC_DISABLE_PASSES: 'nope' is not an optional pass"), std::string::npos) << refused.status().message();
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
