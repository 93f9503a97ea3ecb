// The optimizer update ops against torch.optim's update rules, written out in double here,
// over several steps (so first-step special cases and bias corrections are exercised).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backends/kernel_math.h"
#include "ir/dtype.h"
#include "runtime/executor.h"
#include "tests/test_util.h"

namespace memc {
namespace {

Tensor scalar(float v) {
  Tensor t = Tensor::zeros(DType::kF32, {});
  t.data<float>()[0] = v;
  return t;
}

struct UpdateRun {
  std::vector<Tensor> states;  // w, then optimizer states
};

// Runs `op` for `steps` steps on a 5-element parameter, feeding outputs back as inputs.
// skips: per step, the optional `skip` input's value (empty: the input is absent).
UpdateRun run_updates(const std::string& op, Attrs attrs, int num_states, const std::vector<Tensor>& grads, float lr,
                      const std::vector<float>& skips = {}) {
  Module m;
  const Shape shape = {5};
  std::vector<ValueId> inputs = {m.add_argument("w", {DType::kF32, shape}, Role::kParam),
                                 m.add_argument("g", {DType::kF32, shape}, Role::kInput)};
  for (int i = 0; i < num_states; ++i) inputs.push_back(m.add_argument("s" + std::to_string(i), {DType::kF32, shape}, Role::kOptimizerState));
  inputs.push_back(m.add_argument("lr", {DType::kF32, {}}, Role::kScalar));
  if (op != "sgd_update") inputs.push_back(m.add_argument("step", {DType::kF32, {}}, Role::kScalar));
  if (!skips.empty()) inputs.push_back(m.add_argument("skip", {DType::kF32, {}}, Role::kScalar));
  auto out = m.add_node(op, inputs, attrs);
  MEMC_CHECK(out.ok(), out.status().message());
  m.set_outputs(*out);
  UpdateRun run;
  run.states.push_back(Tensor::zeros(DType::kF32, shape));
  for (int i = 0; i < 5; ++i) run.states[0].data<float>()[i] = 0.5f - 0.2f * static_cast<float>(i);
  for (int i = 0; i < num_states; ++i) run.states.push_back(Tensor::zeros(DType::kF32, shape));
  for (size_t step = 1; step <= grads.size(); ++step) {
    std::map<std::string, Tensor> feeds = {{"w", run.states[0]}, {"g", grads[step - 1]}, {"lr", scalar(lr)}, {"step", scalar(static_cast<float>(step))}};
    for (int i = 0; i < num_states; ++i) feeds["s" + std::to_string(i)] = run.states[1 + i];
    if (!skips.empty()) feeds["skip"] = scalar(skips[step - 1]);
    auto result = execute(m, feeds);
    MEMC_CHECK(result.ok(), result.status().message());
    run.states = *result;
  }
  return run;
}

std::vector<Tensor> random_grads(int steps) {
  std::mt19937 rng(11);
  std::vector<Tensor> g;
  for (int i = 0; i < steps; ++i) g.push_back(testing::random_tensor(DType::kF32, {5}, rng));
  return g;
}

void expect_close(const Tensor& got, const std::vector<double>& want) {
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(got.get_as_double(i), want[i], 1e-6 * std::max(1.0, std::abs(want[i]))) << "element " << i;
}

std::vector<double> initial_w() {
  std::vector<double> w(5);
  for (int i = 0; i < 5; ++i) w[i] = static_cast<double>(0.5f - 0.2f * static_cast<float>(i));
  return w;
}

TEST(Optimizer, SgdWithWeightDecay) {
  const auto grads = random_grads(3);
  Attrs a;
  a.set("weight_decay", 0.1);
  UpdateRun run = run_updates("sgd_update", a, 0, grads, 0.05f);
  std::vector<double> w = initial_w();
  for (const Tensor& g : grads) {
    for (int i = 0; i < 5; ++i) w[i] -= 0.05 * (g.get_as_double(i) + 0.1 * w[i]);  // w ← w − lr·(g + λw)
  }
  expect_close(run.states[0], w);
}

void check_momentum(bool nesterov, double dampening) {
  const auto grads = random_grads(4);
  Attrs a;
  a.set("momentum", 0.9);
  a.set("dampening", dampening);
  a.set("nesterov", int64_t{nesterov});
  a.set("weight_decay", 0.01);
  UpdateRun run = run_updates("momentum_update", a, 1, grads, 0.1f);
  std::vector<double> w = initial_w(), buf(5, 0.0);
  for (size_t t = 0; t < grads.size(); ++t) {
    for (int i = 0; i < 5; ++i) {
      const double g = grads[t].get_as_double(i) + 0.01 * w[i];
      buf[i] = t == 0 ? g : 0.9 * buf[i] + (1 - dampening) * g;  // torch: buf = g on the first step
      w[i] -= 0.1 * (nesterov ? g + 0.9 * buf[i] : buf[i]);
    }
  }
  expect_close(run.states[0], w);
  expect_close(run.states[1], buf);
}

TEST(Optimizer, Momentum) { check_momentum(false, 0.0); }
TEST(Optimizer, MomentumNesterov) { check_momentum(true, 0.0); }
TEST(Optimizer, MomentumDampening) { check_momentum(false, 0.3); }

Attrs adam_attrs(bool decoupled) {
  Attrs a;
  a.set("beta1", 0.9);
  a.set("beta2", 0.99);
  a.set("eps", 1e-8);
  a.set("weight_decay", 0.05);
  a.set("decoupled", int64_t{decoupled});
  return a;
}

void check_adam(bool decoupled) {
  const auto grads = random_grads(4);
  UpdateRun run = run_updates("adam_update", adam_attrs(decoupled), 2, grads, 0.01f);
  std::vector<double> w = initial_w(), m(5, 0.0), v(5, 0.0);
  for (size_t t = 1; t <= grads.size(); ++t) {
    for (int i = 0; i < 5; ++i) {
      double g = grads[t - 1].get_as_double(i);
      if (decoupled) w[i] *= 1 - 0.01 * 0.05;  // AdamW
      else g += 0.05 * w[i];                   // Adam's L2 term
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.99 * v[i] + 0.01 * g * g;
      const double m_hat = m[i] / (1 - std::pow(0.9, t)), v_hat = v[i] / (1 - std::pow(0.99, t));
      w[i] -= 0.01 * m_hat / (std::sqrt(v_hat) + 1e-8);
    }
  }
  expect_close(run.states[0], w);
  expect_close(run.states[1], m);
  expect_close(run.states[2], v);
}

TEST(Optimizer, Adam) { check_adam(false); }
TEST(Optimizer, AdamW) { check_adam(true); }

// A parameter longer than the CPU kernel's chunk (kVectorChunk, 256) and not a multiple of it,
// so its vectorized chunks and its tail both run: every element equals AdamStep::apply, the
// one-element update the CUDA kernel runs, bit for bit, in f32 and bf16, Adam and AdamW.
TEST(Optimizer, AdamLongTensorEqualsOneElementUpdateBitForBit) {
  constexpr int64_t n = 1000;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const bool decoupled : {false, true}) {
      Module m;
      const TensorType type{dtype, {n}};
      std::vector<ValueId> inputs = {m.add_argument("w", type, Role::kParam), m.add_argument("g", type, Role::kInput),
                                     m.add_argument("m", type, Role::kOptimizerState), m.add_argument("v", type, Role::kOptimizerState),
                                     m.add_argument("lr", {DType::kF32, {}}, Role::kScalar), m.add_argument("step", {DType::kF32, {}}, Role::kScalar)};
      auto out = m.add_node("adam_update", inputs, adam_attrs(decoupled));
      ASSERT_TRUE(out.ok()) << out.status().message();
      m.set_outputs(*out);
      std::mt19937 rng(5);
      const Tensor w = testing::random_tensor(dtype, {n}, rng), g = testing::random_tensor(dtype, {n}, rng),
                   mom = testing::random_tensor(dtype, {n}, rng), var = testing::random_tensor(dtype, {n}, rng, 0.0, 1.0);
      auto result = execute(m, {{"w", w}, {"g", g}, {"m", mom}, {"v", var}, {"lr", scalar(0.01f)}, {"step", scalar(3.0f)}});
      ASSERT_TRUE(result.ok()) << result.status().message();
      AdamStep step;
      step.beta1 = 0.9, step.beta2 = 0.99, step.eps = 1e-8, step.weight_decay = 0.05, step.decoupled = decoupled;
      step.lr = static_cast<double>(0.01f);
      step.set_step(3.0);
      for (int64_t i = 0; i < n; ++i) {
        float wi = static_cast<float>(w.get_as_double(i)), mi = static_cast<float>(mom.get_as_double(i)), vi = static_cast<float>(var.get_as_double(i));
        step.apply<float>(wi, static_cast<float>(g.get_as_double(i)), mi, vi);
        // The kernel's outputs hold wi, mi and vi stored in the tensor's dtype.
        Tensor want = Tensor::zeros(dtype, {3});
        want.set_from_double(0, wi), want.set_from_double(1, mi), want.set_from_double(2, vi);
        for (int k = 0; k < 3; ++k) {
          ASSERT_EQ((*result)[k].get_as_double(i), want.get_as_double(k))
              << dtype_name(dtype) << (decoupled ? " AdamW" : " Adam") << ", output " << k << ", element " << i;
        }
      }
    }
  }
}

// momentum_update over a long parameter (vectorized chunks and a tail), first and later steps,
// plain and Nesterov, f32 and bf16: each element as torch.optim.SGD computes it in f32, bit for bit.
TEST(Optimizer, MomentumLongTensorEqualsOneElementUpdateBitForBit) {
  constexpr int64_t n = 1000;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const bool nesterov : {false, true}) {
      for (const float step : {1.0f, 3.0f}) {
        Module m;
        const TensorType type{dtype, {n}};
        std::vector<ValueId> inputs = {m.add_argument("w", type, Role::kParam), m.add_argument("g", type, Role::kInput),
                                       m.add_argument("buf", type, Role::kOptimizerState), m.add_argument("lr", {DType::kF32, {}}, Role::kScalar),
                                       m.add_argument("step", {DType::kF32, {}}, Role::kScalar)};
        Attrs a;
        a.set("momentum", 0.9);
        a.set("dampening", nesterov ? 0.0 : 0.3);
        a.set("nesterov", int64_t{nesterov});
        a.set("weight_decay", 0.01);
        auto out = m.add_node("momentum_update", inputs, a);
        ASSERT_TRUE(out.ok()) << out.status().message();
        m.set_outputs(*out);
        std::mt19937 rng(7);
        const Tensor w = testing::random_tensor(dtype, {n}, rng), g = testing::random_tensor(dtype, {n}, rng),
                     buf = testing::random_tensor(dtype, {n}, rng);
        auto result = execute(m, {{"w", w}, {"g", g}, {"buf", buf}, {"lr", scalar(0.1f)}, {"step", scalar(step)}});
        ASSERT_TRUE(result.ok()) << result.status().message();
        const float wd = static_cast<float>(0.01), mu = static_cast<float>(0.9), rest = static_cast<float>(1.0 - (nesterov ? 0.0 : 0.3)),
                    lr = static_cast<float>(static_cast<double>(0.1f));
        for (int64_t i = 0; i < n; ++i) {
          const float wi = static_cast<float>(w.get_as_double(i));
          const float gi = static_cast<float>(g.get_as_double(i)) + wd * wi;
          const float b = step <= 1.0f ? gi : mu * static_cast<float>(buf.get_as_double(i)) + rest * gi;
          const float dir = nesterov ? gi + mu * b : b;
          Tensor want = Tensor::zeros(dtype, {2});
          want.set_from_double(0, wi - lr * dir), want.set_from_double(1, b);
          for (int k = 0; k < 2; ++k) {
            ASSERT_EQ((*result)[k].get_as_double(i), want.get_as_double(k))
                << dtype_name(dtype) << (nesterov ? " nesterov" : "") << " step " << step << ", output " << k << ", element " << i;
          }
        }
      }
    }
  }
}

// The optional `skip` input (loss scaling's found_inf): 1 leaves parameter and states as they
// were, bit for bit, even for a NaN gradient; 0 is the plain update.
TEST(Optimizer, SkipInputLeavesEverythingUnchanged) {
  std::vector<Tensor> grads = random_grads(3);
  grads[1].data<float>()[2] = std::nanf("");  // the skipped step's gradient is NaN
  struct Op {
    std::string name;
    int states;
  };
  for (const Op& op : {Op{"sgd_update", 0}, Op{"momentum_update", 1}, Op{"adam_update", 2}}) {
    Attrs a;
    a.set("weight_decay", 0.01);
    const UpdateRun one = run_updates(op.name, a, op.states, {grads[0]}, 0.05f, {0.0f});
    const UpdateRun plain = run_updates(op.name, a, op.states, {grads[0]}, 0.05f);
    const UpdateRun skipped = run_updates(op.name, a, op.states, {grads[0], grads[1]}, 0.05f, {0.0f, 1.0f});
    ASSERT_EQ(skipped.states.size(), one.states.size()) << op.name;
    for (size_t k = 0; k < one.states.size(); ++k) {
      ASSERT_EQ(one.states[k].nbytes(), skipped.states[k].nbytes());
      EXPECT_EQ(std::memcmp(one.states[k].raw(), skipped.states[k].raw(), one.states[k].nbytes()), 0) << op.name << " output " << k;
      EXPECT_EQ(std::memcmp(one.states[k].raw(), plain.states[k].raw(), one.states[k].nbytes()), 0) << op.name << " output " << k;
    }
  }
}

}  // namespace
}  // namespace memc
