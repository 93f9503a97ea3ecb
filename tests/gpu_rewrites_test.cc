// The rewrites GPU targets run, on the CPU against the plans without them.
//
// patch_gemm (passes/patch_gemm.h): a stride-equals-kernel convolution as patches and one GEMM.
// The rewritten forward equals the convolution in 1, 2 and 3 spatial dims, with and without a
// bias, where its output is read as it is and where a ViT's flatten + transpose reads it (the
// transposes then cancel); convolutions it must not touch stay. On the committed ViTs the whole
// training step (loss and every gradient) equals the convolution's within rounding, and the
// rewritten plan's measured peak is its planned one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "passes/add_layernorm.h"
#include "passes/bias_grad_gemm.h"
#include "passes/fuse_elementwise.h"
#include "passes/patch_gemm.h"
#include "passes/split_gathers.h"
#include "ir/grad.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"
#include "tests/frontend_onnx_builder.h"
#include "tests/pass_compare.h"
#include "tests/test_util.h"

namespace memc {
namespace {

struct ConvCase {
  std::string name;
  Shape x, w;
  std::vector<int64_t> strides, pads;  // pads empty: none
  bool bias = true;
  bool tokens = false;  // the output read as a ViT reads it: flatten(2), transpose(1, 2)
  bool rewritten = true;
};

// A test name from `text`: letters and digits kept, anything else '_'.
std::string test_name(std::string text) {
  for (char& ch : text) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return text;
}

// One Conv (and, for `tokens`, Reshape to [N, Co, P] and Transpose(0, 2, 1)) on random data.
Module conv_module(const ConvCase& c, std::mt19937& rng) {
  testing::OnnxBuilder b;
  b.input("x", c.x).output(c.tokens ? "t" : "y");
  b.init("w", testing::random_tensor(DType::kF32, c.w, rng));
  std::vector<std::string> inputs = {"x", "w"};
  if (c.bias) {
    b.init("b", testing::random_tensor(DType::kF32, {c.w[0]}, rng));
    inputs.push_back("b");
  }
  auto& conv = b.node("Conv", inputs, {"y"});
  testing::attr_ints(conv, "strides", c.strides);
  if (!c.pads.empty()) testing::attr_ints(conv, "pads", c.pads);
  if (c.tokens) {
    b.ints("flat", {c.x[0], c.w[0], -1});
    b.node("Reshape", {"y", "flat"}, {"f"});
    auto& t = b.node("Transpose", {"f"}, {"t"});
    testing::attr_ints(t, "perm", {0, 2, 1});
  }
  ImportOptions o;
  o.fuse = false;
  auto m = b.import(o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(*m) : Module();
}

class PatchGemmForward : public ::testing::TestWithParam<ConvCase> {};

TEST_P(PatchGemmForward, EqualsTheConvolution) {
  const ConvCase& c = GetParam();
  std::mt19937 rng(7);
  const Module conv = conv_module(c, rng);
  ASSERT_EQ(testing::count_op(conv, "conv"), 1);
  Module patched = conv_module(c, rng = std::mt19937(7));
  auto report = PatchGemm().run(patched);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->get("rewritten"), c.rewritten ? 1 : 0);
  EXPECT_EQ(testing::count_op(patched, "conv"), c.rewritten ? 0 : 1);
  EXPECT_EQ(testing::count_op(patched, "linear"), c.rewritten ? 1 : 0);
  // Tokens: the linear's output is the model's output; the conv's layout is never made.
  EXPECT_EQ(report->get("transposes_cancelled"), c.rewritten && c.tokens ? 1 : 0);
  if (c.rewritten && c.tokens) {
    EXPECT_EQ(testing::count_op(patched, "transpose"), 1);  // the patches' only
  }
  const std::map<std::string, Tensor> feeds = {{"x", testing::random_tensor(DType::kF32, c.x, rng)}};
  auto want = execute(conv, feeds);
  auto got = execute(patched, feeds);
  ASSERT_TRUE(want.ok()) << want.status().message();
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->at(0).shape(), want->at(0).shape());
  EXPECT_LE(testing::rel_error(got->at(0), want->at(0)), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Convs, PatchGemmForward,
    ::testing::Values(ConvCase{"vit_patches", {2, 3, 8, 12}, {5, 3, 4, 4}, {4, 4}},
                      ConvCase{"vit_tokens", {2, 3, 8, 12}, {5, 3, 4, 4}, {4, 4}, {}, true, true},
                      ConvCase{"rectangular_no_bias", {3, 2, 6, 9}, {4, 2, 2, 3}, {2, 3}, {}, false},
                      ConvCase{"one_d_tokens", {2, 4, 20}, {6, 4, 5}, {5}, {}, true, true},
                      ConvCase{"three_d", {1, 2, 4, 6, 4}, {3, 2, 2, 3, 2}, {2, 3, 2}},
                      ConvCase{"pointwise", {2, 5, 3, 3}, {4, 5, 1, 1}, {1, 1}},
                      // not patch embeddings: each stays a convolution
                      ConvCase{"overlapping", {2, 3, 8, 8}, {4, 3, 4, 4}, {2, 2}, {}, true, false, false},
                      ConvCase{"padded", {2, 3, 8, 8}, {4, 3, 2, 2}, {2, 2}, {1, 1, 1, 1}, true, false, false},
                      ConvCase{"left_over", {2, 3, 9, 8}, {4, 3, 2, 2}, {2, 2}, {}, true, false, false}),
    [](const auto& info) { return info.param.name; });

// The whole step on the committed ViTs (both exporters' patch embeddings): the same loss and
// gradients as the convolution's plan, a plan that measures what it plans, and the transposes
// back to tokens gone.
struct ModelCase {
  std::string model, precision;
  int64_t batch = 8;
};

class PatchGemmStep : public ::testing::TestWithParam<ModelCase> {};

TEST_P(PatchGemmStep, EqualsTheConvolutionsStep) {
  const ModelCase& c = GetParam();
  CompileOptions o;
  o.batch = c.batch;
  o.precision = *parse_precision(c.precision);
  const Plan conv = testing::compile_committed(c.model, o);
  o.patch_gemm = true;
  const Plan patched = testing::compile_committed(c.model, o);
  EXPECT_EQ(testing::count_op(conv.train, "conv"), 1);
  EXPECT_EQ(testing::count_op(patched.train, "conv"), 0);
  EXPECT_EQ(testing::count_op(patched.train, "conv_grad_weight"), 0);
  EXPECT_EQ(testing::count_op(patched.train, "linear"), testing::count_op(conv.train, "linear") + 1);
  const auto diff = testing::compare_gradients(testing::first_step_gradients(patched, "digits_train.npz"),
                                               testing::first_step_gradients(conv, "digits_train.npz"));
  std::printf("[patch_gemm] %s %s: loss rel %.2e, grads rel L2 %.2e (worst %s %.2e); planned %lld vs %lld with the conv\n",
              c.model.c_str(), c.precision.c_str(), diff.loss_rel, diff.grad_rel_l2, diff.worst_param.c_str(), diff.worst_param_rel,
              static_cast<long long>(patched.memory.predicted_peak_bytes), static_cast<long long>(conv.memory.predicted_peak_bytes));
  EXPECT_EQ(diff.missing, "");
  const double tolerance = c.precision == "fp32" ? 1e-5 : 1e-2;
  EXPECT_LE(diff.loss_rel, tolerance);
  EXPECT_LE(diff.worst_param_rel, tolerance);
  EXPECT_EQ(testing::measured_peak(patched, "digits_train.npz", 2), patched.memory.predicted_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, PatchGemmStep,
                         ::testing::Values(ModelCase{"vit_tiny", "fp32"}, ModelCase{"vit_tiny", "bf16-mixed"},
                                           ModelCase{"vit_tiny_dynamo_t215", "fp32", 4}),
                         [](const auto& info) { return test_name(info.param.model + "_" + info.param.precision); });

// bias_grad_gemm (passes/bias_grad_gemm.h): every linear layer's bias gradient joins its weight
// gradient's GEMM (one matmul_bgrad per linear with a trained bias in the first micro-batch),
// and the step's loss and gradients equal the unfused step's; the plan measures what it plans.
struct FusedCase {
  std::string model, data, precision;
  int64_t batch = 8, seq = -1, micro_batches = 1;
  int linears = 9;  // linear layers with a trained bias (the committed models have 9 each)
};

// model_precision_xK.
std::string fused_case_name(const FusedCase& c) { return test_name(str_cat(c.model, "_", c.precision, "_x", c.micro_batches)); }

CompileOptions options_of(const FusedCase& c) {
  CompileOptions o;
  o.batch = c.batch;
  o.seq = c.seq;
  o.micro_batches = c.micro_batches;
  o.precision = *parse_precision(c.precision);
  return o;
}

class BiasGradGemmStep : public ::testing::TestWithParam<FusedCase> {};

TEST_P(BiasGradGemmStep, EqualsTheUnfusedStep) {
  const FusedCase& c = GetParam();
  CompileOptions o = options_of(c);
  const Plan plain = testing::compile_committed(c.model, o);
  o.bias_grad_gemm = true;
  const Plan fused = testing::compile_committed(c.model, o);
  const int pairs = testing::count_op(fused.train, "matmul_bgrad");
  // Every one in the first micro-batch; a later one's weight gradient is added into the sum by
  // its GEMM (accumulate_gemm, before this pass) and its bias gradient stays a reduce_sum.
  EXPECT_EQ(pairs, c.linears);
  EXPECT_GE(testing::count_op(fused.train, "matmul_acc"), c.linears * (c.micro_batches - 1));
  EXPECT_EQ(testing::count_op(fused.train, "matmul_acc"), testing::count_op(plain.train, "matmul_acc"));
  EXPECT_EQ(testing::count_op(fused.train, "matmul"), testing::count_op(plain.train, "matmul") - pairs);
  EXPECT_EQ(testing::count_op(fused.train, "reduce_sum"), testing::count_op(plain.train, "reduce_sum") - pairs);
  const auto diff = testing::compare_gradients(testing::first_step_gradients(fused, c.data), testing::first_step_gradients(plain, c.data));
  std::printf("[bias_grad_gemm] %s %s x%lld: %d fused; loss rel %.2e, grads rel L2 %.2e (worst %s %.2e); planned %lld vs %lld unfused\n",
              c.model.c_str(), c.precision.c_str(), static_cast<long long>(c.micro_batches), pairs, diff.loss_rel, diff.grad_rel_l2,
              diff.worst_param.c_str(), diff.worst_param_rel, static_cast<long long>(fused.memory.predicted_peak_bytes),
              static_cast<long long>(plain.memory.predicted_peak_bytes));
  EXPECT_EQ(diff.missing, "");
  const double tolerance = c.precision == "fp32" ? 1e-5 : 1e-2;
  EXPECT_LE(diff.loss_rel, tolerance);
  EXPECT_LE(diff.worst_param_rel, tolerance);
  EXPECT_EQ(testing::measured_peak(fused, c.data, 2), fused.memory.predicted_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, BiasGradGemmStep,
                         ::testing::Values(FusedCase{"vit_tiny", "digits_train.npz", "fp32"},
                                           FusedCase{"vit_tiny", "digits_train.npz", "bf16-mixed"},
                                           FusedCase{"vit_tiny", "digits_train.npz", "fp32", 8, -1, 2},
                                           FusedCase{"vit_tiny_dynamo_t215", "digits_train.npz", "fp32", 4},
                                           FusedCase{"text_encoder", "text_train.npz", "fp32", 8, 32}),
                         [](const auto& info) { return fused_case_name(info.param); });

// fuse_elementwise (passes/fuse_elementwise.h): each chain of elementwise ops becomes one
// fused_elementwise node, and the step's loss and gradients equal the unfused step's bit for bit
// (a fused step computes and rounds as its op's kernel does; dropout draws the same masks). The
// intermediates leave the plan, which measures what it plans and peaks no higher.
struct FuseCase : FusedCase {
  int groups = 0;  // fused nodes made (per micro-batch on top of the shared ones: at least)
};
class FuseElementwiseStep : public ::testing::TestWithParam<FuseCase> {};

TEST_P(FuseElementwiseStep, EqualsTheUnfusedStepBitForBit) {
  const FuseCase& c = GetParam();
  CompileOptions o = options_of(c);
  const Plan plain = testing::compile_committed(c.model, o);
  o.fuse_elementwise = true;
  const Plan fused = testing::compile_committed(c.model, o);
  const int groups = testing::count_op(fused.train, "fused_elementwise");
  int64_t steps = 0;
  for (NodeId n : fused.train.schedule()) steps += static_cast<int64_t>(fused.train.node(n).attrs.get_ints("args").size() / 3);
  EXPECT_GE(groups, c.groups);
  // Every node of the unfused step is a node or a step of the fused one.
  std::map<std::string, int64_t> ops;
  Module live = plain.train;  // without what reaches no output (fusion drops it: the loss scaled for reporting)
  live.eliminate_dead_nodes();
  for (NodeId n : live.schedule()) ++ops[live.node(n).op];
  for (NodeId n : fused.train.schedule()) {
    const Node& node = fused.train.node(n);
    if (node.op != "fused_elementwise") --ops[node.op];
    for (const std::string& op : node.attrs.get_strings("ops")) --ops[op];
  }
  for (const auto& [op, count] : ops) EXPECT_EQ(count, 0) << op;
  const auto diff = testing::compare_gradients(testing::first_step_gradients(fused, c.data), testing::first_step_gradients(plain, c.data));
  std::printf("[fuse_elementwise] %s %s x%lld: %lld ops as %d kernels; loss rel %.2e, grads rel L2 %.2e, %s; planned %lld vs %lld unfused\n",
              c.model.c_str(), c.precision.c_str(), static_cast<long long>(c.micro_batches), static_cast<long long>(steps), groups,
              diff.loss_rel, diff.grad_rel_l2, diff.bit_identical ? "bit-identical" : "NOT bit-identical",
              static_cast<long long>(fused.memory.predicted_peak_bytes), static_cast<long long>(plain.memory.predicted_peak_bytes));
  EXPECT_EQ(diff.missing, "");
  EXPECT_TRUE(diff.bit_identical);
  EXPECT_LE(fused.memory.predicted_peak_bytes, plain.memory.predicted_peak_bytes);
  EXPECT_EQ(testing::measured_peak(fused, c.data, 2), fused.memory.predicted_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, FuseElementwiseStep,
                         // ViT blocks: dropout + residual add forward, gelu + dropout, dropout + gelu_grad backward
                         ::testing::Values(FuseCase{{"vit_tiny", "digits_train.npz", "fp32"}, 12},
                                           FuseCase{{"vit_tiny", "digits_train.npz", "bf16-mixed"}, 12},
                                           FuseCase{{"vit_tiny", "digits_train.npz", "fp16-mixed"}, 12},
                                           FuseCase{{"vit_tiny", "digits_train.npz", "fp32", 8, -1, 2}, 24},
                                           // dropout-free: the attention gradients' sums only
                                           FuseCase{{"vit_tiny_dynamo_t215", "digits_train.npz", "fp32", 4}, 2},
                                           FuseCase{{"text_encoder", "text_train.npz", "bf16-mixed", 8, 32}, 12}),
                         [](const auto& info) { return fused_case_name(info.param); });


// add_layernorm (passes/add_layernorm.h): each residual add that a layernorm reads joins it, each
// layernorm gradient takes the add after it, alone and beside fuse_elementwise as a GPU target
// runs them; the step's loss and gradients equal the unfused step's bit for bit, and the plan
// measures what it plans and peaks no higher.
struct AddLayernormCase : FusedCase {
  int forward = 0, backward = 0;  // fused pairs
  bool with_elementwise = false;
};
class AddLayernormStep : public ::testing::TestWithParam<AddLayernormCase> {};

TEST_P(AddLayernormStep, EqualsTheUnfusedStepBitForBit) {
  const AddLayernormCase& c = GetParam();
  CompileOptions o = options_of(c);
  o.fuse_elementwise = c.with_elementwise;
  const Plan plain = testing::compile_committed(c.model, o);
  o.add_layernorm = true;
  const Plan fused = testing::compile_committed(c.model, o);
  const int forward = testing::count_op(fused.train, "add_layernorm");
  int backward = 0;
  for (NodeId n : fused.train.schedule()) backward += fused.train.node(n).op == "layernorm_grad" && fused.train.node(n).inputs.size() == 4;
  EXPECT_EQ(forward, c.forward);
  EXPECT_EQ(backward, c.backward);
  const auto diff = testing::compare_gradients(testing::first_step_gradients(fused, c.data), testing::first_step_gradients(plain, c.data));
  std::printf("[add_layernorm] %s %s x%lld%s: %d forward, %d backward; %zu nodes against %zu; loss rel %.2e, %s; planned %lld vs %lld unfused\n",
              c.model.c_str(), c.precision.c_str(), static_cast<long long>(c.micro_batches), c.with_elementwise ? " + fuse_elementwise" : "",
              forward, backward, fused.train.schedule().size(), plain.train.schedule().size(), diff.loss_rel,
              diff.bit_identical ? "bit-identical" : "NOT bit-identical", static_cast<long long>(fused.memory.predicted_peak_bytes),
              static_cast<long long>(plain.memory.predicted_peak_bytes));
  EXPECT_EQ(diff.missing, "");
  EXPECT_TRUE(diff.bit_identical);
  EXPECT_LE(fused.memory.predicted_peak_bytes, plain.memory.predicted_peak_bytes);
  EXPECT_EQ(testing::measured_peak(fused, c.data, 2), fused.memory.predicted_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, AddLayernormStep,
                         // pre-LN ViTs (2 blocks): the second layernorm of each block and the final one read a residual
                         // sum (the first block's first reads the position embedding's broadcast add), and each of their
                         // gradients takes the residual gradient's add
                         ::testing::Values(AddLayernormCase{{"vit_tiny", "digits_train.npz", "fp32"}, 4, 4},
                                           AddLayernormCase{{"vit_tiny", "digits_train.npz", "bf16-mixed"}, 4, 4},
                                           AddLayernormCase{{"vit_tiny", "digits_train.npz", "bf16-mixed"}, 4, 4, true},
                                           AddLayernormCase{{"vit_tiny", "digits_train.npz", "fp32", 8, -1, 2}, 8, 8},
                                           AddLayernormCase{{"vit_tiny_dynamo_t215", "digits_train.npz", "fp32", 4}, 4, 4},
                                           // post-LN: each add's sum is normalized, and the gradient's add comes before
                                           // layernorm_grad (its dy), not after
                                           AddLayernormCase{{"text_encoder", "text_train.npz", "bf16-mixed", 8, 32}, 4, 0, true}),
                         [](const auto& info) { return fused_case_name(info.param) + (info.param.with_elementwise ? "_elementwise" : ""); });

// update_grad_casts (passes/update_grad_casts.h): in a bf16-mixed step every f32 parameter's
// update reads its bf16 gradient instead of a cast of it. The losses of three steps, each after
// the previous step's updates, equal the plan's with the casts bit for bit (what shows the
// updates unchanged); the gradients are found under their names (grad.W now names the bf16
// value); the plan measures what it plans and peaks no higher.
class UpdateGradCastsStep : public ::testing::TestWithParam<FusedCase> {};

TEST_P(UpdateGradCastsStep, EqualsTheStepWithTheCastsBitForBit) {
  const FusedCase& c = GetParam();
  CompileOptions o = options_of(c);
  o.optimizer.kind = "adamw";
  const Plan plain = testing::compile_committed(c.model, o);
  o.update_grad_casts = true;
  const Plan folded = testing::compile_committed(c.model, o);
  const int casts = testing::count_op(plain.train, "cast") - testing::count_op(folded.train, "cast");
  const auto diff = testing::compare_gradients(testing::first_step_gradients(folded, c.data), testing::first_step_gradients(plain, c.data));
  auto losses = [&](const Plan& plan) {
    auto report = run_plan("", plan, RunOptions{.data = testing::source_path("data/" + c.data), .steps = 3, .seed = 0, .quiet = true});
    EXPECT_TRUE(report.ok()) << report.status().message();
    return report.ok() ? report->losses : std::vector<double>{};
  };
  const std::vector<double> want = losses(plain), got = losses(folded);
  std::printf("[update_grad_casts] %s %s x%lld: %d casts folded; gradients %s; losses %.9g %.9g %.9g; planned %lld vs %lld with the casts\n",
              c.model.c_str(), c.precision.c_str(), static_cast<long long>(c.micro_batches), casts,
              diff.bit_identical ? "bit-identical" : "NOT bit-identical", got.size() == 3 ? got[0] : 0.0, got.size() == 3 ? got[1] : 0.0,
              got.size() == 3 ? got[2] : 0.0, static_cast<long long>(folded.memory.predicted_peak_bytes),
              static_cast<long long>(plain.memory.predicted_peak_bytes));
  EXPECT_EQ(casts, c.linears);
  EXPECT_EQ(diff.missing, "");
  EXPECT_TRUE(diff.bit_identical);
  ASSERT_EQ(want.size(), 3u);
  EXPECT_EQ(got, want);
  EXPECT_LE(folded.memory.predicted_peak_bytes, plain.memory.predicted_peak_bytes);
  EXPECT_EQ(testing::measured_peak(folded, c.data, 2), folded.memory.predicted_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, UpdateGradCastsStep,
                         // `linears` here: the casts folded, one per weight and bias a bf16 GEMM produces (vit_tiny: 9
                         // linears and the patch embedding's GEMM). With 2 micro-batches none: each micro-batch's gradient
                         // is cast before the f32 accumulation, which the update reads.
                         ::testing::Values(FusedCase{"vit_tiny", "digits_train.npz", "bf16-mixed", 8, -1, 1, 20},
                                           FusedCase{"vit_tiny", "digits_train.npz", "bf16-mixed", 8, -1, 2, 0},
                                           FusedCase{"text_encoder", "text_train.npz", "bf16-mixed", 8, 32, 1, 18}),
                         [](const auto& info) { return fused_case_name(info.param); });

// layernorm_grad_casts (passes/layernorm_grad_casts.h): in a 16-bit mixed step, after the other
// layernorm rewrites as a GPU target runs them, each layernorm_grad reads the 16-bit dy its
// widening cast read and writes the 16-bit copy of dx a cast made. The step's loss and gradients
// equal the step with the casts bit for bit, and the plan measures what it plans.
struct GradCastsStepCase : FusedCase {
  int widened = 0, narrowed = 0;
};
class LayernormGradCastsStep : public ::testing::TestWithParam<GradCastsStepCase> {};

TEST_P(LayernormGradCastsStep, EqualsTheStepWithTheCastsBitForBit) {
  const GradCastsStepCase& c = GetParam();
  CompileOptions o = options_of(c);
  o.optimizer.kind = "adamw";
  o.add_layernorm = o.layernorm_bias_grad = o.update_grad_casts = o.narrow_transposes = true;
  const Plan plain = testing::compile_committed(c.model, o);
  o.layernorm_grad_casts = true;
  const Plan folded = testing::compile_committed(c.model, o);
  int widened = 0, narrowed = 0;
  int64_t copy_bytes = 0;  // the largest dx copy
  for (NodeId n : folded.train.schedule()) {
    const Node& node = folded.train.node(n);
    if (node.op != "layernorm_grad") continue;
    widened += folded.train.value(node.inputs[0]).type.dtype != folded.train.value(node.inputs[1]).type.dtype;
    if (!node.attrs.has("dx_copy")) continue;
    ++narrowed;
    copy_bytes = std::max(copy_bytes, folded.train.value(node.outputs.back()).type.bytes());
  }
  const auto diff = testing::compare_gradients(testing::first_step_gradients(folded, c.data), testing::first_step_gradients(plain, c.data));
  std::printf("[layernorm_grad_casts] %s %s x%lld: %d dys read in 16 bits, %d dx copies; %d casts against %d; gradients %s; planned %lld vs %lld with the casts\n",
              c.model.c_str(), c.precision.c_str(), static_cast<long long>(c.micro_batches), widened, narrowed,
              testing::count_op(folded.train, "cast"), testing::count_op(plain.train, "cast"), diff.bit_identical ? "bit-identical" : "NOT bit-identical",
              static_cast<long long>(folded.memory.predicted_peak_bytes), static_cast<long long>(plain.memory.predicted_peak_bytes));
  EXPECT_EQ(widened, c.widened);
  EXPECT_EQ(narrowed, c.narrowed);
  EXPECT_EQ(testing::count_op(plain.train, "cast") - testing::count_op(folded.train, "cast"), c.widened + c.narrowed);
  EXPECT_EQ(diff.missing, "");
  EXPECT_TRUE(diff.bit_identical);
  // The copy is written beside the 16-bit dy, where the cast wrote it after dy was freed: at most
  // one copy more where a layernorm gradient is the peak.
  EXPECT_LE(folded.memory.predicted_peak_bytes, plain.memory.predicted_peak_bytes + copy_bytes);
  EXPECT_EQ(testing::measured_peak(folded, c.data, 2), folded.memory.predicted_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, LayernormGradCastsStep,
                         // pre-LN ViTs (2 blocks): each block's two layernorm gradients read a 16-bit dy (the
                         // GEMM's) and their dx is narrowed for the GEMM before them; the final layernorm's dy is
                         // the class token's f32 gather gradient, and its dx goes to the last block's residual sum.
                         // Post-LN text_encoder: each dy is a residual add's f32 sum, each dx goes to a GEMM.
                         ::testing::Values(GradCastsStepCase{{"vit_tiny", "digits_train.npz", "bf16-mixed"}, 4, 4},
                                           GradCastsStepCase{{"vit_tiny", "digits_train.npz", "fp16-mixed"}, 4, 4},
                                           GradCastsStepCase{{"vit_tiny", "digits_train.npz", "bf16-mixed", 8, -1, 2}, 8, 8},
                                           GradCastsStepCase{{"text_encoder", "text_train.npz", "bf16-mixed", 8, 32}, 0, 4}),
                         [](const auto& info) { return fused_case_name(info.param); });

// The two rewrites on their own: a gather of a transposed tensor's slice reads the tensor itself
// only where the other dims keep their order; gather gradients become a concat only where they
// fill every slice of the axis once. The rewritten modules compute the same values.
ValueId scalar_index(Module& m, int64_t i) {
  Tensor t = Tensor::zeros(DType::kI64, {});
  t.set_from_double(0, static_cast<double>(i));
  return m.add_constant(std::move(t), "index");
}
using testing::emit;
void expect_same_values(const Module& plain, const Module& rewritten, const std::map<std::string, Tensor>& feeds) {
  auto want = execute(plain, feeds);
  auto got = execute(rewritten, feeds);
  ASSERT_TRUE(want.ok()) << want.status().message();
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), want->size());
  for (size_t k = 0; k < want->size(); ++k) {
    ASSERT_EQ(got->at(k).shape(), want->at(k).shape());
    EXPECT_EQ(testing::rel_error(got->at(k), want->at(k)), 0.0) << "output " << k;
  }
}

// A chain where each rewrite touches the next match: six post-LN blocks, each layernorm's output
// the next residual add's operand. A pass walks the schedule with the readers taken once
// (fusion::Walk); a match whose values an earlier rewrite changed waits for the next walk, so every
// pair is fused (three per walk here), and the rewritten module computes the same values.
TEST(AddLayernormChain, EveryPairFusedOverTwoWalks) {
  std::mt19937 rng(3);
  testing::OnnxBuilder b(17);
  b.input("x", {4, 8}).input("r", {4, 8}).output("y5");
  std::string y = "x";
  for (int i = 0; i < 6; ++i) {
    const std::string scale = str_cat("scale", i), bias = str_cat("bias", i);
    b.init(scale, testing::random_tensor(DType::kF32, {8}, rng)).init(bias, testing::random_tensor(DType::kF32, {8}, rng));
    b.node("Add", {y, "r"}, {str_cat("s", i)});
    b.node("LayerNormalization", {str_cat("s", i), scale, bias}, {str_cat("y", i)});
    y = str_cat("y", i);
  }
  ImportOptions o;
  o.fuse = false;
  auto plain = b.import(o);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  Module fused = *plain;
  auto report = AddLayernorm().run(fused);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(testing::count_op(fused, "add_layernorm"), 6);
  EXPECT_EQ(testing::count_op(fused, "layernorm"), 0);
  expect_same_values(*plain, fused, {{"x", testing::random_tensor(DType::kF32, {4, 8}, rng)}, {"r", testing::random_tensor(DType::kF32, {4, 8}, rng)}});
}

TEST(GatherTransposes, ReadsTheUntransposedTensorWhereTheOrderHolds) {
  for (const bool in_order : {true, false}) {
    SCOPED_TRACE(in_order ? "[4, 5] kept in order" : "[5, 4]: another order");
    Module m;
    const ValueId x = m.add_argument("x", TensorType{DType::kF32, {4, 5, 3, 6}}, Role::kInput);
    // [4, 5, 3, 6] → (unsqueezed) → the 3 first → squeezed [3, 4|5, 5|4, 6]
    const ValueId u = emit(m, "reshape", {x}, make_attrs({{"shape", std::vector<int64_t>{1, 4, 5, 3, 6}}}));
    const std::vector<int64_t> perm = in_order ? std::vector<int64_t>{3, 1, 2, 0, 4} : std::vector<int64_t>{3, 2, 1, 0, 4};
    const ValueId t = emit(m, "transpose", {u}, make_attrs({{"perm", perm}}));
    const ValueId r = emit(m, "reshape", {t}, make_attrs({{"shape", in_order ? std::vector<int64_t>{3, 4, 5, 6} : std::vector<int64_t>{3, 5, 4, 6}}}));
    std::vector<ValueId> slices;
    for (int64_t i : {0, 2, -2}) slices.push_back(emit(m, "gather", {r, scalar_index(m, i)}, make_attrs({{"axis", int64_t{0}}})));
    m.set_outputs(slices);
    Module rewritten = m;
    auto report = GatherTransposes().run(rewritten);
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->get("rewritten"), in_order ? 3 : 0);
    EXPECT_EQ(testing::count_op(rewritten, "transpose"), in_order ? 0 : 1);
    std::mt19937 rng(3);
    expect_same_values(m, rewritten, {{"x", testing::random_tensor(DType::kF32, {4, 5, 3, 6}, rng)}});
  }
}

TEST(ConcatGatherGrads, OnlyGradientsThatFillEverySliceOnceBecomeAConcat) {
  struct Cover {
    const char* name;
    std::vector<int64_t> indices;
    bool joined;
    bool more = false;  // the sum then added to another gradient of the tensor
  };
  for (const Cover& c : {Cover{"0, 1, 2", {2, 0, 1}, true}, Cover{"−1 for 2", {0, -1, 1}, true}, Cover{"two of three", {0, 1}, false},
                         Cover{"one twice", {0, 1, 1}, false}, Cover{"0, 1, 2 and another gradient", {0, 1, 2}, true, true}}) {
    SCOPED_TRACE(c.name);
    Module m;
    std::vector<ValueId> grads;
    for (size_t i = 0; i < c.indices.size(); ++i) {
      const ValueId dy = m.add_argument(str_cat("dy", i), TensorType{DType::kF32, {4, 5}}, Role::kInput);
      grads.push_back(emit(m, "gather_grad", {dy, scalar_index(m, c.indices[i])},
                           make_attrs({{"axis", int64_t{1}}, {"input_shape", std::vector<int64_t>{4, 3, 5}}})));
    }
    ValueId sum = grads[0];
    for (size_t i = 1; i < grads.size(); ++i) sum = emit(m, "add", {sum, grads[i]});
    if (c.more) sum = emit(m, "add", {sum, m.add_argument("other", TensorType{DType::kF32, {4, 3, 5}}, Role::kInput)});
    m.set_outputs({emit(m, "tanh", {sum})});
    Module rewritten = m;
    auto report = ConcatGatherGrads().run(rewritten);
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->get("concats"), c.joined ? 1 : 0);
    EXPECT_EQ(testing::count_op(rewritten, "gather_grad"), c.joined ? 0 : static_cast<int>(c.indices.size()));
    std::mt19937 rng(4);
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < c.indices.size(); ++i) feeds[str_cat("dy", i)] = testing::random_tensor(DType::kF32, {4, 5}, rng);
    if (c.more) feeds["other"] = testing::random_tensor(DType::kF32, {4, 3, 5}, rng);
    expect_same_values(m, rewritten, feeds);
  }
}

// gather_transposes and concat_gather_grads (passes/split_gathers.h) on the committed exports of
// torch's MultiheadAttention, whose packed q/k/v projection is split by a transpose and three
// gathers: each gather reads the projection's output along its own axis (the transpose goes,
// forward and backward), and the three gathers' gradients are one concat where three full-size
// gather_grads were added up. The same loss and gradients (values equal; the concat keeps a −0
// that x + 0 made +0), a plan that peaks no higher and measures what it plans.
struct SplitGathersCase {
  FusedCase step;
  int gathers, concats;  // rewritten forward, written backward
};

class SplitGathersStep : public ::testing::TestWithParam<SplitGathersCase> {};

TEST_P(SplitGathersStep, EqualsTheStepWithTheTransposes) {
  const SplitGathersCase& c = GetParam();
  CompileOptions o = options_of(c.step);
  const Plan plain = testing::compile_committed(c.step.model, o);
  o.gather_transposes = o.concat_gather_grads = true;
  const Plan split = testing::compile_committed(c.step.model, o);
  const int transposes = testing::count_op(split.train, "transpose"), plain_transposes = testing::count_op(plain.train, "transpose");
  const int concats = testing::count_op(split.train, "concat") - testing::count_op(plain.train, "concat");
  const int gather_grads = testing::count_op(split.train, "gather_grad"), plain_gather_grads = testing::count_op(plain.train, "gather_grad");
  const auto diff = testing::compare_gradients(testing::first_step_gradients(split, c.step.data), testing::first_step_gradients(plain, c.step.data));
  std::printf("[split_gathers] %s %s x%lld: transposes %d against %d, gather_grads %d against %d, %d concats; %zu nodes against %zu; "
              "loss rel %.2e, worst gradient rel %.2e; planned %lld vs %lld\n",
              c.step.model.c_str(), c.step.precision.c_str(), static_cast<long long>(c.step.micro_batches), transposes, plain_transposes,
              gather_grads, plain_gather_grads, concats, split.train.schedule().size(), plain.train.schedule().size(), diff.loss_rel,
              diff.worst_param_rel, static_cast<long long>(split.memory.predicted_peak_bytes),
              static_cast<long long>(plain.memory.predicted_peak_bytes));
  EXPECT_EQ(plain_transposes - transposes, 2 * c.gathers / 3);  // one forward, one backward per split
  EXPECT_EQ(plain_gather_grads - gather_grads, c.concats * 3);
  EXPECT_EQ(concats, c.concats);
  EXPECT_EQ(diff.missing, "");
  EXPECT_EQ(diff.loss_rel, 0.0);
  EXPECT_EQ(diff.worst_param_rel, 0.0);
  EXPECT_LE(split.memory.predicted_peak_bytes, plain.memory.predicted_peak_bytes);
  EXPECT_EQ(testing::measured_peak(split, c.step.data, 2), split.memory.predicted_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, SplitGathersStep,
                         // 2 blocks: 3 gathers and one concat each (per micro-batch)
                         ::testing::Values(SplitGathersCase{{"vit_tiny", "digits_train.npz", "fp32"}, 6, 2},
                                           SplitGathersCase{{"vit_tiny", "digits_train.npz", "bf16-mixed"}, 6, 2},
                                           SplitGathersCase{{"vit_tiny", "digits_train.npz", "fp32", 8, -1, 2}, 12, 4},
                                           SplitGathersCase{{"text_encoder", "text_train.npz", "bf16-mixed", 8, 32}, 6, 2}),
                         [](const auto& info) { return fused_case_name(info.param.step); });

// The rewrites a GPU target runs, together (CompileOptions as planner/compile.cc sets them for
// h200), against the same step without any: loss and gradients equal the unrewritten step's
// within rounding (bias_grad_gemm's and layernorm_bias_grad's sums and patch_gemm's GEMM reorder
// them; every other rewrite is bit-exact on its own), every layernorm's bias gradient is inside
// its layernorm_grad, and the plan measures what it plans. It peaks no higher but for the
// layernorm bias gradients, which the fused node writes earlier than the reduce_sum did, and one
// 16-bit dx copy, which layernorm_grad writes beside its dy (passes/layernorm_grad_casts.h).
class GpuRewritesStep : public ::testing::TestWithParam<FusedCase> {};

TEST_P(GpuRewritesStep, EqualsTheStepWithoutThem) {
  const FusedCase& c = GetParam();
  CompileOptions o = options_of(c);
  o.optimizer.kind = "adamw";
  const Plan plain = testing::compile_committed(c.model, o);
  o.patch_gemm = o.bias_grad_gemm = o.update_grad_casts = o.narrow_transposes = o.add_layernorm = o.layernorm_bias_grad = true;
  o.layernorm_grad_casts = true;
  o.gather_transposes = o.concat_gather_grads = o.fuse_elementwise = true;
  const Plan all = testing::compile_committed(c.model, o);
  const auto diff = testing::compare_gradients(testing::first_step_gradients(all, c.data), testing::first_step_gradients(plain, c.data));
  std::printf("[gpu rewrites] %s %s: %zu nodes against %zu, %d casts against %d; loss rel %.2e, worst gradient rel %.2e (%s); planned %lld vs %lld\n",
              c.model.c_str(), c.precision.c_str(), all.train.schedule().size(), plain.train.schedule().size(), testing::count_op(all.train, "cast"),
              testing::count_op(plain.train, "cast"), diff.loss_rel, diff.worst_param_rel, diff.worst_param.c_str(),
              static_cast<long long>(all.memory.predicted_peak_bytes), static_cast<long long>(plain.memory.predicted_peak_bytes));
  EXPECT_EQ(diff.missing, "");
  const double tolerance = c.precision == "fp32" ? 1e-5 : 1e-2;
  EXPECT_LE(diff.loss_rel, tolerance);
  EXPECT_LE(diff.worst_param_rel, tolerance);
  EXPECT_LT(all.train.schedule().size(), plain.train.schedule().size());
  int layernorms = 0, with_bias = 0;
  int64_t bias_bytes = 0, copy_bytes = 0;
  for (NodeId n : all.train.schedule()) {
    const Node& node = all.train.node(n);
    layernorms += node.op == "layernorm" || node.op == "add_layernorm";
    if (node.op != "layernorm_grad") continue;
    if (node.attrs.get_int("bias_grad", 0)) ++with_bias, bias_bytes += all.train.value(node.outputs[2]).type.bytes();
    if (node.attrs.has("dx_copy")) copy_bytes = std::max(copy_bytes, all.train.value(node.outputs.back()).type.bytes());
  }
  EXPECT_EQ(with_bias, layernorms);
  EXPECT_LE(all.memory.predicted_peak_bytes, plain.memory.predicted_peak_bytes + bias_bytes + copy_bytes);
  EXPECT_EQ(testing::measured_peak(all, c.data, 2), all.memory.predicted_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuRewritesStep,
                         ::testing::Values(FusedCase{"vit_tiny", "digits_train.npz", "fp32"},
                                           FusedCase{"vit_tiny", "digits_train.npz", "bf16-mixed"},
                                           FusedCase{"text_encoder", "text_train.npz", "bf16-mixed", 8, 32}),
                         [](const auto& info) { return test_name(str_cat(info.param.model, "_", info.param.precision)); });

}  // namespace
}  // namespace memc
