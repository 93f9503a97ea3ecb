// CPU matmul, linear, conv and attention against naive double-precision references.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backends/cpu/blas.h"
#include "backends/cpu/onednn_matmul.h"
#include "tests/cpu_test_util.h"

namespace memc::testing {
namespace {

// Naive numpy matmul in double, with the same 1-D promotion and batch broadcasting.
Tensor matmul_reference(const Tensor& a, const Tensor& b, bool ta, bool tb, const Shape& out_shape) {
  Shape as = a.shape(), bs = b.shape();
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const int64_t ra = as.size(), rb = bs.size();
  const int64_t m = ta ? as[ra - 1] : as[ra - 2], k = ta ? as[ra - 2] : as[ra - 1], n = tb ? bs[rb - 2] : bs[rb - 1];
  const Shape a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  const int64_t batches = numel(out_shape) / (m * n);
  Shape batch(out_shape.begin(), out_shape.end() - (a_vec ? 0 : 1) - (b_vec ? 0 : 1));
  Tensor out = Tensor::zeros(DType::kF64, out_shape);
  for (int64_t bi = 0; bi < batches; ++bi) {
    const auto index = unravel(bi, batch);
    const int64_t ao = ravel_broadcast(index, a_batch) * m * k, bo = ravel_broadcast(index, b_batch) * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          sum += a.get_as_double(ao + (ta ? p * m + i : i * k + p)) * b.get_as_double(bo + (tb ? j * k + p : p * n + j));
        }
        out.set_from_double((bi * m + i) * n + j, sum);
      }
    }
  }
  return out;
}

struct MatmulCase {
  Shape a, b;
  bool ta = false, tb = false;
};

TEST(CpuLinalg, MatmulTransposesBatchesAndBroadcasts) {
  const std::vector<MatmulCase> cases = {
      {{3, 4}, {4, 5}},           {{4, 3}, {4, 5}, true},         {{3, 4}, {5, 4}, false, true},
      {{4, 3}, {5, 4}, true, true}, {{2, 3, 4}, {2, 4, 5}},       {{2, 1, 3, 4}, {3, 4, 5}},
      {{2, 3, 4}, {4, 5}},        {{2, 3, 4}, {5, 4}, false, true}, {{2, 4, 3}, {4, 5}, true},
      {{4}, {4, 5}},              {{3, 4}, {4}},                  {{4}, {4}},
      {{4}, {2, 4, 5}},           {{3, 4}, {2, 2, 4, 6}},         {{1, 3, 4}, {2, 4, 5}},
      // One strided-batched gemm: both transposed over two batch dims; a shared with b transposed.
      {{2, 3, 4, 3}, {2, 3, 5, 4}, true, true}, {{3, 4}, {2, 3, 5, 4}, false, true},
      // Above 32³ multiply-adds: the library's GEMMs (bf16 natively where the CPU has bf16 dot
      // products: onednn_bf16_gemm), batched, folded, transposed and shared.
      {{2, 40, 48}, {2, 48, 36}}, {{48, 40}, {36, 48}, true, true}, {{3, 40, 48}, {48, 36}},
      {{2, 48, 40}, {36, 48}, true, true},
  };
  std::mt19937 rng(10);
  for (const MatmulCase& c : cases) {
    for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI64, DType::kI32}) {
      const Tensor a = random_tensor(dtype, c.a, rng, -3, 3), b = random_tensor(dtype, c.b, rng, -3, 3);
      Attrs attrs;
      if (c.ta) attrs.set("transpose_a", int64_t{1});
      if (c.tb) attrs.set("transpose_b", int64_t{1});
      const Tensor y = run1("matmul", {&a, &b}, attrs);
      const double tol = is_float(dtype) ? 2 * tolerance(dtype) : 0;
      EXPECT_LE(rel_error(y, matmul_reference(a, b, c.ta, c.tb, y.shape())), tol)
          << shape_str(c.a) << " · " << shape_str(c.b) << " " << c.ta << c.tb << " " << dtype_name(dtype);
    }
  }
}

// The bf16 GEMM path is measured, not read off the CPU flags: where oneDNN can run bf16
// natively the probe timed both, the process's choice follows it, and a plan's pin overrides it
// either way (native only where possible). Both paths multiply alike and size their scratch as
// blas.h says.
TEST(CpuLinalg, Bf16GemmPathIsMeasuredAndPinnable) {
  const bool supported = cpu::onednn_bf16_gemm_supported();
  const cpu::Bf16GemmProbe probe = cpu::bf16_gemm_probe();
  if (!supported) {
    EXPECT_EQ(probe.f32_gflops, 0.0);
    EXPECT_FALSE(cpu::onednn_bf16_gemm());
  } else {
    EXPECT_GT(probe.f32_gflops, 0.0);
    EXPECT_GT(probe.bf16_gflops, 0.0);
    EXPECT_GT(probe.ratio, 0.0);
    if (!std::getenv("MEMC_BF16_GEMM")) EXPECT_EQ(cpu::onednn_bf16_gemm(), probe.ratio >= cpu::kBf16NativeMinRatio);
  }
  const cpu::GemmShape s{.m = 40, .n = 36, .k = 48, .trans_b = true};  // above small_gemm: the library's path
  std::mt19937 rng(12);
  const Tensor a = random_tensor(DType::kBF16, {s.m, s.k}, rng, -3, 3), b = random_tensor(DType::kBF16, {s.n, s.k}, rng, -3, 3);
  const Tensor reference = matmul_reference(a, b, false, true, {s.m, s.n});
  for (bool native : {true, false, true}) {
    EXPECT_EQ(cpu::pin_onednn_bf16_gemm(native), !native || supported);
    EXPECT_EQ(cpu::onednn_bf16_gemm(), native && supported);
    const int64_t widened = cpu::gemm_scratch_floats<float>(s) + s.m * s.k + s.k * s.n + s.m * s.n;
    const int64_t floats = cpu::gemm_scratch_floats<bf16_t>(s);
    if (cpu::native_bf16_gemm(s)) {
      EXPECT_EQ(floats, (cpu::onednn_scratch_either_way(s, cpu::GemmType::kBf16) + 63) / 64 * 16);
    } else {
      EXPECT_EQ(floats, widened);
    }
    std::vector<float> scratch(static_cast<size_t>(floats) + 16);
    Tensor c = Tensor::zeros(DType::kBF16, {s.m, s.n});
    cpu::gemm(c.data<bf16_t>(), a.data<bf16_t>(), b.data<bf16_t>(), s, scratch.data());
    EXPECT_LE(rel_error(c, reference), 2 * tolerance(DType::kBF16)) << (native ? "native" : "widened");
  }
}

// f32 products go to oneDNN where its brgemm runs them in the planned scratchpad, else to
// OpenBLAS (AVX2: oneDNN's gemm driver mallocs per call), which memc's threads call one block of
// c each, like f64's: either way c is the same bits on one thread and on two, accumulating or
// not, and a product oneDNN does not run asks for no scratchpad.
TEST(CpuLinalg, LibraryGemmsAreTheSameBitsOnOneThreadAndTwo) {
  const std::vector<cpu::GemmShape> shapes = {
      {.m = 200, .n = 72, .k = 96},
      {.m = 72, .n = 200, .k = 96, .trans_a = true, .trans_b = true},
      {.m = 64, .n = 48, .k = 80, .trans_b = true, .accumulate = true, .batch = 3, .batch_stride_a = 64 * 80, .batch_stride_b = 0},
      {.m = 130, .n = 33, .k = 257, .trans_a = true, .batch = 2, .batch_stride_a = 257 * 130, .batch_stride_b = 257 * 33},
  };
  const int saved = cpu::onednn_threads();
  std::mt19937 rng(13);
  for (const cpu::GemmShape& s : shapes) {
    const int64_t a_rows = s.batch_stride_a ? s.batch : 1, b_rows = s.batch_stride_b ? s.batch : 1;
    for (DType dtype : {DType::kF32, DType::kF64}) {
      const Tensor a = random_tensor(dtype, {a_rows, s.m * s.k}, rng, -3, 3), b = random_tensor(dtype, {b_rows, s.k * s.n}, rng, -3, 3);
      const Tensor c0 = random_tensor(dtype, {s.batch, s.m * s.n}, rng, -3, 3);
      std::vector<Tensor> results;
      for (int threads : {1, 2}) {
        cpu::set_onednn_threads(threads);
        Tensor c = c0.clone();
        std::vector<float> scratch(static_cast<size_t>(cpu::gemm_scratch_floats<float>(s)) + 16);
        if (dtype == DType::kF32) {
          if (!cpu::onednn_f32_gemm(s)) EXPECT_EQ(cpu::gemm_scratch_floats<float>(s), 0);
          cpu::gemm(c.data<float>(), a.data<float>(), b.data<float>(), s, scratch.data());
        } else {
          cpu::gemm(c.data<double>(), a.data<double>(), b.data<double>(), s);
        }
        results.push_back(c);
      }
      int64_t first = 0;  // the first element that differs, for the message
      while (first + 1 < results[0].numel() && results[0].get_as_double(first) == results[1].get_as_double(first)) ++first;
      EXPECT_EQ(std::memcmp(results[0].raw(), results[1].raw(), results[0].nbytes()), 0)
          << "element " << first << ": " << results[0].get_as_double(first) << " vs " << results[1].get_as_double(first) << "; " << s.m << "x" << s.n << "x" << s.k << " batch " << s.batch << " " << dtype_name(dtype)
          << (dtype == DType::kF32 && cpu::onednn_f32_gemm(s) ? " (oneDNN)" : " (OpenBLAS)");
      // Against a plain sum in double, batch by batch.
      double worst = 0;
      for (int64_t i = 0; i < s.batch; ++i) {
        for (int64_t r = 0; r < s.m; ++r) {
          for (int64_t col = 0; col < s.n; ++col) {
            double sum = s.accumulate ? c0.get_as_double(i * s.m * s.n + r * s.n + col) : 0.0;
            for (int64_t p = 0; p < s.k; ++p) {
              const double x = a.get_as_double((s.batch_stride_a ? i * s.m * s.k : 0) + (s.trans_a ? p * s.m + r : r * s.k + p));
              const double y = b.get_as_double((s.batch_stride_b ? i * s.k * s.n : 0) + (s.trans_b ? col * s.k + p : p * s.n + col));
              sum += x * y;
            }
            worst = std::max(worst, std::abs(results[0].get_as_double(i * s.m * s.n + r * s.n + col) - sum) / (1.0 + std::abs(sum)));
          }
        }
      }
      EXPECT_LE(worst, dtype == DType::kF32 ? 1e-4 : 1e-12) << s.m << "x" << s.n << "x" << s.k << " " << dtype_name(dtype);
    }
  }
  cpu::set_onednn_threads(saved);
}

TEST(CpuLinalg, LinearWithAndWithoutBias) {
  std::mt19937 rng(11);
  for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16}) {
    for (bool transpose_w : {true, false}) {
      for (bool with_bias : {true, false}) {
        const Tensor x = random_tensor(dtype, {2, 3, 8}, rng);
        const Tensor w = random_tensor(dtype, transpose_w ? Shape{5, 8} : Shape{8, 5}, rng);
        const Tensor b = random_tensor(dtype, {5}, rng);
        Attrs attrs;
        attrs.set("transpose_w", int64_t{transpose_w});
        const Tensor y = run1("linear", {&x, &w, with_bias ? &b : nullptr}, attrs);
        Tensor expected = matmul_reference(x, w, false, transpose_w, {2, 3, 5});
        for (int64_t i = 0; with_bias && i < expected.numel(); ++i) {
          expected.set_from_double(i, expected.get_as_double(i) + b.get_as_double(i % 5));
        }
        EXPECT_LE(rel_error(y, expected), 2 * tolerance(dtype)) << dtype_name(dtype) << transpose_w << with_bias;
      }
    }
  }
}

struct ConvCase {
  Shape x, w;
  std::vector<int64_t> strides, pads, dilations;
  int64_t group = 1;
  bool bias = true;
};

// Direct N-d convolution in double.
Tensor conv_reference(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvCase& c, const Shape& out_shape) {
  const size_t sd = c.x.size() - 2;
  const int64_t cg = c.w[1], mg = c.w[0] / c.group;
  const Shape in(c.x.begin() + 2, c.x.end()), kernel(c.w.begin() + 2, c.w.end()), out(out_shape.begin() + 2, out_shape.end());
  Tensor y = Tensor::zeros(DType::kF64, out_shape);
  for (int64_t i = 0; i < y.numel(); ++i) {
    const auto yi = unravel(i, out_shape);
    const int64_t n = yi[0], m = yi[1], g = m / mg;
    double sum = bias ? bias->get_as_double(m) : 0;
    for (int64_t ci = 0; ci < cg; ++ci) {
      for (int64_t kk = 0; kk < numel(kernel); ++kk) {
        const auto ki = unravel(kk, kernel);
        int64_t offset = n * c.x[1] + g * cg + ci;
        bool inside = true;
        for (size_t d = 0; d < sd; ++d) {
          const int64_t pos = yi[2 + d] * c.strides[d] - c.pads[d] + ki[d] * c.dilations[d];
          inside = inside && pos >= 0 && pos < in[d];
          offset = offset * in[d] + pos;
        }
        if (inside) sum += x.get_as_double(offset) * w.get_as_double((m * cg + ci) * numel(kernel) + kk);
      }
    }
    y.set_from_double(i, sum);
  }
  return y;
}

TEST(CpuLinalg, ConvWithStridePadDilationAndGroups) {
  const std::vector<ConvCase> cases = {
      {{2, 4, 9, 8}, {6, 2, 3, 3}, {2, 1}, {1, 2, 0, 1}, {2, 1}, 2},  // 2-D: stride, asymmetric pad, dilation, groups
      {{1, 3, 16, 16}, {8, 3, 4, 4}, {4, 4}, {0, 0, 0, 0}, {1, 1}, 1},  // patch embedding
      {{2, 6, 5, 5}, {4, 6, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},    // pointwise
      {{2, 4, 6, 6}, {4, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 4, false},  // depthwise
      {{2, 3, 11}, {4, 3, 3}, {2}, {1, 2}, {2}, 1},                     // 1-D
      {{1, 2, 5, 4, 6}, {4, 1, 2, 3, 2}, {1, 2, 2}, {1, 0, 1, 0, 1, 0}, {2, 1, 1}, 2},  // 3-D
  };
  std::mt19937 rng(12);
  for (const ConvCase& c : cases) {
    for (DType dtype : {DType::kF32, DType::kF64}) {
      const Tensor x = random_tensor(dtype, c.x, rng), w = random_tensor(dtype, c.w, rng), b = random_tensor(dtype, {c.w[0]}, rng);
      Attrs attrs;
      attrs.set("strides", c.strides);
      attrs.set("pads", c.pads);
      attrs.set("dilations", c.dilations);
      attrs.set("group", c.group);
      const Tensor y = run1("conv", {&x, &w, c.bias ? &b : nullptr}, attrs);
      EXPECT_LE(rel_error(y, conv_reference(x, w, c.bias ? &b : nullptr, c, y.shape())), tolerance(dtype))
          << shape_str(c.x) << " * " << shape_str(c.w) << " " << dtype_name(dtype);
    }
  }
}

// softmax(scale·q·kᵀ + bias)·v computed whole, in double.
Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* bias, double scale, const Shape& out_shape) {
  const size_t r = q.rank();
  const int64_t tq = q.shape()[r - 2], tk = k.shape()[r - 2], d = q.shape()[r - 1], dv = v.shape()[r - 1];
  const Shape batch(out_shape.begin(), out_shape.end() - 2);
  const Shape qb(q.shape().begin(), q.shape().end() - 2), kb(k.shape().begin(), k.shape().end() - 2), vb(v.shape().begin(), v.shape().end() - 2);
  Shape scores_shape = batch;
  scores_shape.insert(scores_shape.end(), {tq, tk});
  Tensor y = Tensor::zeros(DType::kF64, out_shape);
  for (int64_t b = 0; b < numel(batch); ++b) {
    const auto bi = unravel(b, batch);
    const int64_t qo = ravel_broadcast(bi, qb) * tq * d, ko = ravel_broadcast(bi, kb) * tk * d, vo = ravel_broadcast(bi, vb) * tk * dv;
    for (int64_t i = 0; i < tq; ++i) {
      std::vector<double> s(tk);
      double mx = -INFINITY;
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (int64_t p = 0; p < d; ++p) dot += q.get_as_double(qo + i * d + p) * k.get_as_double(ko + j * d + p);
        s[j] = scale * dot;
        if (bias) {
          std::vector<int64_t> index = bi;
          index.insert(index.end(), {i, j});
          s[j] += bias->get_as_double(ravel_broadcast(index, bias->shape()));
        }
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t c = 0; c < dv; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < tk; ++j) acc += s[j] / sum * v.get_as_double(vo + j * dv + c);
        y.set_from_double((b * tq + i) * dv + c, acc);
      }
    }
  }
  return y;
}

struct AttentionCase {
  Shape q, k, v, bias;  // empty bias: none
};

TEST(CpuLinalg, TiledAttentionMatchesNaiveSoftmax) {
  const std::vector<AttentionCase> cases = {
      {{2, 3, 70, 16}, {2, 3, 130, 16}, {2, 3, 130, 8}, {}},               // Tq, Tk not multiples of 64
      {{2, 3, 70, 16}, {2, 3, 130, 16}, {2, 3, 130, 8}, {1, 3, 70, 130}},  // bias broadcast over batch
      {{2, 5, 8}, {1, 200, 8}, {1, 200, 12}, {200}},                       // key-padding style bias, k/v batch broadcast
      {{4, 1, 4}, {4, 3, 4}, {4, 3, 4}, {4, 1, 3}},
      {{1, 64, 32}, {1, 128, 32}, {1, 128, 32}, {64, 1}},                  // exact block multiples
  };
  std::mt19937 rng(13);
  for (const AttentionCase& c : cases) {
    for (DType dtype : {DType::kF32, DType::kF64}) {
      const Tensor q = random_tensor(dtype, c.q, rng, -2, 2), k = random_tensor(dtype, c.k, rng, -2, 2), v = random_tensor(dtype, c.v, rng);
      const Tensor bias = random_tensor(dtype, c.bias.empty() ? Shape{1} : c.bias, rng, -3, 3);
      const Tensor* bias_ptr = c.bias.empty() ? nullptr : &bias;
      Attrs attrs;
      const double scale = 0.3;
      attrs.set("scale", scale);
      const Tensor y = run1("attention", {&q, &k, &v, bias_ptr}, attrs);
      EXPECT_LE(rel_error(y, attention_reference(q, k, v, bias_ptr, scale, y.shape())), tolerance(dtype))
          << shape_str(c.q) << " " << shape_str(c.k) << " bias " << shape_str(c.bias) << " " << dtype_name(dtype);
    }
  }
}

TEST(CpuLinalg, AttentionDefaultScaleMaskedKeysAndDropout) {
  std::mt19937 rng(14);
  const Tensor q = random_tensor(DType::kF64, {2, 9, 16}, rng), k = random_tensor(DType::kF64, {2, 100, 16}, rng),
               v = random_tensor(DType::kF64, {2, 100, 4}, rng);
  // -inf bias on the first 90 keys: softmax over the remaining 10 (spans two key blocks).
  Tensor mask = Tensor::zeros(DType::kF64, {100});
  for (int j = 0; j < 90; ++j) mask.set_from_double(j, -INFINITY);
  const Tensor y = run1("attention", {&q, &k, &v, &mask});
  EXPECT_LE(rel_error(y, attention_reference(q, k, v, &mask, 0.25, y.shape())), 1e-12);

  Attrs attrs;
  attrs.set("dropout_ratio", 0.5);
  attrs.set("seed", int64_t{3});
  auto run = [&](bool training, int64_t step) {
    auto r = run_op("attention", {&q, &k, &v}, attrs, -1, ExecOptions{.training = training, .seed = 1, .step = step});
    EXPECT_TRUE(r.ok()) << r.status().message();
    return values(r.value()[0]);
  };
  const Tensor plain = run1("attention", {&q, &k, &v});
  EXPECT_EQ(run(false, 1), values(plain));
  EXPECT_EQ(run(true, 1), run(true, 1));
  EXPECT_NE(run(true, 1), run(true, 2));
  EXPECT_NE(run(true, 1), values(plain));
}

}  // namespace
}  // namespace memc::testing
