#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>
#include <unistd.h>

#include "ir/printer.h"
#include "ir/verifier.h"

namespace memc::testing {

std::string source_path(const std::string& relative) { return std::string(MEMC_SOURCE_DIR) + "/" + relative; }

namespace {

// <temp dir>/memc_test_<pid>: made on first use, removed with everything in it when the test
// process exits (by the process that made it, not by a death test's fork).
class ScratchDir {
 public:
  const std::filesystem::path& path() {
    if (path_.empty()) {
      path_ = std::filesystem::temp_directory_path() / ("memc_test_" + std::to_string(getpid()));
      std::filesystem::create_directories(path_);
      owner_ = getpid();
    }
    return path_;
  }
  ~ScratchDir() {
    std::error_code ignored;
    if (!path_.empty() && getpid() == owner_) std::filesystem::remove_all(path_, ignored);
  }

 private:
  std::filesystem::path path_;
  pid_t owner_ = 0;
};

ScratchDir scratch_dir;

}  // namespace

std::string scratch_path(const std::string& name) { return (scratch_dir.path() / name).string(); }

Tensor random_tensor(DType dtype, const Shape& shape, std::mt19937& rng, double lo, double hi) {
  Tensor t = Tensor::zeros(dtype, shape);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = dist(rng);
    if (!is_float(dtype)) v = std::floor(v);
    t.set_from_double(i, v);
  }
  return t;
}

double rel_error(const Tensor& actual, const Tensor& expected) {
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double a = actual.get_as_double(i), e = expected.get_as_double(i);
    if (std::isnan(a) != std::isnan(e)) return INFINITY;
    if (std::isnan(e)) continue;
    max_diff = std::max(max_diff, std::abs(a - e));
    max_ref = std::max(max_ref, std::abs(e));
  }
  if (max_ref == 0) return max_diff;
  return max_diff / max_ref;
}

ValueId emit(Module& m, const std::string& op, std::vector<ValueId> in, Attrs attrs) {
  auto out = m.add_node(op, std::move(in), std::move(attrs));
  EXPECT_TRUE(out.ok()) << op << ": " << out.status().message();
  return out.ok() ? out->front() : kNoValue;
}

Module parse_ok(std::string_view text) {
  auto parsed = parse_module(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  if (!parsed.ok()) return Module();
  EXPECT_TRUE(verify(*parsed).ok()) << verify(*parsed).message();
  return std::move(parsed).value();
}

}  // namespace memc::testing
