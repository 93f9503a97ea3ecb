// Helpers shared by the CPU kernel tests: run one op through the executor, numpy-style index
// arithmetic for the reference implementations (which compute in double), tolerances.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/op_registry.h"
#include "runtime/executor.h"
#include "tests/test_util.h"

namespace memc::testing {

// Builds a module holding one `op` node over `inputs` (nullptr: absent optional input) and
// executes it. Shape-function and kernel errors come back as the status.
inline Expected<std::vector<Tensor>> run_op(const std::string& op, const std::vector<const Tensor*>& inputs,
                                            Attrs attrs = {}, int num_outputs = -1, ExecOptions options = {}) {
  Module m;
  std::vector<ValueId> ids;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) {
      ids.push_back(kNoValue);
      continue;
    }
    const std::string name = "in" + std::to_string(i);
    ids.push_back(m.add_argument(name, TensorType{inputs[i]->dtype(), inputs[i]->shape()}, Role::kInput));
    feeds[name] = *inputs[i];
  }
  MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> outs, m.add_node(op, ids, std::move(attrs), "test", num_outputs));
  m.set_outputs(outs);
  return execute(m, feeds, options);
}

// The single output of a run that must succeed.
inline Tensor run1(const std::string& op, const std::vector<const Tensor*>& inputs, Attrs attrs = {}) {
  auto r = run_op(op, inputs, std::move(attrs));
  EXPECT_TRUE(r.ok()) << op << ": " << r.status().message();
  return r.ok() ? r.value()[0] : Tensor();
}

inline std::vector<double> values(const Tensor& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.get_as_double(i);
  return v;
}

inline Tensor make(DType dtype, const Shape& shape, const std::vector<double>& v) {
  Tensor t = Tensor::zeros(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_from_double(i, v[i]);
  return t;
}

// Multi-index of a row-major linear position, and back (with broadcasting: dims of size 1 in
// `shape` read index 0; `shape` is right-aligned against `index`).
inline std::vector<int64_t> unravel(int64_t linear, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    index[d] = linear % shape[d];
    linear /= shape[d];
  }
  return index;
}
inline int64_t ravel_broadcast(const std::vector<int64_t>& index, const Shape& shape) {
  int64_t linear = 0;
  const size_t lead = index.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) linear = linear * shape[d] + (shape[d] == 1 ? 0 : index[lead + d]);
  return linear;
}

inline double tolerance(DType t) {
  switch (t) {
    case DType::kF64: return 1e-12;
    case DType::kF32: return 1e-5;
    case DType::kF16: return 2e-3;
    case DType::kBF16: return 1.6e-2;
    default: return 0;
  }
}

}  // namespace memc::testing
