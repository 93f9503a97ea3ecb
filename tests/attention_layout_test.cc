// attention and attention_grad in the layouts "bthd" and "tbhd" (ir/attention_layout.h) equal the
// default layout on the same operands transposed to [B, H, T, E], outputs transposed back: for
// f32 and bf16, with a broadcast bias and its gradient, with dropout, on short sequences (the
// grouped products) and long ones (the tiled blocks), on one and two threads. The shape function
// rejects operands the layouts cannot describe.
#include <gtest/gtest.h>

#include <random>

#include "ir/attention_layout.h"
#include "runtime/host_memory.h"
#include "tests/cpu_test_util.h"

namespace memc::testing {
namespace {

// The permutation from a layout's dims to [B, H, T, E], and back.
std::vector<int64_t> to_bhte(AttentionLayout layout) {
  return layout == AttentionLayout::kBTHD ? std::vector<int64_t>{0, 2, 1, 3} : std::vector<int64_t>{1, 2, 0, 3};
}
std::vector<int64_t> from_bhte(AttentionLayout layout) {
  return layout == AttentionLayout::kBTHD ? std::vector<int64_t>{0, 2, 1, 3} : std::vector<int64_t>{2, 0, 1, 3};
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& perm) {
  Attrs a;
  a.set("perm", perm);
  return run1("transpose", {&x}, a);
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double tol = got.dtype() == DType::kF32 ? 1e-6 : 1e-2;
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get_as_double(i), w = want.get_as_double(i);
    bad += !(std::abs(g - w) <= tol * std::max(1.0, std::abs(w)));
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.numel() << " elements differ";
}

struct Case {
  int64_t b, h, tq, tk, d, dv;
  bool bias, dropout;
};

void check(AttentionLayout layout, DType dtype, const Case& c) {
  SCOPED_TRACE(std::string(attention_layout_name(layout)) + " " + std::string(dtype_name(dtype)) + " Tq " + std::to_string(c.tq));
  std::mt19937 rng(static_cast<unsigned>(c.tq * 7 + c.h));
  const Shape batch{c.b, c.h};
  const Tensor q = random_tensor(dtype, attention_operand_shape(layout, batch, c.tq, c.d), rng, -1, 1);
  const Tensor k = random_tensor(dtype, attention_operand_shape(layout, batch, c.tk, c.d), rng, -1, 1);
  const Tensor v = random_tensor(dtype, attention_operand_shape(layout, batch, c.tk, c.dv), rng, -1, 1);
  const Tensor dy = random_tensor(dtype, attention_operand_shape(layout, batch, c.tq, c.dv), rng, -1, 1);
  const Tensor bias = random_tensor(dtype, {c.b, 1, c.tq, c.tk}, rng, -1, 1);  // broadcast over heads
  Attrs plain;
  plain.set("scale", 0.3);
  if (c.dropout) {
    plain.set("dropout_ratio", 0.2);
    plain.set("seed", int64_t{4});
  }
  Attrs laid = plain;
  laid.set("layout", std::string(attention_layout_name(layout)));
  const ExecOptions training{.training = true, .seed = 3, .step = 2};
  const Tensor qb = permute(q, to_bhte(layout)), kb = permute(k, to_bhte(layout)), vb = permute(v, to_bhte(layout)),
               dyb = permute(dy, to_bhte(layout));
  const Tensor* b = c.bias ? &bias : nullptr;

  auto y = run_op("attention", {&q, &k, &v, b}, laid, 1, training);
  auto y_ref = run_op("attention", {&qb, &kb, &vb, b}, plain, 1, training);
  ASSERT_TRUE(y.ok()) << y.status().message();
  ASSERT_TRUE(y_ref.ok()) << y_ref.status().message();
  expect_close((*y)[0], permute((*y_ref)[0], from_bhte(layout)), "y");

  const int outs = c.bias ? 4 : 3;
  auto grads = run_op("attention_grad", {&dy, &q, &k, &v, b}, laid, outs, training);
  auto grads_ref = run_op("attention_grad", {&dyb, &qb, &kb, &vb, b}, plain, outs, training);
  ASSERT_TRUE(grads.ok()) << grads.status().message();
  ASSERT_TRUE(grads_ref.ok()) << grads_ref.status().message();
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) expect_close((*grads)[i], permute((*grads_ref)[i], from_bhte(layout)), names[i]);
  if (c.bias) expect_close((*grads)[3], (*grads_ref)[3], "dbias");
}

TEST(AttentionLayout, EqualsTheDefaultLayoutTransposed) {
  const std::vector<Case> cases = {
      {3, 4, 17, 17, 8, 8, false, false},    // short: grouped products
      {2, 3, 20, 30, 8, 6, true, true},      // short, bias and dropout (one slot: dbias)
      {2, 2, 300, 270, 16, 16, false, true}, // long: tiled blocks, entries on parallel slots
      {1, 3, 140, 260, 8, 4, true, false},   // long with bias
  };
  for (const int64_t threads : {int64_t{1}, int64_t{2}}) {
    const int64_t saved = host_memory().threads;
    set_compute_threads(threads);
    for (const AttentionLayout layout : {AttentionLayout::kBTHD, AttentionLayout::kTBHD}) {
      for (const DType dtype : {DType::kF32, DType::kBF16}) {
        for (const Case& c : cases) check(layout, dtype, c);
      }
    }
    set_compute_threads(saved);
  }
}

TEST(AttentionLayout, ShapesFollowTheLayout) {
  std::mt19937 rng(1);
  const Tensor q = random_tensor(DType::kF32, {2, 5, 3, 4}, rng), v = random_tensor(DType::kF32, {2, 7, 3, 6}, rng),
               k = random_tensor(DType::kF32, {2, 7, 3, 4}, rng);
  Attrs bthd;
  bthd.set("layout", std::string("bthd"));
  auto y = run_op("attention", {&q, &k, &v}, bthd);
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_EQ((*y)[0].shape(), (Shape{2, 5, 3, 6}));
  // Heads differ between q and k: no broadcasting outside the default layout.
  const Tensor k_one_head = random_tensor(DType::kF32, {2, 7, 1, 4}, rng);
  auto bad = run_op("attention", {&q, &k_one_head, &v}, bthd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("batch and head dims differ"), std::string::npos) << bad.status().message();
  Attrs unknown;
  unknown.set("layout", std::string("hbtd"));
  auto bad_name = run_op("attention", {&q, &k, &v}, unknown);
  ASSERT_FALSE(bad_name.ok());
  EXPECT_NE(bad_name.status().message().find("hbtd"), std::string::npos) << bad_name.status().message();
  const Tensor q3 = random_tensor(DType::kF32, {2, 5, 4}, rng);
  auto bad_rank = run_op("attention", {&q3, &q3, &q3}, bthd);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_NE(bad_rank.status().message().find("rank-4"), std::string::npos) << bad_rank.status().message();
}

}  // namespace
}  // namespace memc::testing
