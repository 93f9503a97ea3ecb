// CPU backward kernels (conv_grad_input, conv_grad_weight, attention_grad) against naive
// double-precision references, and bit-exact replay of dropout masks in gradients.
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"
#include "passes/autodiff.h"
#include "tests/cpu_test_util.h"

namespace memc::testing {
namespace {

using I = std::vector<int64_t>;

// ---- conv -----------------------------------------------------------------------------------

struct ConvGradCase {
  Shape x, w;
  I strides, pads, dilations;
  int64_t group = 1;
};

Attrs conv_attrs(const ConvGradCase& c) {
  Attrs a;
  a.set("strides", c.strides);
  a.set("pads", c.pads);
  a.set("dilations", c.dilations);
  a.set("group", c.group);
  return a;
}

// Scatters every product of the forward sum y[n, m, o] = Σ x[n, g·Cg + ci, o·s - p + k·d]·w[m, ci, k]
// back to dx and dw.
void conv_grad_reference(const Tensor& dy, const Tensor& x, const Tensor& w, const ConvGradCase& c, Tensor& dx, Tensor& dw) {
  const size_t sd = c.x.size() - 2;
  const Shape in(c.x.begin() + 2, c.x.end()), kernel(c.w.begin() + 2, c.w.end());
  const int64_t cg = c.w[1], mg = c.w[0] / c.group, kernel_size = numel(kernel);
  dx = Tensor::zeros(DType::kF64, c.x);
  dw = Tensor::zeros(DType::kF64, c.w);
  for (int64_t i = 0; i < dy.numel(); ++i) {
    const auto yi = unravel(i, dy.shape());
    const int64_t n = yi[0], m = yi[1], g = m / mg;
    const double dyi = dy.get_as_double(i);
    for (int64_t ci = 0; ci < cg; ++ci) {
      for (int64_t kk = 0; kk < kernel_size; ++kk) {
        const auto ki = unravel(kk, kernel);
        int64_t offset = n * c.x[1] + g * cg + ci;
        bool inside = true;
        for (size_t d = 0; d < sd; ++d) {
          const int64_t pos = yi[2 + d] * c.strides[d] - c.pads[d] + ki[d] * c.dilations[d];
          inside = inside && pos >= 0 && pos < in[d];
          offset = offset * in[d] + pos;
        }
        if (!inside) continue;
        const int64_t wi = (m * cg + ci) * kernel_size + kk;
        dx.set_from_double(offset, dx.get_as_double(offset) + dyi * w.get_as_double(wi));
        dw.set_from_double(wi, dw.get_as_double(wi) + dyi * x.get_as_double(offset));
      }
    }
  }
}

TEST(CpuGrad, ConvGradInputAndWeightMatchNaiveScatter) {
  const std::vector<ConvGradCase> cases = {
      {{2, 4, 9, 8}, {6, 2, 3, 3}, {2, 1}, {1, 2, 0, 1}, {2, 1}, 2},               // 2-D: stride, pads, dilation, groups
      {{1, 3, 16, 16}, {8, 3, 4, 4}, {4, 4}, {0, 0, 0, 0}, {1, 1}, 1},             // patch embedding
      {{2, 6, 5, 5}, {4, 3, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 2},               // pointwise, grouped
      {{2, 4, 6, 6}, {4, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 4},               // depthwise
      {{2, 2, 7, 7}, {3, 2, 3, 3}, {3, 3}, {0, 0, 0, 0}, {1, 1}, 1},               // stride skips input rows
      {{2, 3, 11}, {4, 3, 3}, {2}, {1, 2}, {2}, 1},                                // 1-D
      {{1, 2, 5, 4, 6}, {4, 1, 2, 3, 2}, {1, 2, 2}, {1, 0, 1, 0, 1, 0}, {2, 1, 1}, 2},  // 3-D
      {{1, 4, 3, 3, 3}, {2, 4, 1, 1, 1}, {1, 1, 1}, {0, 0, 0, 0, 0, 0}, {1, 1, 1}, 1},  // 3-D pointwise
  };
  std::mt19937 rng(21);
  for (const ConvGradCase& c : cases) {
    for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      const Tensor x = random_tensor(dtype, c.x, rng), w = random_tensor(dtype, c.w, rng);
      const Tensor y = run1("conv", {&x, &w}, conv_attrs(c));
      const Tensor dy = random_tensor(dtype, y.shape(), rng);
      Attrs in_attrs = conv_attrs(c), w_attrs = conv_attrs(c);
      in_attrs.set("input_shape", c.x);
      w_attrs.set("weight_shape", c.w);
      const Tensor dx = run1("conv_grad_input", {&dy, &w}, in_attrs);
      const Tensor dw = run1("conv_grad_weight", {&dy, &x}, w_attrs);
      Tensor dx_ref, dw_ref;
      conv_grad_reference(dy, x, w, c, dx_ref, dw_ref);
      ASSERT_EQ(dx.shape(), c.x);
      ASSERT_EQ(dw.shape(), c.w);
      EXPECT_EQ(dx.dtype(), dtype);
      const std::string what = shape_str(c.x) + " * " + shape_str(c.w) + " " + std::string(dtype_name(dtype));
      EXPECT_LE(rel_error(dx, dx_ref), 2 * tolerance(dtype)) << "dx " << what;
      EXPECT_LE(rel_error(dw, dw_ref), 2 * tolerance(dtype)) << "dw " << what;
    }
  }
}

TEST(CpuGrad, ConvGradRejectsIntegers) {
  const Tensor dy = Tensor::zeros(DType::kI32, {1, 1, 2, 2}), w = Tensor::zeros(DType::kI32, {1, 1, 1, 1});
  Attrs a;
  a.set("input_shape", I{1, 1, 2, 2});
  EXPECT_FALSE(run_op("conv_grad_input", {&dy, &w}, a).ok());
}

// ---- attention ------------------------------------------------------------------------------

struct DropoutSpec {
  double ratio = 0;
  int64_t node_seed = 0;
  ExecOptions options;
  // The kernel's documented mask: score (b, i, j) is kept when
  // counter_random(seed, dropout_stream(node seed, step), (b·Tq + i)·Tk + j) < threshold.
  double factor(int64_t b, int64_t i, int64_t j, int64_t tq, int64_t tk) const {
    if (!options.training || ratio <= 0) return 1.0;
    const uint64_t index = static_cast<uint64_t>((b * tq + i) * tk + j);
    const bool kept = counter_random(options.seed, dropout_stream(node_seed, options.step), index) <
                      dropout_threshold(ratio);
    return kept ? 1.0 / (1.0 - ratio) : 0.0;
  }
};

struct AttentionGrads {
  Tensor y, dq, dk, dv, dbias;
};

// Whole-matrix attention and its gradient in double, straight from the definitions:
//   P = softmax(scale·q·kᵀ + bias), P̃ = P∘F (dropout factors), y = P̃·v,
//   dv = P̃ᵀ·dy, dP = (dy·vᵀ)∘F, dS = P∘(dP - rowsum(P∘dP)), dq = scale·dS·k, dk = scale·dSᵀ·q.
AttentionGrads attention_grad_reference(const Tensor& dy, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor* bias, double scale, const DropoutSpec& dropout) {
  const size_t r = q.rank();
  const int64_t tq = q.shape()[r - 2], tk = k.shape()[r - 2], d = q.shape()[r - 1], dv = v.shape()[r - 1];
  const Shape batch(dy.shape().begin(), dy.shape().end() - 2);
  const Shape qb(q.shape().begin(), q.shape().end() - 2), kb(k.shape().begin(), k.shape().end() - 2),
      vb(v.shape().begin(), v.shape().end() - 2);
  AttentionGrads g{Tensor::zeros(DType::kF64, dy.shape()), Tensor::zeros(DType::kF64, q.shape()),
                   Tensor::zeros(DType::kF64, k.shape()), Tensor::zeros(DType::kF64, v.shape()),
                   Tensor::zeros(DType::kF64, bias ? bias->shape() : Shape{1})};
  auto add = [](Tensor& t, int64_t i, double x) { t.set_from_double(i, t.get_as_double(i) + x); };
  for (int64_t b = 0; b < numel(batch); ++b) {
    const auto bi = unravel(b, batch);
    const int64_t qo = ravel_broadcast(bi, qb) * tq * d, ko = ravel_broadcast(bi, kb) * tk * d,
                  vo = ravel_broadcast(bi, vb) * tk * dv;
    for (int64_t i = 0; i < tq; ++i) {
      std::vector<double> p(tk), f(tk), dp(tk);
      std::vector<int64_t> bias_index(tk);
      double mx = -INFINITY;
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q.get_as_double(qo + i * d + c) * k.get_as_double(ko + j * d + c);
        p[j] = scale * dot;
        if (bias) {
          std::vector<int64_t> index = bi;
          index.insert(index.end(), {i, j});
          bias_index[j] = ravel_broadcast(index, bias->shape());
          p[j] += bias->get_as_double(bias_index[j]);
        }
        mx = std::max(mx, p[j]);
        f[j] = dropout.factor(b, i, j, tq, tk);
      }
      double sum = 0;
      for (double& x : p) sum += (x = mx == -INFINITY ? 0.0 : std::exp(x - mx));
      for (double& x : p) x = sum > 0 ? x / sum : 0.0;  // a fully masked row attends to nothing
      double delta = 0;
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < dv; ++c) {
          const double dyc = dy.get_as_double((b * tq + i) * dv + c), vjc = v.get_as_double(vo + j * dv + c);
          add(g.y, (b * tq + i) * dv + c, p[j] * f[j] * vjc);
          add(g.dv, vo + j * dv + c, p[j] * f[j] * dyc);
          dot += dyc * vjc;
        }
        dp[j] = dot * f[j];
        delta += p[j] * dp[j];
      }
      for (int64_t j = 0; j < tk; ++j) {
        const double ds = p[j] * (dp[j] - delta);
        if (bias) add(g.dbias, bias_index[j], ds);
        for (int64_t c = 0; c < d; ++c) {
          add(g.dq, qo + i * d + c, scale * ds * k.get_as_double(ko + j * d + c));
          add(g.dk, ko + j * d + c, scale * ds * q.get_as_double(qo + i * d + c));
        }
      }
    }
  }
  return g;
}

struct AttentionGradCase {
  std::string label;
  Shape q, k, v, bias;  // empty bias: none
  double dropout_ratio = 0;
  bool want_dbias = true;
};

TEST(CpuGrad, AttentionGradMatchesWholeMatrixReference) {
  const std::vector<AttentionGradCase> cases = {
      {"plain", {2, 5, 8}, {2, 7, 8}, {2, 7, 6}, {}},
      {"blocks", {1, 2, 70, 8}, {1, 2, 130, 8}, {1, 2, 130, 4}, {1, 2, 70, 130}},  // Tq, Tk cross 64-blocks
      {"bias_broadcast", {2, 3, 6, 4}, {2, 3, 9, 4}, {2, 3, 9, 5}, {1, 3, 6, 9}},
      {"kv_broadcast_key_mask", {2, 5, 8}, {1, 80, 8}, {1, 80, 3}, {80}},
      {"q_broadcast", {1, 4, 8}, {3, 6, 8}, {3, 6, 2}, {3, 1, 6}},
      {"row_bias", {2, 4, 4}, {2, 5, 4}, {2, 5, 4}, {4, 1}},  // softmax-invariant: dbias ≈ 0
      {"dropout", {2, 2, 9, 8}, {2, 2, 70, 8}, {2, 2, 70, 4}, {2, 1, 9, 70}, 0.3},
      {"dropout_no_dbias", {3, 66, 4}, {3, 5, 4}, {3, 5, 4}, {5}, 0.5, false},
      {"dropout_no_bias", {1, 3, 4}, {2, 5, 4}, {1, 5, 4}, {}, 0.2},
      // Short sequences over many heads: strided-batched groups of entries (groups of several
      // entries and a smaller last one in f32), with and without dropout and a read-only bias.
      {"grouped", {8, 4, 20, 16}, {8, 4, 20, 16}, {8, 4, 20, 16}, {}},
      {"grouped_dropout_bias", {8, 4, 20, 16}, {8, 4, 20, 16}, {8, 4, 20, 16}, {1, 4, 20, 20}, 0.3, false},
  };
  std::mt19937 rng(22);
  const double scale = 0.4;
  for (const AttentionGradCase& c : cases) {
    for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(c.label + " " + std::string(dtype_name(dtype)));
      const Tensor q = random_tensor(dtype, c.q, rng, -2, 2), k = random_tensor(dtype, c.k, rng, -2, 2),
                   v = random_tensor(dtype, c.v, rng);
      const Tensor bias = random_tensor(dtype, c.bias.empty() ? Shape{1} : c.bias, rng, -2, 2);
      const Tensor* bias_ptr = c.bias.empty() ? nullptr : &bias;
      Attrs attrs;
      attrs.set("scale", scale);
      attrs.set("dropout_ratio", c.dropout_ratio);
      attrs.set("seed", int64_t{9});
      const DropoutSpec dropout{c.dropout_ratio, 9, ExecOptions{.training = true, .seed = 5, .step = 3}};
      auto forward = run_op("attention", {&q, &k, &v, bias_ptr}, attrs, -1, dropout.options);
      ASSERT_TRUE(forward.ok()) << forward.status().message();
      const Tensor dy = random_tensor(dtype, (*forward)[0].shape(), rng);
      const int num_outputs = bias_ptr && c.want_dbias ? 4 : 3;
      auto grads = run_op("attention_grad", {&dy, &q, &k, &v, bias_ptr}, attrs, num_outputs, dropout.options);
      ASSERT_TRUE(grads.ok()) << grads.status().message();
      ASSERT_EQ(grads->size(), static_cast<size_t>(num_outputs));
      const AttentionGrads ref = attention_grad_reference(dy, q, k, v, bias_ptr, scale, dropout);
      const double tol = 2 * tolerance(dtype);
      EXPECT_LE(rel_error((*forward)[0], ref.y), tol) << "y (forward mask = reference mask)";
      EXPECT_LE(rel_error((*grads)[0], ref.dq), tol) << "dq";
      EXPECT_LE(rel_error((*grads)[1], ref.dk), tol) << "dk";
      EXPECT_LE(rel_error((*grads)[2], ref.dv), tol) << "dv";
      for (int i = 0; i < 3; ++i) EXPECT_EQ((*grads)[i].dtype(), dtype);
      if (num_outputs == 4) {
        EXPECT_EQ((*grads)[3].shape(), c.bias);
        if (c.label == "row_bias") {  // Σ_j dS_ij = 0: a per-row shift leaves softmax unchanged
          for (int64_t i = 0; i < (*grads)[3].numel(); ++i) EXPECT_LE(std::abs((*grads)[3].get_as_double(i)), 1e-5);
        } else {
          EXPECT_LE(rel_error((*grads)[3], ref.dbias), tol) << "dbias";
        }
      }
    }
  }
}

// A query whose every key is masked (-inf bias) gets y = 0 and zero gradients, not NaN.
TEST(CpuGrad, AttentionGradOfFullyMaskedRowIsZero) {
  std::mt19937 rng(23);
  const Tensor q = random_tensor(DType::kF32, {1, 3, 4}, rng), k = random_tensor(DType::kF32, {1, 5, 4}, rng),
               v = random_tensor(DType::kF32, {1, 5, 2}, rng), dy = random_tensor(DType::kF32, {1, 3, 2}, rng);
  Tensor bias = Tensor::zeros(DType::kF32, {3, 5});
  for (int j = 0; j < 5; ++j) bias.set_from_double(1 * 5 + j, -INFINITY);  // query 1: all keys masked
  bias.set_from_double(0, -INFINITY);                                      // query 0: key 0 masked
  Attrs attrs;
  attrs.set("scale", 0.5);
  auto grads = run_op("attention_grad", {&dy, &q, &k, &v, &bias}, attrs, 4);
  ASSERT_TRUE(grads.ok()) << grads.status().message();
  const AttentionGrads ref = attention_grad_reference(dy, q, k, v, &bias, 0.5, {});
  for (const auto& [got, want] : {std::pair{&(*grads)[0], &ref.dq}, {&(*grads)[1], &ref.dk}, {&(*grads)[2], &ref.dv},
                                  {&(*grads)[3], &ref.dbias}}) {
    for (int64_t i = 0; i < got->numel(); ++i) ASSERT_FALSE(std::isnan(got->get_as_double(i)));
    EXPECT_LE(rel_error(*got, *want), 1e-5);
  }
  for (int c = 0; c < 4; ++c) EXPECT_EQ((*grads)[0].get_as_double(1 * 4 + c), 0.0);
}

// ---- dropout replay -------------------------------------------------------------------------

// loss = Σ f(inputs)·r for a random r, with the gradient of every input appended; the module's
// outputs are f's output followed by the gradients.
struct GradModule {
  Module module;
  std::map<std::string, Tensor> feeds;
  Tensor r;  // the loss weights: d loss / d y
};

GradModule grad_module(const std::string& op, const std::vector<Shape>& shapes, const Attrs& attrs, std::mt19937& rng) {
  GradModule g;
  Module& m = g.module;
  std::vector<ValueId> inputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    inputs.push_back(m.add_argument(name, TensorType{DType::kF32, shapes[i]}, Role::kInput));
    g.feeds[name] = random_tensor(DType::kF32, shapes[i], rng);
  }
  const ValueId y = m.add_node(op, inputs, attrs, "forward").value()[0];
  g.r = random_tensor(DType::kF32, m.value(y).type.shape, rng);
  const ValueId r = m.add_constant(g.r, "r");
  const ValueId weighted = m.add_node("mul", {y, r}).value()[0];
  Attrs sum;
  sum.set("axes", I{});
  sum.set("keepdims", int64_t{0});
  const ValueId loss = m.add_node("reduce_sum", {weighted}, sum).value()[0];
  auto grads = Autodiff().run(m, loss, inputs);
  EXPECT_TRUE(grads.ok()) << grads.status().message();
  std::vector<ValueId> outputs = {y};
  outputs.insert(outputs.end(), grads->begin(), grads->end());
  m.set_outputs(outputs);
  return g;
}

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].nbytes() != b[i].nbytes() || std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()) != 0) return false;
  }
  return true;
}

std::vector<Tensor> run_module(const GradModule& g, const ExecOptions& options) {
  auto out = execute(g.module, g.feeds, options);
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? *out : std::vector<Tensor>{};
}

// A sharded rank's loss (passes/shard.h): rows labelled {ignore_index} add nothing to the loss
// and get a zero gradient; the rest are summed and divided by {divisor}, not by the rows.
TEST(CpuGrad, CrossEntropyIgnoresPaddingRowsAndDividesByItsDivisor) {
  const Tensor logits = make(DType::kF64, {3, 4}, {0.5, -1, 2, 0.25, 1, 1, -0.5, 3, -2, 0.75, 0, 1.5});
  const Tensor labels = make(DType::kI64, {3}, {2, -1, 0});
  const Tensor every = make(DType::kI64, {3}, {2, 3, 0});
  Attrs attrs;
  attrs.set("ignore_index", int64_t{-1});
  attrs.set("divisor", 2.5);
  auto row_loss = [&](int64_t row, int64_t label) {
    double sum = 0;
    for (int64_t c = 0; c < 4; ++c) sum += std::exp(logits.get_as_double(row * 4 + c));
    return std::log(sum) - logits.get_as_double(row * 4 + label);
  };
  EXPECT_NEAR(run1("softmax_cross_entropy", {&logits, &labels}, attrs).get_as_double(0), (row_loss(0, 2) + row_loss(2, 0)) / 2.5, 1e-12);
  EXPECT_NEAR(run1("softmax_cross_entropy", {&logits, &every}).get_as_double(0), (row_loss(0, 2) + row_loss(1, 3) + row_loss(2, 0)) / 3, 1e-12);
  // Without ignore_index a negative label is bad input, naming its row.
  const auto bad = run_op("softmax_cross_entropy", {&logits, &labels});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("label -1 at row 1"), std::string::npos) << bad.status().message();

  const Tensor dloss = make(DType::kF64, {}, {2.0});
  const Tensor dz = run1("softmax_cross_entropy_grad", {&dloss, &logits, &labels}, attrs);
  const Tensor dz_every = run1("softmax_cross_entropy_grad", {&dloss, &logits, &every});
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_EQ(dz.get_as_double(4 + c), 0.0) << "the ignored row's gradient is zero";
    // Kept rows: 2·(softmax - onehot)/2.5, against the same rows' 2·(…)/3 without the attributes.
    EXPECT_NEAR(dz.get_as_double(c), dz_every.get_as_double(c) * 3 / 2.5, 1e-12);
    EXPECT_NEAR(dz.get_as_double(8 + c), dz_every.get_as_double(8 + c) * 3 / 2.5, 1e-12);
  }
}

TEST(CpuGrad, DropoutGradientReplaysTheForwardMask) {
  std::mt19937 rng(24);
  Attrs attrs;
  attrs.set("ratio", 0.4);
  attrs.set("seed", int64_t{17});
  const GradModule g = grad_module("dropout", {{6, 50}}, attrs, rng);
  const ExecOptions step1{.training = true, .seed = 2, .step = 1};
  const std::vector<Tensor> first = run_module(g, step1), second = run_module(g, step1);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_TRUE(same_bits(first, second)) << "same (seed, step): identical forward and gradient bits";
  EXPECT_FALSE(same_bits(first, run_module(g, ExecOptions{.training = true, .seed = 2, .step = 2})));

  // dx = r·mask/(1 - ratio): nonzero exactly where the forward kept the element.
  const Tensor& y = first[0];
  const Tensor& dx = first[1];
  int64_t kept = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const bool forward_kept = y.get_as_double(i) != 0.0;
    kept += forward_kept;
    EXPECT_EQ(forward_kept, dx.get_as_double(i) != 0.0) << "element " << i;
  }
  EXPECT_GT(kept, 120);  // ~60% of 300
  EXPECT_LT(kept, 240);
}

TEST(CpuGrad, AttentionDropoutGradientReplaysTheForwardMask) {
  std::mt19937 rng(25);
  Attrs attrs;
  attrs.set("scale", 0.5);
  attrs.set("dropout_ratio", 0.3);
  attrs.set("seed", int64_t{4});
  const GradModule g = grad_module("attention", {{2, 9, 4}, {2, 70, 4}, {2, 70, 3}, {9, 70}}, attrs, rng);
  const ExecOptions options{.training = true, .seed = 8, .step = 5};
  const std::vector<Tensor> first = run_module(g, options), second = run_module(g, options);
  ASSERT_EQ(first.size(), 5u);
  EXPECT_TRUE(same_bits(first, second));
  EXPECT_FALSE(same_bits(first, run_module(g, ExecOptions{.training = true, .seed = 8, .step = 6})));

  // The gradients the rule emitted use the forward's mask: compare with the reference under
  // that mask (dy = r, the loss weights).
  const DropoutSpec dropout{0.3, 4, options};
  const AttentionGrads ref = attention_grad_reference(g.r, g.feeds.at("in0"), g.feeds.at("in1"), g.feeds.at("in2"),
                                                      &g.feeds.at("in3"), 0.5, dropout);
  EXPECT_LE(rel_error(first[0], ref.y), 1e-5);
  EXPECT_LE(rel_error(first[1], ref.dq), 1e-5);
  EXPECT_LE(rel_error(first[2], ref.dk), 1e-5);
  EXPECT_LE(rel_error(first[3], ref.dv), 1e-5);
  EXPECT_LE(rel_error(first[4], ref.dbias), 1e-5);
}

}  // namespace
}  // namespace memc::testing
