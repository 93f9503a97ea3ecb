// Token-level cross-entropy (a language model's logits [N, T, C], labels [N, T]): the loss is
// PyTorch's cross_entropy with ignore_index -100, the mean over the positions not ignored, and
// the gradients are its gradients. Checked against the same loss and gradients computed here in
// f64 on a small embedding → projection model, and across micro-batches whose kept positions
// differ (a per-micro-batch mean would weigh them wrongly).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "planner/compile.h"
#include "runtime/dataset.h"
#include "runtime/trainer.h"
#include "tests/frontend_onnx_builder.h"
#include "tests/test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kVocab = 7, kDim = 4, kBatch = 6, kSeq = 5;

// A weight of `shape` with distinct, deterministic values.
Tensor weight(const Shape& shape, double phase) {
  Tensor t = Tensor::zeros(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_from_double(i, 0.5 * std::sin(1.7 * static_cast<double>(i) + phase));
  return t;
}

// ids [batch, seq] → Gather(E [V, D]) → MatMul(W [D, V]) → logits [batch, seq, V], written to a file.
std::string token_model() {
  testing::OnnxBuilder b;
  b.input("ids", {-1, -1}, onnx::TensorProto::INT64).init("E", weight({kVocab, kDim}, 0.3)).init("W", weight({kDim, kVocab}, 1.1));
  b.node("Gather", {"E", "ids"}, {"h"});
  b.node("MatMul", {"h", "W"}, {"logits"});
  b.output("logits");
  const std::string path = testing::scratch_path("token_model.onnx");
  std::ofstream(path, std::ios::binary) << b.bytes();
  return path;
}

Plan compile_token_model(int64_t micro_batches) {
  const std::string model = token_model();
  CompileOptions options;
  options.batch = kBatch;
  options.seq = kSeq;
  options.micro_batches = micro_batches;
  options.dropout = false;
  options.optimizer.kind = "sgd";
  auto plan = compile_model(model, model + ".plan", options);
  MEMC_CHECK(plan.ok(), plan.status().message());
  plan->model_path = model;
  return std::move(plan).value();
}

Tensor i64(const Shape& shape, const std::vector<int64_t>& values) {
  Tensor t = Tensor::zeros(DType::kI64, shape);
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  return t;
}

// The batch: ids, and labels whose first rows are mostly ignored, so each micro-batch keeps a
// different number of positions.
std::map<std::string, Tensor> token_batch(bool all_ignored = false) {
  std::vector<int64_t> ids, labels;
  for (int64_t i = 0; i < kBatch * kSeq; ++i) {
    ids.push_back((3 * i + 1) % kVocab);
    const bool ignored = all_ignored || (i < 2 * kSeq ? i % 4 != 0 : i % 3 == 0);
    labels.push_back(ignored ? -100 : (5 * i + 2) % kVocab);
  }
  return {{"ids", i64({kBatch, kSeq}, ids)}, {kLabelsArg, i64({kBatch, kSeq}, labels)}};
}

struct Reference {
  double loss = 0;
  std::vector<double> dE, dW;
};

// The loss and gradients in f64: mean over kept positions of -log softmax(h·W)[label].
Reference reference(const std::map<std::string, Tensor>& batch) {
  const Tensor E = weight({kVocab, kDim}, 0.3), W = weight({kDim, kVocab}, 1.1);
  const int64_t* ids = batch.at("ids").data<int64_t>();
  const int64_t* labels = batch.at(kLabelsArg).data<int64_t>();
  int64_t kept = 0;
  for (int64_t p = 0; p < kBatch * kSeq; ++p) kept += labels[p] >= 0;
  Reference r{.dE = std::vector<double>(kVocab * kDim), .dW = std::vector<double>(kDim * kVocab)};
  for (int64_t p = 0; p < kBatch * kSeq; ++p) {
    if (labels[p] < 0) continue;
    std::vector<double> logit(kVocab), h(kDim);
    for (int64_t d = 0; d < kDim; ++d) h[d] = E.get_as_double(ids[p] * kDim + d);
    double top = -1e300;
    for (int64_t c = 0; c < kVocab; ++c) {
      for (int64_t d = 0; d < kDim; ++d) logit[c] += h[d] * W.get_as_double(d * kVocab + c);
      top = std::max(top, logit[c]);
    }
    double sum = 0;
    for (double l : logit) sum += std::exp(l - top);
    r.loss += (top + std::log(sum) - logit[labels[p]]) / static_cast<double>(kept);
    for (int64_t c = 0; c < kVocab; ++c) {
      const double g = (std::exp(logit[c] - top) / sum - (c == labels[p] ? 1.0 : 0.0)) / static_cast<double>(kept);
      for (int64_t d = 0; d < kDim; ++d) {
        r.dW[d * kVocab + c] += h[d] * g;
        r.dE[ids[p] * kDim + d] += W.get_as_double(d * kVocab + c) * g;
      }
    }
  }
  return r;
}

double max_abs_diff(const Tensor& got, const std::vector<double>& want) {
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) worst = std::max(worst, std::abs(got.get_as_double(i) - want[static_cast<size_t>(i)]));
  return worst;
}

std::map<std::string, Tensor> gradients(const Plan& plan, const std::map<std::string, Tensor>& batch) {
  auto state = initial_state("", plan);
  MEMC_CHECK(state.ok(), state.status().message());
  auto grads = compute_gradients(plan, *state, batch, 0, 1);
  MEMC_CHECK(grads.ok(), grads.status().message());
  return std::move(grads).value();
}

TEST(TokenLoss, TheLabelsArePositionsAndTheLossIsTheMeanOverKeptPositions) {
  const Plan plan = compile_token_model(1);
  EXPECT_EQ(plan.num_classes, kVocab);
  EXPECT_EQ(label_spec(plan.train, plan.num_classes).sample, Shape{kSeq});
  const auto batch = token_batch();
  const Reference want = reference(batch);
  const auto got = gradients(plan, batch);
  std::printf("[token loss] loss %.9g (f64 %.9g)\n", got.at("loss").get_as_double(0), want.loss);
  EXPECT_NEAR(got.at("loss").get_as_double(0), want.loss, 1e-6 * want.loss);
  EXPECT_LE(max_abs_diff(got.at("E"), want.dE), 1e-6);
  EXPECT_LE(max_abs_diff(got.at("W"), want.dW), 1e-6);
}

// Micro-batches of 2 rows: the first keeps 3 positions, the others 7 each. Each divides its
// sum by the whole batch's 17, so the step equals the one-batch step.
TEST(TokenLoss, MicroBatchesDivideByTheWholeBatchsKeptPositions) {
  const auto batch = token_batch();
  const auto one = gradients(compile_token_model(1), batch);
  for (int64_t k : {2, 3}) {
    const auto got = gradients(compile_token_model(k), batch);
    EXPECT_NEAR(got.at("loss").get_as_double(0), one.at("loss").get_as_double(0), 1e-6) << k << " micro-batches";
    for (const char* name : {"E", "W"}) {
      std::vector<double> want(static_cast<size_t>(one.at(name).numel()));
      for (size_t i = 0; i < want.size(); ++i) want[i] = one.at(name).get_as_double(static_cast<int64_t>(i));
      EXPECT_LE(max_abs_diff(got.at(name), want), 1e-7) << name << ", " << k << " micro-batches";
    }
  }
}

// Nothing reads a language model's logits after the step: it does not return them, so they die
// with the loss's gradient (a classifier's [N, C] are returned).
TEST(TokenLoss, TheStepDoesNotReturnTheLogits) {
  const Plan plan = compile_token_model(2);
  for (ValueId out : plan.train.outputs()) EXPECT_NE(plan.train.value(out).type.shape, (Shape{kBatch, kSeq, kVocab}));
  EXPECT_EQ(plan.train.value(plan.train.outputs()[0]).type.shape, Shape{});
  // Nor does it concatenate the micro-batches' logits for nothing (it did, holding each to the end).
  EXPECT_EQ(testing::count_op(plan.train, "concat"), 0);
}

TEST(TokenLoss, ABatchOfIgnoredPositionsHasAZeroLossAndGradient) {
  const auto got = gradients(compile_token_model(1), token_batch(true));
  EXPECT_EQ(got.at("loss").get_as_double(0), 0.0);
  for (const char* name : {"E", "W"}) EXPECT_EQ(max_abs_diff(got.at(name), std::vector<double>(got.at(name).numel())), 0.0) << name;
}

TEST(TokenLoss, DataNeedsALabelPerPositionWithinTheVocabularyOrIgnored) {
  const LabelSpec spec{.classes = kVocab, .sample = {kSeq}};
  const std::vector<InputSpec> inputs{{"ids", TensorType{DType::kI64, {kBatch, kSeq}}}};
  TensorMap arrays = token_batch();
  arrays["y"] = arrays.at(kLabelsArg);
  arrays.erase(kLabelsArg);
  auto data = dataset_from_arrays("lm.npz", arrays, inputs, spec);
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ(data->size, kBatch);

  // A tokenizer's int32 ids as labels are read as int64.
  TensorMap narrow = arrays;
  narrow["y"] = arrays.at("y").cast(DType::kI32);
  auto from_i32 = dataset_from_arrays("lm.npz", narrow, inputs, spec);
  ASSERT_TRUE(from_i32.ok()) << from_i32.status().message();
  EXPECT_EQ(from_i32->labels.dtype(), DType::kI64);
  EXPECT_EQ(from_i32->labels.get_as_double(1), arrays.at("y").get_as_double(1));

  TensorMap per_sample = arrays;
  per_sample["y"] = Tensor::zeros(DType::kI64, {kBatch});
  auto wrong_shape = dataset_from_arrays("lm.npz", per_sample, inputs, spec);
  ASSERT_FALSE(wrong_shape.ok());
  EXPECT_EQ(wrong_shape.status().message(),
            "lm.npz: array 'y' is i64[6], expected int64 [N, 5] (a label per position of the model's logits)");

  TensorMap outside = arrays;
  outside["y"].data<int64_t>()[kSeq + 2] = kVocab;
  auto refused = dataset_from_arrays("lm.npz", outside, inputs, spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "lm.npz: label y[1] position 2 = 7 is outside [0, 7) and is not -100 (ignored)");

  // Class labels keep their rule: -100 is no class.
  TensorMap classes{{"ids", arrays.at("ids")}, {"y", i64({kBatch}, {0, 1, 2, -100, 4, 5})}};
  auto no_ignore = dataset_from_arrays("c.npz", classes, inputs, LabelSpec{.classes = kVocab});
  ASSERT_FALSE(no_ignore.ok());
  EXPECT_EQ(no_ignore.status().message(), "c.npz: label y[3] = -100 is outside [0, 7)");
}

}  // namespace
}  // namespace memc
