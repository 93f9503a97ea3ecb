// CPU data-movement kernels (constant, reshape, transpose, slice, concat, expand, gather, pad,
// tile) against index-arithmetic references, in several dtypes; gather's bad-index error.
#include "backends/cpu/kernels.h"
#include "tests/cpu_test_util.h"

namespace memc::testing {
namespace {

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kI64, DType::kBool, DType::kU8, DType::kF64};

Tensor random_any(DType dtype, const Shape& shape, std::mt19937& rng) { return random_tensor(dtype, shape, rng, 0, 100); }

TEST(CpuShape, EveryRegisteredCoreOpHasAKernel) {
  for (const char* op : {"neg", "abs", "sign", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu",
                         "leaky_relu", "erf", "gelu", "floor", "ceil", "round", "sin", "cos", "asin", "acos", "atan", "softplus", "not", "add", "sub",
                         "mul", "div", "pow", "max", "min", "mod", "equal", "less", "less_equal", "greater", "greater_equal",
                         "and", "or", "xor", "where", "cast", "copy", "dropout", "matmul", "linear", "conv", "attention",
                         "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_sum_square",
                         "reduce_l2", "argmax", "argmin", "softmax", "log_softmax", "layernorm", "constant", "reshape",
                         "transpose", "slice", "concat", "expand", "gather", "pad", "tile"}) {
    EXPECT_NE(OpRegistry::get().find(op), nullptr) << op;
    EXPECT_NE(cpu::find_kernel(op), nullptr) << op;
  }
}

TEST(CpuShape, ConstantAndReshapeCopyBytes) {
  std::mt19937 rng(30);
  const Tensor value = random_tensor(DType::kF32, {2, 3}, rng);
  Module m;
  const ValueId c = m.add_constant(value);
  Attrs attrs;
  attrs.set("shape", std::vector<int64_t>{3, 2});
  auto reshaped = m.add_node("reshape", {c}, attrs);
  ASSERT_TRUE(reshaped.ok());
  m.set_outputs({c, reshaped.value()[0]});
  auto r = execute(m, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(values(r.value()[0]), values(value));
  EXPECT_EQ(values(r.value()[1]), values(value));
  EXPECT_EQ(r.value()[1].shape(), (Shape{3, 2}));
}

TEST(CpuShape, TransposeEveryPermutation) {
  std::mt19937 rng(31);
  const std::vector<std::vector<int64_t>> perms = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (DType dtype : kDtypes) {
    const Tensor x = random_any(dtype, {2, 3, 4}, rng);
    for (const auto& perm : perms) {
      Attrs attrs;
      attrs.set("perm", perm);
      const Tensor y = run1("transpose", {&x}, attrs);
      for (int64_t i = 0; i < y.numel(); ++i) {
        const auto yi = unravel(i, y.shape());
        std::vector<int64_t> xi(3);
        for (int d = 0; d < 3; ++d) xi[perm[d]] = yi[d];
        EXPECT_EQ(y.get_as_double(i), x.get_as_double(ravel_broadcast(xi, x.shape()))) << dtype_name(dtype);
      }
    }
  }
}

TEST(CpuShape, SliceWithStepsAndNegativeSteps) {
  struct Case {
    std::vector<int64_t> axes, starts, ends, steps;
  };
  const std::vector<Case> cases = {{{0}, {1}, {3}, {1}},           {{1, 2}, {0, 1}, {5, 6}, {2, 3}},
                                   {{2}, {5}, {-1}, {-1}},         {{0, 2}, {2, 4}, {0, 0}, {-2, -3}},
                                   {{1}, {3}, {3}, {1}}};  // empty
  std::mt19937 rng(32);
  for (DType dtype : kDtypes) {
    const Tensor x = random_any(dtype, {3, 5, 6}, rng);
    for (const Case& c : cases) {
      Attrs attrs;
      attrs.set("axes", c.axes);
      attrs.set("starts", c.starts);
      attrs.set("ends", c.ends);
      attrs.set("steps", c.steps);
      const Tensor y = run1("slice", {&x}, attrs);
      for (int64_t i = 0; i < y.numel(); ++i) {
        auto index = unravel(i, y.shape());
        for (size_t a = 0; a < c.axes.size(); ++a) index[c.axes[a]] = c.starts[a] + index[c.axes[a]] * c.steps[a];
        EXPECT_EQ(y.get_as_double(i), x.get_as_double(ravel_broadcast(index, x.shape())));
      }
    }
  }
}

TEST(CpuShape, ConcatAlongEachAxis) {
  std::mt19937 rng(33);
  for (DType dtype : kDtypes) {
    for (int64_t axis : {0, 1, 2}) {
      std::vector<Tensor> parts;
      for (int64_t extent : {1, 3, 2}) {
        Shape s = {2, 3, 4};
        s[axis] = extent;
        parts.push_back(random_any(dtype, s, rng));
      }
      Attrs attrs;
      attrs.set("axis", axis);
      const Tensor y = run1("concat", {&parts[0], &parts[1], &parts[2]}, attrs);
      for (int64_t i = 0; i < y.numel(); ++i) {
        auto index = unravel(i, y.shape());
        size_t part = 0;
        while (index[axis] >= parts[part].shape()[axis]) index[axis] -= parts[part++].shape()[axis];
        EXPECT_EQ(y.get_as_double(i), parts[part].get_as_double(ravel_broadcast(index, parts[part].shape())));
      }
    }
  }
}

TEST(CpuShape, ExpandAndTile) {
  std::mt19937 rng(34);
  for (DType dtype : kDtypes) {
    const Tensor x = random_any(dtype, {3, 1}, rng);
    Attrs attrs;
    attrs.set("shape", std::vector<int64_t>{2, 3, 4});
    const Tensor y = run1("expand", {&x}, attrs);
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.get_as_double(i), x.get_as_double(ravel_broadcast(unravel(i, y.shape()), x.shape())));

    const Tensor t = random_any(dtype, {2, 3}, rng);
    Attrs tile;
    tile.set("repeats", std::vector<int64_t>{2, 3});
    const Tensor z = run1("tile", {&t}, tile);
    ASSERT_EQ(z.shape(), (Shape{4, 9}));
    for (int64_t i = 0; i < z.numel(); ++i) {
      const auto index = unravel(i, z.shape());
      EXPECT_EQ(z.get_as_double(i), t.get_as_double((index[0] % 2) * 3 + index[1] % 3));
    }
  }
}

TEST(CpuShape, GatherWrapsNegativeIndicesAndRejectsOutOfRange) {
  std::mt19937 rng(35);
  for (DType index_dtype : {DType::kI64, DType::kI32}) {
    for (int64_t axis : {0, 1}) {
      const Tensor data = random_any(DType::kF32, {4, 5, 2}, rng);
      const int64_t n = data.shape()[axis];
      const Tensor indices = make(index_dtype, {2, 3}, {0, static_cast<double>(n - 1), -1, 2, static_cast<double>(-n), 1});
      Attrs attrs;
      attrs.set("axis", axis);
      const Tensor y = run1("gather", {&data, &indices}, attrs);
      for (int64_t i = 0; i < y.numel(); ++i) {
        const auto yi = unravel(i, y.shape());
        std::vector<int64_t> xi(yi.begin(), yi.begin() + axis);
        int64_t index = indices.get_as_int(yi[axis] * 3 + yi[axis + 1]);
        xi.push_back(index < 0 ? index + n : index);
        xi.insert(xi.end(), yi.begin() + axis + 2, yi.end());
        EXPECT_EQ(y.get_as_double(i), data.get_as_double(ravel_broadcast(xi, data.shape())));
      }
      for (int64_t bad : {n, -n - 1, int64_t{1} << 40}) {
        const Tensor bad_indices = make(DType::kI64, {2}, {0, static_cast<double>(bad)});
        auto r = run_op("gather", {&data, &bad_indices}, attrs);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.status().kind(), ErrorKind::kBadInput);
        EXPECT_NE(r.status().message().find(std::to_string(bad)), std::string::npos) << r.status().message();
        EXPECT_NE(r.status().message().find("dim " + std::to_string(n)), std::string::npos) << r.status().message();
      }
    }
  }
}

// numpy.pad semantics for the three modes, one dim at a time.
int64_t pad_source(int64_t o, int64_t begin, int64_t in, const std::string& mode) {
  int64_t i = o - begin;
  if (i >= 0 && i < in) return i;
  if (mode == "constant") return -1;
  if (mode == "edge") return std::clamp<int64_t>(i, 0, in - 1);
  while (i < 0 || i >= in) i = i < 0 ? -i : 2 * (in - 1) - i;
  return i;
}

TEST(CpuShape, PadConstantReflectEdge) {
  std::mt19937 rng(36);
  const std::vector<std::vector<int64_t>> pad_sets = {{1, 2, 0, 3}, {0, 0, 2, 1}, {2, 5, 1, 4}, {-1, 0, 1, -2}};
  for (const char* mode : {"constant", "reflect", "edge"}) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kI64}) {
      for (const auto& pads : pad_sets) {
        const Tensor x = random_any(dtype, {3, 4}, rng);
        Attrs attrs;
        attrs.set("pads", pads);
        attrs.set("mode", std::string(mode));
        attrs.set("value", 7.0);
        const Tensor y = run1("pad", {&x}, attrs);
        for (int64_t i = 0; i < y.numel(); ++i) {
          const auto index = unravel(i, y.shape());
          const int64_t r = pad_source(index[0], pads[0], 3, mode), c = pad_source(index[1], pads[1], 4, mode);
          EXPECT_EQ(y.get_as_double(i), r < 0 || c < 0 ? 7.0 : x.get_as_double(r * 4 + c)) << mode << " " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace memc::testing
