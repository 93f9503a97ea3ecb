// Kernel workspace: every kernel with scratch runs inside exactly its declared workspace (a
// guard region after it stays untouched, the workspace starts poisoned with NaN bytes), the
// results match the executor's, 16-bit results equal the f32 kernel's rounded once (the
// kernels widen, compute in f32 and round on store), and ops without scratch declare 0.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backends/cpu/kernels.h"
#include "backends/cpu/workspace.h"
#include "tests/cpu_test_util.h"

namespace memc::testing {
namespace {

constexpr uint8_t kGuardPattern = 0x5A;
constexpr int64_t kGuardBytes = 1024;

struct GuardedResult {
  std::vector<Tensor> outputs;
  int64_t declared_bytes = 0;
  bool guard_intact = false;
};

// Builds a one-node module like run_op, asks the kernel's workspace function for its size and
// calls the kernel directly on a buffer of that size followed by a patterned guard.
// `guard_at` moves the guard's start (default: right after the declared bytes).
GuardedResult run_guarded(const std::string& op, const std::vector<const Tensor*>& inputs, Attrs attrs, int num_outputs = -1,
                          int64_t guard_at = -1) {
  Module m;
  std::vector<ValueId> ids;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ids.push_back(inputs[i] ? m.add_argument("in" + std::to_string(i), TensorType{inputs[i]->dtype(), inputs[i]->shape()}, Role::kInput)
                            : kNoValue);
  }
  auto outs = m.add_node(op, ids, std::move(attrs), "test", num_outputs);
  EXPECT_TRUE(outs.ok()) << outs.status().message();
  const Node& node = m.node(m.value((*outs)[0]).producer);
  GuardedResult r;
  r.declared_bytes = cpu::cpu_workspace_bytes(m, node);
  EXPECT_EQ(r.declared_bytes % cpu::Workspace::kAlignment, 0);
  if (guard_at < 0) guard_at = r.declared_bytes;
  Tensor buffer = Tensor::zeros(DType::kU8, {guard_at + kGuardBytes});
  auto* base = static_cast<uint8_t*>(buffer.raw());
  std::memset(base, 0xFF, static_cast<size_t>(guard_at));  // NaN in every float dtype
  std::memset(base + guard_at, kGuardPattern, kGuardBytes);

  cpu::KernelContext ctx{node, {}, {}, /*training=*/true, /*seed=*/5, /*step=*/3};
  ctx.workspace = r.declared_bytes ? base : nullptr;
  ctx.workspace_bytes = r.declared_bytes;
  for (const Tensor* t : inputs) ctx.inputs.push_back(t);
  for (ValueId v : *outs) r.outputs.push_back(Tensor::zeros(m.value(v).type.dtype, m.value(v).type.shape));
  for (Tensor& t : r.outputs) ctx.outputs.push_back(&t);
  const Status st = (*cpu::find_kernel(op))(ctx);
  EXPECT_TRUE(st.ok()) << op << ": " << st.message();
  r.guard_intact = true;
  for (int64_t i = 0; i < kGuardBytes; ++i) r.guard_intact = r.guard_intact && base[guard_at + i] == kGuardPattern;
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct ScratchCase {
  std::string label, op;
  std::vector<Shape> inputs;  // float inputs; an empty shape marks an absent optional input
  Attrs attrs;
  int num_outputs = -1;
  std::vector<std::pair<int, Tensor>> fixed;  // non-float inputs by position (indices)
};

Attrs conv_attrs(std::vector<int64_t> strides, std::vector<int64_t> pads, int64_t group) {
  Attrs a;
  a.set("strides", strides);
  a.set("pads", pads);
  a.set("group", group);
  return a;
}

std::vector<ScratchCase> scratch_cases() {
  std::vector<ScratchCase> cases;
  Attrs none;
  cases.push_back({"matmul_folded", "matmul", {{2, 3, 5, 4}, {4, 6}}, none});
  Attrs trans;
  trans.set("transpose_b", int64_t{1});
  cases.push_back({"matmul_broadcast", "matmul", {{2, 1, 5, 4}, {3, 6, 4}}, trans});
  cases.push_back({"linear_bias", "linear", {{3, 5, 8}, {6, 8}, {6}}, none});
  cases.push_back({"conv2d_grouped", "conv", {{2, 4, 7, 7}, {6, 2, 3, 3}, {6}}, conv_attrs({2, 2}, {1, 1, 1, 1}, 2)});
  cases.push_back({"conv1d", "conv", {{2, 3, 9}, {4, 3, 3}}, conv_attrs({1}, {1, 1}, 1)});
  cases.push_back({"conv_pointwise", "conv", {{2, 3, 4, 4}, {5, 3, 1, 1}}, conv_attrs({1, 1}, {0, 0, 0, 0}, 1)});
  Attrs gi = conv_attrs({2, 2}, {1, 1, 1, 1}, 2), gw = gi;
  gi.set("input_shape", std::vector<int64_t>{2, 4, 7, 7});
  gw.set("weight_shape", std::vector<int64_t>{6, 2, 3, 3});
  cases.push_back({"conv_grad_input", "conv_grad_input", {{2, 6, 4, 4}, {6, 2, 3, 3}}, gi});
  cases.push_back({"conv_grad_weight", "conv_grad_weight", {{2, 6, 4, 4}, {2, 4, 7, 7}}, gw});
  Attrs gi3 = conv_attrs({1}, {1, 1}, 1);
  gi3.set("input_shape", std::vector<int64_t>{2, 3, 9});
  cases.push_back({"conv1d_grad_input", "conv_grad_input", {{2, 4, 9}, {4, 3, 3}}, gi3});
  // Tq = 70 and Tk = 80 span two query and two key blocks; dropout is on (training).
  Attrs att;
  att.set("scale", 0.4);
  att.set("dropout_ratio", 0.3);
  att.set("seed", int64_t{9});
  cases.push_back({"attention", "attention", {{2, 2, 70, 8}, {2, 2, 80, 8}, {2, 2, 80, 6}, {2, 1, 70, 80}}, att});
  cases.push_back({"attention_grad", "attention_grad",
                   {{2, 2, 70, 6}, {2, 2, 70, 8}, {2, 2, 80, 8}, {2, 2, 80, 6}, {2, 1, 70, 80}}, att, 4});
  Attrs att_plain;
  cases.push_back({"attention_grad_no_bias", "attention_grad", {{3, 5, 4}, {3, 5, 4}, {1, 9, 4}, {1, 9, 4}}, att_plain, 3});
  // The other layouts (ir/attention_layout.h): operands gathered into slot scratch, gradients
  // done per entry (tiled) or per group (short sequences) and stored where the layout puts them.
  Attrs bthd = att, tbhd = att, bthd_plain;
  bthd.set("layout", std::string("bthd"));
  tbhd.set("layout", std::string("tbhd"));
  bthd_plain.set("layout", std::string("bthd"));
  cases.push_back({"attention_bthd", "attention", {{2, 70, 2, 8}, {2, 80, 2, 8}, {2, 80, 2, 6}, {2, 1, 70, 80}}, bthd});
  cases.push_back({"attention_grad_tbhd", "attention_grad",
                   {{70, 2, 2, 6}, {70, 2, 2, 8}, {80, 2, 2, 8}, {80, 2, 2, 6}, {2, 1, 70, 80}}, tbhd, 4});
  cases.push_back({"attention_grad_bthd_grouped", "attention_grad", {{3, 5, 4, 4}, {3, 5, 4, 4}, {3, 9, 4, 4}, {3, 9, 4, 4}}, bthd_plain, 3});
  Attrs axes;
  axes.set("axes", std::vector<int64_t>{1});
  cases.push_back({"reduce_sum", "reduce_sum", {{3, 7, 5}}, axes});
  cases.push_back({"softmax", "softmax", {{4, 33}}, none});
  Attrs ln;
  ln.set("axis", int64_t{1});
  cases.push_back({"layernorm", "layernorm", {{3, 4, 5}, {4, 5}, {5}}, ln});
  cases.push_back({"layernorm_grad", "layernorm_grad", {{3, 4, 5}, {3, 4, 5}, {4, 5}}, ln, 2});
  cases.push_back({"layernorm_grad_broadcast_scale", "layernorm_grad", {{3, 4, 5}, {3, 4, 5}, {5}}, ln, 2});
  Attrs gg;
  gg.set("axis", int64_t{0});
  gg.set("input_shape", std::vector<int64_t>{10, 4});
  cases.push_back({"gather_grad", "gather_grad", {{6, 4}}, gg, -1, {{1, make(DType::kI64, {6}, {1, 3, 3, 0, 9, -1})}}});
  // The optimizers' states are f32 (adafactor's factors, adam8bit's block maxima) or codes.
  const Tensor lr = make(DType::kF32, {}, {0.01}), step = make(DType::kF32, {}, {3});
  Attrs factored;
  factored.set("factored", int64_t{1});
  cases.push_back({"adafactor_factored", "adafactor_update", {{2, 5, 7}, {2, 5, 7}}, factored, 3,
                   {{2, make(DType::kF32, {2, 5}, std::vector<double>(10, 0.5))}, {3, make(DType::kF32, {2, 7}, std::vector<double>(14, 0.25))},
                    {4, lr}, {5, step}}});
  cases.push_back({"adafactor_flat", "adafactor_update", {{9000}, {9000}}, none, 2,
                   {{2, make(DType::kF32, {9000}, std::vector<double>(9000, 0.5))}, {3, lr}, {4, step}}});
  Attrs q8;
  q8.set("block", int64_t{256});
  cases.push_back({"adam8bit", "adam8bit_update", {{600}, {600}}, q8, 5,
                   {{2, make(DType::kU8, {600}, std::vector<double>(600, 200))}, {3, make(DType::kF32, {3}, {0.1, 0.2, 0.3})},
                    {4, make(DType::kU8, {600}, std::vector<double>(600, 100))}, {5, make(DType::kF32, {3}, {0.01, 0.02, 0.03})},
                    {6, lr}, {7, step}}});
  Attrs pad;
  pad.set("pads", std::vector<int64_t>{1, 2, 0, 3});
  pad.set("mode", std::string("reflect"));
  cases.push_back({"pad", "pad", {{4, 5}}, pad});
  return cases;
}

std::vector<Tensor> make_inputs(const ScratchCase& c, DType dtype, std::mt19937& rng) {
  std::vector<Tensor> inputs;
  for (const Shape& s : c.inputs) inputs.push_back(random_tensor(dtype, s, rng, -2, 2));
  for (const auto& [pos, t] : c.fixed) inputs.insert(inputs.begin() + pos, t);
  return inputs;
}

TEST(Workspace, KernelsStayInsideTheirDeclaredWorkspace) {
  std::mt19937 rng(7);
  for (const ScratchCase& c : scratch_cases()) {
    for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(c.label + " " + std::string(dtype_name(dtype)));
      const std::vector<Tensor> inputs = make_inputs(c, dtype, rng);
      std::vector<const Tensor*> ptrs;
      for (const Tensor& t : inputs) ptrs.push_back(&t);
      const GuardedResult guarded = run_guarded(c.op, ptrs, c.attrs, c.num_outputs);
      EXPECT_TRUE(guarded.guard_intact);

      // The executor, in its own check mode, gets bit-identical results.
      const ExecOptions options{.training = true, .seed = 5, .step = 3, .check_workspace = true};
      auto executed = run_op(c.op, ptrs, c.attrs, c.num_outputs, options);
      ASSERT_TRUE(executed.ok()) << executed.status().message();
      for (size_t i = 0; i < executed->size(); ++i) EXPECT_TRUE(same_bits((*executed)[i], guarded.outputs[i])) << "output " << i;

      // 16-bit: the f32 kernel on the same (widened) values, rounded once.
      if (dtype == DType::kF16 || dtype == DType::kBF16) {
        std::vector<Tensor> wide;
        for (const Tensor& t : inputs) wide.push_back(t.dtype() == dtype ? t.cast(DType::kF32) : t);
        std::vector<const Tensor*> wide_ptrs;
        for (const Tensor& t : wide) wide_ptrs.push_back(&t);
        const GuardedResult f32 = run_guarded(c.op, wide_ptrs, c.attrs, c.num_outputs);
        EXPECT_TRUE(f32.guard_intact);
        for (size_t i = 0; i < f32.outputs.size(); ++i) {
          // Outputs in the data dtype are rounded; f32 ones (optimizer states) compare as they are.
          const Tensor expected = f32.outputs[i].dtype() != guarded.outputs[i].dtype() ? f32.outputs[i].cast(guarded.outputs[i].dtype()) : f32.outputs[i];
          EXPECT_TRUE(same_bits(guarded.outputs[i], expected)) << "output " << i << " differs from the rounded f32 result";
        }
      }
    }
  }
}

// The guard really catches a write: conv with a 2x2 kernel fills its whole im2col buffer, so
// a guard moved 64 bytes into the declared workspace is overwritten.
TEST(Workspace, GuardCatchesWritesPastTheEnd) {
  std::mt19937 rng(3);
  const Tensor x = random_tensor(DType::kF32, {1, 2, 5, 5}, rng), w = random_tensor(DType::kF32, {3, 2, 2, 2}, rng);
  const Attrs a = conv_attrs({1, 1}, {0, 0, 0, 0}, 1);
  // col [Cg·K, P] = [2·4, 4·4] f32 = 512 bytes, already whole cache lines.
  EXPECT_EQ(run_guarded("conv", {&x, &w}, a).declared_bytes, 512);
  EXPECT_FALSE(run_guarded("conv", {&x, &w}, a, -1, 512 - 64).guard_intact);
}

TEST(Workspace, SizesFollowTheFormulas) {
  std::mt19937 rng(1);
  auto declared = [&](const std::string& op, DType dtype, const std::vector<Shape>& shapes, Attrs attrs = {}, int outs = -1) {
    std::vector<Tensor> inputs;
    for (const Shape& s : shapes) inputs.push_back(random_tensor(dtype, s, rng));
    std::vector<const Tensor*> ptrs;
    for (const Tensor& t : inputs) ptrs.push_back(&t);
    return run_guarded(op, ptrs, std::move(attrs), outs).declared_bytes;
  };
  // f16 matmul [5,4]·[4,6]: f32 copies of a, b, c = 20 + 24 + 30 = 74 floats = 296 → 320 bytes.
  EXPECT_EQ(declared("matmul", DType::kF16, {{5, 4}, {4, 6}}), 320);
  // conv f32 x[1,2,5,5] w[3,2,3,3]: col [18, 9] = 162 floats = 648 → 704 bytes; f16 adds the gemm
  // copies w[3,18] + col[18,9] + y[3,9] = 54 + 162 + 27 = 243 floats = 972 → 1024, col in f16 = 324 → 384.
  EXPECT_EQ(declared("conv", DType::kF32, {{1, 2, 5, 5}, {3, 2, 3, 3}}), 704);
  EXPECT_EQ(declared("conv", DType::kF16, {{1, 2, 5, 5}, {3, 2, 3, 3}}), 384 + 1024);
  // attention f32, Tq = Tk = 300, D = Dv = 1, no dropout: blocks of 128 queries × 256 keys, whose
  // products (≤ 128·256·1 multiply-adds) run in the plain loop, without library scratch:
  // scores [128, 256] = 131072 bytes, out [128, 1] = 512, row max and sum [128] = 512 each.
  EXPECT_EQ(declared("attention", DType::kF32, {{300, 1}, {300, 1}, {300, 1}}), 131072 + 512 + 512 + 512);
  // softmax over 33 f64: 264 → 320 bytes. gather_grad f16 into [10, 4]: f32 accumulator 160 → 192,
  // and the 2 wrapped indices, 16 → 64; f32 accumulates in dx itself: the indices alone.
  EXPECT_EQ(declared("softmax", DType::kF64, {{4, 33}}), 320);
  const Tensor dy = random_tensor(DType::kF16, {2, 4}, rng), idx = make(DType::kI64, {2}, {1, 7});
  Attrs gg;
  gg.set("input_shape", std::vector<int64_t>{10, 4});
  EXPECT_EQ(run_guarded("gather_grad", {&dy, &idx}, gg).declared_bytes, 192 + 64);
  const Tensor dy32 = dy.cast(DType::kF32);
  EXPECT_EQ(run_guarded("gather_grad", {&dy32, &idx}, gg).declared_bytes, 64);
  // adafactor on w [3, 40, 30], factored: column means [3·30] f64 = 720 → 768, row-factor means
  // [3] → 64, Σu² partials [⌈3600/4096⌉ = 1] → 64. Never a copy of w.
  const Tensor lr = make(DType::kF32, {}, {0.01}), step = make(DType::kF32, {}, {1});
  const Tensor w = random_tensor(DType::kF32, {3, 40, 30}, rng), r = Tensor::zeros(DType::kF32, {3, 40}), c = Tensor::zeros(DType::kF32, {3, 30});
  Attrs factored;
  factored.set("factored", int64_t{1});
  EXPECT_EQ(run_guarded("adafactor_update", {&w, &w, &r, &c, &lr, &step}, factored, 3).declared_bytes, 768 + 64 + 64);
  // adam8bit, blocks of 256 over [600]: each of 8 thread slots holds one block's m and v in f32,
  // 2 · 8 · 256 · 4 = 16384 bytes.
  const Tensor w600 = random_tensor(DType::kF32, {600}, rng), codes = Tensor::zeros(DType::kU8, {600}), maxima = Tensor::zeros(DType::kF32, {3});
  Attrs q8;
  q8.set("block", int64_t{256});
  EXPECT_EQ(run_guarded("adam8bit_update", {&w600, &w600, &codes, &maxima, &codes, &maxima, &lr, &step}, q8, 5).declared_bytes, 16384);
}

TEST(Workspace, OpsWithoutScratchDeclareZero) {
  std::mt19937 rng(2);
  const Tensor a = random_tensor(DType::kF32, {3, 4}, rng), b = random_tensor(DType::kF32, {4, 5}, rng);
  const Tensor a16 = a.cast(DType::kF16);
  const Tensor idx = make(DType::kI64, {2}, {0, 2});
  Attrs perm;
  perm.set("perm", std::vector<int64_t>{1, 0});
  Attrs gg;
  gg.set("input_shape", std::vector<int64_t>{3, 4});
  const Tensor dy_gather = random_tensor(DType::kF32, {2, 4}, rng), idx_elements = make(DType::kI64, {2, 4}, {0, 1, 2, 0, 2, 2, 1, 0});
  const Tensor x_conv = random_tensor(DType::kF32, {1, 3, 4, 4}, rng), w_conv = random_tensor(DType::kF32, {2, 3, 1, 1}, rng);
  struct Zero {
    std::string op;
    std::vector<const Tensor*> inputs;
    Attrs attrs;
  };
  const std::vector<Zero> cases = {
      {"add", {&a, &a}, {}},
      {"relu", {&a16}, {}},
      {"transpose", {&a}, perm},
      {"gather", {&a, &idx}, {}},
      {"matmul", {&a, &b}, {}},             // f32 and f64 go straight to BLAS
      {"conv", {&x_conv, &w_conv}, conv_attrs({1, 1}, {0, 0, 0, 0}, 1)},  // pointwise: x is the im2col matrix
      {"gather_elements_grad", {&dy_gather, &idx_elements}, gg},  // f32 accumulates in dx itself
  };
  for (const Zero& c : cases) {
    const GuardedResult r = run_guarded(c.op, c.inputs, c.attrs);
    EXPECT_EQ(r.declared_bytes, 0) << c.op;
    EXPECT_TRUE(r.guard_intact) << c.op;
  }
}

TEST(Workspace, CarvingPastTheDeclaredSizeAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS has started threads
  Tensor buffer = Tensor::zeros(DType::kU8, {256});
  cpu::Workspace ws(buffer.raw(), 128);
  EXPECT_NE(ws.take<float>(16), nullptr);  // 64 bytes
  EXPECT_NE(ws.take<float>(1), nullptr);   // rounds up to the next 64
  EXPECT_EQ(ws.used_bytes(), 128);
  EXPECT_DEATH(ws.take<float>(1), "workspace overrun");
}

TEST(Workspace, ExecutorSizesItsScratchByTheLargestNode) {
  // y = softmax(matmul(a, b)) in f16: matmul needs (6·4 + 4·5 + 6·5)·4 = 296 → 320 bytes,
  // softmax a row of 5 f32 = 20 → 64 bytes; the executor allocates the larger.
  Module m;
  const ValueId a = m.add_argument("a", TensorType{DType::kF16, {6, 4}}, Role::kInput);
  const ValueId b = m.add_argument("b", TensorType{DType::kF16, {4, 5}}, Role::kInput);
  auto mm = m.add_node("matmul", {a, b}, {}, "mm");
  ASSERT_TRUE(mm.ok());
  auto sm = m.add_node("softmax", {(*mm)[0]}, {}, "sm");
  ASSERT_TRUE(sm.ok());
  m.set_outputs(*sm);
  EXPECT_EQ(cpu::cpu_workspace_bytes(m, m.node(m.value((*mm)[0]).producer)), 320);
  EXPECT_EQ(cpu::cpu_workspace_bytes(m, m.node(m.value((*sm)[0]).producer)), 64);
  EXPECT_EQ(max_workspace_bytes(cpu_backend(), m), 320);
}

}  // namespace
}  // namespace memc::testing
