// Finite-difference checks of every gradient rule, in float64 on random inputs.
// loss = Σ y·R for a random R, so every output element's gradient is exercised.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "ir/op_registry.h"
#include "ir/printer.h"
#include "passes/autodiff.h"
#include "runtime/executor.h"
#include "tests/test_util.h"

namespace memc {
namespace {

struct InputSpec {
  Shape shape;
  DType dtype = DType::kF64;
  double lo = -1.0, hi = 1.0;
  bool differentiable = true;  // fed as an argument and checked; else a constant
};

struct GradCase {
  std::string label;
  std::string op;
  std::vector<InputSpec> inputs;
  Attrs attrs;
  int num_outputs = -1;
};

Attrs A(std::initializer_list<std::pair<std::string, Attr>> items) {
  Attrs a;
  for (const auto& [k, v] : items) a.set(k, v);
  return a;
}
using I = std::vector<int64_t>;

std::vector<GradCase> cases() {
  const InputSpec x23{{2, 3}}, pos23{{2, 3}, DType::kF64, 0.5, 2.0}, unit23{{2, 3}, DType::kF64, -0.8, 0.8};
  std::vector<GradCase> c;
  for (const char* op : {"neg", "abs", "exp", "tanh", "sigmoid", "relu", "erf", "sin", "cos", "softplus"}) c.push_back({op, op, {x23}});
  for (const char* op : {"log", "sqrt", "rsqrt", "reciprocal"}) c.push_back({op, op, {pos23}});
  for (const char* op : {"asin", "acos", "atan"}) c.push_back({op, op, {unit23}});
  c.push_back({"leaky_relu", "leaky_relu", {x23}, A({{"alpha", 0.1}})});
  c.push_back({"gelu", "gelu", {x23}, A({{"approximate", std::string("none")}})});
  c.push_back({"gelu_tanh", "gelu", {x23}, A({{"approximate", std::string("tanh")}})});
  for (const char* op : {"add", "sub", "mul", "div", "max", "min"}) {
    c.push_back({op, op, {x23, op == std::string("div") ? pos23 : InputSpec{{2, 3}}}});
    c.push_back({std::string(op) + "_broadcast", op, {InputSpec{{4, 2, 3}}, op == std::string("div") ? InputSpec{{1, 3}, DType::kF64, 0.5, 2} : InputSpec{{1, 3}}}});
  }
  c.push_back({"pow", "pow", {pos23, InputSpec{{3}, DType::kF64, 0.5, 2.0}}});
  c.push_back({"where", "where", {InputSpec{{2, 3}, DType::kBool, 0, 2, false}, InputSpec{{2, 3}}, InputSpec{{3}}}});
  c.push_back({"cast_f32", "cast", {x23}, A({{"to", std::string("f64")}})});
  c.push_back({"copy", "copy", {x23}});
  // A flat unit's pieces at aligned offsets (adam8bit's layout): the loss reads the first piece,
  // so d x is its gradient at [2, 5) and zeros elsewhere, the unread piece's span included.
  c.push_back({"split_flat_offsets", "split_flat", {InputSpec{{10}}}, A({{"sizes", I{3, 2}}, {"offsets", I{2, 7}}}), 2});
  c.push_back({"matmul", "matmul", {InputSpec{{3, 4}}, InputSpec{{4, 2}}}});
  c.push_back({"matmul_ta", "matmul", {InputSpec{{4, 3}}, InputSpec{{4, 2}}}, A({{"transpose_a", int64_t{1}}})});
  c.push_back({"matmul_tb", "matmul", {InputSpec{{3, 4}}, InputSpec{{2, 4}}}, A({{"transpose_b", int64_t{1}}})});
  c.push_back({"matmul_tatb", "matmul", {InputSpec{{4, 3}}, InputSpec{{2, 4}}}, A({{"transpose_a", int64_t{1}}, {"transpose_b", int64_t{1}}})});
  c.push_back({"matmul_batch_broadcast", "matmul", {InputSpec{{2, 3, 4}}, InputSpec{{4, 2}}}});
  c.push_back({"matmul_vec_left", "matmul", {InputSpec{{4}}, InputSpec{{2, 4, 3}}}});
  c.push_back({"matmul_vec_right", "matmul", {InputSpec{{2, 3, 4}}, InputSpec{{4}}}});
  c.push_back({"linear", "linear", {InputSpec{{2, 3, 4}}, InputSpec{{5, 4}}, InputSpec{{5}}}});
  c.push_back({"linear_nt", "linear", {InputSpec{{3, 4}}, InputSpec{{4, 5}}}, A({{"transpose_w", int64_t{0}}})});
  c.push_back({"conv", "conv", {InputSpec{{2, 2, 5, 5}}, InputSpec{{3, 2, 2, 2}}, InputSpec{{3}}},
               A({{"strides", I{2, 1}}, {"pads", I{1, 0, 0, 1}}, {"dilations", I{1, 2}}, {"group", int64_t{1}}})});
  c.push_back({"conv_group", "conv", {InputSpec{{1, 4, 4, 4}}, InputSpec{{2, 2, 2, 2}}},
               A({{"strides", I{2, 2}}, {"pads", I{0, 0, 0, 0}}, {"dilations", I{1, 1}}, {"group", int64_t{2}}})});
  c.push_back({"attention", "attention", {InputSpec{{2, 3, 4}}, InputSpec{{2, 5, 4}}, InputSpec{{2, 5, 3}}}, A({{"scale", 0.5}})});
  c.push_back({"attention_bias", "attention", {InputSpec{{2, 3, 4}}, InputSpec{{2, 5, 4}}, InputSpec{{2, 5, 3}}, InputSpec{{1, 3, 5}}},
               A({{"scale", 0.5}})});
  c.push_back({"conv_group_pad_dilate", "conv", {InputSpec{{2, 6, 5, 4}}, InputSpec{{4, 3, 3, 2}}, InputSpec{{4}}},
               A({{"strides", I{1, 2}}, {"pads", I{1, 1, 2, 0}}, {"dilations", I{2, 1}}, {"group", int64_t{2}}})});
  c.push_back({"conv_depthwise_1d", "conv", {InputSpec{{2, 3, 7}}, InputSpec{{3, 1, 3}}},
               A({{"strides", I{2}}, {"pads", I{1, 1}}, {"group", int64_t{3}}})});
  c.push_back({"conv_3d", "conv", {InputSpec{{1, 2, 3, 4, 3}}, InputSpec{{2, 2, 2, 2, 2}}},
               A({{"strides", I{1, 2, 1}}, {"pads", I{0, 1, 1, 0, 0, 1}}})});
  c.push_back({"conv_pointwise_group", "conv", {InputSpec{{2, 4, 3, 3}}, InputSpec{{6, 2, 1, 1}}}, A({{"group", int64_t{2}}})});
  c.push_back({"attention_dropout", "attention", {InputSpec{{2, 3, 4}}, InputSpec{{2, 5, 4}}, InputSpec{{2, 5, 3}}, InputSpec{{2, 3, 5}}},
               A({{"scale", 0.5}, {"dropout_ratio", 0.4}, {"seed", int64_t{11}}})});
  c.push_back({"attention_broadcast", "attention",
               {InputSpec{{2, 2, 3, 4}}, InputSpec{{1, 2, 5, 4}}, InputSpec{{2, 1, 5, 3}}, InputSpec{{2, 1, 1, 5}}},
               A({{"scale", 0.7}})});
  c.push_back({"attention_long", "attention", {InputSpec{{1, 70, 3}}, InputSpec{{1, 67, 3}}, InputSpec{{1, 67, 2}}, InputSpec{{67}}},
               A({{"dropout_ratio", 0.25}, {"seed", int64_t{5}}})});
  c.push_back({"reduce_sum", "reduce_sum", {InputSpec{{2, 3, 4}}}, A({{"axes", I{1}}, {"keepdims", int64_t{0}}})});
  c.push_back({"reduce_sum_all", "reduce_sum", {InputSpec{{2, 3}}}, A({{"axes", I{}}, {"keepdims", int64_t{1}}})});
  c.push_back({"reduce_mean", "reduce_mean", {InputSpec{{2, 3, 4}}}, A({{"axes", I{0, 2}}, {"keepdims", int64_t{1}}})});
  c.push_back({"reduce_max", "reduce_max", {InputSpec{{2, 3, 4}}}, A({{"axes", I{2}}, {"keepdims", int64_t{0}}})});
  c.push_back({"reduce_min", "reduce_min", {InputSpec{{2, 3, 4}}}, A({{"axes", I{1}}, {"keepdims", int64_t{1}}})});
  c.push_back({"reduce_sum_square", "reduce_sum_square", {InputSpec{{2, 3}}}, A({{"axes", I{1}}, {"keepdims", int64_t{0}}})});
  c.push_back({"reduce_l2", "reduce_l2", {InputSpec{{2, 3}, DType::kF64, 0.5, 1.0}}, A({{"axes", I{1}}, {"keepdims", int64_t{0}}})});
  c.push_back({"softmax_last", "softmax", {InputSpec{{2, 3, 4}}}, A({{"axis", int64_t{2}}})});
  c.push_back({"softmax_mid", "softmax", {InputSpec{{2, 3, 4}}}, A({{"axis", int64_t{1}}})});
  c.push_back({"softmax_default_axis", "softmax", {InputSpec{{2, 3, 4}}}});  // no attrs: the last axis
  c.push_back({"log_softmax_default_axis", "log_softmax", {InputSpec{{3, 5}}}});
  c.push_back({"layernorm_default_axis", "layernorm", {InputSpec{{2, 3, 4}}, InputSpec{{4}}}});
  c.push_back({"log_softmax", "log_softmax", {InputSpec{{2, 5}}}, A({{"axis", int64_t{1}}})});
  c.push_back({"layernorm", "layernorm", {InputSpec{{2, 3, 4}}, InputSpec{{4}}, InputSpec{{4}}}, A({{"axis", int64_t{2}}, {"eps", 1e-5}})});
  c.push_back({"layernorm_2d", "layernorm", {InputSpec{{2, 3, 4}}, InputSpec{{3, 4}}}, A({{"axis", int64_t{1}}, {"eps", 1e-5}})});
  c.push_back({"softmax_cross_entropy", "softmax_cross_entropy", {InputSpec{{4, 5}}, InputSpec{{4}, DType::kI64, 0, 5, false}}});
  // A sharded rank's loss: labels -1 (padding) ignored, the sum divided by batch/devices.
  c.push_back({"softmax_cross_entropy_padded", "softmax_cross_entropy", {InputSpec{{8, 5}}, InputSpec{{8}, DType::kI64, -1, 5, false}},
               A({{"ignore_index", int64_t{-1}}, {"divisor", 2.5}})});
  c.push_back({"reshape", "reshape", {InputSpec{{2, 6}}}, A({{"shape", I{3, 4}}})});
  c.push_back({"transpose", "transpose", {InputSpec{{2, 3, 4}}}, A({{"perm", I{2, 0, 1}}})});
  c.push_back({"slice", "slice", {InputSpec{{4, 5}}}, A({{"axes", I{0, 1}}, {"starts", I{1, 4}}, {"ends", I{4, 0}}, {"steps", I{2, -2}}})});
  c.push_back({"concat", "concat", {InputSpec{{2, 3}}, InputSpec{{2, 1}}, InputSpec{{2, 2}}}, A({{"axis", int64_t{1}}})});
  c.push_back({"expand", "expand", {InputSpec{{3, 1}}}, A({{"shape", I{2, 3, 4}}})});
  c.push_back({"gather", "gather", {InputSpec{{5, 3}}, InputSpec{{2, 3}, DType::kI64, -5, 5, false}}, A({{"axis", int64_t{0}}})});
  c.push_back({"gather_axis1", "gather", {InputSpec{{2, 5, 3}}, InputSpec{{4}, DType::kI64, 0, 5, false}}, A({{"axis", int64_t{1}}})});
  // torch.gather: repeated indices accumulate in the scatter-add; indices smaller off the axis.
  c.push_back({"gather_elements", "gather_elements", {InputSpec{{3, 4}}, InputSpec{{5, 4}, DType::kI64, -3, 3, false}}, A({{"axis", int64_t{0}}})});
  c.push_back({"gather_elements_axis1", "gather_elements", {InputSpec{{3, 5}}, InputSpec{{2, 7}, DType::kI64, 0, 5, false}}, A({{"axis", int64_t{1}}})});
  // The scatter-adds as a forward op (a scatter the step computes: ScatterND / ScatterElements
  // with runtime indices or reduction 'add'): each added element's gradient is dY at its place.
  c.push_back({"gather_grad", "gather_grad", {InputSpec{{2, 4, 3}}, InputSpec{{4}, DType::kI64, -5, 5, false}},
               A({{"axis", int64_t{1}}, {"input_shape", I{2, 5, 3}}})});
  c.push_back({"gather_elements_grad", "gather_elements_grad", {InputSpec{{2, 3}}, InputSpec{{2, 3}, DType::kI64, 0, 4, false}},
               A({{"axis", int64_t{1}}, {"input_shape", I{3, 4}}})});
  c.push_back({"topk", "topk", {InputSpec{{3, 5}}}, A({{"axis", int64_t{1}}, {"k", int64_t{2}}, {"largest", int64_t{1}}}), 2});
  c.push_back({"topk_smallest_axis0", "topk", {InputSpec{{4, 3}}}, A({{"axis", int64_t{0}}, {"k", int64_t{3}}, {"largest", int64_t{0}}}), 2});
  c.push_back({"cumsum", "cumsum", {InputSpec{{3, 4}}}, A({{"axis", int64_t{1}}})});
  c.push_back({"cumsum_reverse_exclusive", "cumsum", {InputSpec{{3, 4}}}, A({{"axis", int64_t{0}}, {"exclusive", int64_t{1}}, {"reverse", int64_t{1}}})});
  c.push_back({"pad", "pad", {InputSpec{{2, 3}}}, A({{"pads", I{1, 0, 0, 2}}, {"mode", std::string("constant")}, {"value", 0.0}})});
  // A strided write into zeros (Col2Im's placements): the gradient reads the slice back.
  c.push_back({"slice_grad", "slice_grad", {InputSpec{{2, 3}}},
               A({{"axes", I{0, 1}}, {"starts", I{1, 0}}, {"ends", I{4, 7}}, {"steps", I{2, 3}}, {"input_shape", I{5, 8}}})});
  // Mirrored coordinates accumulate; a pad wider than the dim mirrors periodically (reflect).
  c.push_back({"pad_reflect", "pad", {InputSpec{{2, 3, 4}}}, A({{"pads", I{0, 2, 1, 0, 1, 5}}, {"mode", std::string("reflect")}})});
  c.push_back({"pad_edge", "pad", {InputSpec{{2, 3, 4}}}, A({{"pads", I{0, 2, 0, 1, 0, 3}}, {"mode", std::string("edge")}})});
  c.push_back({"tile", "tile", {InputSpec{{2, 3}}}, A({{"repeats", I{2, 3}}})});
  c.push_back({"dropout_train", "dropout", {InputSpec{{4, 8}}}, A({{"ratio", 0.3}, {"seed", int64_t{7}}})});
  return c;
}

struct Built {
  Module module;
  ValueId loss;
  std::vector<ValueId> wrt;
  std::vector<std::string> wrt_names;
};

Built build(const GradCase& c, std::mt19937& rng, std::map<std::string, Tensor>& feeds) {
  Built b;
  std::vector<ValueId> inputs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& s = c.inputs[i];
    Tensor t = testing::random_tensor(s.dtype, s.shape, rng, s.lo, s.hi);
    if (s.differentiable) {
      const std::string name = "in" + std::to_string(i);
      ValueId v = b.module.add_argument(name, TensorType{s.dtype, s.shape}, Role::kInput);
      feeds[name] = t;
      b.wrt.push_back(v);
      b.wrt_names.push_back(name);
      inputs.push_back(v);
    } else {
      inputs.push_back(b.module.add_constant(t, "k"));
    }
  }
  auto y = b.module.add_node(c.op, inputs, c.attrs, c.label, c.num_outputs);
  MEMC_CHECK(y.ok(), y.status().message());
  const TensorType out = b.module.value((*y)[0]).type;
  ValueId r = b.module.add_constant(testing::random_tensor(out.dtype, out.shape, rng), "r");
  auto weighted = b.module.add_node("mul", {(*y)[0], r});
  auto loss = b.module.add_node("reduce_sum", {(*weighted)[0]}, A({{"axes", I{}}, {"keepdims", int64_t{0}}}));
  b.loss = (*loss)[0];
  return b;
}

double eval_loss(const Module& m, ValueId loss, const std::map<std::string, Tensor>& feeds, const ExecOptions& opts) {
  Module copy = m;
  copy.set_outputs({loss});
  auto out = execute(copy, feeds, opts);
  MEMC_CHECK(out.ok(), out.status().message());
  return (*out)[0].get_as_double(0);
}

class GradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradCheck, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  const unsigned seed = static_cast<unsigned>(std::hash<std::string>{}(c.label) & 0xffff);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::map<std::string, Tensor> feeds;
  Built b = build(c, rng, feeds);
  const ExecOptions opts{.training = true, .seed = 3, .step = 1};

  Module grad_module = b.module;
  Expected<std::vector<ValueId>> grads = Autodiff().run(grad_module, b.loss, b.wrt);
  ASSERT_TRUE(grads.ok()) << grads.status().message();
  grad_module.set_outputs(*grads);
  auto analytic = execute(grad_module, feeds, opts);
  ASSERT_TRUE(analytic.ok()) << analytic.status().message() << "\n" << print_module(grad_module);

  const double h = 1e-6;
  for (size_t k = 0; k < b.wrt.size(); ++k) {
    Tensor& x = feeds[b.wrt_names[k]];
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = x.get_as_double(i);
      x.set_from_double(i, saved + h);
      const double up = eval_loss(b.module, b.loss, feeds, opts);
      x.set_from_double(i, saved - h);
      const double down = eval_loss(b.module, b.loss, feeds, opts);
      x.set_from_double(i, saved);
      const double numeric = (up - down) / (2 * h);
      const double got = (*analytic)[k].get_as_double(i);
      ASSERT_NEAR(got, numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
          << c.label << ": d loss / d " << b.wrt_names[k] << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.label; });

// Every differentiable registered op has a rule or says it has none.
TEST(GradRules, EveryOpHasARuleOrSaysItHasNone) {
  // reduce_prod has no rule yet: autodiff refuses a model that needs it, naming the op
  // (AutodiffRefusesOpsWithoutARule below); no committed model uses it.
  const std::set<std::string> pending = {"reduce_prod"};
  for (const std::string& name : OpRegistry::get().names()) {
    const OpDef* def = OpRegistry::get().find(name);
    if (def->grad || (def->flags & kOpNoGradient) || pending.count(name)) continue;
    ADD_FAILURE() << "memc." << name << " has neither a gradient rule nor kOpNoGradient";
  }
}

TEST(GradRules, AutodiffRefusesOpsWithoutARule) {
  Module m;
  ValueId x = m.add_argument("x", TensorType{DType::kF64, {2, 3}}, Role::kParam);
  auto p = m.add_node("reduce_prod", {x}, A({{"axes", I{}}, {"keepdims", int64_t{0}}}), "node 'prod' (ReduceProd)");
  ASSERT_TRUE(p.ok());
  auto grads = Autodiff().run(m, (*p)[0], {x});
  ASSERT_FALSE(grads.ok());
  EXPECT_NE(grads.status().message().find("memc.reduce_prod (node 'prod' (ReduceProd)) has no gradient rule"), std::string::npos)
      << grads.status().message();
}

// nn.Embedding(padding_idx=p): a gather with `padding_idx` gives row p no gradient from the
// lookup, however often the indices name it (from the end too; a NaN of dY there included), and every other row the
// scatter-add of its rows of dY, as without the attribute.
TEST(GradRules, AnEmbeddingsPaddingRowGetsNoGradientFromItsLookup) {
  for (const int64_t pad : {int64_t{-1}, int64_t{1}}) {
    Module m;
    ValueId w = m.add_argument("w", TensorType{DType::kF32, {4, 2}}, Role::kParam);
    ValueId ids = m.add_argument("ids", TensorType{DType::kI64, {2, 3}}, Role::kInput);
    Attrs a = A({{"axis", int64_t{0}}});
    if (pad >= 0) a.set("padding_idx", pad);
    auto y = m.add_node("gather", {w, ids}, a);
    ASSERT_TRUE(y.ok());
    // dY = r: row i of the lookup gets weight i + 1; the lookup of row 1 at (0, 2) a NaN.
    Tensor r = Tensor::zeros(DType::kF32, {2, 3, 2});
    for (int64_t i = 0; i < 12; ++i) r.set_from_double(i, static_cast<double>(i / 2 + 1));
    r.set_from_double(4, std::nan(""));
    auto weighted = m.add_node("mul", {(*y)[0], m.add_constant(r, "r")});
    auto loss = m.add_node("reduce_sum", {(*weighted)[0]}, A({{"axes", I{}}, {"keepdims", int64_t{0}}}));
    auto grads = Autodiff().run(m, (*loss)[0], {w});
    ASSERT_TRUE(grads.ok()) << grads.status().message();
    m.set_outputs(*grads);
    Tensor at = Tensor::zeros(DType::kI64, {2, 3});
    const int64_t rows[] = {0, 3, 1, -3, 3, 0};  // -3: row 1 counted from the end
    for (int64_t i = 0; i < 6; ++i) at.set_from_double(i, static_cast<double>(rows[i]));
    auto out = execute(m, {{"w", Tensor::zeros(DType::kF32, {4, 2})}, {"ids", at}});
    ASSERT_TRUE(out.ok()) << out.status().message();
    const Tensor& dw = (*out)[0];
    EXPECT_EQ(dw.get_as_double(0), 1 + 6) << pad;  // row 0: lookups 0 and 5
    EXPECT_EQ(dw.get_as_double(6), 2 + 5) << pad;  // row 3: lookups 1 and 4
    EXPECT_EQ(dw.get_as_double(4), 0) << pad;      // row 2: never looked up
    if (pad == 1) {
      EXPECT_EQ(dw.get_as_double(2), 0);  // row 1: lookups 2 (NaN) and 3, left out
      EXPECT_EQ(dw.get_as_double(3), 0);
    } else {
      EXPECT_TRUE(std::isnan(dw.get_as_double(2)));
      EXPECT_EQ(dw.get_as_double(3), 3 + 4);
    }
  }
}

// The L2 norm of a zero vector: its gradient is PyTorch's subgradient 0, not 0/0 (Swin v2 normalizes
// the zero keys of padded window tokens); elsewhere x/‖x‖.
TEST(GradRules, TheNormOfAZeroVectorHasGradientZero) {
  Module m;
  ValueId x = m.add_argument("x", TensorType{DType::kF32, {2, 3}}, Role::kParam);
  auto y = m.add_node("reduce_l2", {x}, A({{"axes", I{1}}, {"keepdims", int64_t{0}}}));
  ASSERT_TRUE(y.ok());
  auto loss = m.add_node("reduce_sum", {(*y)[0]}, A({{"axes", I{}}, {"keepdims", int64_t{0}}}));
  auto grads = Autodiff().run(m, (*loss)[0], {x});
  ASSERT_TRUE(grads.ok()) << grads.status().message();
  m.set_outputs(*grads);
  Tensor at = Tensor::zeros(DType::kF32, {2, 3});
  at.set_from_double(3, 3.0), at.set_from_double(4, 4.0);  // rows (0, 0, 0) and (3, 4, 0)
  auto out = execute(m, {{"x", at}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ((*out)[0].get_as_double(i), 0.0) << i;
  EXPECT_NEAR((*out)[0].get_as_double(3), 0.6, 1e-7);
  EXPECT_NEAR((*out)[0].get_as_double(4), 0.8, 1e-7);
}

// At exactly 0, where no finite difference decides, ReLU and LeakyReLU take PyTorch's
// subgradients: relu' = 0 and leaky_relu' = alpha (its backward tests x > 0).
TEST(GradRules, ReluAndLeakyReluAtZeroTakePyTorchsSubgradients) {
  for (const char* op : {"relu", "leaky_relu"}) {
    Module m;
    ValueId x = m.add_argument("x", TensorType{DType::kF64, {3}}, Role::kParam);
    auto y = m.add_node(op, {x}, A({{"alpha", 0.25}}));
    ASSERT_TRUE(y.ok());
    auto loss = m.add_node("reduce_sum", {(*y)[0]}, A({{"axes", I{}}, {"keepdims", int64_t{0}}}));
    auto grads = Autodiff().run(m, (*loss)[0], {x});
    ASSERT_TRUE(grads.ok()) << grads.status().message();
    m.set_outputs(*grads);
    Tensor at = Tensor::zeros(DType::kF64, {3});
    at.set_from_double(0, -1.0), at.set_from_double(2, 1.0);  // -1, 0, 1
    auto out = execute(m, {{"x", at}});
    ASSERT_TRUE(out.ok()) << out.status().message();
    const double slope = std::string(op) == "relu" ? 0.0 : 0.25;
    EXPECT_EQ((*out)[0].get_as_double(0), slope) << op;
    EXPECT_EQ((*out)[0].get_as_double(1), slope) << op << " at 0";
    EXPECT_EQ((*out)[0].get_as_double(2), 1.0) << op;
  }
}

// max's and min's tie rule: "first" (the default) gives a tie to the first operand, "second" to
// the second, "split" half to each; anything else is refused by name.
TEST(GradRules, MaxAndMinGiveATieAsTheirAttributeSays) {
  struct Case {
    const char* ties;
    double da, db;
  };
  for (const char* op : {"max", "min"}) {
    for (const Case& c : {Case{"", 1, 0}, Case{"first", 1, 0}, Case{"second", 0, 1}, Case{"split", 0.5, 0.5}}) {
      Module m;
      ValueId a = m.add_argument("a", TensorType{DType::kF64, {2}}, Role::kParam);
      ValueId b = m.add_argument("b", TensorType{DType::kF64, {2}}, Role::kParam);
      Attrs attrs;
      if (*c.ties) attrs.set("ties", std::string(c.ties));
      auto y = m.add_node(op, {a, b}, attrs);
      ASSERT_TRUE(y.ok());
      auto loss = m.add_node("reduce_sum", {(*y)[0]}, A({{"axes", I{}}, {"keepdims", int64_t{0}}}));
      auto grads = Autodiff().run(m, (*loss)[0], {a, b});
      ASSERT_TRUE(grads.ok()) << grads.status().message();
      m.set_outputs(*grads);
      Tensor ta = Tensor::zeros(DType::kF64, {2}), tb = Tensor::zeros(DType::kF64, {2});
      ta.set_from_double(1, std::string(op) == "max" ? 1.0 : -1.0);  // element 0 ties, a wins element 1
      auto out = execute(m, {{"a", ta}, {"b", tb}});
      ASSERT_TRUE(out.ok()) << out.status().message();
      EXPECT_EQ((*out)[0].get_as_double(0), c.da) << op << " " << c.ties;
      EXPECT_EQ((*out)[1].get_as_double(0), c.db) << op << " " << c.ties;
      EXPECT_EQ((*out)[0].get_as_double(1), 1.0) << op << " " << c.ties;
      EXPECT_EQ((*out)[1].get_as_double(1), 0.0) << op << " " << c.ties;
    }
  }
  Module m;
  ValueId a = m.add_argument("a", TensorType{DType::kF64, {2}}, Role::kParam);
  auto y = m.add_node("max", {a, a}, A({{"ties", std::string("middle")}}));
  ASSERT_TRUE(y.ok());
  auto loss = m.add_node("reduce_sum", {(*y)[0]}, A({{"axes", I{}}, {"keepdims", int64_t{0}}}));
  auto grads = Autodiff().run(m, (*loss)[0], {a});
  ASSERT_FALSE(grads.ok());
  EXPECT_NE(grads.status().message().find("'ties' is 'middle'"), std::string::npos) << grads.status().message();
}

// reduce_max's and reduce_min's ties: "split" (the default) shares the gradient evenly, as
// torch.amax does; "first" gives it to the first tied element in row-major order over the
// reduced axes, as max(dim) and adaptive max pooling do. The gradient's sum is dy either way.
TEST(GradRules, ReduceMaxAndMinShareOrGiveATieAsTheirAttributeSays) {
  for (const char* op : {"reduce_max", "reduce_min"}) {
    for (const char* ties : {"", "split", "first"}) {
      Module m;
      ValueId x = m.add_argument("x", TensorType{DType::kF64, {2, 2, 3}}, Role::kParam);
      Attrs attrs = A({{"axes", I{1, 2}}, {"keepdims", int64_t{0}}});
      if (*ties) attrs.set("ties", std::string(ties));
      auto y = m.add_node(op, {x}, attrs);
      ASSERT_TRUE(y.ok());
      // dy = [1, 10] for the two rows
      Tensor r = Tensor::zeros(DType::kF64, {2});
      r.set_from_double(0, 1), r.set_from_double(1, 10);
      auto weighted = m.add_node("mul", {(*y)[0], m.add_constant(r, "r")});
      auto loss = m.add_node("reduce_sum", {(*weighted)[0]}, A({{"axes", I{}}, {"keepdims", int64_t{0}}}));
      auto grads = Autodiff().run(m, (*loss)[0], {x});
      ASSERT_TRUE(grads.ok()) << grads.status().message();
      m.set_outputs(*grads);
      // Row 0: the extreme 5 (or -5) at flat positions 1, 4 and 5; row 1: one extreme at 3.
      const double sign = std::string(op) == "reduce_max" ? 1 : -1;
      const std::vector<double> v = {0, 5, 1, 2, 5, 5, 0, 1, 2, 7, 3, 4};
      Tensor at = Tensor::zeros(DType::kF64, {2, 2, 3});
      for (int64_t i = 0; i < 12; ++i) at.set_from_double(i, sign * v[i]);
      auto out = execute(m, {{"x", at}});
      ASSERT_TRUE(out.ok()) << out.status().message();
      const bool first = std::string(ties) == "first";
      for (int64_t i = 0; i < 12; ++i) {
        double want = 0;
        if (i == 1) want = first ? 1.0 : 1.0 / 3;
        if (i == 4 || i == 5) want = first ? 0.0 : 1.0 / 3;
        if (i == 9) want = 10;
        EXPECT_NEAR((*out)[0].get_as_double(i), want, 1e-12) << op << " ties '" << ties << "' at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace memc
