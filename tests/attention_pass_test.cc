// The attention pass: memory-efficient tiled attention against the exported
// MatMul→Softmax→MatMul on every committed model with attention (dropout on: both draw the
// same counter-based mask): loss and every gradient within 1e-5 relative, a lower planned
// peak, and measured peak = planned peak.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>

#include "passes/attention.h"
#include "frontend/onnx_import.h"
#include "runtime/executor.h"
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
                                           Case{"bigbird_full", "text_train.npz", 16, 32},
                                           // today's exports: torch's SDPA decomposition, its NaN guard included
                                           Case{"bert_t215", "text_train.npz", 4, 32}, Case{"distilbert_ts_t215", "text_train.npz", 4, 32},
                                           Case{"vit_tiny_dynamo_t215", "digits_train.npz", 4, -1}),
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

// In 16-bit precisions the planner lays attention out (planner/compile.cc); the same step with
// the default layout kept gives the same loss and gradients on the CPU backend: the kernels
// compute in f32 from the same 16-bit operands, read from other addresses.
TEST(AttentionPass, Bf16StepWithLayoutsEqualsTheDefaultLayout) {
  for (const Case& c : {Case{"vit_tiny", "digits_train.npz", 16, -1}, Case{"bert_t215", "text_train.npz", 4, 32}}) {
    SCOPED_TRACE(c.model);
    CompileOptions o = options_for(c, "tiled");
    o.precision = PrecisionKind::kBf16Mixed;
    const Plan laid = testing::compile_committed(c.model, o);
    o.default_attention_layout = true;
    const Plan plain = testing::compile_committed(c.model, o);
    int laid_out = 0;
    for (NodeId id : laid.train.schedule()) laid_out += laid.train.node(id).attrs.get_string("layout", "bhtd") != "bhtd";
    EXPECT_GT(laid_out, 0);
    for (NodeId id : plain.train.schedule()) EXPECT_EQ(plain.train.node(id).attrs.get_string("layout", "bhtd"), "bhtd");
    const auto diff = testing::compare_gradients(testing::first_step_gradients(laid, c.data), testing::first_step_gradients(plain, c.data));
    std::printf("[attention] %s bf16-mixed, layouts against none: loss rel %.2e, worst grad %s %.2e\n", c.model.c_str(), diff.loss_rel,
                diff.worst_param.c_str(), diff.worst_param_rel);
    EXPECT_EQ(diff.missing, "");
    EXPECT_LE(diff.loss_rel, 1e-6);
    EXPECT_LE(diff.worst_param_rel, 1e-5);
  }
}

// Which layouts each target takes: the CPU in 16-bit precisions only; GPU targets in every
// precision, in fp32 the sequence-first one only (torchvision's ViT: tbhd; transformers' BERT:
// bthd, kept in bhtd for the GEMM path's batched products).
TEST(AttentionPass, GpuTargetsLayOutAttentionByPrecision) {
  struct Expect {
    Case c;
    std::string target;
    PrecisionKind precision;
    std::string layout;
  };
  const Case vit{"vit_tiny", "digits_train.npz", 16, -1}, bert{"bert_t215", "text_train.npz", 4, 32};
  for (const Expect& e : {Expect{vit, "h200", PrecisionKind::kFp32, "tbhd"}, Expect{vit, "h200", PrecisionKind::kBf16Mixed, "tbhd"},
                          Expect{bert, "h200", PrecisionKind::kFp32, "bhtd"}, Expect{bert, "h200", PrecisionKind::kBf16Mixed, "bthd"},
                          Expect{vit, "cpu", PrecisionKind::kFp32, "bhtd"}, Expect{bert, "cpu", PrecisionKind::kBf16Mixed, "bthd"}}) {
    SCOPED_TRACE(e.c.model + " " + e.target + " " + std::string(precision_name(e.precision)));
    CompileOptions o = options_for(e.c, "tiled");
    o.target = e.target, o.precision = e.precision;
    const Plan plan = testing::compile_committed(e.c.model, o);
    int attention = 0;
    for (NodeId id : plan.train.schedule()) {
      const Node& n = plan.train.node(id);
      if (n.op != "attention" && n.op != "attention_grad") continue;
      ++attention;
      EXPECT_EQ(n.attrs.get_string("layout", "bhtd"), e.layout) << n.op;
    }
    EXPECT_GT(attention, 0);
  }
}

// With layouts (CPU targets), every attention of these exports reads q, k and v where the
// projections wrote them and writes its output where out_proj reads it: torchvision's
// sequence-first MultiheadAttention as tbhd, transformers' [batch, seq, heads, dim] as bthd. No
// transpose is left next to an attention, and the forward computes the same logits.
TEST(AttentionPass, LayoutsRemoveTheTransposesAroundAttention) {
  struct Expect {
    std::string model;
    int64_t batch, seq;
    std::string layout;
    int removed;  // per model: 4 per layer, 6 where the key also went through a [B·H, E, T] view
  };
  for (const Expect& e : {Expect{"vit_tiny", 4, -1, "tbhd", 8}, Expect{"bert_t215", 4, 32, "bthd", 12},
                          Expect{"distilbert_ts_t215", 4, 32, "bthd", 8}, Expect{"text_encoder", 4, 32, "tbhd", 8}}) {
    SCOPED_TRACE(e.model);
    ImportOptions import;
    import.batch = e.batch;
    import.seq = e.seq;
    import.fuse_attention = false;
    auto plain = import_onnx(testing::source_path("models/" + e.model + ".onnx"), import);
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    Module laid = *plain;
    ASSERT_TRUE(AttentionPass().run(*plain).ok());
    auto report = AttentionPass(AttentionLayouts::kAll).run(laid);
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->get("transposes_removed"), e.removed);
    const auto users = laid.users();
    for (NodeId id : laid.schedule()) {
      const Node& n = laid.node(id);
      if (n.op != "attention") continue;
      EXPECT_EQ(n.attrs.get_string("layout", "bhtd"), e.layout);
      for (int i = 0; i < 3; ++i) {
        const Node* p = laid.value(n.inputs[i]).producer == kNoNode ? nullptr : &laid.node(laid.value(n.inputs[i]).producer);
        EXPECT_TRUE(!p || p->op != "transpose") << "operand " << i << " still transposed";
      }
      for (NodeId u : users[n.outputs[0]]) EXPECT_NE(laid.node(u).op, "transpose") << "output still transposed";
    }
    // Same logits on the same random weights and inputs.
    std::mt19937 rng(11);
    std::map<std::string, Tensor> feeds;
    for (ValueId a : plain->arguments()) {
      const Value& v = plain->value(a);
      Tensor t = v.type.dtype == DType::kI64 ? Tensor::zeros(DType::kI64, v.type.shape) : testing::random_tensor(v.type.dtype, v.type.shape, rng, 0.0, 1.0);
      if (v.type.dtype == DType::kI64) {
        for (int64_t i = 0; i < t.numel(); ++i) t.set_from_double(i, static_cast<double>(i % 7));
      }
      feeds[v.name] = t;
    }
    auto want = execute(*plain, feeds), got = execute(laid, feeds);
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_TRUE(got.ok()) << got.status().message();
    for (int64_t i = 0; i < (*want)[0].numel(); ++i) {
      EXPECT_NEAR((*got)[0].get_as_double(i), (*want)[0].get_as_double(i), 1e-5) << i;
    }
  }
}

}  // namespace
}  // namespace memc
