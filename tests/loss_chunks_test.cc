// The loss_chunks memory pass (passes/loss_chunks.h): a language model's head and loss in K
// chunks of positions, each differentiated as it is computed. Against the same step unchunked
// on the committed language models (tied embeddings split by the exporter or not, a decoder
// bias): the loss and every gradient equal up to summation order, with micro-batches, loss
// scaling and bf16-mixed too, and planned = measured. On a model whose logits dominate, the peak
// falls by about the logits and their gradient, and the budget search chooses the chunks before
// micro-batches or remat.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "passes/loss_chunks.h"
#include "planner/search.h"
#include "runtime/npz.h"
#include "runtime/trainer.h"
#include "tests/frontend_onnx_builder.h"
#include "tests/pass_compare.h"
#include "tests/test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;
using testing::count_op;

CompileOptions lm_options(int64_t chunks, const std::string& precision = "fp32", int64_t micro_batches = 1) {
  CompileOptions o;
  o.batch = 4;
  o.seq = 32;
  o.precision = *parse_precision(precision);
  o.micro_batches = micro_batches;
  o.loss_chunks = chunks;
  o.optimizer.kind = "adamw";
  return o;
}

struct Case {
  std::string model, precision;
  int64_t chunks, micro_batches;
  double tolerance;  // loss and each gradient, relative
};

// model_precision_K<chunks>_k<micro-batches>, for either parametrized case.
template <typename C>
std::string case_name(const C& c) {
  std::string precision = c.precision;
  std::replace(precision.begin(), precision.end(), '-', '_');
  return c.model + "_" + precision + "_K" + std::to_string(c.chunks) + "_k" + std::to_string(c.micro_batches);
}

class LossChunksVsWholeLoss : public ::testing::TestWithParam<Case> {};

TEST_P(LossChunksVsWholeLoss, LossGradientsAndPeak) {
  const Case& c = GetParam();
  const Plan whole = testing::compile_committed(c.model, lm_options(1, c.precision, c.micro_batches));
  const Plan chunked = testing::compile_committed(c.model, lm_options(c.chunks, c.precision, c.micro_batches));
  EXPECT_EQ(chunked.decisions.loss_chunks, c.chunks);
  EXPECT_EQ(whole.decisions.loss_chunks, 1);
  // One softmax cross-entropy (and its gradient) per chunk of each micro-batch.
  EXPECT_EQ(count_op(chunked.train, "softmax_cross_entropy"), c.chunks * c.micro_batches);
  EXPECT_EQ(count_op(chunked.train, "softmax_cross_entropy_grad"), c.chunks * c.micro_batches);
  const auto want = testing::first_step_gradients(whole, "lm_test.npz");
  const auto got = testing::first_step_gradients(chunked, "lm_test.npz");
  const testing::GradientDiff diff = testing::compare_gradients(got, want);
  std::printf("[loss chunks] %s %s K=%lld k=%lld: loss rel %.2e, grads rel L2 %.2e (worst %s %.2e); planned %lld vs %lld\n", c.model.c_str(),
              c.precision.c_str(), static_cast<long long>(c.chunks), static_cast<long long>(c.micro_batches), diff.loss_rel, diff.grad_rel_l2,
              diff.worst_param.c_str(), diff.worst_param_rel, static_cast<long long>(chunked.memory.predicted_peak_bytes),
              static_cast<long long>(whole.memory.predicted_peak_bytes));
  EXPECT_EQ(diff.missing, "");
  EXPECT_LE(diff.loss_rel, c.tolerance);
  EXPECT_LE(diff.worst_param_rel, c.tolerance);
  EXPECT_EQ(testing::measured_peak(chunked, "lm_test.npz", 2), chunked.memory.predicted_peak_bytes);
}

// K = 3 does not divide the 128 positions (43, 43, 42); fp16-mixed scales the loss, so each
// chunk's gradient carries loss_scale / kept.
INSTANTIATE_TEST_SUITE_P(Models, LossChunksVsWholeLoss,
                         ::testing::Values(Case{"gpt2_lm_t215", "fp32", 3, 1, 1e-6}, Case{"gpt2_lm_ts_t215", "fp32", 4, 1, 1e-6},
                                           Case{"bert_mlm_t215", "fp32", 3, 1, 1e-6}, Case{"gpt2_lm_ts_t215", "fp32", 3, 2, 1e-6},
                                           Case{"bert_mlm_t215", "bf16-mixed", 4, 1, 5e-3}, Case{"gpt2_lm_ts_t215", "fp16-mixed", 2, 1, 1e-3}),
                         [](const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); });

// The check can fail: a chunk whose gradient is not scaled by 1/kept (the whole batch's count)
// gives gradients far from the unchunked step's.
TEST(LossChunks, EachChunksGradientIsScaledByTheWholeBatchsCount) {
  const Plan whole = testing::compile_committed("gpt2_lm_t215", lm_options(1));
  Plan chunked = testing::compile_committed("gpt2_lm_t215", lm_options(3));
  int rewired = 0;
  for (NodeId n : chunked.train.schedule()) {
    Node& node = chunked.train.node(n);
    if (node.op != "softmax_cross_entropy_grad") continue;
    const NodeId scale = chunked.train.value(node.inputs[0]).producer;  // div(1, kept)
    ASSERT_NE(scale, kNoNode);
    node.inputs[0] = chunked.train.node(scale).inputs[0];  // the 1 alone
    ++rewired;
  }
  EXPECT_EQ(rewired, 3);
  const auto diff = testing::compare_gradients(testing::first_step_gradients(chunked, "lm_test.npz"),
                                               testing::first_step_gradients(whole, "lm_test.npz"));
  EXPECT_GT(diff.worst_param_rel, 1.0);
}

// ids [4, 32] → Gather(E [V, 16]) → MatMul(W [16, V]) → logits [4, 32, V] with V = 4096: the
// logits (2 MiB in f32) and their gradient dominate the step.
constexpr int64_t kVocab = 4096, kDim = 16, kBatch = 4, kSeq = 32;

Tensor weight(const Shape& shape, double phase) {
  Tensor t = Tensor::zeros(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_from_double(i, 0.05 * std::sin(1.7 * static_cast<double>(i) + phase));
  return t;
}

std::string wide_head_model(int64_t dim = kDim) {
  testing::OnnxBuilder b;
  b.input("ids", {-1, -1}, onnx::TensorProto::INT64).init("E", weight({kVocab, dim}, 0.3)).init("W", weight({dim, kVocab}, 1.1));
  b.node("Gather", {"E", "ids"}, {"h"});
  b.node("MatMul", {"h", "W"}, {"logits"});
  b.output("logits");
  const std::string path = testing::scratch_path(str_cat("wide_head_", dim, ".onnx"));
  std::ofstream(path, std::ios::binary) << b.bytes();
  return path;
}

// 8 rows of ids and labels (every fifth position ignored).
std::string wide_head_data() {
  Tensor ids = Tensor::zeros(DType::kI64, {8, kSeq}), y = Tensor::zeros(DType::kI64, {8, kSeq});
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int64_t>()[i] = (37 * i + 5) % kVocab;
    y.data<int64_t>()[i] = i % 5 == 0 ? -100 : (53 * i + 11) % kVocab;
  }
  const std::string path = testing::scratch_path("wide_head.npz");
  MEMC_CHECK(write_npz(path, {{"ids", ids}, {"y", y}}).ok());
  return path;
}

CompileOptions wide_options(int64_t chunks) {
  CompileOptions o;
  o.batch = kBatch;
  o.seq = kSeq;
  o.loss_chunks = chunks;
  o.optimizer.kind = "sgd";
  return o;
}

Plan compile_wide(const CompileOptions& options, int64_t dim = kDim) {
  const std::string model = wide_head_model(dim);
  auto plan = compile_model(model, model + ".plan", options);
  MEMC_CHECK(plan.ok(), plan.status().message());
  plan->model_path = model;
  return std::move(plan).value();
}

int64_t measured(const Plan& plan) {
  auto report = run_plan("", plan, RunOptions{.data = wide_head_data(), .steps = 2, .seed = 0, .quiet = true});
  EXPECT_TRUE(report.ok()) << report.status().message();
  return report.ok() ? report->measured_peak_bytes : -1;
}

TEST(LossChunks, AWideHeadsPeakFallsByItsLogits) {
  const int64_t logits = kBatch * kSeq * kVocab * 4;
  const Plan whole = compile_wide(wide_options(1));
  const Plan chunked = compile_wide(wide_options(8));
  const int64_t before = whole.memory.predicted_peak_bytes, after = chunked.memory.predicted_peak_bytes;
  std::printf("[loss chunks] V %lld: planned %lld → %lld bytes with 8 chunks (logits %lld)\n", static_cast<long long>(kVocab),
              static_cast<long long>(before), static_cast<long long>(after), static_cast<long long>(logits));
  // The logits and dlogits of the whole batch were live together; now one chunk's of each.
  EXPECT_GE(before - after, logits * 3 / 2);
  EXPECT_EQ(measured(chunked), after);
  EXPECT_EQ(measured(whole), before);
  // auto: min(⌈128 positions / width 16⌉, ⌈4096 / (4·16)⌉) = 8 chunks of 16 positions.
  EXPECT_EQ(compile_wide(wide_options(0)).decisions.loss_chunks, 8);
}

// With a budget between the chunked and the whole plan's peaks, the search picks the chunks:
// they fit without the micro-batches or remat that would also fit, and cost less time.
TEST(LossChunks, TheBudgetSearchChoosesChunks) {
  const std::string model = wide_head_model();
  ModelCompiler compiler(model, model + ".plan");
  const Plan whole = compile_wide(wide_options(1));
  const Plan chunked = compile_wide(wide_options(0));
  EXPECT_GT(chunked.decisions.loss_chunks, 1);
  CompileOptions base = wide_options(1);
  base.budget_bytes = (whole.memory.predicted_peak_bytes + chunked.memory.predicted_peak_bytes) / 2;
  auto found = search_plan(compiler, base, SearchSpace{.precision = false, .attention = false, .offload = false});
  ASSERT_TRUE(found.ok()) << found.status().message();
  std::printf("[loss chunks] budget %lld: %s, peak %lld\n", static_cast<long long>(base.budget_bytes), found->best.label().c_str(),
              static_cast<long long>(found->best.peak_bytes));
  EXPECT_EQ(found->best.loss_chunks, 0);  // auto: each micro-batch count chunks its own positions
  EXPECT_EQ(found->best.micro_batches, 1);
  EXPECT_EQ(found->best.remat.policy, RematPolicy::kNone);
  EXPECT_LE(found->best.peak_bytes, base.budget_bytes);
  bool ladder_rung = false;
  for (const Candidate& c : found->ladder) ladder_rung |= c.loss_chunks == 0 && c.micro_batches == 1;
  EXPECT_TRUE(ladder_rung);
}

// Gemma's logit softcap (÷ 30, tanh, × 30) and BART's final_logits_bias buffer after the head:
// each operand is the same for every row ([1, 1, 1] and [1, 1, V]) and untrained (--freeze), so
// the chain runs per chunk; chunked equals whole. Trained, the bias is refused in one line.
std::string softcapped_head_model() {
  testing::OnnxBuilder b;
  b.input("ids", {-1, -1}, onnx::TensorProto::INT64).init("E", weight({256, kDim}, 0.3)).init("W", weight({kDim, 256}, 1.1));
  Tensor cap = Tensor::zeros(DType::kF32, {1, 1, 1});
  cap.set_from_double(0, 0.03);  // the logits here are ~0.02: a small cap so tanh bends them
  b.init("cap", cap).init("fb", weight({1, 1, 256}, 2.3));
  b.node("Gather", {"E", "ids"}, {"h"});
  b.node("MatMul", {"h", "W"}, {"raw"});
  b.node("Div", {"raw", "cap"}, {"scaled"});
  b.node("Tanh", {"scaled"}, {"bent"});
  b.node("Mul", {"bent", "cap"}, {"capped"});
  b.node("Add", {"capped", "fb"}, {"logits"});
  b.output("logits");
  const std::string path = testing::scratch_path("softcapped_head.onnx");
  std::ofstream(path, std::ios::binary) << b.bytes();
  return path;
}

TEST(LossChunks, ASoftcapAndAFinalBiasAfterTheHeadRunPerChunk) {
  const std::string model = softcapped_head_model();
  auto compile = [&](int64_t chunks, std::vector<std::string> frozen) {
    CompileOptions o = wide_options(chunks);
    o.frozen = std::move(frozen);
    return compile_model(model, model + ".plan", o);
  };
  auto whole = compile(1, {"cap", "fb"});
  auto chunked = compile(5, {"cap", "fb"});
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  ASSERT_TRUE(chunked.ok()) << chunked.status().message();
  EXPECT_EQ(count_op(chunked->train, "tanh"), 5);
  Tensor ids = Tensor::zeros(DType::kI64, {kBatch, kSeq}), labels = Tensor::zeros(DType::kI64, {kBatch, kSeq});
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int64_t>()[i] = (37 * i + 5) % 256;
    labels.data<int64_t>()[i] = i % 7 == 0 ? -100 : (53 * i + 11) % 256;
  }
  const std::map<std::string, Tensor> batch{{"ids", ids}, {kLabelsArg, labels}};
  auto gradients = [&](const Plan& plan) {
    auto state = initial_state(model, plan);
    MEMC_CHECK(state.ok(), state.status().message());
    auto g = compute_gradients(plan, *state, batch, 0, 1);
    MEMC_CHECK(g.ok(), g.status().message());
    return std::move(g).value();
  };
  const testing::GradientDiff diff = testing::compare_gradients(gradients(*chunked), gradients(*whole));
  EXPECT_EQ(diff.missing, "");
  EXPECT_LE(diff.loss_rel, 1e-6);
  EXPECT_LE(diff.worst_param_rel, 1e-6) << diff.worst_param;
  auto trained_bias = compile(5, {"cap"});
  ASSERT_FALSE(trained_bias.ok());
  EXPECT_NE(trained_bias.status().message().find("have no head to chunk: memc.add's operand 'fb' between the head's linear layer and them is trained"),
            std::string::npos)
      << trained_bias.status().message();
}

// Logits that no linear layer computes have no head to chunk: an explicit count is refused in
// one line, auto leaves the loss whole.
TEST(LossChunks, LogitsWithoutAHeadAreRefusedWhenChunksAreAskedFor) {
  testing::OnnxBuilder b;
  b.input("ids", {-1, -1}, onnx::TensorProto::INT64).init("E", weight({64, 64}, 0.3));
  b.node("Gather", {"E", "ids"}, {"logits"});
  b.output("logits");
  const std::string path = testing::scratch_path("gather_logits.onnx");
  std::ofstream(path, std::ios::binary) << b.bytes();
  CompileOptions o = wide_options(4);
  auto refused = compile_model(path, path + ".plan", o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().kind(), ErrorKind::kBadInput);
  EXPECT_NE(refused.status().message().find("--loss-chunks 4: the logits 'logits' have no head to chunk: memc.gather"), std::string::npos)
      << refused.status().message();
  o.loss_chunks = 0;
  auto whole = compile_model(path, path + ".plan", o);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ(whole->decisions.loss_chunks, 1);
}

}  // namespace
}  // namespace memc

namespace memc {
namespace {

// accumulate_gemm (passes/accumulate_gemm.h): each chunk's head-weight gradient, and each
// micro-batch's weight gradients, are added into their sums by the GEMM that computes them. The
// same step without the pass is the reference: fp32 equal up to summation order; under
// bf16-mixed the terms are no longer rounded to bf16 before the f32 sum, so the gradients are
// at least as close to the fp32 step's as the unfused ones. Planned = measured, and the peak does
// not rise.
struct AccumulateCase {
  std::string model, precision;
  int64_t chunks, micro_batches;
  int64_t accumulating_gemms;  // matmul_acc nodes expected
};

class AccumulateGemmVsUnfused : public ::testing::TestWithParam<AccumulateCase> {};

TEST_P(AccumulateGemmVsUnfused, SameGradientsNoHigherPeak) {
  const AccumulateCase& c = GetParam();
  CompileOptions o = lm_options(c.chunks, c.precision, c.micro_batches);
  const std::string data = c.model.rfind("vit", 0) == 0 ? "digits_test.npz" : "lm_test.npz";
  if (c.model.rfind("vit", 0) == 0) o.seq = 0;
  const Plan fused = testing::compile_committed(c.model, o);
  o.disabled_passes = {"accumulate_gemm"};
  const Plan plain = testing::compile_committed(c.model, o);
  EXPECT_EQ(count_op(fused.train, "matmul_acc"), c.accumulating_gemms);
  EXPECT_EQ(count_op(plain.train, "matmul_acc"), 0);
  const auto got = testing::first_step_gradients(fused, data);
  const auto unfused = testing::first_step_gradients(plain, data);
  const testing::GradientDiff diff = testing::compare_gradients(got, unfused);
  CompileOptions f32 = lm_options(1, "fp32", 1);
  f32.seq = o.seq;
  f32.disabled_passes = {"accumulate_gemm"};
  const auto exact = testing::first_step_gradients(testing::compile_committed(c.model, f32), data);
  const testing::GradientDiff fused_err = testing::compare_gradients(got, exact), plain_err = testing::compare_gradients(unfused, exact);
  std::printf("[accumulate_gemm] %s %s K=%lld k=%lld: %lld matmul_acc; vs unfused grads rel L2 %.2e (worst %s %.2e); vs fp32 %.2e "
              "(unfused %.2e); planned %lld vs %lld\n",
              c.model.c_str(), c.precision.c_str(), static_cast<long long>(c.chunks), static_cast<long long>(c.micro_batches),
              static_cast<long long>(count_op(fused.train, "matmul_acc")), diff.grad_rel_l2, diff.worst_param.c_str(), diff.worst_param_rel,
              fused_err.grad_rel_l2, plain_err.grad_rel_l2, static_cast<long long>(fused.memory.predicted_peak_bytes),
              static_cast<long long>(plain.memory.predicted_peak_bytes));
  EXPECT_EQ(diff.missing, "");
  if (c.precision == "fp32") {
    EXPECT_LE(diff.worst_param_rel, 1e-6);
  } else {
    EXPECT_LE(diff.worst_param_rel, 1e-2);
    EXPECT_LE(fused_err.grad_rel_l2, plain_err.grad_rel_l2 * 1.02);
  }
  // Within 0.1 %: a rescheduled step packs its arena differently (GPT-2 bf16-mixed, K = 3:
  // 842,176 B against 842,112 B). A fused start held across a micro-batch rose 3.5 %.
  EXPECT_LE(fused.memory.predicted_peak_bytes, plain.memory.predicted_peak_bytes + plain.memory.predicted_peak_bytes / 1000);
  EXPECT_EQ(testing::measured_peak(fused, data, 2), fused.memory.predicted_peak_bytes);
}

// GPT-2's head is tied to its token embedding: K chunks give K − 1 terms, and under bf16-mixed
// one start (the first chunk's product written as f32). BERT's: 3 terms and a start, and in each
// of its 2 layers the input gradients of the query and key projections (added to the value's)
// and of the intermediate layer (added to its residual's). Micro-batches: each linear weight's
// gradient of the second micro-batch is a term (ViT-tiny: 9 weights), and the starts stay.
INSTANTIATE_TEST_SUITE_P(Models, AccumulateGemmVsUnfused,
                         ::testing::Values(AccumulateCase{"gpt2_lm_t215", "fp32", 3, 1, 2}, AccumulateCase{"gpt2_lm_t215", "bf16-mixed", 3, 1, 3},
                                           AccumulateCase{"bert_mlm_t215", "bf16-mixed", 4, 1, 10},
                                           AccumulateCase{"vit_tiny", "fp32", 1, 2, 9}, AccumulateCase{"vit_tiny", "bf16-mixed", 1, 2, 9}),
                         [](const ::testing::TestParamInfo<AccumulateCase>& info) { return case_name(info.param); });

// Where the head's weight dominates (4096 × 256: 4 MiB in f32, the logits of a chunk 256 KiB),
// its sum over 8 chunks no longer holds a chunk's product beside it: the peak falls by most of
// the weight's f32 bytes in fp32 (21,474,816 → 17,575,424 B: 0.93 of them; the peak moves
// elsewhere) and by more under bf16-mixed, whose 16-bit product and its f32 cast both go
// (21,360,256 → 14,100,992 B: 1.73 of them).
TEST(AccumulateGemm, AWideHeadsGradientSumHoldsNoProductBesideIt) {
  constexpr int64_t kWideDim = 256;
  for (const char* precision : {"fp32", "bf16-mixed"}) {
    CompileOptions o = wide_options(8);
    o.precision = *parse_precision(precision);
    const Plan fused = compile_wide(o, kWideDim);
    o.disabled_passes = {"accumulate_gemm"};
    const Plan plain = compile_wide(o, kWideDim);
    const int64_t weight_bytes = kWideDim * kVocab * 4;
    std::printf("[accumulate_gemm] wide head %s, 8 chunks: planned %lld → %lld bytes (weight %lld)\n", precision,
                static_cast<long long>(plain.memory.predicted_peak_bytes), static_cast<long long>(fused.memory.predicted_peak_bytes),
                static_cast<long long>(weight_bytes));
    const bool fp32 = std::string(precision) == "fp32";
    EXPECT_EQ(count_op(fused.train, "matmul_acc"), fp32 ? 7 : 8);
    EXPECT_GE(plain.memory.predicted_peak_bytes - fused.memory.predicted_peak_bytes, fp32 ? weight_bytes * 3 / 4 : weight_bytes * 3 / 2);
    EXPECT_EQ(measured(fused), fused.memory.predicted_peak_bytes);
  }
}

}  // namespace
}  // namespace memc
