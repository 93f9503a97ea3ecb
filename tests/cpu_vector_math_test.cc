// libmvec's exp, erf and tanh (backends/cpu/vector_math.h) at every vector width this CPU runs,
// against the f64 functions: within 4 ulp of the correctly rounded float, the tail past the
// last full vector included, and nothing written past n.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "backends/cpu/vector_math.h"

namespace memc::cpu {
namespace {

double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  if (got == w) return 0;
  const float step = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / step;
}

struct Function {
  const char* name;
  void (*vector)(float*, int64_t, int);
  double (*reference)(double);
  float lo, hi;
};

TEST(VectorMath, EveryWidthWithin4UlpOfF64) {
  const Function functions[] = {
      {"exp", exp_in_place, [](double x) { return std::exp(x); }, -87.0f, 88.0f},
      {"erf", erf_in_place, [](double x) { return std::erf(x); }, -5.0f, 5.0f},
      {"tanh", tanh_in_place, [](double x) { return std::tanh(x); }, -10.0f, 10.0f},
  };
  for (int lanes : {4, 8, 16}) {
    if (lanes > vector_lanes()) continue;
    for (const Function& f : functions) {
      for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, int64_t{4099}}) {
        std::vector<float> x(n + 1);
        for (int64_t i = 0; i < n; ++i) x[i] = f.lo + (f.hi - f.lo) * static_cast<float>(i) / static_cast<float>(n);
        x[n] = 12345.0f;  // a guard past n
        std::vector<float> y = x;
        f.vector(y.data(), n, lanes);
        double worst = 0;
        for (int64_t i = 0; i < n; ++i) worst = std::max(worst, ulps(y[i], f.reference(x[i])));
        EXPECT_LE(worst, 4.0) << f.name << " at " << lanes << " lanes, n = " << n;
        EXPECT_EQ(y[n], 12345.0f) << f.name << " wrote past n at " << lanes << " lanes";
      }
    }
  }
}

// exp near and past the ends of its normal range: results subnormal, zero or infinite, which
// vector_math.cc evaluates as (e^(x/2))² so libmvec stays on its vector path. Vectors mixing
// such lanes with ordinary ones are included (the ranges straddle -87 and 88).
TEST(VectorMath, ExpSubnormalAndOverflowingResults) {
  for (int lanes : {4, 8, 16}) {
    if (lanes > vector_lanes()) continue;
    for (auto [lo, hi] : {std::pair{-110.0f, -80.0f}, std::pair{80.0f, 89.0f}, std::pair{-104.5f, -103.5f}}) {
      const int64_t n = 4099;
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n);
      std::vector<float> y = x;
      exp_in_place(y.data(), n, lanes);
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) worst = std::max(worst, ulps(y[i], std::exp(static_cast<double>(x[i]))));
      EXPECT_LE(worst, 4.0) << "exp over [" << lo << ", " << hi << "] at " << lanes << " lanes";
    }
  }
}

TEST(VectorMath, SpecialValues) {
  std::vector<float> x = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 100.0f, -200.0f};  // e^-200 is below the least subnormal
  std::vector<float> e = x, r = x, t = x;
  exp_in_place(e.data(), static_cast<int64_t>(e.size()));
  erf_in_place(r.data(), static_cast<int64_t>(r.size()));
  tanh_in_place(t.data(), static_cast<int64_t>(t.size()));
  EXPECT_EQ(e[0], 1.0f);
  EXPECT_EQ(e[2], INFINITY);
  EXPECT_EQ(e[3], 0.0f);
  EXPECT_TRUE(std::isnan(e[4]));
  EXPECT_EQ(e[5], INFINITY);  // overflows
  EXPECT_EQ(e[6], 0.0f);
  EXPECT_EQ(r[2], 1.0f);
  EXPECT_EQ(r[3], -1.0f);
  EXPECT_TRUE(std::isnan(r[4]));
  EXPECT_EQ(t[5], 1.0f);
  EXPECT_EQ(t[6], -1.0f);
  EXPECT_TRUE(std::isnan(t[4]));
}

}  // namespace
}  // namespace memc::cpu
