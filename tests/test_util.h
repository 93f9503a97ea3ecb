// Shared helpers for tests: paths to committed files, random tensors, comparisons.
#pragma once
#include <random>
#include <string>

#include <string_view>

#include "ir/graph.h"
#include "ir/tensor.h"
#include "passes/pass.h"

namespace memc::testing {

std::string source_path(const std::string& relative);  // MEMC_SOURCE_DIR/relative
// <temp dir>/memc_test_<pid>/<name>: a file of this test process's own. ctest runs a file's tests
// as processes side by side, and one rewriting a shared scratch file truncates it under another.
// The folder goes when the process exits.
std::string scratch_path(const std::string& name);
Tensor random_tensor(DType dtype, const Shape& shape, std::mt19937& rng, double lo = -1.0, double hi = 1.0);
// max|a-b| / max|b| (max-abs relative error used across the suite); 0 when both are zero.
double rel_error(const Tensor& actual, const Tensor& expected);

// How many live nodes of `op` the module schedules (the passes' own count, passes/pass.h).
using memc::count_op;

// Adds `op` over `in` to m and returns its first output, failing the current test (with the
// op's message) and returning kNoValue where the op refuses.
ValueId emit(Module& m, const std::string& op, std::vector<ValueId> in, Attrs attrs = {});

// Parses IR text and verifies it, failing the current test (with the message) when either fails.
Module parse_ok(std::string_view text);

}  // namespace memc::testing
