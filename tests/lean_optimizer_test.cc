// Lean optimizer states: adam8bit (AdamW with block-wise dynamically quantized 8-bit moments)
// and adafactor (factored second moment). The first adam8bit step equals AdamW's bit for bit
// (the moments are quantized only when stored); adafactor matches an independent double
// reference over three steps; the state bytes are what the arithmetic predicts; both train the
// digits ViT like AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "backends/kernel_math.h"
#include "ir/grad.h"
#include "planner/compile.h"
#include "runtime/executor.h"
#include "runtime/host_memory.h"
#include "runtime/trainer.h"
#include "tests/pass_compare.h"
#include "tests/test_util.h"

namespace memc {
namespace {

ValueId arg(Module& m, const std::string& name, TensorType t, Role role = Role::kInput) { return m.add_argument(name, std::move(t), role); }

Tensor scalar(float v) {
  Tensor t = Tensor::zeros(DType::kF32, {});
  t.data<float>()[0] = v;
  return t;
}

// QuantMap::encode (adam8bit's moments) gives the code of the nearest value, the lower one on a
// tie, against a brute-force search of all codes: at every coded value, the midpoints between
// neighbours and the floats either side of them, a dense grid, and values out of range.
TEST(Adam8bit, EncodeGivesTheNearestCode) {
  for (const bool is_signed : {true, false}) {
    const QuantMap map = QuantMap::dynamic(is_signed);
    std::vector<float> xs = {-2.0f, 2.0f, 0.0f, -0.0f, 1e-9f, -1e-9f};
    for (int i = 0; i < map.count; ++i) {
      const float v = map.sorted_value[i];
      xs.push_back(v);
      if (i + 1 < map.count) {
        const float mid = v + (map.sorted_value[i + 1] - v) / 2;
        xs.insert(xs.end(), {mid, std::nextafter(mid, -1.0f), std::nextafter(mid, 1.0f)});
      }
    }
    for (int i = -5000; i <= 5000; ++i) xs.push_back(static_cast<float>(i) / 4000.0f);
    for (const float x : xs) {
      int best = 0;
      for (int c = 1; c < map.count; ++c) {
        const float d = std::abs(map.value[c] - x), best_d = std::abs(map.value[best] - x);
        if (d < best_d || (d == best_d && map.value[c] < map.value[best])) best = c;
      }
      ASSERT_EQ(map.value[map.encode(x)], map.value[best]) << (is_signed ? "signed" : "unsigned") << " x = " << x;
    }
  }
}

// The CPU kernel's table (QuantIndex) gives encode's code for every value above, for both ends of
// every bucket of floats that share their top 16 bits (infinities and NaNs among them), and for
// the floats either side of every sorted value: the same codes as the halving, not just as near.
TEST(Adam8bit, TheTableEncodesAsTheHalving) {
  for (const bool is_signed : {true, false}) {
    const QuantMap map = QuantMap::dynamic(is_signed);
    const QuantIndex index(map);
    EXPECT_LE(index.steps(), 2);  // values at least 1/128 of themselves apart (the unsigned top decade: 0.9/128)
    std::vector<float> xs = {-2.0f, 2.0f, 0.0f, -0.0f, 1e-9f, -1e-9f, std::nanf(""), -std::nanf("")};
    for (uint32_t key = 0; key < (1u << 16); ++key) {
      for (const uint32_t low : {0u, 0x7FFFu, 0xFFFFu}) {
        const uint32_t bits = key << 16 | low;
        float x;
        std::memcpy(&x, &bits, sizeof x);
        xs.push_back(x);
      }
    }
    for (int i = 0; i < map.count; ++i) {
      const float v = map.sorted_value[i];
      xs.insert(xs.end(), {v, std::nextafter(v, -2.0f), std::nextafter(v, 2.0f)});
      if (i + 1 < map.count) xs.push_back(v + (map.sorted_value[i + 1] - v) / 2);
    }
    std::vector<uint8_t> codes(xs.size());
    index.encode_many(xs.data(), codes.data(), static_cast<int64_t>(xs.size()));
    for (size_t i = 0; i < xs.size(); ++i) {
      ASSERT_EQ(codes[i], map.encode(xs[i])) << (is_signed ? "signed" : "unsigned") << " x = " << xs[i];
    }
  }
}

// Blocks run on parallel threads: three steps over 1,172 blocks (the last one partial) give the
// same codes, block maxima and weights, bit for bit, on one thread and on two.
TEST(Adam8bit, BlocksOnTwoThreadsEqualOneThreadBitForBit) {
  const int64_t n = 300000, block = 256, blocks = (n + block - 1) / block;
  Module m;
  const ValueId ws = arg(m, "w", {DType::kF32, {n}}), gs = arg(m, "g", {DType::kF32, {n}}), mq = arg(m, "mq", {DType::kU8, {n}}),
                mm = arg(m, "mm", {DType::kF32, {blocks}}), vq = arg(m, "vq", {DType::kU8, {n}}), vm = arg(m, "vm", {DType::kF32, {blocks}}),
                lr = arg(m, "lr", {DType::kF32, {}}), st = arg(m, "step", {DType::kF32, {}});
  m.set_outputs(*m.add_node("adam8bit_update", {ws, gs, mq, mm, vq, vm, lr, st},
                            make_attrs({{"weight_decay", 0.01}, {"decoupled", int64_t{1}}, {"block", block}})));
  auto run = [&](int64_t threads) {
    set_compute_threads(threads);
    std::mt19937 rng(9);
    std::vector<Tensor> state = {testing::random_tensor(DType::kF32, {n}, rng), Tensor::zeros(DType::kU8, {n}), Tensor::zeros(DType::kF32, {blocks}),
                                 Tensor::zeros(DType::kU8, {n}), Tensor::zeros(DType::kF32, {blocks})};
    for (int step = 1; step <= 3; ++step) {
      auto out = execute(m, {{"w", state[0]}, {"g", testing::random_tensor(DType::kF32, {n}, rng)}, {"mq", state[1]}, {"mm", state[2]},
                             {"vq", state[3]}, {"vm", state[4]}, {"lr", scalar(1e-3f)}, {"step", scalar(static_cast<float>(step))}});
      MEMC_CHECK(out.ok(), out.status().message());
      state = *out;
    }
    return state;
  };
  const int64_t threads = host_memory().threads;
  const std::vector<Tensor> one = run(1), two = run(2);
  set_compute_threads(threads);
  for (size_t k = 0; k < one.size(); ++k) {
    ASSERT_EQ(one[k].nbytes(), two[k].nbytes());
    EXPECT_EQ(std::memcmp(one[k].raw(), two[k].raw(), one[k].nbytes()), 0) << "output " << k;
  }
  // The codes are not all zero: the encoding ran.
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) nonzero += one[1].data<uint8_t>()[i] != 0;
  EXPECT_GT(nonzero, n / 2);
}

TEST(Adam8bit, FirstStepEqualsAdamWAndLaterStepsStayClose) {
  const Shape shape{3000};  // two blocks of 2048
  std::mt19937 rng(3);
  Tensor w = testing::random_tensor(DType::kF32, shape, rng), g = testing::random_tensor(DType::kF32, shape, rng);
  Attrs a = make_attrs({{"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.01}, {"decoupled", int64_t{1}}});
  Module m32, m8;
  {
    const ValueId ws = arg(m32, "w", {DType::kF32, shape}), gs = arg(m32, "g", {DType::kF32, shape}), ms = arg(m32, "m", {DType::kF32, shape}),
                  vs = arg(m32, "v", {DType::kF32, shape}), lr = arg(m32, "lr", {DType::kF32, {}}), st = arg(m32, "step", {DType::kF32, {}});
    m32.set_outputs(*m32.add_node("adam_update", {ws, gs, ms, vs, lr, st}, a));
  }
  {
    Attrs a8 = a;
    a8.set("block", int64_t{2048});
    const ValueId ws = arg(m8, "w", {DType::kF32, shape}), gs = arg(m8, "g", {DType::kF32, shape}), mq = arg(m8, "mq", {DType::kU8, shape}),
                  mm = arg(m8, "mm", {DType::kF32, {2}}), vq = arg(m8, "vq", {DType::kU8, shape}), vm = arg(m8, "vm", {DType::kF32, {2}}),
                  lr = arg(m8, "lr", {DType::kF32, {}}), st = arg(m8, "step", {DType::kF32, {}});
    m8.set_outputs(*m8.add_node("adam8bit_update", {ws, gs, mq, mm, vq, vm, lr, st}, a8));
  }
  Tensor w32 = w, m = Tensor::zeros(DType::kF32, shape), v = m;
  Tensor w8 = w, mq = Tensor::zeros(DType::kU8, shape), mm = Tensor::zeros(DType::kF32, {2}), vq = mq, vm = mm;
  for (int step = 1; step <= 20; ++step) {
    Tensor grad = testing::random_tensor(DType::kF32, shape, rng);
    auto o32 = execute(m32, {{"w", w32}, {"g", grad}, {"m", m}, {"v", v}, {"lr", scalar(1e-3f)}, {"step", scalar(static_cast<float>(step))}});
    auto o8 = execute(m8, {{"w", w8}, {"g", grad}, {"mq", mq}, {"mm", mm}, {"vq", vq}, {"vm", vm}, {"lr", scalar(1e-3f)},
                           {"step", scalar(static_cast<float>(step))}});
    ASSERT_TRUE(o32.ok() && o8.ok());
    w32 = (*o32)[0], m = (*o32)[1], v = (*o32)[2];
    w8 = (*o8)[0], mq = (*o8)[1], mm = (*o8)[2], vq = (*o8)[3], vm = (*o8)[4];
    if (step == 1) {
      ASSERT_EQ(std::memcmp(w8.raw(), w32.raw(), w32.nbytes()), 0) << "the first step differs from AdamW";
    }
  }
  // After 20 steps the weights moved by ~lr·20; the 8-bit moments keep that movement within 5%.
  double moved = 0, diff = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    moved += std::abs(w32.get_as_double(i) - w.get_as_double(i));
    diff += std::abs(w8.get_as_double(i) - w32.get_as_double(i));
  }
  std::printf("[lean] adam8bit vs AdamW after 20 steps: mean |Δw| %.3g, mean |w8 - w32| %.3g\n", moved / w.numel(), diff / w.numel());
  EXPECT_LT(diff, 0.05 * moved);
}

// Independent reference: Adafactor without momentum, explicit lr, in double, on `mats`
// matrices [rows, cols] (factored: r [mats·rows], c [mats·cols]) or, with factored false, on
// a flat tensor whose second moment is v = r (c unused).
void adafactor_reference(std::vector<double>& w, const std::vector<double>& g, std::vector<double>& r, std::vector<double>& c,
                         bool factored, int mats, int rows, int cols, double lr, double t, double wd) {
  const double beta = 1.0 - std::pow(t, -0.8);
  std::vector<double> u(w.size());
  if (!factored) {
    for (size_t k = 0; k < w.size(); ++k) {
      r[k] = beta * r[k] + (1 - beta) * (g[k] * g[k] + 1e-30);
      u[k] = g[k] / std::sqrt(r[k]);
    }
  }
  for (int b = 0; factored && b < mats; ++b) {
    const auto at = [&](int i, int j) { return (static_cast<size_t>(b) * rows + i) * cols + j; };
    for (int i = 0; i < rows; ++i) {
      double s = 0;
      for (int j = 0; j < cols; ++j) s += g[at(i, j)] * g[at(i, j)] + 1e-30;
      r[b * rows + i] = beta * r[b * rows + i] + (1 - beta) * s / cols;
    }
    for (int j = 0; j < cols; ++j) {
      double s = 0;
      for (int i = 0; i < rows; ++i) s += g[at(i, j)] * g[at(i, j)] + 1e-30;
      c[b * cols + j] = beta * c[b * cols + j] + (1 - beta) * s / rows;
    }
    double r_mean = 0;
    for (int i = 0; i < rows; ++i) r_mean += r[b * rows + i] / rows;
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) u[at(i, j)] = g[at(i, j)] / std::sqrt(r[b * rows + i] / r_mean * c[b * cols + j]);
    }
  }
  double sq = 0;
  for (double x : u) sq += x * x;
  const double scale = 1.0 / std::max(1.0, std::sqrt(sq / static_cast<double>(u.size())));
  for (size_t k = 0; k < w.size(); ++k) w[k] = w[k] - lr * wd * w[k] - lr * scale * u[k];
}

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = t.get_as_double(i);
  return out;
}

// An adafactor_update node on w [mats, rows, cols] (factored) or [mats·rows·cols] (not).
struct AdafactorCase {
  bool factored;
  int mats, rows, cols;
  Module m;
  Shape w_shape() const { return factored ? Shape{mats, rows, cols} : Shape{int64_t{mats} * rows * cols}; }
  Shape r_shape() const { return factored ? Shape{mats, rows} : w_shape(); }
  AdafactorCase(bool f, int b, int r, int c) : factored(f), mats(b), rows(r), cols(c) {
    std::vector<ValueId> in = {arg(m, "w", {DType::kF32, w_shape()}), arg(m, "g", {DType::kF32, w_shape()}), arg(m, "r", {DType::kF32, r_shape()})};
    if (factored) in.push_back(arg(m, "c", {DType::kF32, {mats, cols}}));
    in.push_back(arg(m, "lr", {DType::kF32, {}}));
    in.push_back(arg(m, "step", {DType::kF32, {}}));
    Attrs a = make_attrs({{"factored", int64_t{factored}}, {"decay_rate", -0.8}, {"eps1", 1e-30}, {"clip_threshold", 1.0}, {"weight_decay", 0.1}});
    auto outs = m.add_node("adafactor_update", in, a, "", factored ? 3 : 2);
    MEMC_CHECK(outs.ok(), outs.status().message());
    m.set_outputs(*outs);
  }
  // Three steps from random weights and zero state, on `threads` threads; each step's inputs
  // are also stepped through the reference, which must agree.
  std::vector<Tensor> run(int64_t threads, bool check_reference) {
    const int64_t saved = host_memory().threads;
    set_compute_threads(threads);
    std::mt19937 rng(5);
    std::vector<Tensor> state = {testing::random_tensor(DType::kF32, w_shape(), rng), Tensor::zeros(DType::kF32, r_shape())};
    if (factored) state.push_back(Tensor::zeros(DType::kF32, {mats, cols}));
    std::vector<double> rw = doubles(state[0]), rr = doubles(state[1]), rc(static_cast<size_t>(mats) * cols, 0.0);
    for (int step = 1; step <= 3; ++step) {
      Tensor g = testing::random_tensor(DType::kF32, w_shape(), rng);
      std::map<std::string, Tensor> feeds = {{"w", state[0]}, {"g", g}, {"r", state[1]}};
      if (factored) feeds.emplace("c", state[2]);
      feeds.emplace("lr", scalar(0.01f));
      feeds.emplace("step", scalar(static_cast<float>(step)));
      auto out = execute(m, feeds);
      MEMC_CHECK(out.ok(), out.status().message());
      state = *out;
      if (check_reference) adafactor_reference(rw, doubles(g), rr, rc, factored, mats, rows, cols, 0.01, step, 0.1);
    }
    set_compute_threads(saved);
    for (int64_t i = 0; check_reference && i < state[0].numel(); ++i) {
      EXPECT_NEAR(state[0].get_as_double(i), rw[static_cast<size_t>(i)], 1e-6 * std::max(1.0, std::abs(rw[static_cast<size_t>(i)]))) << i;
    }
    return state;
  }
};

TEST(Adafactor, FactoredUpdateMatchesAReferenceOverThreeSteps) {
  AdafactorCase one_matrix(true, 1, 5, 7);
  one_matrix.run(1, true);
  AdafactorCase stacked(true, 3, 40, 30);  // a batch of matrices, each with its own factors
  stacked.run(1, true);
}

TEST(Adafactor, UnfactoredUpdateMatchesAReferenceOverThreeSteps) {
  AdafactorCase flat(false, 1, 1, 9000);  // three chunks of the Σu² sum
  flat.run(1, true);
}

// Rows, columns and Σu² chunks split over threads; every sum keeps its order, so two threads
// give one thread's bits. Large enough that every pass splits.
TEST(Adafactor, TwoThreadsEqualOneThreadBitForBit) {
  for (const bool factored : {true, false}) {
    AdafactorCase big(factored, 2, 600, 100);
    const std::vector<Tensor> one = big.run(1, false), two = big.run(2, false);
    for (size_t k = 0; k < one.size(); ++k) {
      ASSERT_EQ(one[k].nbytes(), two[k].nbytes());
      EXPECT_EQ(std::memcmp(one[k].raw(), two[k].raw(), one[k].nbytes()), 0) << "factored " << factored << ", output " << k;
    }
  }
}

int64_t state_bytes(const Plan& p) {
  int64_t total = 0;
  for (ValueId a : p.train.arguments()) total += p.train.value(a).role == Role::kOptimizerState ? p.train.value(a).type.bytes() : 0;
  return total;
}

TEST(LeanOptimizers, StateBytesAsTheArithmeticPredictsAndTheyTrain) {
  CompileOptions o;
  o.batch = 32;
  o.epochs = 8;  // 150 steps: 44 per epoch of digits
  o.schedule.lr = 2e-3;
  o.optimizer.kind = "adamw";
  const Plan adamw = testing::compile_committed("vit_tiny", o);
  int64_t adamw_bytes = 0, q8_bytes = 0, factored_bytes = 0;
  for (ValueId a : adamw.train.arguments()) {
    const Value& v = adamw.train.value(a);
    if (v.role != Role::kParam) continue;
    const int64_t n = v.type.numel();
    adamw_bytes += 8 * n;
    q8_bytes += 2 * n + 8 * ((n + 2047) / 2048);
    const Shape& s = v.type.shape;
    if (s.size() >= 2) {
      factored_bytes += 4 * (n / s.back() + n / s[s.size() - 2]);
    } else {
      factored_bytes += 4 * n;
    }
  }
  o.optimizer.kind = "adam8bit";
  const Plan q8 = testing::compile_committed("vit_tiny", o);
  o.optimizer.kind = "adafactor";
  const Plan fa = testing::compile_committed("vit_tiny", o);
  EXPECT_EQ(state_bytes(adamw), adamw_bytes);
  EXPECT_EQ(state_bytes(q8), q8_bytes);
  EXPECT_EQ(state_bytes(fa), factored_bytes);
  std::printf("[lean] vit_tiny optimizer state: adamw %lld B, adam8bit %lld B, adafactor %lld B\n", static_cast<long long>(adamw_bytes),
              static_cast<long long>(q8_bytes), static_cast<long long>(factored_bytes));
  double last[3] = {0, 0, 0};
  const Plan* plans[3] = {&adamw, &q8, &fa};
  for (int k = 0; k < 3; ++k) {
    RunOptions run{.data = testing::source_path("data/digits_train.npz"), .steps = 150, .seed = 0, .quiet = true};
    auto report = run_plan("", *plans[k], run);
    ASSERT_TRUE(report.ok()) << report.status().message();
    ASSERT_EQ(report->losses.size(), 150u);
    for (size_t i = 140; i < 150; ++i) last[k] += report->losses[i] / 10;
    EXPECT_EQ(report->measured_peak_bytes, plans[k]->memory.predicted_peak_bytes);
  }
  std::printf("[lean] mean loss of steps 141-150: adamw %.4f, adam8bit %.4f, adafactor %.4f\n", last[0], last[1], last[2]);
  EXPECT_LT(last[1], 2.0);  // chance is ln 10 = 2.30
  EXPECT_LT(last[2], 2.0);
  EXPECT_NEAR(last[1], last[0], 0.25 * last[0]);
}

}  // namespace
}  // namespace memc
