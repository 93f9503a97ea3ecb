// One check per ONNX op lowering: a tiny model in, the expected core ops out, and the
// numbers the CPU executor computes from it.
#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/frontend_onnx_builder.h"
#include "tests/test_util.h"

namespace memc {
namespace {

using testing::OnnxBuilder;
using testing::make_tensor;

Tensor run1(const Module& m, std::map<std::string, Tensor> feeds) {
  auto out = execute(m, feeds);
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? out->at(0) : Tensor();
}

ImportOptions raw() {
  ImportOptions o;
  o.fuse = false;
  return o;
}

void expect_values(const Tensor& t, std::vector<double> expected, double tol = 1e-5) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(expected.size()));
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_NEAR(t.get_as_double(i), expected[i], tol) << "element " << i;
}

struct UnaryCase {
  const char* onnx;
  const char* memc;
  std::function<double(double)> ref;
};

TEST(FrontendLowering, UnaryOps) {
  const UnaryCase cases[] = {
      {"Abs", "abs", [](double x) { return std::abs(x); }},       {"Neg", "neg", [](double x) { return -x; }},
      {"Sign", "sign", [](double x) { return (x > 0) - (x < 0); }}, {"Exp", "exp", [](double x) { return std::exp(x); }},
      {"Log", "log", [](double x) { return std::log(std::abs(x) + 1); }}, {"Sqrt", "sqrt", [](double x) { return std::sqrt(std::abs(x) + 1); }},
      {"Tanh", "tanh", [](double x) { return std::tanh(x); }},    {"Sigmoid", "sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }},
      {"Relu", "relu", [](double x) { return std::max(x, 0.0); }}, {"Erf", "erf", [](double x) { return std::erf(x); }},
      {"Floor", "floor", [](double x) { return std::floor(x); }}, {"Ceil", "ceil", [](double x) { return std::ceil(x); }},
      {"Round", "round", [](double x) { return std::nearbyint(x); }}, {"Sin", "sin", [](double x) { return std::sin(x); }},
      {"Cos", "cos", [](double x) { return std::cos(x); }},       {"Softplus", "softplus", [](double x) { return std::log1p(std::exp(x)); }},
      {"Asin", "asin", [](double x) { return std::asin(x / 3); }}, {"Acos", "acos", [](double x) { return std::acos(x / 3); }},
      {"Atan", "atan", [](double x) { return std::atan(x); }},
      {"Reciprocal", "reciprocal", [](double x) { return 1 / x; }},
  };
  const std::vector<double> xs = {-1.7, -0.3, 0.4, 1.2, 2.6, -2.2};
  for (const auto& c : cases) {
    const bool shifted = std::string(c.onnx) == "Log" || std::string(c.onnx) == "Sqrt";
    const bool within_one = std::string(c.onnx) == "Asin" || std::string(c.onnx) == "Acos";  // their domain: [−1, 1]
    std::vector<double> in = xs;
    if (shifted) for (double& v : in) v = std::abs(v) + 1;
    if (within_one) for (double& v : in) v /= 3;
    OnnxBuilder b;
    b.input("x", {2, 3}).output("y").node(c.onnx, {"x"}, {"y"});
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << c.onnx << ": " << m.status().message();
    EXPECT_EQ(testing::count_op(*m, c.memc), 1) << c.onnx;
    Tensor y = run1(*m, {{"x", make_tensor(DType::kF32, {2, 3}, in)}});
    std::vector<double> expected;
    for (double v : xs) expected.push_back(c.ref(v));
    expect_values(y, expected, 1e-4);
  }
}

// Col2Im (F.fold) of non-overlapping blocks: element (c, ki, kj) of block (bi, bj) lands at
// image row bi·kh + ki, column bj·kw + kj.
TEST(FrontendLowering, Col2ImPlacesNonOverlappingBlocks) {
  const int64_t c = 2, kh = 2, kw = 3, hb = 2, wb = 2, h = hb * kh, w = wb * kw;
  std::vector<double> x(c * kh * kw * hb * wb);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i);
  auto model = [&](std::vector<double> strides) {
    OnnxBuilder b(18);
    b.input("x", {1, c * kh * kw, hb * wb}).output("y");
    b.init("image", make_tensor(DType::kI64, {2}, {static_cast<double>(h), static_cast<double>(w)}));
    b.init("block", make_tensor(DType::kI64, {2}, {static_cast<double>(kh), static_cast<double>(kw)}));
    auto& node = b.node("Col2Im", {"x", "image", "block"}, {"y"});
    auto* a = node.add_attribute();
    a->set_name("strides");
    a->set_type(onnx::AttributeProto::INTS);
    for (double s : strides) a->add_ints(static_cast<int64_t>(s));
    return b;
  };
  auto m = model({kh, kw}).import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  Tensor y = run1(*m, {{"x", make_tensor(DType::kF32, {1, c * kh * kw, hb * wb}, x)}});
  ASSERT_EQ(y.shape(), (Shape{1, c, h, w}));
  std::vector<double> expected(c * h * w);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t ki = 0; ki < kh; ++ki)
      for (int64_t kj = 0; kj < kw; ++kj)
        for (int64_t bi = 0; bi < hb; ++bi)
          for (int64_t bj = 0; bj < wb; ++bj)
            expected[(ch * h + bi * kh + ki) * w + bj * kw + kj] = x[((ch * kh + ki) * kw + kj) * hb * wb + bi * wb + bj];
  expect_values(y, expected, 0);
}

// Col2Im in general (volo's outlook attention folds 3x3 blocks at stride 2 with padding 1):
// overlapping blocks add, padding is cut away, dilation spreads a block. Against a direct
// scatter: element (c, ki, kj) of block (bi, bj) adds to row bi·sh + ki·dh − pt, column
// bj·sw + kj·dw − pl where that lies inside the image.
TEST(FrontendLowering, Col2ImAddsOverlappingPaddedAndDilatedBlocks) {
  struct Case {
    int64_t h, w, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr;
  };
  for (const Case& k : {Case{4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1}, Case{5, 6, 2, 3, 1, 2, 1, 1, 0, 1, 0, 1}, Case{7, 5, 2, 2, 2, 1, 2, 1, 1, 0, 0, 0},
                        Case{4, 6, 2, 3, 2, 3, 1, 1, 0, 0, 0, 0}}) {
    const int64_t c = 2, lh = (k.h + k.pt + k.pb - k.dh * (k.kh - 1) - 1) / k.sh + 1, lw = (k.w + k.pl + k.pr - k.dw * (k.kw - 1) - 1) / k.sw + 1;
    OnnxBuilder b(18);
    b.input("x", {1, c * k.kh * k.kw, lh * lw}).output("y");
    b.init("image", make_tensor(DType::kI64, {2}, {static_cast<double>(k.h), static_cast<double>(k.w)}));
    b.init("block", make_tensor(DType::kI64, {2}, {static_cast<double>(k.kh), static_cast<double>(k.kw)}));
    auto& node = b.node("Col2Im", {"x", "image", "block"}, {"y"});
    testing::attr_ints(node, "strides", {k.sh, k.sw});
    testing::attr_ints(node, "dilations", {k.dh, k.dw});
    testing::attr_ints(node, "pads", {k.pt, k.pl, k.pb, k.pr});
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    std::vector<double> x(c * k.kh * k.kw * lh * lw);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>((i * 7) % 13) - 6.0;
    Tensor y = run1(*m, {{"x", make_tensor(DType::kF32, {1, c * k.kh * k.kw, lh * lw}, x)}});
    ASSERT_EQ(y.shape(), (Shape{1, c, k.h, k.w}));
    std::vector<double> expected(c * k.h * k.w, 0.0);
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t ki = 0; ki < k.kh; ++ki)
        for (int64_t kj = 0; kj < k.kw; ++kj)
          for (int64_t bi = 0; bi < lh; ++bi)
            for (int64_t bj = 0; bj < lw; ++bj) {
              const int64_t r = bi * k.sh + ki * k.dh - k.pt, col = bj * k.sw + kj * k.dw - k.pl;
              if (r < 0 || r >= k.h || col < 0 || col >= k.w) continue;
              expected[(ch * k.h + r) * k.w + col] += x[((ch * k.kh + ki) * k.kw + kj) * lh * lw + bi * lw + bj];
            }
    expect_values(y, expected, 1e-5);
  }
}

// Stochastic depth as transformers' DropPath exports it, x/keep · floor(rand([N, 1]) + keep),
// as timm's bernoulli_ does ((x · (rand < keep))/keep) and as LeViT's rand.ge_(drop) does
// ((rand ≥ 1 − keep)/keep · x): in training each sample's row is kept
// (x/keep) or dropped (0) by a seeded draw; in inference the draw is its expectation, so y = x.
// A uniform draw used otherwise is refused in one line.
TEST(FrontendLowering, StochasticDepthDrawsPerSampleAndIsTheIdentityInInference) {
  const int64_t n = 64;
  std::vector<double> xs(n * 3);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = 1.0 + static_cast<double>(i % 7);
  const Tensor x = make_tensor(DType::kF32, {n, 3}, xs);
  for (const std::string form : {"Floor", "Less", "GreaterOrEqual"}) {
    SCOPED_TRACE(form);
    OnnxBuilder b(17);
    b.input("x", {n, 3}).output("y");
    b.init("shape", make_tensor(DType::kI64, {2}, {static_cast<double>(n), 1}));
    b.init("keep", make_tensor(DType::kF32, {}, {0.75}));
    b.init("drop", make_tensor(DType::kF32, {}, {0.25}));
    b.node("ConstantOfShape", {"shape"}, {"zeros"});
    b.node("RandomUniformLike", {"zeros"}, {"u"});
    if (form == "Floor") {
      b.node("Add", {"u", "keep"}, {"sum"});
      b.node("Floor", {"sum"}, {"mask"});
    } else {
      b.node(form, {"u", form == "Less" ? "keep" : "drop"}, {"compared"});
      testing::attr_i(b.node("Cast", {"compared"}, {"mask"}), "to", onnx::TensorProto::FLOAT);
    }
    // The three products a mask scales: x/keep · mask (transformers), mask/keep · x past a
    // detach()'s Identity (LeViT), (x · mask)/keep (timm).
    if (form == "Floor") {
      b.node("Div", {"x", "keep"}, {"scaled"});
      b.node("Mul", {"scaled", "mask"}, {"y"});
    } else if (form == "GreaterOrEqual") {
      b.node("Div", {"mask", "keep"}, {"scaled_mask"});
      b.node("Identity", {"scaled_mask"}, {"detached"});
      b.node("Mul", {"x", "detached"}, {"y"});
    } else {
      b.node("Mul", {"x", "mask"}, {"masked"});
      b.node("Div", {"masked", "keep"}, {"y"});
    }
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(testing::count_op(*m, "dropout"), 1);
    expect_values(run1(*m, {{"x", x}}), xs, 1e-6);  // inference: the identity
    auto trained = execute(*m, {{"x", x}}, ExecOptions{.training = true, .seed = 5, .step = 1});
    ASSERT_TRUE(trained.ok()) << trained.status().message();
    int kept = 0;
    for (int64_t r = 0; r < n; ++r) {
      const double first = trained->at(0).get_as_double(r * 3);
      const bool row_kept = first != 0.0;
      kept += row_kept;
      for (int64_t c = 0; c < 3; ++c) {
        EXPECT_NEAR(trained->at(0).get_as_double(r * 3 + c), row_kept ? xs[r * 3 + c] / 0.75 : 0.0, 1e-5) << "row " << r;
      }
    }
    EXPECT_GT(kept, 0.75 * n - 5 * std::sqrt(0.75 * 0.25 * n));
    EXPECT_LT(kept, 0.75 * n + 5 * std::sqrt(0.75 * 0.25 * n));
  }
  // A draw used otherwise, or a mask that does not scale a product divided by keep (AlphaDropout
  // mixes it affinely: its expectation would not give back x), is refused.
  for (const bool masked : {false, true}) {
    OnnxBuilder other(17);
    other.input("x", {2, 3}).output("y");
    other.init("keep", make_tensor(DType::kF32, {}, {0.75}));
    other.node("RandomUniformLike", {"x"}, {"u"});
    if (masked) {
      other.node("Add", {"u", "keep"}, {"sum"});
      other.node("Floor", {"sum"}, {"mask"});
      other.node("Add", {"x", "mask"}, {"y"});
    } else {
      other.node("Add", {"x", "u"}, {"y"});
    }
    auto refused = other.import(raw());
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("(RandomUniformLike, opset 17): unsupported op"), std::string::npos) << refused.status().message();
  }
}

TEST(FrontendLowering, BinaryOpsBroadcastAndKeepDtypes) {
  struct Case { const char* onnx; const char* memc; std::vector<double> expected; DType out; };
  // a = [1, 4, -3, 6] (2x2), b = [2, -1] (2): broadcast over rows.
  const Case cases[] = {
      {"Add", "add", {3, 3, -1, 5}, DType::kF32},   {"Sub", "sub", {-1, 5, -5, 7}, DType::kF32},
      {"Mul", "mul", {2, -4, -6, -6}, DType::kF32}, {"Div", "div", {0.5, -4, -1.5, -6}, DType::kF32},
      {"Max", "max", {2, 4, 2, 6}, DType::kF32},    {"Min", "min", {1, -1, -3, -1}, DType::kF32},
      {"Equal", "equal", {0, 0, 0, 0}, DType::kBool}, {"Less", "less", {1, 0, 1, 0}, DType::kBool},
      {"Greater", "greater", {0, 1, 0, 1}, DType::kBool}, {"LessOrEqual", "less_equal", {1, 0, 1, 0}, DType::kBool},
      {"GreaterOrEqual", "greater_equal", {0, 1, 0, 1}, DType::kBool},
  };
  for (const auto& c : cases) {
    OnnxBuilder b;
    b.input("a", {2, 2}).input("b", {2}).output("y").node(c.onnx, {"a", "b"}, {"y"});
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(testing::count_op(*m, c.memc), 1) << c.onnx;
    Tensor y = run1(*m, {{"a", make_tensor(DType::kF32, {2, 2}, {1, 4, -3, 6})}, {"b", make_tensor(DType::kF32, {2}, {2, -1})}});
    EXPECT_EQ(y.dtype(), c.out) << c.onnx;
    expect_values(y, c.expected);
  }
}

TEST(FrontendLowering, IntegerAndLogicOps) {
  OnnxBuilder b;
  b.input("a", {4}, onnx::TensorProto::INT64).input("p", {4}, onnx::TensorProto::BOOL).input("q", {4}, onnx::TensorProto::BOOL);
  b.ints("three", {3}).output("mod").output("and").output("or").output("xor").output("not");
  b.node("Mod", {"a", "three"}, {"mod"});
  b.node("And", {"p", "q"}, {"and"});
  b.node("Or", {"p", "q"}, {"or"});
  b.node("Xor", {"p", "q"}, {"xor"});
  b.node("Not", {"p"}, {"not"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto out = execute(*m, {{"a", make_tensor(DType::kI64, {4}, {-4, 5, 7, -1})},
                          {"p", make_tensor(DType::kBool, {4}, {1, 1, 0, 0})},
                          {"q", make_tensor(DType::kBool, {4}, {1, 0, 1, 0})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->at(0).dtype(), DType::kI64);
  expect_values(out->at(0), {2, 2, 1, 2});  // Python-style mod: sign of the divisor
  expect_values(out->at(1), {1, 0, 0, 0});
  expect_values(out->at(2), {1, 1, 1, 0});
  expect_values(out->at(3), {0, 1, 1, 0});
  expect_values(out->at(4), {0, 0, 1, 1});
}

TEST(FrontendLowering, PowCastsIntegerExponentAndVariadicOps) {
  OnnxBuilder b;
  b.input("x", {3}).ints("two", {2}).output("pow").output("sum").output("mean");
  b.node("Pow", {"x", "two"}, {"pow"});
  b.node("Sum", {"x", "x", "pow"}, {"sum"});
  b.node("Mean", {"x", "pow", "sum"}, {"mean"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {3}, {1, -2, 3})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  expect_values(out->at(0), {1, 4, 9});
  expect_values(out->at(1), {3, 0, 15});
  expect_values(out->at(2), {5.0 / 3, 2.0 / 3, 9});
}

TEST(FrontendLowering, ClipBothOpsets) {
  for (int64_t opset : {6, 13}) {
    OnnxBuilder b(opset);
    b.input("x", {4}).output("y");
    if (opset < 11) {
      auto& n = b.node("Clip", {"x"}, {"y"});
      testing::attr_f(n, "min", -1);
      testing::attr_f(n, "max", 2);
    } else {
      b.scalar("lo", -1).scalar("hi", 2).node("Clip", {"x", "lo", "hi"}, {"y"});
    }
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    expect_values(run1(*m, {{"x", make_tensor(DType::kF32, {4}, {-3, 0.5, 1.5, 7})}}), {-1, 0.5, 1.5, 2});
  }
}

// At a clip's boundary the input gets no gradient, as PyTorch's clamp, hardtanh, relu6,
// hardsigmoid and hardswish give (MobileNetV2's dead channels sit at ReLU6's 0 exactly); Max and
// Min split a tie in halves, as torch.maximum and torch.minimum do. The expected values are
// torch 2.15's gradients at these points.
TEST(FrontendLowering, ClipsAndMaxTakePyTorchsGradientsAtTheirBoundaries) {
  struct Case {
    const char* op;
    std::vector<double> dx, dbound;  // dbound: Max's / Min's second operand
  };
  const double sixth = 1.0 / 6;
  const Case cases[] = {
      {"Clip", {0, 0, 0, 1, 1, 0}, {}},
      {"HardSigmoid", {0, sixth, sixth, sixth, 0, 0}, {}},
      {"HardSwish", {0, sixth, 0.5, 5 * sixth, 1, 1}, {}},
      {"Max", {0, 0, 0.5, 1, 1, 1}, {1, 1, 0.5, 0, 0, 0}},
      {"Min", {1, 1, 1, 1, 0.5, 0}, {0, 0, 0, 0, 0.5, 1}},
  };
  for (const Case& c : cases) {
    const std::string op = c.op;
    OnnxBuilder b(17);
    b.input("x", {6}).output("y");
    if (op == "Clip") {
      b.scalar("lo", 0).scalar("hi", 6).node("Clip", {"x", "lo", "hi"}, {"y"});
    } else if (op == "Max" || op == "Min") {
      b.input("bound", {6}).node(op, {"x", "bound"}, {"y"});
    } else {
      auto& n = b.node(op, {"x"}, {"y"});
      if (op == "HardSigmoid") testing::attr_f(n, "alpha", 1.0f / 6);
    }
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    std::vector<std::string> wrt = {"x"};
    if (!c.dbound.empty()) wrt.push_back("bound");
    const double bound = op == "Min" ? 3 : 0;
    auto out = testing::input_gradients(*m, wrt, {{"x", make_tensor(DType::kF32, {6}, {-3, -1, 0, 1, 3, 6})},
                                                  {"bound", make_tensor(DType::kF32, {6}, {bound})}});
    ASSERT_TRUE(out.ok()) << op << ": " << out.status().message();
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_NEAR(out->at(0).get_as_double(i), c.dx[i], 1e-6) << op << " dx at " << i;
      if (!c.dbound.empty()) {
        EXPECT_NEAR(out->at(1).get_as_double(i), c.dbound[i], 1e-6) << op << " dbound at " << i;
      }
    }
  }
}

// Ceil mode lets a window overhang the input, even one wider than the input (EfficientNet's
// pooler: AvgPool2d(64, ceil_mode=True) over a 2×2 map): one window over the values inside.
TEST(FrontendLowering, CeilModePoolingWithAWindowWiderThanTheInput) {
  for (const char* op : {"AveragePool", "MaxPool"}) {
    OnnxBuilder b(17);
    b.input("x", {1, 1, 2, 2}).output("y");
    auto& n = b.node(op, {"x"}, {"y"});
    testing::attr_ints(n, "kernel_shape", {64, 64});
    testing::attr_ints(n, "strides", {64, 64});
    testing::attr_i(n, "ceil_mode", 1);
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << op << ": " << m.status().message();
    expect_values(run1(*m, {{"x", make_tensor(DType::kF32, {1, 1, 2, 2}, {1, 2, 3, 6})}}), {op == std::string("MaxPool") ? 6.0 : 3.0});
  }
  OnnxBuilder floor(17);  // without ceil mode such a window has no output: one line
  floor.input("x", {1, 1, 2, 2}).output("y");
  testing::attr_ints(floor.node("AveragePool", {"x"}, {"y"}), "kernel_shape", {3, 3});
  auto refused = floor.import(raw());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the window (3) is larger than the padded input on spatial axis 0"), std::string::npos)
      << refused.status().message();
}

TEST(FrontendLowering, CastCastLikeWhereLeakyReluGelu) {
  OnnxBuilder b(20);
  b.input("x", {4}).input("i", {4}, onnx::TensorProto::INT64).output("c").output("cl").output("w").output("lr").output("g");
  auto& cast = b.node("Cast", {"x"}, {"c"});
  testing::attr_i(cast, "to", onnx::TensorProto::INT64);
  b.node("CastLike", {"i", "x"}, {"cl"});
  b.scalar("zero", 0).node("Greater", {"x", "zero"}, {"pos"});
  b.node("Where", {"pos", "x", "zero"}, {"w"});
  auto& lr = b.node("LeakyRelu", {"x"}, {"lr"});
  testing::attr_f(lr, "alpha", 0.1f);
  b.node("Gelu", {"x"}, {"g"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {4}, {-2, -0.5, 1.5, 3})}, {"i", make_tensor(DType::kI64, {4}, {1, 2, 3, 4})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->at(0).dtype(), DType::kI64);
  expect_values(out->at(0), {-2, 0, 1, 3});
  EXPECT_EQ(out->at(1).dtype(), DType::kF32);
  expect_values(out->at(2), {0, 0, 1.5, 3});
  expect_values(out->at(3), {-0.2, -0.05, 1.5, 3});
  expect_values(out->at(4), {-2 * 0.5 * std::erfc(2 / std::sqrt(2.0)), -0.5 * 0.5 * std::erfc(0.5 / std::sqrt(2.0)),
                             1.5 * 0.5 * std::erfc(-1.5 / std::sqrt(2.0)), 3 * 0.5 * std::erfc(-3 / std::sqrt(2.0))}, 1e-4);
}

TEST(FrontendLowering, ShapeOpsFoldToStaticAttrs) {
  // Reshape with 0 and -1, Squeeze/Unsqueeze (input axes), Flatten, Transpose, Shape, Size.
  OnnxBuilder b(13);
  b.input("x", {2, 3, 4}).output("r").output("u").output("f").output("t").output("s").output("n");
  b.ints("shape", {0, -1}).node("Reshape", {"x", "shape"}, {"r"});
  b.ints("ax", {0, 3}).node("Unsqueeze", {"x", "ax"}, {"u4"});
  b.node("Squeeze", {"u4", "ax"}, {"sq"});
  b.node("Identity", {"u4"}, {"u"});
  auto& fl = b.node("Flatten", {"sq"}, {"f"});
  testing::attr_i(fl, "axis", 2);
  auto& tr = b.node("Transpose", {"x"}, {"t"});
  testing::attr_ints(tr, "perm", {2, 0, 1});
  b.node("Shape", {"x"}, {"s"});
  b.node("Size", {"x"}, {"n"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  const auto& outs = m->outputs();
  EXPECT_EQ(m->value(outs[0]).type.shape, (Shape{2, 12}));
  EXPECT_EQ(m->value(outs[1]).type.shape, (Shape{1, 2, 3, 1, 4}));
  EXPECT_EQ(m->value(outs[2]).type.shape, (Shape{6, 4}));
  EXPECT_EQ(m->value(outs[3]).type.shape, (Shape{4, 2, 3}));
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {2, 3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->at(3).get_as_double(1), 4);  // t[0][0][1] = x[0][1][0]
  expect_values(out->at(4), {2, 3, 4});
  expect_values(out->at(5), {24});
}

TEST(FrontendLowering, SqueezeUnsqueezeAxesAttributeBefore13) {
  OnnxBuilder b(11);
  b.input("x", {3, 1}).output("y");
  auto& sq = b.node("Squeeze", {"x"}, {"s"});
  testing::attr_ints(sq, "axes", {-1});
  auto& un = b.node("Unsqueeze", {"s"}, {"y"});
  testing::attr_ints(un, "axes", {0});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->value(m->outputs()[0]).type.shape, (Shape{1, 3}));
}

TEST(FrontendLowering, SliceNegativeAndReversedSteps) {
  OnnxBuilder b;
  b.input("x", {6}).output("a").output("r");
  b.ints("s1", {-4}).ints("e1", {INT64_MAX}).node("Slice", {"x", "s1", "e1"}, {"a"});
  b.ints("s2", {-1}).ints("e2", {INT64_MIN}).ints("ax", {0}).ints("st", {-2}).node("Slice", {"x", "s2", "e2", "ax", "st"}, {"r"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {6}, {0, 1, 2, 3, 4, 5})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  expect_values(out->at(0), {2, 3, 4, 5});
  expect_values(out->at(1), {5, 3, 1});
}

TEST(FrontendLowering, SplitAcrossOpsets) {
  for (int64_t opset : {11, 13, 18}) {
    OnnxBuilder b(opset);
    b.input("x", {5, 2}).output("a").output("b");
    auto& n = b.node("Split", opset >= 13 && opset < 18 ? std::vector<std::string>{"x", "sizes"} : std::vector<std::string>{"x"}, {"a", "b"});
    if (opset < 13) testing::attr_ints(n, "split", {3, 2});
    else if (opset < 18) b.ints("sizes", {3, 2});
    else testing::attr_i(n, "num_outputs", 2);
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << opset << ": " << m.status().message();
    EXPECT_EQ(m->value(m->outputs()[0]).type.shape, (Shape{3, 2})) << opset;
    EXPECT_EQ(m->value(m->outputs()[1]).type.shape, (Shape{2, 2})) << opset;
    auto out = execute(*m, {{"x", make_tensor(DType::kF32, {5, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9})}});
    ASSERT_TRUE(out.ok());
    expect_values(out->at(1), {6, 7, 8, 9});
  }
}

// torch's dynamo exporter without its optimizer writes tensor.split(n, dim) as SplitToSequence
// read by SequenceAt (GPT-2's q/k/v, the export memc's Python package makes): the sequence's
// items are slices; a scalar split makes chunks (the last shorter), none makes pieces of 1,
// squeezed without keepdims; a negative position counts from the end.
TEST(FrontendLowering, SplitToSequenceReadBySequenceAt) {
  const Tensor x = make_tensor(DType::kF32, {5, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  {
    OnnxBuilder b(20);
    b.input("x", {5, 2}).output("a").output("c");
    b.scalar("two", 2, DType::kI64).scalar("zero", 0, DType::kI64).scalar("minus_one", -1, DType::kI64);
    b.node("SplitToSequence", {"x", "two"}, {"seq"});
    b.node("SequenceAt", {"seq", "zero"}, {"a"});
    b.node("SequenceAt", {"seq", "minus_one"}, {"c"});
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->value(m->outputs()[0]).type.shape, (Shape{2, 2}));
    EXPECT_EQ(m->value(m->outputs()[1]).type.shape, (Shape{1, 2}));  // 5 = 2 + 2 + 1
    auto out = execute(*m, {{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().message();
    expect_values(out->at(0), {0, 1, 2, 3});
    expect_values(out->at(1), {8, 9});
  }
  {
    OnnxBuilder b(20);
    b.input("x", {5, 2}).output("b");
    b.scalar("one", 1, DType::kI64);
    auto& n = b.node("SplitToSequence", {"x"}, {"seq"});
    testing::attr_i(n, "axis", 1);
    testing::attr_i(n, "keepdims", 0);
    b.node("SequenceAt", {"seq", "one"}, {"b"});
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->value(m->outputs()[0]).type.shape, (Shape{5}));
    auto out = execute(*m, {{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status().message();
    expect_values(out->at(0), {1, 3, 5, 7, 9});
  }
  {  // a position past the end: one line naming the node
    OnnxBuilder b(20);
    b.input("x", {5, 2}).output("b");
    b.scalar("nine", 9, DType::kI64).ints("sizes", {3, 2});
    b.node("SplitToSequence", {"x", "sizes"}, {"seq"});
    b.node("SequenceAt", {"seq", "nine"}, {"b"}, "at_nine");
    auto m = b.import(raw());
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("node 'at_nine' (SequenceAt, opset 20): position is outside the sequence of 2"), std::string::npos)
        << m.status().message();
  }
}

TEST(FrontendLowering, ConcatGatherExpandTilePad) {
  OnnxBuilder b;
  b.input("x", {2, 2}).input("ids", {3}, onnx::TensorProto::INT64).output("c").output("g").output("e").output("t").output("p");
  auto& c = b.node("Concat", {"x", "x"}, {"c"});
  testing::attr_i(c, "axis", -1);
  b.node("Gather", {"x", "ids"}, {"g"});
  b.ints("eshape", {3, 1, 2}).node("Expand", {"x", "eshape"}, {"e"});
  b.ints("reps", {1, 2}).node("Tile", {"x", "reps"}, {"t"});
  b.ints("pads", {0, 1, 0, 0}).scalar("pv", 9).node("Pad", {"x", "pads", "pv"}, {"p"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {2, 2}, {1, 2, 3, 4})}, {"ids", make_tensor(DType::kI64, {3}, {1, -2, 1})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  expect_values(out->at(0), {1, 2, 1, 2, 3, 4, 3, 4});
  expect_values(out->at(1), {3, 4, 1, 2, 3, 4});
  EXPECT_EQ(out->at(2).shape(), (Shape{3, 2, 2}));
  expect_values(out->at(3), {1, 2, 1, 2, 3, 4, 3, 4});
  expect_values(out->at(4), {9, 1, 2, 9, 3, 4});
}

// GatherND with indices computed at run time (a sequence classifier picking each row's last
// token): the flat row index is computed in the graph. Negative components wrap; a component
// outside its dim is refused at run time, never read from another row.
TEST(FrontendLowering, GatherNDWithRuntimeIndices) {
  OnnxBuilder b;
  b.input("x", {2, 3, 2}).input("idx", {2, 2}, onnx::TensorProto::INT64).output("y");
  b.node("GatherND", {"x", "idx"}, {"y"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  const Tensor x = make_tensor(DType::kF32, {2, 3, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  auto out = execute(*m, {{"x", x}, {"idx", make_tensor(DType::kI64, {2, 2}, {0, 2, 1, -3})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->at(0).shape(), (Shape{2, 2}));
  expect_values(out->at(0), {5, 6, 7, 8});  // x[0, 2] and x[1, 0]
  for (const std::vector<double>& bad : {std::vector<double>{0, 3, 1, 0}, std::vector<double>{2, 0, 1, 0}, std::vector<double>{0, -4, 1, 0}}) {
    auto refused = execute(*m, {{"x", x}, {"idx", make_tensor(DType::kI64, {2, 2}, bad)}});
    ASSERT_FALSE(refused.ok()) << "index (" << bad[0] << ", " << bad[1] << ") read another row";
    EXPECT_NE(refused.status().message().find("index tuple 0 lies outside the data's dims"), std::string::npos) << refused.status().message();
  }
}

// A scatter the step computes (an MoE router's mask of its top-k experts: indices from TopK)
// or one that adds (index_add_): values as the ONNX spec's, and both data and updates train.
// The loss weighs y by w, so an update's gradient is w at the place it landed, and the data's is
// w where no update did (everywhere for 'add').
TEST(FrontendLowering, ScattersWithRuntimeIndicesOrAddingTrainDataAndUpdates) {
  struct Case {
    const char* op;
    const char* reduction;
    Shape data, idx, upd;
    std::vector<double> indices, y, dx, du;
  };
  // data x = 1..8, updates u = 10, 20, …; w = 0.5, 1.5, …
  const Case cases[] = {
      // rows 0: places 1 and 3; row 1: places 0 and 3 (−1)
      {"ScatterElements", "none", {2, 4}, {2, 2}, {2, 2}, {1, 3, 0, -1},
       {1, 10, 3, 20, 30, 6, 7, 40}, {0.5, 0, 2.5, 0, 0, 5.5, 6.5, 0}, {1.5, 3.5, 4.5, 7.5}},
      // a duplicate (row 0's place 2 twice) writes the mean and shares its gradient
      {"ScatterElements", "none", {2, 4}, {2, 2}, {2, 2}, {2, 2, 0, 1},
       {1, 2, 15, 4, 30, 40, 7, 8}, {0.5, 1.5, 0, 3.5, 0, 0, 6.5, 7.5}, {1.25, 1.25, 4.5, 5.5}},
      {"ScatterElements", "add", {2, 4}, {2, 2}, {2, 2}, {2, 2, 0, 1},
       {1, 2, 33, 4, 35, 46, 7, 8}, {0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5}, {2.5, 2.5, 4.5, 5.5}},
      // ScatterND: rows 3 and 0 of x [4, 2]
      {"ScatterND", "none", {4, 2}, {2, 1}, {2, 2}, {3, 0},
       {30, 40, 3, 4, 5, 6, 10, 20}, {0, 0, 2.5, 3.5, 4.5, 5.5, 0, 0}, {6.5, 7.5, 0.5, 1.5}},
      {"ScatterND", "add", {4, 2}, {2, 1}, {2, 2}, {3, 3},
       {1, 2, 3, 4, 5, 6, 47, 68}, {0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5}, {6.5, 7.5, 6.5, 7.5}},
  };
  for (const Case& c : cases) {
    const std::string label = std::string(c.op) + " " + c.reduction;
    OnnxBuilder b(18);
    b.input("x", c.data).input("idx", c.idx, onnx::TensorProto::INT64).input("u", c.upd).output("z");
    std::vector<double> w, x, u;
    for (int64_t i = 0; i < numel(c.data); ++i) w.push_back(0.5 + i), x.push_back(1 + i);
    for (int64_t i = 0; i < numel(c.upd); ++i) u.push_back(10 * (i + 1));
    b.init("w", make_tensor(DType::kF32, c.data, w));
    auto& n = b.node(c.op, {"x", "idx", "u"}, {"y"});
    testing::attr_s(n, "reduction", c.reduction);
    if (std::string(c.op) == "ScatterElements") testing::attr_i(n, "axis", 1);
    b.node("Mul", {"y", "w"}, {"z"});
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << label << ": " << m.status().message();
    const std::map<std::string, Tensor> feeds = {{"x", make_tensor(DType::kF32, c.data, x)},
                                                 {"idx", make_tensor(DType::kI64, c.idx, c.indices)},
                                                 {"u", make_tensor(DType::kF32, c.upd, u)}};
    auto z = execute(*m, feeds);
    ASSERT_TRUE(z.ok()) << label << ": " << z.status().message();
    std::vector<double> zw;
    for (size_t i = 0; i < c.y.size(); ++i) zw.push_back(c.y[i] * w[i]);
    expect_values(z->at(0), zw);
    auto g = testing::input_gradients(*m, {"x", "u"}, feeds);
    ASSERT_TRUE(g.ok()) << label << ": " << g.status().message();
    SCOPED_TRACE(label);
    expect_values(g->at(0), c.dx);
    expect_values(g->at(1), c.du);
  }
  // An index outside the data is refused at run time, as a gather's is.
  OnnxBuilder b(18);
  b.input("x", {2, 4}).input("idx", {2, 1}, onnx::TensorProto::INT64).input("u", {2, 1}).output("y");
  testing::attr_i(b.node("ScatterElements", {"x", "idx", "u"}, {"y"}), "axis", 1);
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto refused = execute(*m, {{"x", make_tensor(DType::kF32, {2, 4}, {0})}, {"idx", make_tensor(DType::kI64, {2, 1}, {1, 4})},
                              {"u", make_tensor(DType::kF32, {2, 1}, {1, 2})}});
  ASSERT_FALSE(refused.ok()) << "index 4 of a dim of 4 was scattered";
  EXPECT_NE(refused.status().message().find("scatter index 4 out of range for dim 4"), std::string::npos) << refused.status().message();
}

// TopK in torch.topk's and torch.sort's order (NaN the largest, ties to the lower index), for
// any dtype and any K (JetMoE sorts its 128 tokens' expert ids: an int64 TopK of K = n), and the
// values' gradient goes back to where each was taken.
TEST(FrontendLowering, TopKSortsAnyDtypeInTorchsOrderAndItsValuesTrain) {
  {
    OnnxBuilder b(17);
    b.input("ids", {6}, onnx::TensorProto::INT64).ints("k", {6}).output("v").output("i");
    testing::attr_i(b.node("TopK", {"ids", "k"}, {"v", "i"}), "largest", 0);
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    auto out = execute(*m, {{"ids", make_tensor(DType::kI64, {6}, {3, 1, 2, 1, 0, 3})}});
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(out->at(0).dtype(), DType::kI64);
    expect_values(out->at(0), {0, 1, 1, 2, 3, 3}, 0);
    expect_values(out->at(1), {4, 1, 3, 2, 0, 5}, 0);
  }
  {
    OnnxBuilder b(17);
    b.input("x", {1, 5}).ints("k", {3}).output("v").output("i");
    b.node("TopK", {"x", "k"}, {"v", "i"});
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    auto out = execute(*m, {{"x", make_tensor(DType::kF32, {1, 5}, {1, NAN, 3, 3, -1})}});
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_TRUE(std::isnan(out->at(0).get_as_double(0)));
    EXPECT_EQ(out->at(0).get_as_double(1), 3);
    EXPECT_EQ(out->at(0).get_as_double(2), 3);
    expect_values(out->at(1), {1, 2, 3}, 0);
  }
  OnnxBuilder b(17);
  b.input("x", {2, 4}).ints("k", {2}).output("z");
  b.init("w", make_tensor(DType::kF32, {2, 2}, {1, 2, 3, 4}));
  b.node("TopK", {"x", "k"}, {"v", "i"});
  b.node("Mul", {"v", "w"}, {"z"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  const Tensor x = make_tensor(DType::kF32, {2, 4}, {0.5, 4, -1, 2, 7, 6, 8, 5});
  expect_values(run1(*m, {{"x", x}}), {4 * 1, 2 * 2, 8 * 3, 7 * 4});
  auto g = testing::input_gradients(*m, {"x"}, {{"x", x}});
  ASSERT_TRUE(g.ok()) << g.status().message();
  expect_values(g->at(0), {0, 1, 0, 2, 4, 0, 3, 0});
}

// Trilu keeps the upper or lower triangle from diagonal k of the last two dims, and its gradient
// passes there only.
TEST(FrontendLowering, TriluKeepsATriangleAndItsGradient) {
  for (const bool upper : {true, false}) {
    OnnxBuilder b(14);
    b.input("x", {2, 3}).ints("k", {upper ? 1 : -1}).output("y");
    testing::attr_i(b.node("Trilu", {"x", "k"}, {"y"}), "upper", upper);
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << m.status().message();
    const Tensor x = make_tensor(DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6});
    expect_values(run1(*m, {{"x", x}}), upper ? std::vector<double>{0, 2, 3, 0, 0, 6} : std::vector<double>{0, 0, 0, 4, 0, 0});
    auto g = testing::input_gradients(*m, {"x"}, {{"x", x}});
    ASSERT_TRUE(g.ok()) << g.status().message();
    expect_values(g->at(0), upper ? std::vector<double>{0, 1, 1, 0, 0, 1} : std::vector<double>{0, 0, 0, 1, 0, 0});
  }
}

TEST(FrontendLowering, RangeConstantOfShapeFold) {
  OnnxBuilder b;
  b.input("x", {4}).output("y");
  b.scalar("s", 0, DType::kI64).scalar("l", 8, DType::kI64).scalar("d", 2, DType::kI64).node("Range", {"s", "l", "d"}, {"r"});
  b.node("Cast", {"r"}, {"rf"});
  testing::attr_i(*b.proto().mutable_graph()->mutable_node(1), "to", onnx::TensorProto::FLOAT);
  b.node("Shape", {"x"}, {"shp"});
  auto& cos = b.node("ConstantOfShape", {"shp"}, {"ones"});
  auto* v = cos.add_attribute();
  v->set_name("value");
  v->set_type(onnx::AttributeProto::TENSOR);
  tensor_to_proto(make_tensor(DType::kF32, {1}, {1}), *v->mutable_t());
  b.node("Add", {"rf", "ones"}, {"k"});
  b.node("Mul", {"x", "k"}, {"y"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(testing::count_op(*m, "mul"), 1);
  EXPECT_EQ(testing::count_op(*m, "add"), 0);  // folded
  expect_values(run1(*m, {{"x", make_tensor(DType::kF32, {4}, {1, 1, 2, 2})}}), {1, 3, 10, 14});
}

TEST(FrontendLowering, MatMulGemmConv) {
  OnnxBuilder b;
  b.input("a", {2, 3}).input("img", {1, 1, 3, 3}).output("mm").output("gemm").output("conv");
  b.init("w", make_tensor(DType::kF32, {3, 2}, {1, 0, 0, 1, 1, 1}));
  b.init("wt", make_tensor(DType::kF32, {2, 3}, {1, 0, 1, 0, 1, 1}));
  b.init("c", make_tensor(DType::kF32, {2}, {10, 20}));
  b.node("MatMul", {"a", "w"}, {"mm"});
  auto& g = b.node("Gemm", {"a", "wt", "c"}, {"gemm"});
  testing::attr_i(g, "transB", 1);
  testing::attr_f(g, "alpha", 2);
  testing::attr_f(g, "beta", 0.5);
  b.init("k", make_tensor(DType::kF32, {1, 1, 2, 2}, {1, 1, 1, 1}));
  auto& conv = b.node("Conv", {"img", "k"}, {"conv"});
  testing::attr_ints(conv, "strides", {1, 1});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(testing::count_op(*m, "conv"), 1);
  auto out = execute(*m, {{"a", make_tensor(DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6})},
                          {"img", make_tensor(DType::kF32, {1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  expect_values(out->at(0), {4, 5, 10, 11});
  expect_values(out->at(1), {2 * 4 + 5, 2 * 5 + 10, 2 * 10 + 5, 2 * 11 + 10});
  expect_values(out->at(2), {12, 16, 24, 28});
}

TEST(FrontendLowering, SoftmaxOpset11CoercesTo2D) {
  OnnxBuilder b(11);
  b.input("x", {2, 2}).output("y").output("l");
  b.node("Reshape", {"x", "s"}, {"x3"});
  b.ints("s", {1, 2, 2});
  auto& sm = b.node("Softmax", {"x3"}, {"y"});
  testing::attr_i(sm, "axis", 1);  // over the last 4 values together
  auto& lsm = b.node("LogSoftmax", {"x"}, {"l"});
  testing::attr_i(lsm, "axis", 1);
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {2, 2}, {0, 0, 0, 0})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  expect_values(out->at(0), {0.25, 0.25, 0.25, 0.25});
  expect_values(out->at(1), {std::log(0.5), std::log(0.5), std::log(0.5), std::log(0.5)});
}

TEST(FrontendLowering, ReductionsAxesAttributeOrInput) {
  struct Case { int64_t opset; const char* op; std::vector<double> expected; };
  const Case cases[] = {{13, "ReduceSum", {3, 7}},        {11, "ReduceSum", {3, 7}},   {17, "ReduceMean", {1.5, 3.5}},
                        {18, "ReduceMean", {1.5, 3.5}},    {18, "ReduceMax", {2, 4}},   {13, "ReduceMin", {1, 3}},
                        {18, "ReduceProd", {2, 12}},       {13, "ReduceSumSquare", {5, 25}}, {18, "ReduceL2", {std::sqrt(5.0), 5}}};
  for (const auto& c : cases) {
    OnnxBuilder b(c.opset);
    b.input("x", {2, 2}).output("y");
    const bool axes_input = std::string(c.op) == "ReduceSum" ? c.opset >= 13 : c.opset >= 18;
    auto& n = b.node(c.op, axes_input ? std::vector<std::string>{"x", "axes"} : std::vector<std::string>{"x"}, {"y"});
    if (axes_input) b.ints("axes", {-1});
    else testing::attr_ints(n, "axes", {-1});
    testing::attr_i(n, "keepdims", 0);
    auto m = b.import(raw());
    ASSERT_TRUE(m.ok()) << c.op << ": " << m.status().message();
    expect_values(run1(*m, {{"x", make_tensor(DType::kF32, {2, 2}, {1, 2, 3, 4})}}), c.expected, 1e-4);
  }
}

TEST(FrontendLowering, ArgMaxArgMinLayerNorm) {
  OnnxBuilder b;
  b.input("x", {2, 3}).output("amax").output("amin").output("ln");
  auto& a = b.node("ArgMax", {"x"}, {"amax"});
  testing::attr_i(a, "axis", 1);
  auto& i = b.node("ArgMin", {"x"}, {"amin"});
  testing::attr_i(i, "axis", -1);
  testing::attr_i(i, "keepdims", 0);
  b.init("g", make_tensor(DType::kF32, {3}, {1, 1, 1})).init("beta", make_tensor(DType::kF32, {3}, {0, 0, 1}));
  b.node("LayerNormalization", {"x", "g", "beta"}, {"ln"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(testing::count_op(*m, "layernorm"), 1);
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {2, 3}, {1, 5, 3, 6, 0, 2})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->at(0).shape(), (Shape{2, 1}));
  expect_values(out->at(0), {1, 0});
  expect_values(out->at(1), {0, 1});
  const double s = std::sqrt(8.0 / 3 + 1e-5);
  const double s2 = std::sqrt(168.0 / 27 + 1e-5);
  expect_values(out->at(2), {-2 / s, 2 / s, 1, (10.0 / 3) / s2, (-8.0 / 3) / s2, (-2.0 / 3) / s2 + 1}, 1e-4);
}

TEST(FrontendLowering, EinsumFormsFromBigBird) {
  OnnxBuilder b;
  b.input("q", {2, 1, 2, 3, 4}).input("k", {2, 1, 5, 4}).output("s").output("o");
  auto& e1 = b.node("Einsum", {"q", "k"}, {"s"});
  testing::attr_s(e1, "equation", "bhlqd,bhkd->bhlqk");
  auto& e2 = b.node("Einsum", {"s", "k"}, {"o"});
  testing::attr_s(e2, "equation", "bhlqk,bhkd->bhlqd");
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(testing::count_op(*m, "matmul"), 2);
  std::mt19937 rng(1);
  Tensor q = testing::random_tensor(DType::kF32, {2, 1, 2, 3, 4}, rng), k = testing::random_tensor(DType::kF32, {2, 1, 5, 4}, rng);
  auto out = execute(*m, {{"q", q}, {"k", k}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ(out->at(0).shape(), (Shape{2, 1, 2, 3, 5}));
  // s[b,0,l,q,k] = Σ_d q[b,0,l,q,d]·k[b,0,k,d]
  for (int bb = 0; bb < 2; ++bb)
    for (int l = 0; l < 2; ++l)
      for (int qi = 0; qi < 3; ++qi)
        for (int ki = 0; ki < 5; ++ki) {
          double acc = 0;
          for (int d = 0; d < 4; ++d) acc += q.get_as_double(((bb * 2 + l) * 3 + qi) * 4 + d) * k.get_as_double((bb * 5 + ki) * 4 + d);
          EXPECT_NEAR(out->at(0).get_as_double(((bb * 2 + l) * 3 + qi) * 5 + ki), acc, 1e-5);
        }
  EXPECT_EQ(out->at(1).shape(), (Shape{2, 1, 2, 3, 4}));
}

TEST(FrontendLowering, EinsumOuterProductWithBroadcastLetters) {
  OnnxBuilder b;
  b.input("a", {2, 3, 4}).input("c", {2, 5, 3, 6}).output("y");
  auto& e = b.node("Einsum", {"a", "c"}, {"y"});
  testing::attr_s(e, "equation", "blq,bhlk->bhlqk");
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->value(m->outputs()[0]).type.shape, (Shape{2, 5, 3, 4, 6}));
  std::mt19937 rng(2);
  Tensor a = testing::random_tensor(DType::kF32, {2, 3, 4}, rng), c = testing::random_tensor(DType::kF32, {2, 5, 3, 6}, rng);
  Tensor y = run1(*m, {{"a", a}, {"c", c}});
  // y[1,2,1,3,4] = a[1,1,3]·c[1,2,1,4]
  EXPECT_NEAR(y.get_as_double((((1 * 5 + 2) * 3 + 1) * 4 + 3) * 6 + 4), a.get_as_double((1 * 3 + 1) * 4 + 3) * c.get_as_double(((1 * 5 + 2) * 3 + 1) * 6 + 4), 1e-5);
}

// A constant training_mode decides. Without one, ONNX means inference, except in an export made
// in training mode (another Dropout's training_mode is true, or torch's exporter wrote it): there
// torch writes SDPA's attention dropout without training_mode, and PyTorch trains it.
TEST(FrontendLowering, DropoutTrainingModeDecidesIdentity) {
  auto build = [](bool with_training_dropout, const std::string& producer) {
    OnnxBuilder b;
    b.proto().set_producer_name(producer);
    b.input("x", {8}).output("z").scalar("ratio", 0.25);
    if (with_training_dropout) {
      Tensor t = Tensor::zeros(DType::kBool, {});
      t.data<bool>()[0] = true;
      b.init("train", t);
      b.output("y");
      b.node("Dropout", {"x", "ratio", "train"}, {"y", "mask"});
    }
    b.node("Dropout", {"x", "ratio"}, {"z"});
    auto m = b.import(raw());
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m;
  };
  auto training = build(true, "memc-test");
  ASSERT_TRUE(training.ok());
  ASSERT_EQ(testing::count_op(*training, "dropout"), 2);
  for (NodeId n : training->schedule()) {
    if (training->node(n).op == "dropout") {
      EXPECT_DOUBLE_EQ(training->node(n).attrs.get_float("ratio", 0), 0.25);
      EXPECT_TRUE(training->node(n).attrs.has("seed"));
    }
  }
  auto inference = build(false, "memc-test");
  ASSERT_TRUE(inference.ok());
  EXPECT_EQ(testing::count_op(*inference, "dropout"), 0);
  auto torch = build(false, "pytorch");
  ASSERT_TRUE(torch.ok());
  EXPECT_EQ(testing::count_op(*torch, "dropout"), 1);
  // A constant false training_mode stays inference in a training export.
  OnnxBuilder b;
  b.input("x", {8}).output("y").output("z").scalar("ratio", 0.25);
  Tensor on = Tensor::zeros(DType::kBool, {}), off = Tensor::zeros(DType::kBool, {});
  on.data<bool>()[0] = true;
  b.init("on", on).init("off", off);
  b.node("Dropout", {"x", "ratio", "on"}, {"y"});
  b.node("Dropout", {"x", "ratio", "off"}, {"z"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(testing::count_op(*m, "dropout"), 1);
}

TEST(FrontendLowering, ConstantNodeForms) {
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  auto& c = b.node("Constant", {}, {"c"});
  auto* a = c.add_attribute();
  a->set_name("value_floats");
  a->set_type(onnx::AttributeProto::FLOATS);
  a->add_floats(2);
  a->add_floats(3);
  b.node("Mul", {"x", "c"}, {"y"});
  auto m = b.import(raw());
  ASSERT_TRUE(m.ok()) << m.status().message();
  expect_values(run1(*m, {{"x", make_tensor(DType::kF32, {2}, {1, 2})}}), {2, 6});
}

TEST(FrontendLowering, SupportedOpListCoversTheBrief) {
  const auto ops = supported_onnx_ops();
  for (const char* op : {"Abs", "Add", "And", "ArgMax", "ArgMin", "Cast", "CastLike", "Ceil", "Clip", "Concat", "Constant",
                         "ConstantOfShape", "Conv", "Cos", "Div", "Dropout", "Einsum", "Equal", "Erf", "Exp", "Expand",
                         "Flatten", "Floor", "Gather", "Gelu", "Gemm", "Greater", "GreaterOrEqual", "Identity",
                         "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax", "MatMul", "Max",
                         "Mean", "Min", "Mod", "Mul", "Neg", "Not", "Or", "Pad", "Pow", "Range", "Reciprocal", "ReduceL2",
                         "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu",
                         "Reshape", "Round", "SequenceAt", "Shape", "Sigmoid", "Sign", "Sin", "Size", "Slice", "Softmax", "Softplus",
                         "Split", "SplitToSequence", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "Tile", "Transpose", "Unsqueeze", "Where", "Xor"}) {
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op;
  }
}

// docs/ops.md's "The ops" paragraph names exactly the ops the importer lowers.
TEST(FrontendLowering, TheDocsListEveryLoweredOp) {
  std::ifstream in(testing::source_path("docs/ops.md"));
  ASSERT_TRUE(in) << "docs/ops.md";
  std::string line;
  while (std::getline(in, line) && line != "## The ops") {}
  std::getline(in, line);  // the blank line after the heading
  std::set<std::string> listed;
  while (std::getline(in, line) && !line.empty()) {
    std::istringstream words(line);
    for (std::string w; words >> w;) listed.insert(w.back() == '.' ? w.substr(0, w.size() - 1) : w);
  }
  const auto ops = supported_onnx_ops();
  EXPECT_EQ(listed, std::set<std::string>(ops.begin(), ops.end()));
}

}  // namespace
}  // namespace memc
