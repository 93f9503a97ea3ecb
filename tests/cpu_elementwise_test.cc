// CPU elementwise kernels against double-precision references: unary math, broadcasting
// binary ops, where, cast, copy, dropout, and 16-bit rounding.
#include <cmath>

#include "backends/cpu/kernels.h"
#include "tests/cpu_test_util.h"

namespace memc::testing {
namespace {

struct UnaryCase {
  const char* op;
  std::function<double(double)> reference;
  double lo = -2, hi = 2;
  Attrs attrs = {};
};

Attrs attrs_with(const std::string& key, Attr value) {
  Attrs a;
  a.set(key, std::move(value));
  return a;
}

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", [](double x) { return -x; }},
      {"abs", [](double x) { return std::abs(x); }},
      {"sign", [](double x) { return double((x > 0) - (x < 0)); }},
      {"exp", [](double x) { return std::exp(x); }},
      {"log", [](double x) { return std::log(x); }, 0.1, 3},
      {"sqrt", [](double x) { return std::sqrt(x); }, 0.1, 3},
      {"rsqrt", [](double x) { return 1 / std::sqrt(x); }, 0.1, 3},
      {"reciprocal", [](double x) { return 1 / x; }, 0.5, 3},
      {"tanh", [](double x) { return std::tanh(x); }},
      {"sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, -30, 30},
      {"relu", [](double x) { return x > 0 ? x : 0; }},
      {"leaky_relu", [](double x) { return x >= 0 ? x : 0.2 * x; }, -2, 2, attrs_with("alpha", 0.2)},
      {"erf", [](double x) { return std::erf(x); }},
      {"gelu", [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, -4, 4},
      {"gelu", [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }, -4, 4,
       attrs_with("approximate", std::string("tanh"))},
      {"floor", [](double x) { return std::floor(x); }, -5, 5},
      {"ceil", [](double x) { return std::ceil(x); }, -5, 5},
      {"round", [](double x) { return std::nearbyint(x); }, -5, 5},
      {"sin", [](double x) { return std::sin(x); }, -6, 6},
      {"cos", [](double x) { return std::cos(x); }, -6, 6},
      {"asin", [](double x) { return std::asin(x); }, -0.99, 0.99},
      {"acos", [](double x) { return std::acos(x); }, -0.99, 0.99},
      {"atan", [](double x) { return std::atan(x); }, -6, 6},
      {"softplus", [](double x) { return std::log1p(std::exp(x)); }, -20, 20},
  };
}

TEST(CpuElementwise, UnaryOpsMatchReferenceInEveryFloatDtype) {
  std::mt19937 rng(1);
  for (const UnaryCase& c : unary_cases()) {
    for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      const Tensor x = random_tensor(dtype, {3, 17}, rng, c.lo, c.hi);
      const Tensor y = run1(c.op, {&x}, c.attrs);
      std::vector<double> expected = values(x);
      for (double& v : expected) v = c.reference(v);
      // 16-bit results are one rounding away from the exact value of the rounded input.
      EXPECT_LE(rel_error(y, make(DType::kF64, x.shape(), expected)), dtype == DType::kF32 || dtype == DType::kF64 ? tolerance(dtype) : 2 * tolerance(dtype))
          << c.op << " " << dtype_name(dtype);
    }
  }
}

TEST(CpuElementwise, RoundIsHalfToEvenAndSoftplusIsStable) {
  const Tensor x = make(DType::kF32, {6}, {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5});
  EXPECT_EQ(values(run1("round", {&x})), (std::vector<double>{-2, -2, 0, 0, 2, 2}));
  const Tensor big = make(DType::kF32, {2}, {100, -100});
  const std::vector<double> sp = values(run1("softplus", {&big}));
  EXPECT_NEAR(sp[0], 100, 1e-4);
  EXPECT_NEAR(sp[1], std::exp(-100.0), 1e-40);
}

TEST(CpuElementwise, IntegerUnaryOps) {
  for (DType dtype : {DType::kI32, DType::kI64}) {
    const Tensor x = make(dtype, {5}, {-3, -1, 0, 2, 7});
    EXPECT_EQ(values(run1("neg", {&x})), (std::vector<double>{3, 1, 0, -2, -7}));
    EXPECT_EQ(values(run1("abs", {&x})), (std::vector<double>{3, 1, 0, 2, 7}));
    EXPECT_EQ(values(run1("sign", {&x})), (std::vector<double>{-1, -1, 0, 1, 1}));
    EXPECT_EQ(values(run1("relu", {&x})), (std::vector<double>{0, 0, 0, 2, 7}));
  }
  const Tensor b = make(DType::kBool, {2}, {1, 0});
  EXPECT_EQ(values(run1("not", {&b})), (std::vector<double>{0, 1}));
}

// Reference numpy broadcast of a binary function.
Tensor broadcast_reference(const Tensor& a, const Tensor& b, const Shape& out_shape, const std::function<double(double, double)>& f) {
  Tensor out = Tensor::zeros(DType::kF64, out_shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const auto index = unravel(i, out_shape);
    out.set_from_double(i, f(a.get_as_double(ravel_broadcast(index, a.shape())), b.get_as_double(ravel_broadcast(index, b.shape()))));
  }
  return out;
}

const std::vector<std::pair<Shape, Shape>> kBroadcastPairs = {
    {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{1}, {2, 3}},
    {{}, {2, 2}},           {{5, 1, 1, 3}, {1, 4, 2, 1}}, {{3, 1}, {3, 5}}, {{2, 3}, {}}};

TEST(CpuElementwise, BinaryArithmeticBroadcasts) {
  const std::vector<std::pair<const char*, std::function<double(double, double)>>> ops = {
      {"add", [](double a, double b) { return a + b; }},
      {"sub", [](double a, double b) { return a - b; }},
      {"mul", [](double a, double b) { return a * b; }},
      {"div", [](double a, double b) { return a / b; }},
      {"pow", [](double a, double b) { return std::pow(a, b); }},
      {"max", [](double a, double b) { return std::max(a, b); }},
      {"min", [](double a, double b) { return std::min(a, b); }},
      {"mod", [](double a, double b) { return std::fmod(a, b); }},
  };
  std::mt19937 rng(2);
  for (const auto& [op, f] : ops) {
    for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      for (const auto& [sa, sb] : kBroadcastPairs) {
        const Tensor a = random_tensor(dtype, sa, rng, 0.5, 2), b = random_tensor(dtype, sb, rng, 0.5, 2);
        Attrs attrs;
        if (std::string(op) == "mod") attrs.set("fmod", int64_t{1});
        const Tensor y = run1(op, {&a, &b}, attrs);
        auto expected = broadcast_reference(a, b, y.shape(), f);
        const bool wide = dtype == DType::kF32 || dtype == DType::kF64;
        EXPECT_LE(rel_error(y, expected), wide ? tolerance(dtype) : 2 * tolerance(dtype))
            << op << " " << dtype_name(dtype) << " " << shape_str(sa) << " vs " << shape_str(sb);
      }
    }
  }
}

TEST(CpuElementwise, SixteenBitArithmeticRoundsOnceToNearestEven) {
  std::mt19937 rng(3);
  const Tensor a = random_tensor(DType::kF16, {64}, rng), b = random_tensor(DType::kF16, {64}, rng);
  const Tensor y = run1("mul", {&a, &b});
  for (int i = 0; i < 64; ++i) {
    const float exact = f16_to_f32(a.data<f16_t>()[i].bits) * f16_to_f32(b.data<f16_t>()[i].bits);
    EXPECT_EQ(y.data<f16_t>()[i].bits, f32_to_f16(exact));
  }
}

TEST(CpuElementwise, IntegerDivisionTruncatesAndModFollowsFmod) {
  const Tensor a = make(DType::kI64, {4}, {7, -7, 7, -7}), b = make(DType::kI64, {4}, {2, 2, -2, -2});
  EXPECT_EQ(values(run1("div", {&a, &b})), (std::vector<double>{3, -3, -3, 3}));
  EXPECT_EQ(values(run1("mod", {&a, &b})), (std::vector<double>{1, 1, -1, -1}));
  EXPECT_EQ(values(run1("mod", {&a, &b}, attrs_with("fmod", int64_t{1}))), (std::vector<double>{1, -1, 1, -1}));
  const Tensor e = make(DType::kI32, {4}, {2, 3, 0, 1}), base = make(DType::kI32, {4}, {3, -2, 5, 9});
  EXPECT_EQ(values(run1("pow", {&base, &e})), (std::vector<double>{9, -8, 1, 9}));
  const Tensor zero = make(DType::kI32, {4}, {1, 0, 1, 1});
  auto r = run_op("div", {&base, &zero});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("division by zero"), std::string::npos);
  const Tensor u = make(DType::kU8, {3}, {200, 10, 3}), v = make(DType::kU8, {3}, {100, 3, 7});
  EXPECT_EQ(values(run1("add", {&u, &v})), (std::vector<double>{44, 13, 10}));  // wraps mod 256
}

TEST(CpuElementwise, ComparisonsAndLogicalOpsBroadcast) {
  const std::vector<std::pair<const char*, std::function<double(double, double)>>> ops = {
      {"equal", [](double a, double b) { return double(a == b); }},
      {"less", [](double a, double b) { return double(a < b); }},
      {"less_equal", [](double a, double b) { return double(a <= b); }},
      {"greater", [](double a, double b) { return double(a > b); }},
      {"greater_equal", [](double a, double b) { return double(a >= b); }},
  };
  std::mt19937 rng(4);
  for (const auto& [op, f] : ops) {
    for (DType dtype : {DType::kF32, DType::kI64, DType::kI32, DType::kF16, DType::kU8}) {
      const Tensor a = random_tensor(dtype, {2, 3, 4}, rng, 0, 3), b = random_tensor(dtype, {3, 1}, rng, 0, 3);
      const Tensor y = run1(op, {&a, &b});
      EXPECT_EQ(y.dtype(), DType::kBool);
      EXPECT_EQ(values(y), values(broadcast_reference(a, b, y.shape(), f))) << op << " " << dtype_name(dtype);
    }
  }
  const Tensor p = make(DType::kBool, {2, 2}, {0, 0, 1, 1}), q = make(DType::kBool, {2}, {0, 1});
  EXPECT_EQ(values(run1("and", {&p, &q})), (std::vector<double>{0, 0, 0, 1}));
  EXPECT_EQ(values(run1("or", {&p, &q})), (std::vector<double>{0, 1, 1, 1}));
  EXPECT_EQ(values(run1("xor", {&p, &q})), (std::vector<double>{0, 1, 1, 0}));
  EXPECT_EQ(values(run1("equal", {&p, &q})), (std::vector<double>{1, 0, 0, 1}));
}

TEST(CpuElementwise, WhereBroadcastsAllThreeOperands) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kI64, DType::kBool}) {
    const Tensor cond = random_tensor(DType::kBool, {3, 1}, rng, 0, 2);
    const Tensor a = random_tensor(dtype, {2, 1, 4}, rng, 0, 2), b = random_tensor(dtype, {4}, rng, 0, 2);
    const Tensor y = run1("where", {&cond, &a, &b});
    ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
    for (int64_t i = 0; i < y.numel(); ++i) {
      const auto index = unravel(i, y.shape());
      const bool c = cond.get_as_double(ravel_broadcast(index, cond.shape()));
      const double expected = c ? a.get_as_double(ravel_broadcast(index, a.shape())) : b.get_as_double(ravel_broadcast(index, b.shape()));
      EXPECT_EQ(y.get_as_double(i), expected);
    }
  }
}

TEST(CpuElementwise, CastConvertsRoundsAndSaturates) {
  const Tensor x = make(DType::kF32, {6}, {1.7, -1.7, 0, 3e10, -3e10, NAN});
  EXPECT_EQ(values(run1("cast", {&x}, attrs_with("to", std::string("i32")))),
            (std::vector<double>{1, -1, 0, 2147483647, -2147483648.0, 0}));
  EXPECT_EQ(values(run1("cast", {&x}, attrs_with("to", std::string("i1"))))[1], 1);
  std::mt19937 rng(6);
  const Tensor f = random_tensor(DType::kF32, {100}, rng, -100, 100);
  const Tensor h = run1("cast", {&f}, attrs_with("to", std::string("f16")));
  const Tensor bf = run1("cast", {&f}, attrs_with("to", std::string("bf16")));
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(h.data<f16_t>()[i].bits, f32_to_f16(f.data<float>()[i]));
    EXPECT_EQ(bf.data<bf16_t>()[i].bits, f32_to_bf16(f.data<float>()[i]));
  }
  const Tensor i = make(DType::kI64, {3}, {-5, 0, 123456});
  EXPECT_EQ(values(run1("cast", {&i}, attrs_with("to", std::string("f64")))), values(i));
  EXPECT_EQ(values(run1("copy", {&f})), values(f));
}

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(CpuElementwise, HalfConversionsRoundToNearestEvenOnTiesAndSubnormals) {
  // f16: 1 + 2⁻¹¹ lies halfway between 1 (0x3C00, even) and 1 + 2⁻¹⁰ (0x3C01).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);  // just above the tie
  // Subnormals: 2⁻²⁴ is the smallest; 2⁻²⁵ ties to 0, 3·2⁻²⁵ ties to 2 (even).
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);
  EXPECT_EQ(f32_to_f16(-5 * std::ldexp(1.0f, -25)), 0x8002);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16(1023 * std::ldexp(1.0f, -24) + std::ldexp(1.0f, -25)), 0x0400);  // rounds up into normal
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie past max rounds to inf
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  // bf16: 1 + 2⁻⁸ ties between 0x3F80 (even) and 0x3F81.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormal tie rounds to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000u)), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F7FFFFFu)), 0x7F80);  // max float rounds to inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

std::vector<Tensor> run_dropout(const Tensor& x, double ratio, int64_t seed_attr, bool training, int64_t step) {
  Attrs attrs;
  attrs.set("ratio", ratio);
  attrs.set("seed", seed_attr);
  auto r = run_op("dropout", {&x}, attrs, 2, ExecOptions{.training = training, .seed = 42, .step = step});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.value();
}

TEST(CpuElementwise, DropoutIsDeterministicPerStepAndKeepsOneMinusRatio) {
  std::mt19937 rng(7);
  const Tensor x = random_tensor(DType::kF32, {100, 200}, rng, 0.5, 1.5);
  const double ratio = 0.3;
  const auto first = run_dropout(x, ratio, 5, true, 1), again = run_dropout(x, ratio, 5, true, 1);
  const auto next_step = run_dropout(x, ratio, 5, true, 2), other_seed = run_dropout(x, ratio, 6, true, 1);
  EXPECT_EQ(values(first[1]), values(again[1]));
  EXPECT_EQ(values(first[0]), values(again[0]));
  EXPECT_NE(values(first[1]), values(next_step[1]));
  EXPECT_NE(values(first[1]), values(other_seed[1]));
  int64_t kept = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const bool keep = first[1].data<bool>()[i];
    kept += keep;
    EXPECT_FLOAT_EQ(first[0].data<float>()[i], keep ? x.data<float>()[i] * static_cast<float>(1 / (1 - ratio)) : 0.0f);
  }
  EXPECT_NEAR(static_cast<double>(kept) / x.numel(), 1 - ratio, 0.01);
  const auto inference = run_dropout(x, ratio, 5, false, 1);
  EXPECT_EQ(values(inference[0]), values(x));
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_TRUE(inference[1].data<bool>()[i]);
  // Mask output is optional.
  Attrs attrs;
  attrs.set("ratio", ratio);
  attrs.set("seed", int64_t{5});
  auto single = run_op("dropout", {&x}, attrs, 1, ExecOptions{.training = true, .seed = 42, .step = 1});
  ASSERT_TRUE(single.ok()) << single.status().message();
  EXPECT_EQ(values(single.value()[0]), values(first[0]));
}

}  // namespace
}  // namespace memc::testing
