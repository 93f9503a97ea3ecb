// CPU reductions, argmax/argmin, softmax, log_softmax and layernorm against double references.
#include <cmath>

#include "tests/cpu_test_util.h"

namespace memc::testing {
namespace {

// Reduces `x` over `axes` (empty: all) with keepdims; f folds (acc, x), finish maps (acc, count).
Tensor reduce_reference(const Tensor& x, const std::vector<int64_t>& axes, double init, const std::function<double(double, double)>& f,
                        const std::function<double(double, int64_t)>& finish) {
  Shape out_shape = x.shape();
  for (size_t d = 0; d < out_shape.size(); ++d) {
    if (axes.empty() || std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end()) out_shape[d] = 1;
  }
  std::vector<double> acc(numel(out_shape), init);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t o = ravel_broadcast(unravel(i, x.shape()), out_shape);
    acc[o] = f(acc[o], x.get_as_double(i));
  }
  const int64_t count = x.numel() / numel(out_shape);
  for (double& a : acc) a = finish(a, count);
  return make(DType::kF64, out_shape, acc);
}

TEST(CpuReduce, EveryReductionOverEveryAxisSet) {
  struct Case {
    const char* op;
    double init;
    std::function<double(double, double)> f;
    std::function<double(double, int64_t)> finish = [](double a, int64_t) { return a; };
  };
  const std::vector<Case> cases = {
      {"reduce_sum", 0, [](double a, double x) { return a + x; }},
      {"reduce_mean", 0, [](double a, double x) { return a + x; }, [](double a, int64_t n) { return a / n; }},
      {"reduce_max", -INFINITY, [](double a, double x) { return std::max(a, x); }},
      {"reduce_min", INFINITY, [](double a, double x) { return std::min(a, x); }},
      {"reduce_prod", 1, [](double a, double x) { return a * x; }},
      {"reduce_sum_square", 0, [](double a, double x) { return a + x * x; }},
      {"reduce_l2", 0, [](double a, double x) { return a + x * x; }, [](double a, int64_t) { return std::sqrt(a); }},
  };
  const std::vector<std::vector<int64_t>> axes_sets = {{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}};
  std::mt19937 rng(20);
  for (const Case& c : cases) {
    for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16}) {
      for (const auto& axes : axes_sets) {
        for (int64_t keepdims : {0, 1}) {
          const Tensor x = random_tensor(dtype, {3, 4, 5}, rng, 0.5, 1.5);
          Attrs attrs;
          attrs.set("axes", axes);
          attrs.set("keepdims", keepdims);
          const Tensor y = run1(c.op, {&x}, attrs);
          const Tensor expected = reduce_reference(x, axes, c.init, c.f, c.finish);
          EXPECT_EQ(y.numel(), expected.numel());
          EXPECT_LE(rel_error(y, expected), 2 * tolerance(dtype)) << c.op << " " << dtype_name(dtype) << " axes " << axes.size() << " keep " << keepdims;
          if (!keepdims) EXPECT_EQ(y.rank(), axes.empty() ? 0 : 3 - static_cast<int64_t>(axes.size()));
        }
      }
    }
  }
  const Tensor i = make(DType::kI64, {2, 3}, {1, -2, 3, 4, 5, -6});
  Attrs attrs;
  attrs.set("axes", std::vector<int64_t>{1});
  attrs.set("keepdims", int64_t{0});
  EXPECT_EQ(values(run1("reduce_sum", {&i}, attrs)), (std::vector<double>{2, 3}));
  EXPECT_EQ(values(run1("reduce_max", {&i}, attrs)), (std::vector<double>{3, 5}));
  EXPECT_EQ(values(run1("reduce_prod", {&i}, attrs)), (std::vector<double>{-6, -120}));
  EXPECT_EQ(values(run1("reduce_mean", {&i}, attrs)), (std::vector<double>{0, 1}));  // integer mean truncates
}

TEST(CpuReduce, ArgMaxArgMinWithTiesAndKeepdims) {
  // Rows of [2, 4]: ties at the max and min.
  const Tensor x = make(DType::kF32, {2, 4}, {1, 5, 5, 0, 3, 3, -1, -1});
  auto arg = [&](const char* op, int64_t axis, int64_t keepdims, int64_t last) {
    Attrs attrs;
    attrs.set("axis", axis);
    attrs.set("keepdims", keepdims);
    attrs.set("select_last_index", last);
    return run1(op, {&x}, attrs);
  };
  EXPECT_EQ(values(arg("argmax", 1, 0, 0)), (std::vector<double>{1, 0}));
  EXPECT_EQ(values(arg("argmax", 1, 0, 1)), (std::vector<double>{2, 1}));
  EXPECT_EQ(values(arg("argmin", 1, 0, 0)), (std::vector<double>{3, 2}));
  EXPECT_EQ(values(arg("argmin", 1, 1, 1)), (std::vector<double>{3, 3}));
  EXPECT_EQ(arg("argmin", 1, 1, 1).shape(), (Shape{2, 1}));
  EXPECT_EQ(values(arg("argmax", 0, 0, 0)), (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(arg("argmax", 0, 0, 0).dtype(), DType::kI64);
  std::mt19937 rng(21);
  const Tensor r = random_tensor(DType::kF64, {3, 7, 2}, rng);
  Attrs attrs;
  attrs.set("axis", int64_t{1});
  const Tensor y = run1("argmax", {&r}, attrs);
  for (int64_t o = 0; o < 3; ++o) {
    for (int64_t j = 0; j < 2; ++j) {
      int64_t best = 0;
      for (int64_t i = 1; i < 7; ++i) {
        if (r.get_as_double((o * 7 + i) * 2 + j) > r.get_as_double((o * 7 + best) * 2 + j)) best = i;
      }
      EXPECT_EQ(y.get_as_int(o * 2 + j), best);
    }
  }
}

TEST(CpuReduce, SoftmaxAndLogSoftmaxAlongEachAxis) {
  std::mt19937 rng(22);
  for (const char* op : {"softmax", "log_softmax"}) {
    const bool log = std::string(op) == "log_softmax";
    for (DType dtype : {DType::kF32, DType::kF64, DType::kF16}) {
      for (int64_t axis : {0, 1, 2}) {
        const Tensor x = random_tensor(dtype, {3, 4, 5}, rng, -5, 5);
        Attrs attrs;
        attrs.set("axis", axis);
        const Tensor y = run1(op, {&x}, attrs);
        Tensor expected = Tensor::zeros(DType::kF64, x.shape());
        for (int64_t i = 0; i < x.numel(); ++i) {
          auto index = unravel(i, x.shape());
          double mx = -INFINITY, sum = 0;
          for (index[axis] = 0; index[axis] < x.shape()[axis]; ++index[axis]) mx = std::max(mx, x.get_as_double(ravel_broadcast(index, x.shape())));
          for (index[axis] = 0; index[axis] < x.shape()[axis]; ++index[axis]) sum += std::exp(x.get_as_double(ravel_broadcast(index, x.shape())) - mx);
          const double xi = x.get_as_double(i);
          expected.set_from_double(i, log ? xi - mx - std::log(sum) : std::exp(xi - mx) / sum);
        }
        EXPECT_LE(rel_error(y, expected), 2 * tolerance(dtype)) << op << " axis " << axis << " " << dtype_name(dtype);
      }
    }
  }
  // Stable for large logits; the default axis is the last.
  const Tensor big = make(DType::kF32, {1, 3}, {1000, 1000, 990});
  const auto p = values(run1("softmax", {&big}));
  EXPECT_NEAR(p[0], 0.5 * (1 - p[2]), 1e-7);
  EXPECT_NEAR(p[2], std::exp(-10.0) / (2 + std::exp(-10.0)), 1e-9);
  EXPECT_NEAR(values(run1("log_softmax", {&big}))[0], -std::log(2 + std::exp(-10.0)), 1e-5);
}

TEST(CpuReduce, LayernormWithBroadcastParamsAndStats) {
  struct Case {
    Shape x, scale, bias;
    int64_t axis;
  };
  const std::vector<Case> cases = {{{2, 3, 8}, {8}, {8}, 2}, {{2, 3, 4}, {4}, {3, 4}, 1}, {{4, 6}, {6}, {}, 1}, {{2, 3, 4}, {1}, {}, 0}};
  std::mt19937 rng(23);
  for (const Case& c : cases) {
    for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16}) {
      const Tensor x = random_tensor(dtype, c.x, rng, -3, 5), scale = random_tensor(dtype, c.scale, rng);
      const Tensor bias = random_tensor(dtype, c.bias.empty() ? Shape{1} : c.bias, rng);
      Attrs attrs;
      attrs.set("axis", c.axis);
      attrs.set("eps", 1e-5);
      auto r = run_op("layernorm", {&x, &scale, c.bias.empty() ? nullptr : &bias}, attrs, 3);
      ASSERT_TRUE(r.ok()) << r.status().message();
      const Shape normalized(c.x.begin() + c.axis, c.x.end());
      const int64_t n = numel(normalized), rows = x.numel() / n;
      Tensor expected = Tensor::zeros(DType::kF64, c.x), mean = Tensor::zeros(DType::kF64, {rows}), inv_std = Tensor::zeros(DType::kF64, {rows});
      for (int64_t row = 0; row < rows; ++row) {
        double m = 0, var = 0;
        for (int64_t i = 0; i < n; ++i) m += x.get_as_double(row * n + i) / n;
        for (int64_t i = 0; i < n; ++i) var += std::pow(x.get_as_double(row * n + i) - m, 2) / n;
        const double s = 1 / std::sqrt(var + 1e-5);
        mean.set_from_double(row, m);
        inv_std.set_from_double(row, s);
        for (int64_t i = 0; i < n; ++i) {
          const auto index = unravel(i, normalized);
          double v = (x.get_as_double(row * n + i) - m) * s * scale.get_as_double(ravel_broadcast(index, c.scale));
          if (!c.bias.empty()) v += bias.get_as_double(ravel_broadcast(index, c.bias));
          expected.set_from_double(row * n + i, v);
        }
      }
      EXPECT_LE(rel_error(r.value()[0], expected), 2 * tolerance(dtype)) << shape_str(c.x) << " axis " << c.axis << " " << dtype_name(dtype);
      EXPECT_EQ(r.value()[1].dtype(), DType::kF32);
      EXPECT_LE(rel_error(r.value()[1], mean), 1e-6);
      EXPECT_LE(rel_error(r.value()[2], inv_std), 1e-6);
    }
  }
}

}  // namespace
}  // namespace memc::testing
