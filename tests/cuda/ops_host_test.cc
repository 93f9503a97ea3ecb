// The CUDA backend's kernels without a GPU: every op of backends/cuda/op_table.h runs here with a
// host runner (each body a plain loop, GEMMs a double-precision reference), behind a Backend that
// is the CPU's in every other respect. Whole training steps of the committed models through these
// kernels must match the CPU backend, so the kernels' index maps, broadcasts, RNG draws,
// reductions and scratch carving are checked here; a GPU adds only the launch itself
// (bench/device_check.sh runs the same steps on the device).
#include <gtest/gtest.h>

#include <optional>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "backends/backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/onednn_matmul.h"
#include "backends/kernel_attrs.h"
#include "backends/cuda/op_table.h"
#include "tests/cuda/host_cuda_backend.h"
#include "ir/fused_program.h"
#include "ir/grad.h"
#include "passes/add_layernorm.h"
#include "passes/fuse_elementwise.h"
#include "passes/layernorm_bias_grad.h"
#include "passes/layernorm_grad_casts.h"
#include "passes/liveness.h"
#include "passes/narrow_transposes.h"
#include "passes/update_grad_casts.h"
#include "planner/compile.h"
#include "runtime/calibrate.h"
#include "runtime/executor.h"
#include "runtime/planned_executor.h"
#include "tests/test_util.h"

namespace memc {
namespace {

using testing::HostCudaBackend;
using testing::HostRunner;
using testing::source_path;

double l2_norm(const Tensor& t) {
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum += t.get_as_double(i) * t.get_as_double(i);
  return std::sqrt(sum);
}

// ‖a - ref‖₂ / max(‖ref‖₂, floor): the floor keeps gradients that are zero in exact arithmetic
// (a key projection's bias under softmax) from comparing noise with noise.
// `skip_nan`: elements NaN on both sides are left out (where the reference is NaN too).
double relative_difference(const Tensor& a, const Tensor& ref, double floor = 0, bool skip_nan = false) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    if (skip_nan && std::isnan(a.get_as_double(i)) && std::isnan(ref.get_as_double(i))) continue;
    const double r = ref.get_as_double(i), d = a.get_as_double(i) == r ? 0.0 : a.get_as_double(i) - r;  // equal infinities agree
    diff += d * d, norm += r * r;
  }
  return std::sqrt(diff) / std::max({std::sqrt(norm), floor, 1e-300});
}

// A kernel's scratch on the host, 64-byte aligned as the CPU kernels require.
struct Scratch64 {
  std::vector<uint64_t> words;
  int64_t bytes;
  explicit Scratch64(int64_t n) : words(static_cast<size_t>(n / 8 + 16)), bytes(n) {}
  void give(KernelContext& ctx) {
    ctx.workspace = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(words.data()) + 63) / 64 * 64);
    ctx.workspace_bytes = bytes;
  }
};

// Node by node (the planned executor's node_check): after each kernel of a step on the backend
// under test, the CPU backend's kernel runs on host copies of the same inputs into outputs of its
// own, and any float output further than one op's rounding from the tested one is recorded.
// Inputs are identical, so this isolates each kernel's error from the step's accumulated one.
struct NodeCheck {
  const Module* module = nullptr;
  std::vector<std::string> mismatches;
  int64_t nodes = 0;

  // `ctx`'s node on the CPU backend: `inputs` (absent where undefined) into fresh outputs of the
  // given dtypes, in a scratch of the CPU kernel's own size (`scale` times: f64 buffers).
  Expected<std::vector<Tensor>> cpu_outputs(const KernelContext& ctx, const std::vector<Tensor>& inputs, const std::vector<DType>& dtypes,
                                            int64_t scale) const {
    std::vector<Tensor> outputs;
    for (size_t k = 0; k < ctx.outputs.size(); ++k) outputs.push_back(Tensor::zeros(dtypes[k], ctx.outputs[k]->shape()));
    KernelContext cpu{ctx.node, {}, {}, ctx.training, ctx.seed, ctx.step};
    cpu.batch_row_offset = ctx.batch_row_offset;
    for (const Tensor& t : inputs) cpu.inputs.push_back(t.defined() ? &t : nullptr);
    for (Tensor& t : outputs) cpu.outputs.push_back(&t);
    Scratch64 workspace(scale * cpu::cpu_workspace_bytes(*module, ctx.node));
    workspace.give(cpu);
    MEMC_RETURN_IF_ERROR((*cpu::find_kernel(ctx.node.op))(cpu));
    return outputs;
  }

  Status operator()(const KernelContext& ctx, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
    std::vector<DType> dtypes;
    for (const Tensor& t : outputs) dtypes.push_back(t.dtype());
    MEMC_ASSIGN_OR_RETURN(const std::vector<Tensor> ref, cpu_outputs(ctx, inputs, dtypes, 1));
    ++nodes;
    // The CPU kernel run in f64 on the inputs widened: the exact answer's stand-in for outputs
    // whose f32 value is ill-conditioned (made once, where needed; nullopt: no f64 kernel).
    std::optional<std::optional<std::vector<Tensor>>> exact;
    for (size_t k = 0; k < ref.size(); ++k) {
      const DType t = ref[k].dtype();
      // f32: 1e-4 (an f32 product that cancels is off by more than 1e-5 on both backends); 16-bit:
      // about one rounding; integers exactly.
      const double bound = t == DType::kF32 || t == DType::kF64 ? 1e-4 : is_float(t) ? 1e-2 : 0;
      // A NaN where the CPU has a number (an element the kernel left unwritten reads as the
      // executor's NaN poison), or a number where it has NaN, is a mismatch however small the rest.
      int64_t nan_places = 0;
      for (int64_t i = 0; i < ref[k].numel() && is_float(t); ++i) {
        nan_places += std::isnan(outputs[k].get_as_double(i)) != std::isnan(ref[k].get_as_double(i));
      }
      const std::string where = str_cat("memc.", ctx.node.op, " (", ctx.node.source, ") output ", k, ": ");
      if (nan_places > 0) {
        mismatches.push_back(str_cat(where, nan_places, " elements NaN on one side only"));
        continue;
      }
      const double d = relative_difference(outputs[k], ref[k], 1e-30, /*skip_nan=*/true);
      if (d <= bound) continue;
      if (!is_float(t)) {
        mismatches.push_back(str_cat(where, d));
        continue;
      }
      // An output f32 cannot get to 1e-4 (attention's dq through a -finfo.max mask, where dS
      // cancels): the tested kernel passes if it is as near the f64 result as the CPU's, within 2×.
      if (!exact) {
        std::vector<Tensor> wide;
        std::vector<DType> wide_types;
        for (const Tensor& in : inputs) wide.push_back(in.defined() && is_float(in.dtype()) ? in.cast(DType::kF64) : in);
        for (DType o : dtypes) wide_types.push_back(is_float(o) ? DType::kF64 : o);
        auto computed = cpu_outputs(ctx, wide, wide_types, 4);  // f64 buffers: at most twice f32's
        exact = computed.ok() ? std::optional<std::vector<Tensor>>(std::move(*computed)) : std::nullopt;
      }
      if (!*exact) {
        mismatches.push_back(str_cat(where, d));
        continue;
      }
      const Tensor& x = (**exact)[k];
      const double cpu_error = relative_difference(ref[k], x, 1e-30, true), tested_error = relative_difference(outputs[k], x, 1e-30, true);
      if (tested_error <= 2 * cpu_error) continue;
      mismatches.push_back(str_cat(where, d, " (from f64: CPU ", cpu_error, ", tested kernel ", tested_error, ")"));
    }
    return Status::Ok();
  }
};

struct Case {
  std::string model;
  int64_t batch;
  std::string precision;
  int64_t seq = -1;  // for exports with a dynamic sequence length
  OffloadLevel offload = OffloadLevel::kNone;  // transfers as async pairs on the copy stream
  int64_t loss_chunks = 1;  // a language model's head in chunks (passes/loss_chunks.h)
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << c.precision << " batch " << c.batch;
  if (c.offload != OffloadLevel::kNone) *os << " offload " << offload_level_name(c.offload);
  if (c.loss_chunks != 1) *os << " loss chunks " << c.loss_chunks;
}

// Plain SGD, so one step's update is the gradient itself: w' = w - lr·g. Compiled for a GPU
// target, as the CUDA backend gets its plans (attention in its default layout).
Plan compile_case(const Case& c) {
  CompileOptions options;
  options.target = "h200";
  options.batch = c.batch;
  options.optimizer.kind = "sgd";
  options.precision = *parse_precision(c.precision);
  options.seq = c.seq;
  options.offload = c.offload;
  options.loss_chunks = c.loss_chunks;
  const std::string model = source_path(c.model);
  auto plan = compile_model(model, model + ".plan", options);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return std::move(*plan);
}

constexpr double kLr = 1024;  // large, so w' - w is the gradient's bits, not the weight's

// Seeded arguments: integer inputs (token ids, token types, labels: 0 or 1, a language model's
// -100 at every fifth position; masks mostly 1),
// parameters in [-0.1, 0.1], float inputs in [-1, 1], the learning rate kLr.
std::map<std::string, Tensor> arguments(const Module& module, uint32_t seed) {
  std::mt19937 rng(seed);
  std::map<std::string, Tensor> feeds;
  for (ValueId a : module.arguments()) {
    const Value& v = module.value(a);
    Tensor t = Tensor::zeros(v.type.dtype, v.type.shape);
    if (v.role == Role::kScalar) {
      t.set_from_double(0, v.name == "lr" ? kLr : 1.0);
    } else if (is_float(v.type.dtype)) {
      const double amplitude = v.role == Role::kParam ? 0.1 : 1.0;  // weights at a trained model's scale
      t = testing::random_tensor(v.type.dtype, v.type.shape, rng, -amplitude, amplitude);
    } else {
      const bool mask = v.name.find("mask") != std::string::npos;
      const bool positions = v.name == kLabelsArg && v.type.shape.size() > 1;  // a language model's: every fifth ignored
      for (int64_t i = 0; i < t.numel(); ++i) {
        t.set_from_double(i, positions && i % 5 == 2 ? -100.0 : static_cast<double>(mask ? (i % 5 != 4) : (i * 7 + seed) % 2));
      }
    }
    feeds[v.name] = std::move(t);
  }
  return feeds;
}

struct StepResult {
  double loss = 0;
  std::map<std::string, Tensor> gradients;  // (w - w')/lr per updated argument, in f64
};

// One training step (dropout on) on `backend`: the loss and every parameter's gradient.
Expected<StepResult> train_step(Backend& backend, const Module& module, const std::map<std::string, Tensor>& feeds,
                                NodeCheck* check = nullptr) {
  DeviceMemory memory(backend);
  MEMC_ASSIGN_OR_RETURN(PlannedExecutor exec, PlannedExecutor::create(module, memory));
  for (const auto& [name, t] : feeds) MEMC_RETURN_IF_ERROR(exec.set_argument(name, t));
  ExecOptions options{.training = true, .seed = 3, .step = 1, .check_workspace = true};
  if (check) options.node_check = std::ref(*check);
  MEMC_RETURN_IF_ERROR(exec.run(options));
  StepResult r;
  MEMC_ASSIGN_OR_RETURN(const Tensor loss, exec.fetch_output(0));
  r.loss = loss.get_as_double(0);
  for (size_t i = 0; i < module.outputs().size(); ++i) {
    const ValueId updated = module.output_updates()[i];
    if (updated == kNoValue || module.value(updated).role != Role::kParam) continue;
    const std::string& name = module.value(updated).name;
    MEMC_ASSIGN_OR_RETURN(const Tensor after, exec.fetch_output(i));
    const Tensor& before = feeds.at(name);
    Tensor g = Tensor::zeros(DType::kF64, before.shape());
    for (int64_t k = 0; k < g.numel(); ++k) g.data<double>()[k] = (before.get_as_double(k) - after.get_as_double(k)) / kLr;
    r.gradients[name] = std::move(g);
  }
  return r;
}

// Runs the case on `backend` and on the CPU backend and compares loss and gradients.
void expect_matches_cpu(Backend& backend, const Case& c, double tolerance) {
  const Plan plan = compile_case(c);
  for (NodeId n : plan.train.schedule()) {
    ASSERT_NE(backend.find_kernel(plan.train.node(n).op), nullptr) << "no CUDA kernel for memc." << plan.train.node(n).op;
  }
  const auto feeds = arguments(plan.train, 17);
  auto ours = train_step(backend, plan.train, feeds);
  auto ref = train_step(cpu_backend(), plan.train, feeds);
  ASSERT_TRUE(ours.ok()) << ours.status().message();
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  EXPECT_NEAR(ours->loss, ref->loss, tolerance * std::fabs(ref->loss)) << "loss";
  ASSERT_EQ(ours->gradients.size(), ref->gradients.size());
  ASSERT_FALSE(ref->gradients.empty());
  // All gradients as one vector: ‖Δg‖/‖g‖ within the tolerance. Each tensor alone within 10×
  // (a kernel bug shows as O(1)): a small gradient's f32 products cancel more, and the reference
  // is an f32 computation too. The floor, a hundredth of the largest gradient's norm, holds a
  // gradient that is zero in exact arithmetic (rounding noise on both sides) to an absolute bound.
  double floor = 0, diff2 = 0, norm2 = 0;
  for (const auto& [name, g] : ref->gradients) floor = std::max(floor, 1e-2 * l2_norm(g));
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, g] : ref->gradients) {
    const Tensor& mine = ours->gradients.at(name);
    const double d = relative_difference(mine, g, floor);
    EXPECT_LE(d, 10 * tolerance) << name;
    if (d >= worst) worst = d, worst_name = name;
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double r = g.get_as_double(i), e = mine.get_as_double(i) - r;
      diff2 += e * e, norm2 += r * r;
    }
  }
  const double global = std::sqrt(diff2 / norm2);
  EXPECT_LE(global, tolerance) << "all gradients";
  std::printf("[%s] %s %s: loss %.8g vs %.8g; %zu gradients: %.2e relative as one vector, worst tensor %.2e (%s)\n",
              std::string(backend.name()).c_str(), c.model.c_str(), c.precision.c_str(), ours->loss, ref->loss, ref->gradients.size(), global,
              worst, worst_name.c_str());
}

// Every committed model's training step: ViTs, text encoders with masks (attention bias),
// exporters' unfused attention (softmax, where, gather_elements), BigBird's block-sparse form.
const Case kCases[] = {
    {"models/vit_tiny.onnx", 4, "fp32"},
    {"models/vit_tiny.onnx", 4, "bf16-mixed"},
    {"models/vit_small32.onnx", 2, "fp32"},
    {"models/text_encoder.onnx", 4, "fp32", 32},
    {"models/text_encoder.onnx", 4, "bf16-mixed", 32},
    {"models/bert_t215.onnx", 4, "fp32"},
    {"models/distilbert_t215.onnx", 4, "fp32"},
    {"models/roberta_t215.onnx", 4, "fp32"},
    {"models/bigbird_full.onnx", 2, "fp32", 32},
    {"models/bigbird_sparse.onnx", 4, "fp32"},
    // Language models: a loss per position (labels -100 ignored), tied embeddings.
    {"models/gpt2_lm_t215.onnx", 4, "fp32"},
    {"models/bert_mlm_t215.onnx", 4, "bf16-mixed"},
    // … with the head and loss in 3 chunks: slices, each chunk's loss gradient in the forward, f32 sums.
    {"models/gpt2_lm_t215.onnx", 4, "fp32", -1, OffloadLevel::kNone, 3},
    {"models/bert_mlm_t215.onnx", 4, "bf16-mixed", -1, OffloadLevel::kNone, 3},
    // Offload's transfers: async pairs (copy_to_host_start/_done …), the update in host memory,
    // and streamed parameters prefetched one unit ahead.
    {"models/vit_tiny.onnx", 4, "fp32", -1, OffloadLevel::kOptimizer},
    {"models/vit_tiny.onnx", 4, "bf16-mixed", -1, OffloadLevel::kParams},
};

class CudaKernels : public ::testing::TestWithParam<Case> {};

// fp32 within 1e-5 of the CPU backend (issue 15's bound for the GPU); bf16-mixed within 1e-2,
// what 16-bit roundings of intermediate values that land on the other side allow.
double tolerance(const Case& c) { return c.precision == "fp32" ? 1e-5 : 1e-2; }

TEST_P(CudaKernels, OnTheHostMatchTheCpuBackend) {
  HostCudaBackend backend;
  expect_matches_cpu(backend, GetParam(), tolerance(GetParam()));
}

// One step of the case on `backend`, each node checked against the CPU kernel (NodeCheck).
void expect_each_node_matches_cpu(Backend& backend, const Case& c) {
  const Plan plan = compile_case(c);
  NodeCheck check{&plan.train};
  auto step = train_step(backend, plan.train, arguments(plan.train, 17), &check);
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_GT(check.nodes, 0);
  for (const std::string& m : check.mismatches) ADD_FAILURE() << m;
  std::printf("[%s] %s %s: %lld nodes checked, %zu outside one op's rounding\n", std::string(backend.name()).c_str(), c.model.c_str(),
              c.precision.c_str(), static_cast<long long>(check.nodes), check.mismatches.size());
}

TEST_P(CudaKernels, EachNodeMatchesTheCpuKernel) {
  HostCudaBackend backend;
  expect_each_node_matches_cpu(backend, GetParam());
}

// The same on a card (bench/device_check.sh runs *OnTheGpu*): where a step differs, this names
// the kernel.
TEST_P(CudaKernels, OnTheGpuEachNodeMatchesTheCpuKernel) {
  auto opened = open_backend("cuda:0");
  if (!opened.ok()) GTEST_SKIP() << "no GPU: " << opened.status().message();
  expect_each_node_matches_cpu(**opened, GetParam());
}

TEST_P(CudaKernels, OnTheGpuMatchTheCpuBackend) {
  auto opened = open_backend("cuda:0");  // through the CUDA module, as `memc run --device cuda`
  if (!opened.ok()) GTEST_SKIP() << "no GPU: " << opened.status().message();
  expect_matches_cpu(**opened, GetParam(), tolerance(GetParam()));
}

// Every op of the committed models has a CUDA kernel (backends/cuda/op_table.h), the collectives
// of GPU ranks too (backends/collective_kernels.h); an op no backend knows has none.
TEST(CudaOpTable, CoversTheCommittedModelsOps) {
  for (const char* op : {"linear", "matmul", "layernorm", "attention_grad", "adam_update", "all_gather_start", "reduce_scatter_done",
                         "shard_block", "split_flat"}) {
    EXPECT_NE(cuda::ops::find_kernel<HostRunner>(op), nullptr) << op;
  }
  EXPECT_EQ(cuda::ops::find_kernel<HostRunner>("no_such_op"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaKernels, ::testing::ValuesIn(kCases), [](const auto& info) {
  std::string name = info.param.model.substr(7, info.param.model.find('.') - 7) + "_" + info.param.precision;
  if (info.param.offload != OffloadLevel::kNone) name += str_cat("_offload_", offload_level_name(info.param.offload));
  if (info.param.loss_chunks != 1) name += str_cat("_loss_chunks_", info.param.loss_chunks);
  for (char& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
});


// attention_grad's dq cancels terms (Σ_c dS_c = 0 per row), so f32 kernels differ by more than a
// GEMM's rounding. Both f32 kernels against the CPU kernel run in f64 on the same values.
TEST(CudaAttention, BackwardAgainstADoubleReference) {
  const Shape shape{2, 4, 65, 32};
  Node node;
  node.op = "attention_grad";
  std::mt19937 rng(5);
  std::vector<Tensor> in32;
  for (int i = 0; i < 4; ++i) in32.push_back(testing::random_tensor(DType::kF32, shape, rng, -1.0, 1.0));
  auto run = [&](DType t, bool cuda_kernel) {
    std::vector<Tensor> in, out;
    for (const Tensor& x : in32) in.push_back(x.cast(t));
    for (int i = 0; i < 3; ++i) out.push_back(Tensor::zeros(t, shape));
    KernelContext ctx{node, {&in[0], &in[1], &in[2], &in[3]}, {&out[0], &out[1], &out[2]}};
    Scratch64 workspace(int64_t{8} << 20);
    workspace.give(ctx);
    const Kernel* k = cuda_kernel ? cuda::ops::find_kernel<HostRunner>("attention_grad") : cpu::find_kernel("attention_grad");
    EXPECT_TRUE((*k)(ctx).ok());
    return out;
  };
  const auto ref = run(DType::kF64, false), cpu32 = run(DType::kF32, false), cuda32 = run(DType::kF32, true);
  for (int o = 0; o < 3; ++o) {
    const double cpu_err = relative_difference(cpu32[o], ref[o]), cuda_err = relative_difference(cuda32[o], ref[o]);
    std::printf("[attention_grad] output %d: CPU f32 %.2e, CUDA f32 %.2e from f64\n", o, cpu_err, cuda_err);
    EXPECT_LE(cuda_err, 2e-6) << "output " << o;
  }
}


// f32 attention through batched GEMMs (attention_by_gemm, attention_grad_by_gemm) in chunks of 3
// batch entries (8 entries: chunks of 3, 3 and 2), with an additive mask broadcast over heads and
// rows and dropout active, against memc's row kernel on the same values: the same draws, the
// same results within f32 rounding (the row kernel's dot products are f64). Planning asks for at
// least one whole chunk of scores: the path's scratch is what the kernel takes.
TEST(CudaAttention, ThroughGemmsInChunksMatchesTheRowKernel) {
  const Shape shape{2, 4, 33, 16}, mask_shape{2, 1, 1, 33};
  std::mt19937 rng(11);
  std::vector<Tensor> qkv;
  for (int i = 0; i < 4; ++i) qkv.push_back(testing::random_tensor(DType::kF32, shape, rng, -1.0, 1.0));  // q, k, v, dy
  Tensor mask = testing::random_tensor(DType::kF32, mask_shape, rng, -2.0, 0.0);
  for (int64_t c = 30; c < 33; ++c) mask.set_from_double(c, -std::numeric_limits<float>::infinity());  // padding, batch 0
  Node node;
  node.id = 7;
  node.attrs.set("dropout_ratio", 0.25);
  KernelContext proto{node, {}, {}, /*training=*/true, /*seed=*/42, /*step=*/3};
  auto geometry = [&](std::vector<Tensor*> inputs, size_t q_input) {
    KernelContext ctx = proto;
    for (Tensor* t : inputs) ctx.inputs.push_back(t);
    auto g = cuda::ops::attention_geometry(ctx, q_input, shape);
    EXPECT_TRUE(g.ok()) << g.status().message();
    return *g;
  };
  // Forward.
  const cuda::AttentionGeometry g = geometry({&qkv[0], &qkv[1], &qkv[2], &mask}, 0);
  ASSERT_TRUE(g.dropout);
  Tensor rows = Tensor::zeros(DType::kF32, shape), chunks = Tensor::zeros(DType::kF32, shape);
  HostRunner runner(proto);
  ASSERT_TRUE(runner(cuda::AttentionRow<float>{qkv[0].data<float>(), qkv[1].data<float>(), qkv[2].data<float>(), rows.data<float>(), g},
                     g.batch * g.tq).ok());
  {
    KernelContext ctx = proto;
    ctx.inputs = {&qkv[0], &qkv[1], &qkv[2], &mask};
    ctx.outputs = {&chunks};
    Scratch64 workspace(cuda::ops::scratch_piece(3 * 33 * 33 * 4));
    workspace.give(ctx);
    ASSERT_TRUE(cuda::ops::attention_by_gemm(ctx, runner, g, 3).ok());
  }
  EXPECT_LE(relative_difference(chunks, rows), 2e-6);
  // Backward: dy, q, k, v, mask.
  const cuda::AttentionGeometry gb = geometry({&qkv[3], &qkv[0], &qkv[1], &qkv[2], &mask}, 1);
  std::vector<Tensor> by_rows, by_chunks;
  for (int i = 0; i < 3; ++i) by_rows.push_back(Tensor::zeros(DType::kF32, shape)), by_chunks.push_back(Tensor::zeros(DType::kF32, shape));
  std::vector<float> stats(static_cast<size_t>(gb.batch * gb.tq * 2));
  const float *dy = qkv[3].data<float>(), *q = qkv[0].data<float>(), *k = qkv[1].data<float>(), *v = qkv[2].data<float>();
  ASSERT_TRUE(runner(cuda::AttentionGradStats<float>{dy, q, k, v, stats.data(), gb}, gb.batch * gb.tq).ok());
  ASSERT_TRUE(runner(cuda::AttentionGradQ<float>{dy, q, k, v, stats.data(), by_rows[0].data<float>(), gb}, gb.batch * gb.tq).ok());
  ASSERT_TRUE(runner(cuda::AttentionGradKV<float>{dy, q, k, v, stats.data(), by_rows[1].data<float>(), by_rows[2].data<float>(), gb},
                     gb.batch * gb.tk).ok());
  {
    KernelContext ctx = proto;
    ctx.inputs = {&qkv[3], &qkv[0], &qkv[1], &qkv[2], &mask};
    ctx.outputs = {&by_chunks[0], &by_chunks[1], &by_chunks[2]};
    Scratch64 workspace(2 * cuda::ops::scratch_piece(3 * 33 * 33 * 4));
    workspace.give(ctx);
    ASSERT_TRUE(cuda::ops::attention_grad_by_gemm(ctx, runner, gb, 3).ok());
    // One chunk's scores fewer than the kernel takes: refused, not run beyond the plan.
    Scratch64 short_workspace(cuda::ops::scratch_piece(3 * 33 * 33 * 4));
    short_workspace.give(ctx);
    EXPECT_EQ(cuda::ops::attention_grad_by_gemm(ctx, runner, gb, 3).kind(), ErrorKind::kBadInput);
  }
  for (int o = 0; o < 3; ++o) {
    const double d = relative_difference(by_chunks[o], by_rows[o]);
    std::printf("[attention by GEMMs] output %d (dq, dk, dv): %.2e from the row kernel\n", o, d);
    EXPECT_LE(d, 2e-6) << "output " << o;
  }
  // The planned scratch: one chunk forward, two backward, each within kScoreChunkBytes; none
  // for 16-bit operands (cuDNN's) or where one entry's scores exceed the cap.
  const TensorType q32{DType::kF32, shape}, qbf{DType::kBF16, shape};
  EXPECT_EQ(cuda::ops::gemm_attention_chunk(q32, q32), 8);
  EXPECT_EQ(cuda::ops::gemm_attention_scratch(q32, q32, 2, 0), 2 * cuda::ops::scratch_piece(8 * 33 * 33 * 4));
  EXPECT_EQ(cuda::ops::gemm_attention_chunk(qbf, qbf), 0);
  const TensorType huge{DType::kF32, {1, 1, 16384, 64}};
  EXPECT_EQ(cuda::ops::gemm_attention_chunk(huge, huge), 0);  // 1 GiB of scores for one entry
  const TensorType many{DType::kF32, {64, 16, 1024, 64}};
  EXPECT_EQ(cuda::ops::gemm_attention_chunk(many, many), 64);  // 4 MiB an entry: 64 entries in 256 MiB
}

// Attention in the layouts bthd and tbhd (ir/attention_layout.h) on the CUDA kernels, as GPU plans
// now lay it out: each path the op takes (the batched GEMMs in f32, one stride apart per entry in
// tbhd and per sample's heads in bthd; memc's row kernel in bf16, and wherever a bias gradient
// is asked for) reads and writes the operands where the layout puts them. The results equal the
// default layout's on the same values transposed bit for bit, with a bias broadcast over heads
// and dropout, each op given exactly its planned scratch (kernel_scratch_bytes).
Tensor relaid(const Tensor& x, AttentionLayout from, AttentionLayout to, const Shape& batch, int64_t t, int64_t e) {
  Tensor y = Tensor::zeros(x.dtype(), attention_operand_shape(to, batch, t, e));
  const std::array<int64_t, 4> src = attention_steps(from, batch[0], batch[1], t, e), dst = attention_steps(to, batch[0], batch[1], t, e);
  const int64_t size = static_cast<int64_t>(dtype_size(x.dtype()));
  for (int64_t b = 0; b < batch[0]; ++b) {
    for (int64_t h = 0; h < batch[1]; ++h) {
      for (int64_t r = 0; r < t; ++r) {
        for (int64_t j = 0; j < e; ++j) {
          std::memcpy(static_cast<char*>(y.raw()) + (b * dst[0] + h * dst[1] + r * dst[2] + j) * size,
                      static_cast<const char*>(x.raw()) + (b * src[0] + h * src[1] + r * src[2] + j) * size, static_cast<size_t>(size));
        }
      }
    }
  }
  return y;
}

bool bits_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::vector<Tensor> run_cuda_op(const std::string& op, const Attrs& attrs, const std::vector<const Tensor*>& in,
                                const std::vector<std::pair<DType, Shape>>& out_types) {
  Node node;
  node.id = 7, node.op = op, node.attrs = attrs;
  std::vector<Tensor> out;
  std::vector<TensorType> in_types, out_type_list;
  for (const Tensor* t : in) in_types.push_back(t ? TensorType{t->dtype(), t->shape()} : TensorType{});
  for (const auto& [dtype, shape] : out_types) out.push_back(Tensor::zeros(dtype, shape)), out_type_list.push_back({dtype, shape});
  KernelContext ctx{node, in, {}, /*training=*/true, /*seed=*/42, /*step=*/3};
  for (Tensor& t : out) ctx.outputs.push_back(&t);
  Scratch64 workspace(cuda::ops::kernel_scratch_bytes(node, in_types, out_type_list, /*gemm_bytes=*/0));
  workspace.give(ctx);
  const Status st = (*cuda::ops::find_kernel<HostRunner>(op))(ctx);
  EXPECT_TRUE(st.ok()) << op << ": " << st.message();
  return out;
}

TEST(CudaAttention, LayoutsEqualTheDefaultLayoutTransposedBitForBit) {
  struct LayoutCase {
    int64_t b, h, tq, tk, d, dv;
    bool bias, dropout;
  };
  const LayoutCase cases[] = {{3, 4, 17, 17, 8, 8, false, false}, {2, 3, 20, 30, 8, 6, true, true}, {2, 2, 9, 12, 16, 16, false, true}};
  for (const AttentionLayout layout : {AttentionLayout::kBTHD, AttentionLayout::kTBHD}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const LayoutCase& c : cases) {
        SCOPED_TRACE(str_cat(attention_layout_name(layout), " ", dtype_name(dtype), " B", c.b, " H", c.h, " Tq", c.tq, " Tk", c.tk,
                             c.bias ? " bias" : "", c.dropout ? " dropout" : ""));
        std::mt19937 rng(static_cast<unsigned>(c.tq * 7 + c.h));
        const Shape batch{c.b, c.h};
        const AttentionLayout kDefault = AttentionLayout::kBHTD;
        // The operands drawn in the default layout, then laid out.
        const Tensor q = testing::random_tensor(dtype, attention_operand_shape(kDefault, batch, c.tq, c.d), rng, -1, 1);
        const Tensor k = testing::random_tensor(dtype, attention_operand_shape(kDefault, batch, c.tk, c.d), rng, -1, 1);
        const Tensor v = testing::random_tensor(dtype, attention_operand_shape(kDefault, batch, c.tk, c.dv), rng, -1, 1);
        const Tensor dy = testing::random_tensor(dtype, attention_operand_shape(kDefault, batch, c.tq, c.dv), rng, -1, 1);
        const Tensor bias = testing::random_tensor(dtype, {c.b, 1, c.tq, c.tk}, rng, -1, 1);
        const Tensor ql = relaid(q, kDefault, layout, batch, c.tq, c.d), kl = relaid(k, kDefault, layout, batch, c.tk, c.d);
        const Tensor vl = relaid(v, kDefault, layout, batch, c.tk, c.dv), dyl = relaid(dy, kDefault, layout, batch, c.tq, c.dv);
        Attrs plain;
        plain.set("scale", 0.3);
        if (c.dropout) plain.set("dropout_ratio", 0.2);
        Attrs laid = plain;
        laid.set("layout", std::string(attention_layout_name(layout)));
        const Tensor* b = c.bias ? &bias : nullptr;

        auto y = run_cuda_op("attention", plain, {&q, &k, &v, b}, {{dtype, dy.shape()}});
        auto yl = run_cuda_op("attention", laid, {&ql, &kl, &vl, b}, {{dtype, dyl.shape()}});
        EXPECT_TRUE(bits_equal(relaid(yl[0], layout, kDefault, batch, c.tq, c.dv), y[0])) << "y";

        std::vector<std::pair<DType, Shape>> grads = {{dtype, q.shape()}, {dtype, k.shape()}, {dtype, v.shape()}};
        std::vector<std::pair<DType, Shape>> grads_l = {{dtype, ql.shape()}, {dtype, kl.shape()}, {dtype, vl.shape()}};
        if (c.bias) grads.push_back({dtype, bias.shape()}), grads_l.push_back({dtype, bias.shape()});
        auto d = run_cuda_op("attention_grad", plain, {&dy, &q, &k, &v, b}, grads);
        auto dl = run_cuda_op("attention_grad", laid, {&dyl, &ql, &kl, &vl, b}, grads_l);
        EXPECT_TRUE(bits_equal(relaid(dl[0], layout, kDefault, batch, c.tq, c.d), d[0])) << "dq";
        EXPECT_TRUE(bits_equal(relaid(dl[1], layout, kDefault, batch, c.tk, c.d), d[1])) << "dk";
        EXPECT_TRUE(bits_equal(relaid(dl[2], layout, kDefault, batch, c.tk, c.dv), d[2])) << "dv";
        if (c.bias) {
          EXPECT_TRUE(bits_equal(dl[3], d[3])) << "dbias";
        }
        if (dtype != DType::kF32) continue;
        // The GEMM path in chunks of 5 entries (of 6 to 12): chunks that start inside a sample and,
        // in bthd, stop at its end; the same bits again.
        Node node;
        node.id = 7, node.op = "attention", node.attrs = laid;
        KernelContext ctx{node, {&ql, &kl, &vl, b}, {}, /*training=*/true, /*seed=*/42, /*step=*/3};
        auto g = cuda::ops::attention_geometry(ctx, 0, dyl.shape());
        ASSERT_TRUE(g.ok()) << g.status().message();
        Tensor chunked = Tensor::zeros(dtype, dyl.shape());
        ctx.outputs = {&chunked};
        Scratch64 workspace(2 * cuda::ops::scratch_piece(5 * c.tq * c.tk * 4));
        workspace.give(ctx);
        HostRunner runner(ctx);
        ASSERT_TRUE(cuda::ops::attention_by_gemm(ctx, runner, *g, 5).ok());
        EXPECT_TRUE(bits_equal(relaid(chunked, layout, kDefault, batch, c.tq, c.dv), y[0])) << "y in chunks of 5";
        if (c.bias) continue;  // a bias gradient runs the row kernels
        node.op = "attention_grad";
        KernelContext grad_ctx{node, {&dyl, &ql, &kl, &vl}, {}, /*training=*/true, /*seed=*/42, /*step=*/3};
        auto gb = cuda::ops::attention_geometry(grad_ctx, 1, dyl.shape());
        ASSERT_TRUE(gb.ok()) << gb.status().message();
        std::vector<Tensor> parts = {Tensor::zeros(dtype, ql.shape()), Tensor::zeros(dtype, kl.shape()), Tensor::zeros(dtype, vl.shape())};
        grad_ctx.outputs = {&parts[0], &parts[1], &parts[2]};
        workspace.give(grad_ctx);
        ASSERT_TRUE(cuda::ops::attention_grad_by_gemm(grad_ctx, runner, *gb, 5).ok());
        EXPECT_TRUE(bits_equal(relaid(parts[0], layout, kDefault, batch, c.tq, c.d), d[0])) << "dq in chunks of 5";
        EXPECT_TRUE(bits_equal(relaid(parts[1], layout, kDefault, batch, c.tk, c.d), d[1])) << "dk in chunks of 5";
        EXPECT_TRUE(bits_equal(relaid(parts[2], layout, kDefault, batch, c.tk, c.dv), d[2])) << "dv in chunks of 5";
      }
    }
  }
  // The GEMM path's runs: tbhd's entries are one stride apart, bthd's only within a sample.
  Node node;
  node.attrs.set("layout", std::string("bthd"));
  const Tensor q = Tensor::zeros(DType::kF32, {2, 5, 3, 4});
  KernelContext ctx{node, {&q, &q, &q}, {}};
  auto bthd = cuda::ops::attention_geometry(ctx, 0, q.shape());
  ASSERT_TRUE(bthd.ok()) << bthd.status().message();
  EXPECT_EQ(cuda::ops::gemm_entry_run(*bthd), 3);
  node.attrs.set("layout", std::string("tbhd"));
  auto tbhd = cuda::ops::attention_geometry(ctx, 0, q.shape());
  ASSERT_TRUE(tbhd.ok()) << tbhd.status().message();
  EXPECT_EQ(cuda::ops::gemm_entry_run(*tbhd), 15);
  EXPECT_EQ(cuda::ops::entry_step(tbhd->q_map), 4);
  EXPECT_EQ(tbhd->q_row, 5 * 3 * 4);
  // bthd with one head: one stride between samples, so one run.
  const Tensor one_head = Tensor::zeros(DType::kF32, {2, 5, 1, 4});
  node.attrs.set("layout", std::string("bthd"));
  KernelContext one{node, {&one_head, &one_head, &one_head}, {}};
  auto single = cuda::ops::attention_geometry(one, 0, one_head.shape());
  ASSERT_TRUE(single.ok()) << single.status().message();
  EXPECT_EQ(cuda::ops::gemm_entry_run(*single), 2);
  EXPECT_EQ(cuda::ops::entry_step(single->q_map), 5 * 4);
  // The default layout with a batch of 1 is no broadcast: each entry still has its own matrices.
  node.attrs = Attrs();
  const Tensor batch_one = Tensor::zeros(DType::kF32, {1, 3, 5, 4});
  KernelContext default_one{node, {&batch_one, &batch_one, &batch_one}, {}};
  auto bhtd_one = cuda::ops::attention_geometry(default_one, 0, batch_one.shape());
  ASSERT_TRUE(bhtd_one.ok()) << bhtd_one.status().message();
  EXPECT_EQ(cuda::ops::gemm_entry_run(*bhtd_one), 3);
}

// fuse_elementwise (passes/fuse_elementwise.h): every fusable op as a step of a chain equals the
// chain of its own kernels bit for bit, on the CPU backend and on the CUDA kernels' host runner,
// in f32, bf16 and f16, with a broadcast operand; dropout draws each element's own counter.
struct FusedChain {
  std::string name;
  // Builds the chain on a (3x5x7), b (5x7) and c (i1, 3x5x7); returns its result (f32 or the
  // dtype of a).
  std::function<ValueId(Module&, ValueId a, ValueId b, ValueId c)> build;
  int steps;
};

using testing::emit;

std::vector<FusedChain> fused_chains() {
  std::vector<FusedChain> chains;
  for (const char* op : {"neg", "abs", "sign", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu", "erf", "floor",
                         "ceil", "round", "sin", "cos", "asin", "acos", "atan", "softplus"}) {
    chains.push_back({op, [op](Module& m, ValueId a, ValueId b, ValueId) { return emit(m, "mul", {emit(m, op, {emit(m, "add", {a, b})}), a}); }, 3});
  }
  chains.push_back({"leaky_relu", [](Module& m, ValueId a, ValueId b, ValueId) {
                      return emit(m, "add", {emit(m, "leaky_relu", {emit(m, "sub", {a, b})}, make_attrs({{"alpha", 0.2}})), b});
                    }, 3});
  for (const char* form : {"none", "tanh"}) {
    chains.push_back({str_cat("gelu_", form), [form](Module& m, ValueId a, ValueId b, ValueId) {
                        const Attrs approximate = make_attrs({{"approximate", std::string(form)}});
                        const ValueId g = emit(m, "gelu", {emit(m, "add", {a, b})}, approximate);
                        return emit(m, "gelu_grad", {g, emit(m, "mul", {a, a})}, approximate);
                      }, 4});
  }
  for (const char* op : {"add", "sub", "mul", "div", "pow", "max", "min"}) {
    chains.push_back({op, [op](Module& m, ValueId a, ValueId b, ValueId) { return emit(m, "neg", {emit(m, op, {emit(m, "abs", {a}), b})}); }, 3});
  }
  // A comparison's mask is smaller than what it reads, so it joins no later step (the schedule may
  // want it early: passes/fuse_elementwise.h); it ends a chain, and masks feed steps as inputs.
  for (const char* op : {"equal", "less", "less_equal", "greater", "greater_equal"}) {
    chains.push_back({op, [op](Module& m, ValueId a, ValueId b, ValueId) {
                        return emit(m, op, {emit(m, "round", {a}), emit(m, "round", {emit(m, "add", {a, b})})});
                      }, 4});
  }
  for (const char* op : {"and", "or", "xor"}) {
    chains.push_back({op, [op](Module& m, ValueId a, ValueId b, ValueId c) {
                        return emit(m, "where", {emit(m, op, {emit(m, "not", {c}), c}), b, a});
                      }, 3});
  }
  chains.push_back({"casts", [](Module& m, ValueId a, ValueId b, ValueId c) {
                      const DType t = m.value(a).type.dtype;
                      const Attrs to_f32 = make_attrs({{"to", std::string("f32")}});
                      const ValueId wide = emit(m, "cast", {emit(m, "add", {a, b})}, to_f32);
                      const ValueId bits = emit(m, "cast", {c}, to_f32);
                      return emit(m, "cast", {emit(m, "mul", {emit(m, "add", {wide, bits}), wide})}, make_attrs({{"to", std::string(dtype_name(t))}}));
                    }, 6});
  chains.push_back({"cast_to_i1", [](Module& m, ValueId a, ValueId b, ValueId) {
                      return emit(m, "cast", {emit(m, "round", {emit(m, "sub", {a, b})})}, make_attrs({{"to", std::string("i1")}}));
                    }, 3});
  chains.push_back({"dropout", [](Module& m, ValueId a, ValueId b, ValueId) {
                      const Attrs attrs = make_attrs({{"ratio", 0.3}, {"seed", int64_t{11}}, {"rng_offset", int64_t{40}}});
                      const ValueId x = emit(m, "dropout", {emit(m, "add", {a, b})}, attrs);
                      return emit(m, "add", {emit(m, "dropout", {x}, make_attrs({{"ratio", 0.5}, {"seed", int64_t{12}}})), a});
                    }, 4});
  return chains;
}

TEST(CudaFused, EveryStepEqualsItsOpsKernelBitForBit) {
  HostCudaBackend host;
  for (const DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const FusedChain& chain : fused_chains()) {
      SCOPED_TRACE(str_cat(chain.name, " ", dtype_name(t)));
      Module plain;
      const ValueId a = plain.add_argument("a", TensorType{t, {3, 5, 7}}, Role::kInput);
      const ValueId b = plain.add_argument("b", TensorType{t, {5, 7}}, Role::kInput);
      const ValueId c = plain.add_argument("c", TensorType{DType::kBool, {3, 5, 7}}, Role::kInput);
      plain.set_outputs({chain.build(plain, a, b, c)});
      Module fused = plain;
      auto report = FuseElementwise().run(fused);
      ASSERT_TRUE(report.ok()) << report.status().message();
      EXPECT_EQ(report->get("groups"), 1);
      EXPECT_EQ(report->get("nodes"), chain.steps);
      ASSERT_EQ(testing::count_op(fused, "fused_elementwise"), 1);
      std::mt19937 rng(5);
      std::map<std::string, Tensor> feeds = {{"a", testing::random_tensor(t, {3, 5, 7}, rng, -2, 2)},
                                             {"b", testing::random_tensor(t, {5, 7}, rng, -2, 2)},
                                             {"c", Tensor::zeros(DType::kBool, {3, 5, 7})}};
      for (int64_t i = 0; i < 105; ++i) feeds["c"].set_from_double(i, (i * 7) % 3 == 0);
      for (const Backend* kernels : {static_cast<const Backend*>(nullptr), static_cast<const Backend*>(&host)}) {
        const ExecOptions options{.training = true, .seed = 9, .step = 3, .kernels = kernels};
        auto want = execute(plain, feeds, options);
        auto got = execute(fused, feeds, options);
        ASSERT_TRUE(want.ok()) << want.status().message();
        ASSERT_TRUE(got.ok()) << got.status().message();
        ASSERT_EQ(got->at(0).dtype(), want->at(0).dtype());
        EXPECT_EQ(std::memcmp(got->at(0).raw(), want->at(0).raw(), want->at(0).nbytes()), 0) << (kernels ? "CUDA kernels" : "CPU kernels");
      }
    }
  }
}

// A chain longer than a fused node holds, and one with more inputs, split into several nodes
// that together still equal the chain.
TEST(CudaFused, LongChainsSplitWithinTheLimits) {
  Module plain;
  std::vector<ValueId> args;
  for (int k = 0; k < 12; ++k) args.push_back(plain.add_argument(str_cat("x", k), TensorType{DType::kF32, {4, 9}}, Role::kInput));
  ValueId acc = args[0];
  for (int k = 1; k < 12; ++k) acc = emit(plain, "add", {acc, args[k]});  // 11 adds over 12 inputs
  for (int k = 0; k < 30; ++k) acc = emit(plain, k % 2 ? "tanh" : "neg", {acc});
  plain.set_outputs({acc});
  Module fused = plain;
  auto report = FuseElementwise().run(fused);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->get("nodes"), 41);
  EXPECT_GE(report->get("groups"), 2);
  for (NodeId n : fused.schedule()) {
    const Node& node = fused.node(n);
    ASSERT_EQ(node.op, "fused_elementwise");
    EXPECT_LE(node.inputs.size(), static_cast<size_t>(kFusedMaxInputs));
    EXPECT_LE(node.attrs.get_ints("args").size(), static_cast<size_t>(3 * kFusedMaxSteps));
  }
  std::mt19937 rng(3);
  std::map<std::string, Tensor> feeds;
  for (int k = 0; k < 12; ++k) feeds[str_cat("x", k)] = testing::random_tensor(DType::kF32, {4, 9}, rng);
  HostCudaBackend host;
  for (const Backend* kernels : {static_cast<const Backend*>(nullptr), static_cast<const Backend*>(&host)}) {
    auto want = execute(plain, feeds, ExecOptions{.kernels = kernels});
    auto got = execute(fused, feeds, ExecOptions{.kernels = kernels});
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(std::memcmp(got->at(0).raw(), want->at(0).raw(), want->at(0).nbytes()), 0);
  }
}

// What must stay apart: an intermediate another node reads, or that the step returns, and a
// producer of a smaller shape (broadcast into the chain: computing it per element repeats it).
TEST(CudaFused, SharedAndReturnedValuesStayOutsideTheChain) {
  Module m;
  const ValueId a = m.add_argument("a", TensorType{DType::kF32, {6, 8}}, Role::kInput);
  const ValueId row = m.add_argument("row", TensorType{DType::kF32, {8}}, Role::kInput);
  const ValueId shared = emit(m, "exp", {a});                    // read twice below
  const ValueId returned = emit(m, "tanh", {emit(m, "neg", {a})}); // a result of the step
  const ValueId small = emit(m, "sqrt", {emit(m, "abs", {row})});  // [8], broadcast into [6, 8]
  const ValueId x = emit(m, "add", {emit(m, "mul", {shared, returned}), small});
  const ValueId y = emit(m, "sub", {shared, x});
  m.set_outputs({y, returned, emit(m, "reduce_sum", {shared}, make_attrs({{"axes", std::vector<int64_t>{0}}}))});
  const std::string returned_name = m.value(returned).name;
  auto report = FuseElementwise().run(m);
  ASSERT_TRUE(report.ok()) << report.status().message();
  // Chains: [neg, tanh], [abs, sqrt] and [mul, add, sub]; exp stays alone (two chains read it).
  EXPECT_EQ(report->get("groups"), 3);
  EXPECT_EQ(report->get("nodes"), 7);
  EXPECT_EQ(testing::count_op(m, "exp"), 1);
  EXPECT_EQ(m.value(m.outputs()[1]).name, returned_name) << "the returned value keeps its name";
  EXPECT_EQ(m.node(m.value(m.outputs()[1]).producer).op, "fused_elementwise");
}

// A value other nodes read and one fusable consumer of it that reads nothing made later: one
// node with two results (a gradient sum and its bf16 cast for the next GEMM). A consumer that
// also reads a value made after the root stays out: computing it at the root's place could not.
TEST(CudaFused, ARootAndAConsumerOfItAreOneNodeWithTwoResults) {
  Module plain;
  const ValueId a = plain.add_argument("a", TensorType{DType::kF32, {3, 5, 7}}, Role::kInput);
  const ValueId b = plain.add_argument("b", TensorType{DType::kF32, {5, 7}}, Role::kInput);
  const ValueId sum = emit(plain, "add", {emit(plain, "mul", {a, b}), a});
  const ValueId narrow = emit(plain, "cast", {sum}, make_attrs({{"to", std::string("bf16")}}));
  const ValueId rows = emit(plain, "reduce_sum", {sum}, make_attrs({{"axes", std::vector<int64_t>{0}}}));
  const ValueId later = emit(plain, "exp", {emit(plain, "reduce_sum", {narrow}, make_attrs({{"axes", std::vector<int64_t>{0}}}))});
  const ValueId scaled = emit(plain, "mul", {sum, emit(plain, "cast", {later}, make_attrs({{"to", std::string("f32")}}))});
  plain.set_outputs({narrow, rows, scaled});
  Module fused = plain;
  auto report = FuseElementwise().run(fused);
  ASSERT_TRUE(report.ok()) << report.status().message();
  // [mul, add, cast] with two results; [exp, cast] over [5, 7]; the last mul alone (it reads the
  // sum and a value made after it).
  EXPECT_EQ(report->get("groups"), 2);
  EXPECT_EQ(report->get("nodes"), 5);
  EXPECT_EQ(testing::count_op(fused, "mul"), 1);
  int two_results = 0;
  for (NodeId n : fused.schedule()) two_results += fused.node(n).op == "fused_elementwise" && fused.node(n).outputs.size() == 2;
  EXPECT_EQ(two_results, 1);
  std::mt19937 rng(8);
  const std::map<std::string, Tensor> feeds = {{"a", testing::random_tensor(DType::kF32, {3, 5, 7}, rng)},
                                               {"b", testing::random_tensor(DType::kF32, {5, 7}, rng)}};
  HostCudaBackend host;
  for (const Backend* kernels : {static_cast<const Backend*>(nullptr), static_cast<const Backend*>(&host)}) {
    auto want = execute(plain, feeds, ExecOptions{.kernels = kernels});
    auto got = execute(fused, feeds, ExecOptions{.kernels = kernels});
    ASSERT_TRUE(want.ok() && got.ok());
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(std::memcmp(got->at(k).raw(), want->at(k).raw(), want->at(k).nbytes()), 0) << k;
  }
}

// Runs `module` through the planned executor on `backend` (buffers as the memory plan lays them
// out, in-place outputs included) and returns its outputs.
std::vector<Tensor> run_planned(Backend& backend, const Module& module, const std::map<std::string, Tensor>& feeds) {
  DeviceMemory memory(backend);
  auto exec = PlannedExecutor::create(module, memory);
  EXPECT_TRUE(exec.ok()) << exec.status().message();
  if (!exec.ok()) return {};
  for (const auto& [name, t] : feeds) EXPECT_TRUE(exec->set_argument(name, t).ok()) << name;
  EXPECT_TRUE(exec->run(ExecOptions{}).ok());
  std::vector<Tensor> outs;
  for (size_t i = 0; i < module.outputs().size(); ++i) {
    auto t = exec->fetch_output(i);
    EXPECT_TRUE(t.ok());
    if (t.ok()) outs.push_back(std::move(*t));
  }
  return outs;
}

// A step's attention in `layout` against the default layout with the transposes a model has:
// q, k, v and dy in the layout, y and the gradients back in it. `plain` transposes to [B, H, T, E]
// and back; `laid` reads and writes them in place, as GPU plans now do.
struct LayoutModules {
  Module plain, laid;
  std::map<std::string, Tensor> feeds;
};
LayoutModules layout_modules(AttentionLayout layout, DType dtype, const Shape& batch, int64_t t, int64_t e, bool bias) {
  LayoutModules c;
  const Shape operand = attention_operand_shape(layout, batch, t, e), mask{batch[0], 1, 1, t};
  const std::vector<int64_t> to_default = layout == AttentionLayout::kBTHD ? std::vector<int64_t>{0, 2, 1, 3} : std::vector<int64_t>{1, 2, 0, 3};
  const std::vector<int64_t> back = layout == AttentionLayout::kBTHD ? std::vector<int64_t>{0, 2, 1, 3} : std::vector<int64_t>{2, 0, 1, 3};
  for (Module* m : {&c.plain, &c.laid}) {
    const bool laid = m == &c.laid;
    std::vector<ValueId> in;
    for (const char* name : {"q", "k", "v", "dy"}) {
      const ValueId x = m->add_argument(name, TensorType{dtype, operand}, Role::kInput);
      in.push_back(laid ? x : emit(*m, "transpose", {x}, make_attrs({{"perm", to_default}})));
    }
    if (bias) in.push_back(m->add_argument("mask", TensorType{dtype, mask}, Role::kInput));
    Attrs attrs = make_attrs({{"scale", 0.125}});
    if (laid) attrs.set("layout", std::string(attention_layout_name(layout)));
    std::vector<ValueId> qkv_bias = {in[0], in[1], in[2]};
    if (bias) qkv_bias.push_back(in[4]);
    const ValueId y = emit(*m, "attention", qkv_bias, attrs);
    std::vector<ValueId> grad_in = {in[3], in[0], in[1], in[2]};
    if (bias) grad_in.push_back(in[4]);
    auto grads = m->add_node("attention_grad", grad_in, attrs);
    EXPECT_TRUE(grads.ok()) << grads.status().message();
    if (!grads.ok()) return c;
    std::vector<ValueId> outs = {y, grads->at(0), grads->at(1), grads->at(2)};
    if (!laid) {
      for (ValueId& o : outs) o = emit(*m, "transpose", {o}, make_attrs({{"perm", back}}));
    }
    m->set_outputs(outs);
  }
  std::mt19937 rng(17);
  for (const char* name : {"q", "k", "v", "dy"}) c.feeds[name] = testing::random_tensor(dtype, operand, rng, -1, 1);
  if (bias) c.feeds["mask"] = testing::random_tensor(dtype, mask, rng, -2, 0);
  return c;
}

// A language model's loss rows: [R, 50257] logits (a warp per row on a card), labels with an
// ignored row, the loss and its gradient against the CPU kernels (f32 exp in vectors, f64 sums).
struct CrossEntropyCase {
  Module module;
  std::map<std::string, Tensor> feeds;
};
CrossEntropyCase cross_entropy_case(DType dtype) {
  constexpr int64_t kRows = 5, kVocab = 50257;
  CrossEntropyCase c;
  Module& m = c.module;
  const ValueId logits = m.add_argument("logits", TensorType{dtype, {kRows, kVocab}}, Role::kInput);
  const ValueId labels = m.add_argument("labels", TensorType{DType::kI64, {kRows}}, Role::kInput);
  const ValueId dloss = m.add_argument("dloss", TensorType{DType::kF32, {}}, Role::kInput);
  const Attrs attrs = make_attrs({{"ignore_index", int64_t{-100}}, {"divisor", 3.0}});
  const ValueId loss = emit(m, "softmax_cross_entropy", {logits, labels}, attrs);
  const ValueId dz = emit(m, "softmax_cross_entropy_grad", {dloss, logits, labels}, attrs);
  m.set_outputs({loss, dz});
  std::mt19937 rng(29);
  c.feeds["logits"] = testing::random_tensor(dtype, {kRows, kVocab}, rng, -8, 8);
  Tensor l = Tensor::zeros(DType::kI64, {kRows});
  const int64_t picks[kRows] = {7, -100, 50256, 0, 31337};
  for (int64_t i = 0; i < kRows; ++i) l.data<int64_t>()[i] = picks[i];
  c.feeds["labels"] = l;
  Tensor d = Tensor::zeros(DType::kF32, {});
  d.data<float>()[0] = 0.75f;
  c.feeds["dloss"] = d;
  return c;
}

void expect_cross_entropy_matches_cpu(Backend& backend) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const CrossEntropyCase c = cross_entropy_case(dtype);
    DeviceMemory cpu_memory;
    auto ref = PlannedExecutor::create(c.module, cpu_memory);
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    for (const auto& [name, t] : c.feeds) ASSERT_TRUE(ref->set_argument(name, t).ok());
    ASSERT_TRUE(ref->run(ExecOptions{}).ok());
    const std::vector<Tensor> got = run_planned(backend, c.module, c.feeds);
    ASSERT_EQ(got.size(), 2u);
    const Tensor want_loss = *ref->fetch_output(0), want_dz = *ref->fetch_output(1);
    EXPECT_NEAR(got[0].get_as_double(0), want_loss.get_as_double(0), 1e-6 * std::fabs(want_loss.get_as_double(0)));
    double worst = 0;
    for (int64_t i = 0; i < want_dz.numel(); ++i) worst = std::max(worst, std::fabs(got[1].get_as_double(i) - want_dz.get_as_double(i)));
    EXPECT_LE(worst, dtype == DType::kF32 ? 1e-7 : 2e-3) << "dz";  // scale 0.25: bf16 rounds dz's largest values by 1e-3
    for (int64_t c2 = 0; c2 < 50257; ++c2) ASSERT_EQ(got[1].get_as_double(50257 + c2), 0.0) << "the ignored row";
  }
}

TEST(CudaCrossEntropy, AVocabularyWideRowMatchesTheCpuKernels) {
  HostCudaBackend backend;
  expect_cross_entropy_matches_cpu(backend);
}

TEST(CudaCrossEntropy, OnTheGpuAVocabularyWideRowMatchesTheCpuKernels) {
  auto gpu = open_backend("cuda:0");
  if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status().message();
  expect_cross_entropy_matches_cpu(**gpu);
}

// Planned and run whole (the plan sizes each path's scratch) on the CUDA kernels' host runner:
// the same bits in either layout.
TEST(CudaAttention, APlannedStepInEitherLayoutGivesTheSameBits) {
  HostCudaBackend host;
  for (const AttentionLayout layout : {AttentionLayout::kBTHD, AttentionLayout::kTBHD}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(str_cat(attention_layout_name(layout), " ", dtype_name(dtype)));
      const LayoutModules c = layout_modules(layout, dtype, {2, 3}, 21, 16, /*bias=*/true);
      const std::vector<Tensor> want = run_planned(host, c.plain, c.feeds), got = run_planned(host, c.laid, c.feeds);
      ASSERT_EQ(want.size(), 4u);
      ASSERT_EQ(got.size(), 4u);
      for (size_t k = 0; k < 4; ++k) EXPECT_TRUE(bits_equal(got[k], want[k])) << "output " << k;
    }
  }
}

// The same on a card, where bf16 runs cuDNN's SDPA (reading the layouts through strides) and f32
// the batched cuBLASLt products with row steps: within each precision's rounding of the default
// layout, at ViT-B/16's attention shape and at a masked text shape. bench/device_check.sh runs it
// (*OnTheGpu*).
TEST(CudaAttention, OnTheGpuEitherLayoutMatchesTheDefault) {
  auto gpu = open_backend("cuda:0");
  if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status().message();
  for (const AttentionLayout layout : {AttentionLayout::kBTHD, AttentionLayout::kTBHD}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const bool text : {false, true}) {
        SCOPED_TRACE(str_cat(attention_layout_name(layout), " ", dtype_name(dtype), text ? " text" : " ViT-B/16"));
        const LayoutModules c = text ? layout_modules(layout, dtype, {8, 2}, 32, 16, true) : layout_modules(layout, dtype, {4, 12}, 197, 64, false);
        const std::vector<Tensor> want = run_planned(**gpu, c.plain, c.feeds), got = run_planned(**gpu, c.laid, c.feeds);
        ASSERT_EQ(want.size(), 4u);
        ASSERT_EQ(got.size(), 4u);
        for (size_t k = 0; k < 4; ++k) {
          const double d = relative_difference(got[k], want[k]);
          std::printf("[attention layouts on the GPU] %s %s %s output %zu: %.2e\n", std::string(attention_layout_name(layout)).c_str(),
                      std::string(dtype_name(dtype)).c_str(), text ? "text" : "vit_b_16", k, d);
          EXPECT_LE(d, dtype == DType::kF32 ? 1e-5 : 1e-2) << "output " << k;
        }
      }
    }
  }
}

// An input with the output's bytes but fewer elements (f32 [N] broadcast into a bf16 [2, N]
// result) must not share the output's buffer: element i's write would overwrite what a later
// element reads. The planned step equals the unfused one on both kernels' backends.
TEST(CudaFused, ABroadcastInputOfTheOutputsBytesIsNotOverwritten) {
  constexpr int64_t n = 4096;
  Module plain;
  const ValueId x = plain.add_argument("x", TensorType{DType::kF32, {2, n}}, Role::kInput);
  const ValueId row = plain.add_argument("row", TensorType{DType::kF32, {n}}, Role::kInput);
  const ValueId p = emit(plain, "tanh", {row});  // an activation whose last reader is the fused node
  const ValueId y = emit(plain, "cast", {emit(plain, "add", {p, x})}, make_attrs({{"to", std::string("bf16")}}));  // p: input 0
  plain.set_outputs({y});
  Module fused = plain;
  ASSERT_TRUE(FuseElementwise().run(fused).ok());
  ASSERT_EQ(testing::count_op(fused, "fused_elementwise"), 1);
  std::mt19937 rng(4);
  const std::map<std::string, Tensor> feeds = {{"x", testing::random_tensor(DType::kF32, {2, n}, rng)},
                                               {"row", testing::random_tensor(DType::kF32, {n}, rng)}};
  HostCudaBackend host;
  for (Backend* backend : {static_cast<Backend*>(&cpu_backend()), static_cast<Backend*>(&host)}) {
    const std::vector<Tensor> want = run_planned(*backend, plain, feeds), got = run_planned(*backend, fused, feeds);
    ASSERT_EQ(want.size(), 1u);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(std::memcmp(got[0].raw(), want[0].raw(), want[0].nbytes()), 0) << backend->name();
  }
}

// A chain fused first (later in the schedule) feeds a consumer of an earlier root: that consumer
// reads a node made after the root, so it is no second result of the root's chain.
TEST(CudaFused, AConsumerOfALaterFusedChainIsNoSecondResult) {
  Module plain;
  const ValueId a = plain.add_argument("a", TensorType{DType::kBF16, {64}}, Role::kInput);
  const ValueId b = plain.add_argument("b", TensorType{DType::kF32, {64}}, Role::kInput);
  const ValueId r = emit(plain, "neg", {a});
  const ValueId v = emit(plain, "cast", {emit(plain, "gelu", {b})}, make_attrs({{"to", std::string("bf16")}}));
  const ValueId u = emit(plain, "add", {r, v});
  const ValueId w = emit(plain, "exp", {r});
  plain.set_outputs({u, w});
  Module fused = plain;
  auto report = FuseElementwise().run(fused);
  ASSERT_TRUE(report.ok()) << report.status().message();
  std::mt19937 rng(6);
  const std::map<std::string, Tensor> feeds = {{"a", testing::random_tensor(DType::kBF16, {64}, rng)},
                                               {"b", testing::random_tensor(DType::kF32, {64}, rng)}};
  auto want = execute(plain, feeds);
  auto got = execute(fused, feeds);
  ASSERT_TRUE(want.ok() && got.ok());
  for (size_t k = 0; k < 2; ++k) EXPECT_EQ(std::memcmp(got->at(k).raw(), want->at(k).raw(), want->at(k).nbytes()), 0) << k;
}

// A fused node's program is checked where the node is made (and where a plan's IR is parsed):
// each malformed one is refused in one line naming the step.
TEST(CudaFused, MalformedProgramsAreRefusedNamingTheStep) {
  struct Bad {
    std::vector<std::string> ops;
    std::vector<int64_t> args, results;
    std::vector<std::string> step_attrs;
    std::string message;
  };
  const Bad cases[] = {
      {{"exp", "add"}, {0, -1, -1, 2, 5, -1}, {3}, {"", ""}, "step 1 (add) reads slot 5"},
      {{"matmul"}, {0, 1, -1}, {2}, {""}, "step 0: memc.matmul is not fusable"},
      {{"gelu"}, {0, -1, -1}, {2}, {"alpha=2"}, "step gelu: attribute 'alpha=2' is not gelu's"},
      {{"dropout"}, {0, -1, -1}, {2}, {"ratio=x"}, "step dropout: ratio 'x' is no number"},
      {{"add"}, {0, 1}, {2}, {""}, "args (2) and step_attrs (1) do not fit 1 steps"},
      {{"add"}, {0, 1, -1}, {1}, {""}, "result slot 1 is no step's"},
      {{"cast"}, {0, -1, -1}, {2}, {"to=i64"}, "slot 2 is i64, not f32, bf16, f16 or i1"},
      {{"add"}, {0, 1, -1}, {2}, {""}, "do not broadcast"},  // b [4] against a [2, 3]
      {{"add"}, {0, -1, 1}, {2}, {""}, "step 0 (add): operand 2 follows an unused one"},
      {{"greater", "div"}, {0, 1, -1, 2, 2, -1}, {3}, {"", ""}, "step 1 (div) reads i1 slot 2"},
      {{"dropout"}, {1, -1, -1}, {2}, {"ratio=0.5"}, "does not broadcast"},  // b [3] is not the node's [2, 3]
  };
  for (const Bad& bad : cases) {
    Module m;
    const ValueId a = m.add_argument("a", TensorType{DType::kF32, {2, 3}}, Role::kInput);
    const ValueId b = m.add_argument("b", TensorType{DType::kF32, {bad.message == "do not broadcast" ? 4 : 3}}, Role::kInput);
    auto out = m.add_node("fused_elementwise", {a, b},
                          make_attrs({{"ops", bad.ops}, {"args", bad.args}, {"results", bad.results}, {"step_attrs", bad.step_attrs}}));
    ASSERT_FALSE(out.ok()) << bad.message;
    EXPECT_NE(out.status().message().find(bad.message), std::string::npos) << out.status().message();
    EXPECT_EQ(out.status().message().find('\n'), std::string::npos);
  }
}

// Coalesced maps (bodies.h coalesce()) give every element the offset the full maps give it, also
// with 32-bit arithmetic, and drop the dims they can: a contiguous operand and a broadcast one
// merge to what they need.
// add_layernorm (passes/add_layernorm.h): a residual add (its operand widened or narrowed by a
// cast, or not) and the layernorm that reads it (an f32 one's output narrowed by a cast, or not),
// and layernorm_grad and the add that follows it, each as one node: every output equals the ops'
// kernels bit for bit, on the CPU kernels and on the CUDA host runner (a thread per row; the
// device's warp per row runs the same pieces, checked on a card by bench/device_check.sh), in
// f32, bf16 and f16.
// `fused`, a rewrite of `plain`, gives plain's outputs bit for bit on the CPU kernels and on the
// CUDA host runner.
void expect_same_bits(const Module& plain, const Module& fused, const std::map<std::string, Tensor>& feeds) {
  HostCudaBackend host;
  for (const Backend* kernels : {static_cast<const Backend*>(nullptr), static_cast<const Backend*>(&host)}) {
    auto want = execute(plain, feeds, ExecOptions{.kernels = kernels});
    auto got = execute(fused, feeds, ExecOptions{.kernels = kernels});
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->size(), want->size());
    for (size_t k = 0; k < want->size(); ++k) {
      ASSERT_EQ(got->at(k).dtype(), want->at(k).dtype()) << "output " << k;
      EXPECT_EQ(std::memcmp(got->at(k).raw(), want->at(k).raw(), want->at(k).nbytes()), 0) << (kernels ? "CUDA kernels" : "CPU kernels")
                                                                                        << ", output " << k;
    }
  }
}

// One case: x (t), the branch (u; a cast to t where they differ), scale and bias, y narrowed
// (for an f32 x) or not, and the gradient's add; the module, its rewrite and random feeds.
struct AddLayernormCase {
  Module plain, fused;
  std::map<std::string, Tensor> feeds;
};
AddLayernormCase add_layernorm_case(DType t, DType u, std::optional<DType> narrow, const Shape& shape) {
  AddLayernormCase c;
  Module& plain = c.plain;
  const Shape row = {shape.back()};
  const ValueId x = plain.add_argument("x", TensorType{t, shape}, Role::kInput);
  const ValueId b = plain.add_argument("b", TensorType{u, shape}, Role::kInput);
  const ValueId scale = plain.add_argument("scale", TensorType{t, row}, Role::kInput);
  const ValueId bias = plain.add_argument("bias", TensorType{t, row}, Role::kInput);
  const ValueId dy = plain.add_argument("dy", TensorType{t, shape}, Role::kInput);
  const ValueId d = plain.add_argument("d", TensorType{t, shape}, Role::kInput);
  const ValueId r = u == t ? b : emit(plain, "cast", {b}, make_attrs({{"to", std::string(dtype_name(t))}}));
  const Attrs axis = make_attrs({{"axis", static_cast<int64_t>(shape.size()) - 1}, {"eps", 1e-5}});
  const ValueId s = emit(plain, "add", {x, r});
  ValueId y = emit(plain, "layernorm", {s, scale, bias}, axis);
  if (narrow) y = emit(plain, "cast", {y}, make_attrs({{"to", std::string(dtype_name(*narrow))}}));
  auto grads = plain.add_node("layernorm_grad", {dy, s, scale}, axis);
  EXPECT_TRUE(grads.ok()) << grads.status().message();
  if (!grads.ok()) return c;
  plain.set_outputs({s, y, emit(plain, "add", {d, grads->at(0)}), grads->at(1)});
  c.fused = plain;
  auto report = AddLayernorm().run(c.fused);
  EXPECT_TRUE(report.ok()) << report.status().message();
  if (report.ok()) {
    EXPECT_EQ(report->get("forward"), 1);
    EXPECT_EQ(report->get("backward"), 1);
  }
  EXPECT_EQ(testing::count_op(c.fused, "add") + testing::count_op(c.fused, "cast") + testing::count_op(c.fused, "layernorm"), 0);
  for (NodeId n : c.fused.schedule()) {
    if (c.fused.node(n).op == "add_layernorm") {
      EXPECT_EQ(c.fused.node(n).attrs.get_string("y_dtype", ""), narrow ? dtype_name(*narrow) : "");
    }
  }
  std::mt19937 rng(6);
  for (const char* name : {"x", "b", "dy", "d"}) c.feeds[name] = testing::random_tensor(std::string(name) == "b" ? u : t, shape, rng, -3, 3);
  c.feeds["scale"] = testing::random_tensor(t, row, rng, 0.5, 1.5);
  c.feeds["bias"] = testing::random_tensor(t, row, rng, -1, 1);
  return c;
}

// y narrowed to bf16 or f16 after an f32 layernorm.
std::optional<DType> narrowed_y(DType t, DType u) {
  return t != DType::kF32 ? std::nullopt : std::optional<DType>(u == DType::kF16 ? DType::kF16 : DType::kBF16);
}

TEST(CudaAddLayernorm, EqualsTheAddAndTheLayernormBitForBit) {
  for (const DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const DType u : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::optional<DType> narrow = narrowed_y(t, u);
      SCOPED_TRACE(str_cat("x ", dtype_name(t), ", branch ", dtype_name(u), narrow ? str_cat(", y to ", dtype_name(*narrow)) : ""));
      const AddLayernormCase c = add_layernorm_case(t, u, narrow, {6, 4, 33});
      expect_same_bits(c.plain, c.fused, c.feeds);
    }
  }
}

// layernorm_bias_grad (passes/layernorm_bias_grad.h): the bias gradient summed with dscale's
// partials equals reduce_sum's within rounding, on the CPU kernels and the host runner, f32 and
// bf16, the other outputs bit for bit.
TEST(CudaLayernormBiasGrad, EqualsTheRowSumWithinRounding) {
  HostCudaBackend host;
  for (const DType t : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(t));
    const Shape shape = {5, 41, 96}, row = {96};
    Module plain;
    const ValueId dy = plain.add_argument("dy", TensorType{t, shape}, Role::kInput);
    const ValueId x = plain.add_argument("x", TensorType{t, shape}, Role::kInput);
    const ValueId scale = plain.add_argument("scale", TensorType{t, row}, Role::kInput);
    auto grads = plain.add_node("layernorm_grad", {dy, x, scale}, make_attrs({{"axis", int64_t{2}}}));
    ASSERT_TRUE(grads.ok()) << grads.status().message();
    const ValueId db = emit(plain, "reduce_sum", {dy}, make_attrs({{"axes", std::vector<int64_t>{0, 1}}, {"keepdims", int64_t{0}}}));
    plain.set_outputs({grads->at(0), grads->at(1), db});
    Module fused = plain;
    auto report = LayernormBiasGrad().run(fused);
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->get("fused"), 1);
    EXPECT_EQ(testing::count_op(fused, "reduce_sum"), 0);
    std::mt19937 rng(21);
    const std::map<std::string, Tensor> feeds = {{"dy", testing::random_tensor(t, shape, rng, -2, 2)},
                                                 {"x", testing::random_tensor(t, shape, rng, -2, 2)},
                                                 {"scale", testing::random_tensor(t, row, rng, 0.5, 1.5)}};
    for (const Backend* kernels : {static_cast<const Backend*>(nullptr), static_cast<const Backend*>(&host)}) {
      auto want = execute(plain, feeds, ExecOptions{.kernels = kernels});
      auto got = execute(fused, feeds, ExecOptions{.kernels = kernels});
      ASSERT_TRUE(want.ok() && got.ok());
      for (size_t k = 0; k < 2; ++k) EXPECT_EQ(std::memcmp(got->at(k).raw(), want->at(k).raw(), want->at(k).nbytes()), 0) << k;
      const double d = relative_difference(got->at(2), want->at(2), 1e-30);
      EXPECT_LE(d, t == DType::kF32 ? 1e-6 : 1e-2) << (kernels ? "CUDA kernels" : "CPU kernels");
      EXPECT_GT(l2_norm(got->at(2)), 1.0);  // a real sum: 205 rows of values in [-2, 2]
    }
  }
}

// The same on a card: the warp-per-row kernels (kernels.cu) of the fused and the unfused ops, run
// by the planned executor, give the same bits (the CUDA module rounds as written: -fmad=false).
// Rows of ViT-B's 768 and a ragged 33. bench/device_check.sh runs it (*OnTheGpu*).
TEST(CudaAddLayernorm, OnTheGpuEqualsTheUnfusedKernelsBitForBit) {
  auto gpu = open_backend("cuda:0");
  if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status().message();
  for (const Shape& shape : {Shape{8, 197, 768}, Shape{6, 4, 33}}) {
    for (const DType t : {DType::kF32, DType::kBF16}) {
      for (const DType u : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(str_cat(shape_str(shape), " x ", dtype_name(t), ", branch ", dtype_name(u)));
        const AddLayernormCase c = add_layernorm_case(t, u, narrowed_y(t, u), shape);
        const std::vector<Tensor> want = run_planned(**gpu, c.plain, c.feeds), got = run_planned(**gpu, c.fused, c.feeds);
        ASSERT_EQ(want.size(), 4u);
        ASSERT_EQ(got.size(), 4u);
        for (size_t k = 0; k < 4; ++k) EXPECT_EQ(std::memcmp(got[k].raw(), want[k].raw(), want[k].nbytes()), 0) << "output " << k;
      }
    }
  }
}

// layernorm_grad_casts (passes/layernorm_grad_casts.h): an f32 layernorm_grad whose dy is a
// 16-bit value widened by a cast, and whose dx a cast narrows (dx itself returned too, as the
// residual stream's gradient is read on), with and without the addend and the bias gradient. One
// case: the module, its rewrite, what the pass reports, and random feeds.
struct GradCastsCase {
  Module plain, fused;
  int64_t widened = 0, narrowed = 0;
  std::map<std::string, Tensor> feeds;
};
GradCastsCase grad_casts_case(DType half, const Shape& shape, bool addend, bool bias, bool widen, bool narrow) {
  GradCastsCase c;
  Module& plain = c.plain;
  const Shape row = {shape.back()};
  const ValueId d16 = plain.add_argument("dy", TensorType{widen ? half : DType::kF32, shape}, Role::kInput);
  const ValueId x = plain.add_argument("x", TensorType{DType::kF32, shape}, Role::kInput);
  const ValueId scale = plain.add_argument("scale", TensorType{DType::kF32, row}, Role::kInput);
  const ValueId d = plain.add_argument("d", TensorType{DType::kF32, shape}, Role::kInput);
  const ValueId dy = widen ? emit(plain, "cast", {d16}, make_attrs({{"to", std::string("f32")}})) : d16;
  std::vector<ValueId> inputs = {dy, x, scale};
  if (addend) inputs.push_back(d);
  Attrs attrs = make_attrs({{"axis", static_cast<int64_t>(shape.size()) - 1}, {"eps", 1e-5}});
  if (bias) attrs.set("bias_grad", int64_t{1});
  auto grads = plain.add_node("layernorm_grad", inputs, attrs);
  EXPECT_TRUE(grads.ok()) << grads.status().message();
  if (!grads.ok()) return c;
  std::vector<ValueId> outputs = *grads;
  if (narrow) outputs.push_back(emit(plain, "cast", {grads->at(0)}, make_attrs({{"to", std::string(dtype_name(half))}})));
  plain.set_outputs(outputs);
  c.fused = plain;
  auto report = LayernormGradCasts().run(c.fused);
  EXPECT_TRUE(report.ok()) << report.status().message();
  if (report.ok()) c.widened = report->get("widened"), c.narrowed = report->get("narrowed");
  std::mt19937 rng(29);
  c.feeds["dy"] = testing::random_tensor(widen ? half : DType::kF32, shape, rng, -3, 3);
  c.feeds["x"] = testing::random_tensor(DType::kF32, shape, rng, -3, 3);
  c.feeds["scale"] = testing::random_tensor(DType::kF32, row, rng, 0.5, 1.5);
  c.feeds["d"] = testing::random_tensor(DType::kF32, shape, rng, -3, 3);
  return c;
}

// Every output (dx, dscale, dbias, the 16-bit copy) equals the unfused ops' bit for bit on the
// CPU kernels and the CUDA host runner, and the casts are gone.
TEST(CudaLayernormGradCasts, CastsAtTheEdgesBitForBit) {
  for (const DType half : {DType::kBF16, DType::kF16}) {
    for (const bool addend : {false, true}) {
      for (const bool bias : {false, true}) {
        for (const auto [widen, narrow] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
          SCOPED_TRACE(str_cat(dtype_name(half), addend ? ", addend" : "", bias ? ", bias" : "", widen ? ", 16-bit dy" : "",
                               narrow ? ", 16-bit dx copy" : ""));
          // 185 rows: the CPU kernel's blocks hold 3 rows each (64 blocks at most), so each block
          // writes its rows' copy after its last row
          const GradCastsCase c = grad_casts_case(half, {5, 37, 40}, addend, bias, widen, narrow);
          EXPECT_EQ(c.widened, widen);
          EXPECT_EQ(c.narrowed, narrow);
          EXPECT_EQ(testing::count_op(c.fused, "cast"), 0);
          expect_same_bits(c.plain, c.fused, c.feeds);
        }
      }
    }
  }
}

// A widening cast that something else reads too stays (the f32 dy is written anyway), and so does
// its layernorm_grad's dy; a cast of dx beside other readers still joins.
TEST(CudaLayernormGradCasts, ACastReadElsewhereStays) {
  const Shape shape = {4, 24}, row = {24};
  Module plain;
  const ValueId d16 = plain.add_argument("dy", TensorType{DType::kBF16, shape}, Role::kInput);
  const ValueId x = plain.add_argument("x", TensorType{DType::kF32, shape}, Role::kInput);
  const ValueId scale = plain.add_argument("scale", TensorType{DType::kF32, row}, Role::kInput);
  const ValueId dy = emit(plain, "cast", {d16}, make_attrs({{"to", std::string("f32")}}));
  auto grads = plain.add_node("layernorm_grad", {dy, x, scale}, make_attrs({{"axis", int64_t{1}}}));
  ASSERT_TRUE(grads.ok()) << grads.status().message();
  const ValueId copy = emit(plain, "cast", {grads->at(0)}, make_attrs({{"to", std::string("bf16")}}));
  plain.set_outputs({emit(plain, "exp", {dy}), grads->at(0), grads->at(1), copy, emit(plain, "neg", {grads->at(0)})});
  Module fused = plain;
  auto report = LayernormGradCasts().run(fused);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->get("widened"), 0);
  EXPECT_EQ(report->get("narrowed"), 1);
  EXPECT_EQ(testing::count_op(fused, "cast"), 1);
  std::mt19937 rng(30);
  expect_same_bits(plain, fused, {{"dy", testing::random_tensor(DType::kBF16, shape, rng, -2, 2)},
                                  {"x", testing::random_tensor(DType::kF32, shape, rng, -2, 2)},
                                  {"scale", testing::random_tensor(DType::kF32, row, rng, 0.5, 1.5)}});
}

// The same on a card (bench/device_check.sh runs *OnTheGpu*): the warp-per-row kernels of the
// rewritten and the unfused ops through the planned executor, at ViT-B's rows and a ragged 40.
TEST(CudaLayernormGradCasts, OnTheGpuEqualsTheUnfusedKernelsBitForBit) {
  auto gpu = open_backend("cuda:0");
  if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status().message();
  for (const Shape& shape : {Shape{8, 197, 768}, Shape{5, 7, 40}}) {
    for (const bool addend : {false, true}) {
      SCOPED_TRACE(str_cat(shape_str(shape), addend ? ", addend" : ""));
      const GradCastsCase c = grad_casts_case(DType::kBF16, shape, addend, true, true, true);
      const std::vector<Tensor> want = run_planned(**gpu, c.plain, c.feeds), got = run_planned(**gpu, c.fused, c.feeds);
      ASSERT_EQ(want.size(), 4u);
      ASSERT_EQ(got.size(), 4u);
      for (size_t k = 0; k < 4; ++k) EXPECT_EQ(std::memcmp(got[k].raw(), want[k].raw(), want[k].nbytes()), 0) << "output " << k;
    }
  }
}

// narrow_transposes (passes/narrow_transposes.h): a transpose of f32 that a cast to 16 bits reads
// becomes the cast then the transpose, and a transpose of a widened 16-bit value becomes the
// transpose then the cast: the same bits on the CPU kernels and the CUDA host runner, and the
// transposes move 16-bit values. A transpose whose f32 result something else reads stays.
TEST(CudaNarrowTransposes, CastsMoveAcrossTransposesBitForBit) {
  for (const DType half : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(half));
    Module plain;
    const ValueId x = plain.add_argument("x", TensorType{DType::kF32, {3, 5, 7}}, Role::kInput);
    const ValueId h = plain.add_argument("h", TensorType{half, {3, 5, 7}}, Role::kInput);
    const Attrs perm = make_attrs({{"perm", std::vector<int64_t>{1, 0, 2}}});
    const ValueId narrowed = emit(plain, "cast", {emit(plain, "transpose", {emit(plain, "tanh", {x})}, perm)},
                                  make_attrs({{"to", std::string(dtype_name(half))}}));
    const ValueId widened = emit(plain, "transpose", {emit(plain, "cast", {emit(plain, "neg", {h})}, make_attrs({{"to", std::string("f32")}}))}, perm);
    const ValueId kept_t = emit(plain, "transpose", {x}, perm);  // its f32 result is returned too: stays
    const ValueId kept = emit(plain, "cast", {kept_t}, make_attrs({{"to", std::string(dtype_name(half))}}));
    plain.set_outputs({narrowed, widened, kept, kept_t});
    Module moved = plain;
    auto report = NarrowTransposes().run(moved);
    ASSERT_TRUE(report.ok()) << report.status().message();
    EXPECT_EQ(report->get("narrowed"), 1);
    EXPECT_EQ(report->get("widened"), 1);
    int half_transposes = 0;
    for (NodeId n : moved.schedule()) {
      const Node& node = moved.node(n);
      half_transposes += node.op == "transpose" && moved.value(node.outputs[0]).type.dtype == half;
    }
    EXPECT_EQ(half_transposes, 2);
    std::mt19937 rng(14);
    const std::map<std::string, Tensor> feeds = {{"x", testing::random_tensor(DType::kF32, {3, 5, 7}, rng, -3, 3)},
                                                 {"h", testing::random_tensor(half, {3, 5, 7}, rng, -3, 3)}};
    expect_same_bits(plain, moved, feeds);
  }
}

// The sum takes the buffer of an operand nothing else reads (the add's output did too): the
// kernel reads each element before it writes its sum. Through the planned executor, where the
// buffers are shared, the outputs equal the unfused step's on both backends.
TEST(CudaAddLayernorm, TheSumMayTakeItsOperandsBuffer) {
  const Shape shape = {5, 96}, row = {96};
  Module plain;
  const ValueId x = plain.add_argument("x", TensorType{DType::kF32, shape}, Role::kInput);
  const ValueId b = plain.add_argument("b", TensorType{DType::kF32, shape}, Role::kInput);
  const ValueId scale = plain.add_argument("scale", TensorType{DType::kF32, row}, Role::kInput);
  const ValueId branch = emit(plain, "tanh", {b});  // an activation only the add reads
  const ValueId s = emit(plain, "add", {x, branch});
  plain.set_outputs({emit(plain, "layernorm", {s, scale}, make_attrs({{"axis", int64_t{1}}})), emit(plain, "exp", {s})});
  Module fused = plain;
  ASSERT_TRUE(AddLayernorm().run(fused).ok());
  ASSERT_EQ(testing::count_op(fused, "add_layernorm"), 1);
  auto live = analyze_liveness(fused);
  ASSERT_TRUE(live.ok()) << live.status().message();
  const Node& node = fused.node(fused.value(fused.outputs()[0]).producer);
  EXPECT_EQ(live->alias[node.outputs[0]], AliasKind::kInplace);  // the sum in tanh's buffer
  std::mt19937 rng(8);
  const std::map<std::string, Tensor> feeds = {{"x", testing::random_tensor(DType::kF32, shape, rng)},
                                               {"b", testing::random_tensor(DType::kF32, shape, rng)},
                                               {"scale", testing::random_tensor(DType::kF32, row, rng)}};
  HostCudaBackend host;
  for (Backend* backend : {static_cast<Backend*>(&cpu_backend()), static_cast<Backend*>(&host)}) {
    const std::vector<Tensor> want = run_planned(*backend, plain, feeds), got = run_planned(*backend, fused, feeds);
    ASSERT_EQ(want.size(), 2u);
    ASSERT_EQ(got.size(), 2u);
    for (size_t k = 0; k < 2; ++k) EXPECT_EQ(std::memcmp(got[k].raw(), want[k].raw(), want[k].nbytes()), 0) << backend->name() << " " << k;
  }
}

TEST(CudaStrided, CoalescedMapsGiveTheSameOffsets) {
  auto map = [](const Shape& in, const Shape& out) {
    const std::vector<int64_t> st = broadcast_strides(in, out);
    cuda::Strided m;
    m.rank = static_cast<int>(out.size());
    for (size_t d = 0; d < out.size(); ++d) m.dims[d] = out[d], m.strides[d] = st[d];
    return m;
  };
  struct Case {
    Shape out, a, b;
    int rank;  // after coalescing
  };
  for (const Case& c : {Case{{4, 5, 6}, {4, 5, 6}, {4, 5, 6}, 1}, Case{{4, 5, 6}, {4, 5, 6}, {6}, 2}, Case{{4, 5, 6}, {4, 1, 6}, {4, 5, 6}, 3},
                        Case{{2, 1, 3, 1, 4}, {2, 1, 3, 1, 4}, {1, 1, 1, 1, 1}, 1}, Case{{3, 4, 5}, {3, 4, 1}, {1, 1, 5}, 2},
                        Case{{2, 3, 4, 5}, {2, 3, 1, 1}, {2, 3, 4, 5}, 2}}) {
    const cuda::Strided a0 = map(c.a, c.out), b0 = map(c.b, c.out);
    cuda::Strided a = a0, b = b0;
    cuda::coalesce({&a, &b});
    EXPECT_EQ(a.rank, c.rank) << shape_str(c.out) << " " << shape_str(c.a) << " " << shape_str(c.b);
    EXPECT_EQ(b.rank, c.rank);
    cuda::Strided a32 = a, b32 = b;  // and with 32-bit index arithmetic
    a32.narrow = b32.narrow = true;
    for (int64_t i = 0; i < numel(c.out); ++i) {
      ASSERT_EQ(a.offset(i), a0.offset(i)) << i;
      ASSERT_EQ(b.offset(i), b0.offset(i)) << i;
      ASSERT_EQ(a32.offset(i), a0.offset(i)) << i;
      ASSERT_EQ(b32.offset(i), b0.offset(i)) << i;
    }
  }
  // A transpose's source map ([B, T, H, D] read as [B, H, T, D]) keeps its 4 dims.
  cuda::Strided t;
  t.rank = 4;
  const int64_t dims[] = {2, 3, 4, 5}, strides[] = {60, 5, 15, 1};
  for (int d = 0; d < 4; ++d) t.dims[d] = dims[d], t.strides[d] = strides[d];
  const cuda::Strided t0 = t;
  cuda::coalesce({&t});
  EXPECT_EQ(t.rank, 4);
  for (int64_t i = 0; i < 120; ++i) ASSERT_EQ(t.offset(i), t0.offset(i));
}

// matmul_bgrad (a linear layer's bias gradient in its weight-gradient GEMM): for either summed
// operand, every transpose, f32 and bf16, through the epilogue and through the fallback (the
// plain GEMM and a reduction, where cuBLASLt offers no algorithm), y and the sums equal a double
// reference and the CPU kernel (the one the GPU plans' CPU runs use).
TEST(CudaGemmEpilogues, BiasGradientEqualsMatmulAndItsSums) {
  constexpr int64_t kM = 12, kN = 9, kK = 37;
  std::mt19937 rng(23);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t summed : {0, 1}) {
      for (const int64_t ta : {0, 1}) {
        for (const int64_t tb : {0, 1}) {
          for (const bool fallback : {false, true}) {
            Node node;
            node.op = "matmul_bgrad";
            node.attrs.set("transpose_a", ta), node.attrs.set("transpose_b", tb), node.attrs.set("summed", summed);
            const Tensor a = testing::random_tensor(dtype, ta ? Shape{kK, kM} : Shape{kM, kK}, rng);
            const Tensor b = testing::random_tensor(dtype, tb ? Shape{kN, kK} : Shape{kK, kN}, rng);
            auto at = [&](int64_t i, int64_t k) { return a.get_as_double(ta ? k * kM + i : i * kK + k); };
            auto bt = [&](int64_t k, int64_t j) { return b.get_as_double(tb ? j * kK + k : k * kN + j); };
            const int64_t count = summed ? kN : kM;
            auto run = [&](bool cuda_kernel) {
              std::vector<Tensor> out = {Tensor::zeros(dtype, {kM, kN}), Tensor::zeros(dtype, {count})};
              KernelContext ctx{node, {&a, &b}, {&out[0], &out[1]}};
              Scratch64 workspace(int64_t{1} << 20);
              workspace.give(ctx);
              HostRunner::refuse_bias_grad() = fallback;
              const Kernel* k = cuda_kernel ? cuda::ops::find_kernel<HostRunner>("matmul_bgrad") : cpu::find_kernel("matmul_bgrad");
              EXPECT_NE(k, nullptr);
              const Status st = (*k)(ctx);
              HostRunner::refuse_bias_grad() = false;
              EXPECT_TRUE(st.ok()) << st.message();
              return out;
            };
            const std::vector<Tensor> cuda = run(true), cpu = run(false);
            const double bound = dtype == DType::kF32 ? 1e-6 : 1e-2;
            double y_err = 0, s_err = 0, scale = 0;
            for (int64_t i = 0; i < kM; ++i) {
              for (int64_t j = 0; j < kN; ++j) {
                double ref = 0;
                for (int64_t k = 0; k < kK; ++k) ref += at(i, k) * bt(k, j);
                y_err = std::max(y_err, std::fabs(cuda[0].get_as_double(i * kN + j) - ref));
                scale = std::max(scale, std::fabs(ref));
              }
            }
            for (int64_t i = 0; i < count; ++i) {
              double ref = 0;
              for (int64_t k = 0; k < kK; ++k) ref += summed ? bt(k, i) : at(i, k);
              s_err = std::max(s_err, std::fabs(cuda[1].get_as_double(i) - ref));
              EXPECT_NEAR(cpu[1].get_as_double(i), ref, bound * std::max(1.0, std::fabs(ref)));
            }
            const std::string where = str_cat(dtype_name(dtype), " summed ", summed, " ta ", ta, " tb ", tb, fallback ? " fallback" : " epilogue");
            EXPECT_LE(y_err, bound * scale) << where;
            EXPECT_LE(s_err, bound * kK) << where;
            EXPECT_LE(relative_difference(cuda[0], cpu[0]), bound) << where;
          }
        }
      }
    }
  }
}

// matmul_acc (a gradient's term added into its sum by its GEMM, passes/accumulate_gemm.h): for
// f32, 16-bit operands into a 16-bit sum and into an f32 one (f32 with and without oneDNN's
// native bf16 kernels), every transpose, an a of rank 3 whose rows fold, with an accumulator
// that y overwrites in place or that y copies, and without one: y equals acc + op(a)·op(b) in double within one rounding of the
// sum, on the CPU kernel (in the workspace its planner function declares) and on the CUDA one.
TEST(CudaGemmEpilogues, AnAccumulatingGemmAddsItsProductIntoTheSum) {
  constexpr int64_t kM = 48, kN = 40, kK = 72;  // above the plain-loop size: oneDNN runs it
  std::mt19937 rng(31);
  const bool was_native = cpu::onednn_bf16_gemm();
  const std::pair<DType, DType> kinds[] = {{DType::kF32, DType::kF32}, {DType::kBF16, DType::kBF16}, {DType::kF32, DType::kBF16},
                                           {DType::kF32, DType::kF16}};
  for (const auto& [sum_type, operand_type] : kinds) {
    for (const bool native : {false, true}) {
      if (native && (operand_type != DType::kBF16 || !cpu::pin_onednn_bf16_gemm(true))) continue;
      if (!native) cpu::pin_onednn_bf16_gemm(false);
      for (const int64_t ta : {0, 1}) {
        for (const int64_t tb : {0, 1}) {
          for (const int mode : {0, 1, 2, 3}) {  // 0: in place, 1: y a copy of acc, 2: no acc, 3: in place, a [2, M/2, K]
            if (mode == 3 && ta) continue;
            const Shape y_shape = mode == 3 ? Shape{2, kM / 2, kN} : Shape{kM, kN};
            Module m;
            const ValueId acc_v = m.add_argument("acc", {sum_type, y_shape}, Role::kActivation);
            const ValueId a_v = m.add_argument("a", {operand_type, mode == 3 ? Shape{2, kM / 2, kK} : ta ? Shape{kK, kM} : Shape{kM, kK}}, Role::kActivation);
            const ValueId b_v = m.add_argument("b", {operand_type, tb ? Shape{kN, kK} : Shape{kK, kN}}, Role::kActivation);
            Attrs attrs;
            attrs.set("transpose_a", ta), attrs.set("transpose_b", tb);
            if (mode == 2) attrs.set("dtype", std::string(dtype_name(sum_type)));
            auto y_v = m.add_node("matmul_acc", {mode == 2 ? kNoValue : acc_v, a_v, b_v}, attrs, "test");
            ASSERT_TRUE(y_v.ok()) << y_v.status().message();
            ASSERT_EQ(m.value((*y_v)[0]).type, (TensorType{sum_type, y_shape}));
            const Node& node = m.node(m.value((*y_v)[0]).producer);
            const Tensor acc = testing::random_tensor(sum_type, y_shape, rng, -4.0, 4.0);
            const Tensor a = testing::random_tensor(operand_type, m.value(a_v).type.shape, rng);
            const Tensor b = testing::random_tensor(operand_type, m.value(b_v).type.shape, rng);
            auto run = [&](bool cuda_kernel) {
              Tensor y = mode == 0 || mode == 3 ? acc.clone() : Tensor::zeros(sum_type, y_shape);
              const Tensor* acc_in = mode == 0 || mode == 3 ? &y : mode == 1 ? &acc : nullptr;
              KernelContext ctx{node, {acc_in, &a, &b}, {&y}};
              const NodeTypes types(m, node);
              Scratch64 workspace(cuda_kernel ? cuda::ops::kernel_scratch_bytes(node, types.in, types.out, 0) : cpu::cpu_workspace_bytes(m, node));
              workspace.give(ctx);
              const Kernel* k = cuda_kernel ? cuda::ops::find_kernel<HostRunner>("matmul_acc") : cpu::find_kernel("matmul_acc");
              EXPECT_NE(k, nullptr);
              const Status st = (*k)(ctx);
              EXPECT_TRUE(st.ok()) << st.message();
              return y;
            };
            const Tensor cuda = run(true), cpu = run(false);
            // One rounding of the sum to its type, plus the f32 product's (k terms of |a·b| ≤ 1).
            const double unit = sum_type == DType::kF32 ? 1.0 / (1 << 23) : 1.0 / (1 << 7);
            double worst = 0;
            for (int64_t i = 0; i < kM; ++i) {
              for (int64_t j = 0; j < kN; ++j) {
                double ref = mode == 2 ? 0.0 : acc.get_as_double(i * kN + j);
                for (int64_t k = 0; k < kK; ++k) {
                  ref += a.get_as_double(ta ? k * kM + i : i * kK + k) * b.get_as_double(tb ? j * kK + k : k * kN + j);
                }
                const double bound = unit * (std::fabs(ref) + 1.0) + kK * 1e-6;
                worst = std::max(worst, std::fabs(cpu.get_as_double(i * kN + j) - ref) / bound);
                worst = std::max(worst, std::fabs(cuda.get_as_double(i * kN + j) - ref) / bound);
              }
            }
            EXPECT_LE(worst, 1.0) << dtype_name(sum_type) << " += " << dtype_name(operand_type) << (native ? " native" : "") << " ta " << ta
                                  << " tb " << tb << " mode " << mode;
          }
        }
      }
    }
  }
  cpu::pin_onednn_bf16_gemm(was_native);
}

// Every optimizer's update kernel in a real step: the updated weights and states after one step
// of the digits ViT, against the CPU backend. The gradients feeding them differ in the last bits
// (GEMM summation order), so floats agree to 1e-4 and an 8-bit code may land on its neighbour.
TEST(CudaOptimizers, OneStepMatchesTheCpuBackend) {
  for (const char* optimizer : {"sgd", "momentum", "adamw", "adam8bit", "adafactor"}) {
    CompileOptions options;
    options.target = "h200";  // as the CUDA backend gets its plans
    options.batch = 4;
    options.optimizer.kind = optimizer;
    const std::string model = source_path("models/vit_tiny.onnx");
    auto plan = compile_model(model, model + ".plan", options);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    const Module& m = plan->train;
    // Step 2 with non-negative moments, as a real second step has: at step 1 Adafactor's update
    // is sign(g) (β = 0), which flips on gradients that are rounding noise (a key bias's).
    auto feeds = arguments(m, 23);
    feeds.at("lr").set_from_double(0, 1e-3);
    feeds.at("step").set_from_double(0, 2);
    for (ValueId a : m.arguments()) {
      Tensor& t = feeds.at(m.value(a).name);
      if (m.value(a).role != Role::kOptimizerState || !is_float(t.dtype())) continue;
      for (int64_t k = 0; k < t.numel(); ++k) t.set_from_double(k, std::fabs(t.get_as_double(k)));
    }
    HostCudaBackend backend;
    DeviceMemory cuda_memory(backend), cpu_memory;
    auto ours = PlannedExecutor::create(m, cuda_memory);
    auto ref = PlannedExecutor::create(m, cpu_memory);
    ASSERT_TRUE(ours.ok()) << ours.status().message();
    ASSERT_TRUE(ref.ok());
    for (const auto& [name, t] : feeds) ASSERT_TRUE(ours->set_argument(name, t).ok() && ref->set_argument(name, t).ok()) << name;
    const ExecOptions run{.training = true, .seed = 3, .step = 2, .check_workspace = true};
    ASSERT_TRUE(ours->run(run).ok());
    ASSERT_TRUE(ref->run(run).ok());
    double worst = 0;
    int64_t codes = 0, codes_off = 0;
    for (size_t i = 0; i < m.outputs().size(); ++i) {
      const Tensor a = *ours->fetch_output(i), b = *ref->fetch_output(i);
      if (is_float(b.dtype())) {
        const double d = relative_difference(a, b, 1e-30);
        if (d > 1e-4) std::printf("  %s: %.2e\n", m.value(m.outputs()[i]).name.c_str(), d);
        worst = std::max(worst, d);
        continue;
      }
      for (int64_t k = 0; k < b.numel(); ++k) codes_off += a.get_as_double(k) != b.get_as_double(k);
      codes += b.numel();
    }
    std::printf("[%s] outputs within %.2e; %lld of %lld codes differ\n", optimizer, worst, static_cast<long long>(codes_off),
                static_cast<long long>(codes));
    EXPECT_LE(worst, 1e-4) << optimizer;
    EXPECT_LE(codes_off, codes / 100) << optimizer;
  }
}

// Fused multi-tensor updates (Backend::find_group_kernel): 100 SGD and Adam nodes of sizes 0 to 97,
// f32 and bf16 mixed (f32 ones with f32, bf16 or f16 gradients), through the fused kernel (dtype runs, cut into launches of at most
// multi_parts) and one by one: the same bits.
TEST(CudaOptimizers, FusedLaunchesMatchOneLaunchPerNode) {
  for (const char* op : {"sgd_update", "adam_update"}) {
    const bool adam = std::string(op) == "adam_update";
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> value(-1, 1);
    struct Part {
      Node node;
      std::vector<Tensor> in, out_fused, out_single;
    };
    std::vector<Part> parts(100);
    Tensor lr = Tensor::zeros(DType::kF32, {}), step = Tensor::zeros(DType::kF32, {});
    lr.set_from_double(0, 1e-2);
    step.set_from_double(0, 3);
    auto random = [&](DType dtype, int64_t n) {
      Tensor t = Tensor::zeros(dtype, {n});
      for (int64_t k = 0; k < n; ++k) t.set_from_double(k, value(rng));
      return t;
    };
    for (size_t i = 0; i < parts.size(); ++i) {
      Part& p = parts[i];
      p.node.op = op;
      p.node.attrs.set("weight_decay", 0.01);
      const DType dtype = i < 60 || i % 9 == 0 ? DType::kF32 : DType::kBF16;  // runs longer and shorter than a launch
      // f32 parameters' gradients in f32, bf16 and f16 (passes/update_grad_casts.h)
      const DType grad = dtype == DType::kBF16 || i % 3 == 0 ? dtype : i % 3 == 1 ? DType::kBF16 : DType::kF16;
      const int64_t n = static_cast<int64_t>(i * 37 % 98);
      const int states = adam ? 2 : 0;
      for (int k = 0; k < 2 + states; ++k) p.in.push_back(random(k == 1 ? grad : dtype, n));
      if (adam) for (int64_t k = 0; k < n; ++k) p.in.back().set_from_double(k, std::fabs(p.in.back().get_as_double(k)));  // v ≥ 0
      for (int k = 0; k < 1 + states; ++k) p.out_fused.push_back(Tensor::zeros(dtype, {n})), p.out_single.push_back(Tensor::zeros(dtype, {n}));
    }
    auto context = [&](Part& p, std::vector<Tensor>& out) {
      KernelContext ctx{p.node, {}, {}};
      for (const Tensor& t : p.in) ctx.inputs.push_back(&t);
      ctx.inputs.push_back(&lr);
      if (adam) ctx.inputs.push_back(&step);
      for (Tensor& t : out) ctx.outputs.push_back(&t);
      return ctx;
    };
    std::vector<KernelContext> fused;
    for (Part& p : parts) fused.push_back(context(p, p.out_fused));
    const GroupKernel group = cuda::ops::find_group_kernel<HostRunner>(op);
    ASSERT_NE(group, nullptr);
    static_assert(cuda::ops::multi_parts<cuda::SgdUpdate<float>>() < 60 && cuda::ops::multi_parts<cuda::AdamUpdate<float>>() < 60);
    ASSERT_TRUE(group(std::span<KernelContext>(fused)).ok());
    const Kernel* single = cuda::ops::find_kernel<HostRunner>(op);
    for (Part& p : parts) {
      KernelContext ctx = context(p, p.out_single);
      ASSERT_TRUE((*single)(ctx).ok());
      for (size_t k = 0; k < p.out_single.size(); ++k) {
        ASSERT_EQ(std::memcmp(p.out_fused[k].raw(), p.out_single[k].raw(), p.out_single[k].nbytes()), 0) << op << " output " << k;
      }
    }
  }
}

// memc calibrate --device cuda (runtime/calibrate.h), its probes made small and run on the CUDA
// host runner: every measured rate is positive and finite, what it does not measure keeps the
// H200's data sheet, and MEMC_GPU_PROFILE hands the file to --target h200 (and no other target).
TEST(CudaCalibrate, AMeasuredProfileReplacesItsTargetsDataSheet) {
  HostCudaBackend host;
  const DeviceProfile sheet = *device_profile("h200");
  auto p = calibrate_device(host, sheet, 1e-3, DeviceProbeSizes{.gemm = 48, .low_gemm = 64, .small_gemm = 8, .stream = 4096});
  ASSERT_TRUE(p.ok()) << p.status().message();
  for (const double v : {p->f32_flops, p->low_flops, p->half_flops, p->mem_bandwidth, p->other_efficiency, p->low_other_factor,
                         p->attention_efficiency, p->node_overhead_s}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  }
  EXPECT_NE(p->f32_flops, sheet.f32_flops);
  EXPECT_EQ(p->name, "h200");
  EXPECT_EQ(p->link_bandwidth, sheet.link_bandwidth);
  EXPECT_EQ(p->memory_bytes, sheet.memory_bytes);
  EXPECT_EQ(p->interconnect, sheet.interconnect);
  const std::string path = ::testing::TempDir() + "memc_h200_measured.json";
  ASSERT_TRUE(write_profile(path, *p).ok());
  ::setenv("MEMC_GPU_PROFILE", path.c_str(), 1);
  auto applied = device_profile("h200");
  auto other = device_profile("a100");
  auto cpu = device_profile("cpu");
  ::unsetenv("MEMC_GPU_PROFILE");
  ASSERT_TRUE(applied.ok()) << applied.status().message();
  EXPECT_EQ(applied->f32_flops, p->f32_flops);
  EXPECT_EQ(applied->node_overhead_s, p->node_overhead_s);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().kind(), ErrorKind::kBadInput);
  EXPECT_NE(other.status().message().find("measured h200, not the a100"), std::string::npos) << other.status().message();
  EXPECT_TRUE(cpu.ok());  // the CPU's profile is not a GPU's
}

// update_grad_casts (passes/update_grad_casts.h): an f32 parameter's update reads its bf16 or
// f16 gradient as the cast to f32 would give it: the updated weight and states equal the cast +
// update's bit for bit, on the CPU kernels and on the CUDA host runner.
TEST(CudaOptimizers, AWidenedGradientIsReadAsItsCast) {
  for (const char* op : {"sgd_update", "momentum_update", "adam_update"}) {
    for (const DType grad : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(str_cat(op, ", ", dtype_name(grad), " gradient"));
      const int states = std::string(op) == "adam_update" ? 2 : std::string(op) == "momentum_update" ? 1 : 0;
      const TensorType f32{DType::kF32, {257}}, scalar{DType::kF32, {}};
      Module plain;
      const ValueId w = plain.add_argument("w", f32, Role::kParam);
      const ValueId g = plain.add_argument("g", TensorType{grad, {257}}, Role::kInput);
      std::vector<ValueId> inputs = {w, emit(plain, "cast", {g}, make_attrs({{"to", std::string("f32")}}))};
      for (int k = 0; k < states; ++k) inputs.push_back(plain.add_argument(str_cat("s", k), f32, Role::kOptimizerState));
      inputs.push_back(plain.add_argument("lr", scalar, Role::kScalar));
      if (states > 0) inputs.push_back(plain.add_argument("step", scalar, Role::kScalar));
      auto outs = plain.add_node(op, inputs, make_attrs({{"weight_decay", 0.01}}));
      ASSERT_TRUE(outs.ok()) << outs.status().message();
      plain.set_outputs(*outs);
      Module fused = plain;
      auto report = UpdateGradCasts().run(fused);
      ASSERT_TRUE(report.ok()) << report.status().message();
      EXPECT_EQ(report->get("folded"), 1);
      EXPECT_EQ(testing::count_op(fused, "cast"), 0);
      std::mt19937 rng(12);
      std::map<std::string, Tensor> feeds = {{"w", testing::random_tensor(DType::kF32, {257}, rng)},
                                             {"g", testing::random_tensor(grad, {257}, rng, -3, 3)},
                                             {"lr", Tensor::zeros(DType::kF32, {})}, {"step", Tensor::zeros(DType::kF32, {})}};
      for (int k = 0; k < states; ++k) feeds[str_cat("s", k)] = testing::random_tensor(DType::kF32, {257}, rng, 0, 1);
      feeds["lr"].set_from_double(0, 0.1);
      feeds["step"].set_from_double(0, 3);
      expect_same_bits(plain, fused, feeds);
    }
  }
}

// One step of `m` on the host runner with the group kernels (consecutive updates, casts) and with
// every node alone: each output the same bits.
void expect_fused_runs_match_each_node(const Module& m) {
  const auto feeds = arguments(m, 29);
  HostCudaBackend fusing, one_by_one(false);
  DeviceMemory a_memory(fusing), b_memory(one_by_one);
  auto a = PlannedExecutor::create(m, a_memory);
  auto b = PlannedExecutor::create(m, b_memory);
  ASSERT_TRUE(a.ok() && b.ok());
  for (const auto& [name, t] : feeds) ASSERT_TRUE(a->set_argument(name, t).ok() && b->set_argument(name, t).ok()) << name;
  const ExecOptions run{.training = true, .seed = 3, .step = 1};
  ASSERT_TRUE(a->run(run).ok());
  ASSERT_TRUE(b->run(run).ok());
  for (size_t i = 0; i < m.outputs().size(); ++i) {
    const Tensor x = *a->fetch_output(i), y = *b->fetch_output(i);
    ASSERT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << m.value(m.outputs()[i]).name;
  }
}

// A GPU target's schedule puts consecutive updates together where that costs no memory
// (Schedule::Options::group_updates), and the executor hands each run to the fused kernel: the
// step's results are bit-identical to running every update alone.
TEST(CudaOptimizers, AGpuPlanFusesItsUpdatesWithTheSameResults) {
  for (const char* optimizer : {"sgd", "momentum", "adamw"}) {
    CompileOptions options;
    options.batch = 4;
    options.optimizer.kind = optimizer;
    options.target = "h200";
    const std::string model = source_path("models/vit_tiny.onnx");
    auto plan = compile_model(model, model + ".plan", options);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    const Module& m = plan->train;
    auto runs_of = [](const Module& module, int& updates) {
      int runs = 0;
      const std::vector<NodeId> order = module.schedule();
      for (size_t i = 0; i < order.size(); ++i) {
        const bool update = module.node(order[i]).op.ends_with("_update");
        updates += update;
        runs += update && (i == 0 || module.node(order[i - 1]).op != module.node(order[i]).op);
      }
      return runs;
    };
    options.target = "cpu";  // the same step without grouping
    auto cpu_plan = compile_model(model, model + ".plan", options);
    ASSERT_TRUE(cpu_plan.ok());
    int updates = 0, cpu_updates = 0;
    const int runs = runs_of(m, updates), cpu_runs = runs_of(cpu_plan->train, cpu_updates);
    std::printf("[%s] %d updates in %d fused launches (%d as the CPU target schedules them)\n", optimizer, updates, runs, cpu_runs);
    EXPECT_EQ(updates, 32);
    EXPECT_EQ(cpu_updates, 32);
    EXPECT_LT(runs, cpu_runs);  // vit_tiny: 15 against 18
    SCOPED_TRACE(optimizer);
    expect_fused_runs_match_each_node(m);
  }
}

// On a GPU the planned executor runs its first step kernel by kernel, captures the second as a
// CUDA graph and replays it from the third on. The same step (same arguments, same step number,
// dropout on) run three times must give the same loss and gradients each time, up to the order of
// atomic adds (gather's gradient).
TEST(CudaGraphs, CapturedAndReplayedStepsMatchTheEagerOne) {
  auto opened = open_backend("cuda:0");
  if (!opened.ok()) GTEST_SKIP() << "no GPU: " << opened.status().message();
  for (const Case& c : {Case{"models/vit_tiny.onnx", 4, "fp32"}, Case{"models/text_encoder.onnx", 4, "bf16-mixed", 32}}) {
    const Plan plan = compile_case(c);
    const auto feeds = arguments(plan.train, 29);
    DeviceMemory memory(**opened);
    auto exec = PlannedExecutor::create(plan.train, memory);
    ASSERT_TRUE(exec.ok()) << exec.status().message();
    std::vector<std::vector<Tensor>> runs;
    for (int run = 0; run < 3; ++run) {
      for (const auto& [name, t] : feeds) ASSERT_TRUE(exec->set_argument(name, t).ok()) << name;
      const Status st = exec->run(ExecOptions{.training = true, .seed = 3, .step = 1});
      ASSERT_TRUE(st.ok()) << c.model << " run " << run << ": " << st.message();
      runs.emplace_back();
      for (size_t i = 0; i < plan.train.outputs().size(); ++i) runs.back().push_back(*exec->fetch_output(i));
    }
    for (int run = 1; run < 3; ++run) {
      for (size_t i = 0; i < runs[0].size(); ++i) {
        if (!is_float(runs[0][i].dtype())) continue;
        EXPECT_LE(relative_difference(runs[run][i], runs[0][i], 1e-30), 1e-6)
            << c.model << " output " << i << (run == 1 ? " (captured)" : " (replayed)");
      }
    }
    std::printf("[cuda graphs] %s %s: eager, captured and replayed steps agree\n", c.model.c_str(), c.precision.c_str());
  }
}

// Consecutive casts as one launch (ops::fused_casts, the executor's group kernel for "cast"): each
// run between one pair of float storages goes out as MultiBody launches of at most
// multi_parts parts (165 casts: three), other casts one by one, and every output equals cast_op's
// alone, bit for bit.
struct CountingRunner {  // runs each launch's body over its elements, and counts the launches
  int launches = 0;
  template <class Body>
  Status operator()(const Body& body, int64_t n) {
    ++launches;
    for (int64_t i = 0; i < n; ++i) body(i);
    return Status::Ok();
  }
};

TEST(CudaCasts, ConsecutiveCastsRunAsFewLaunchesWithTheSameBits) {
  std::vector<std::pair<DType, DType>> pairs(165, {DType::kF32, DType::kBF16});
  for (auto p : {std::pair(DType::kBF16, DType::kF32), std::pair(DType::kBF16, DType::kF32), std::pair(DType::kI64, DType::kF32),
                 std::pair(DType::kF32, DType::kF16)}) {
    pairs.push_back(p);
  }
  Module m;
  std::mt19937 rng(5);
  std::vector<Tensor> xs, fused, alone;
  for (size_t k = 0; k < pairs.size(); ++k) {
    const Shape shape = {static_cast<int64_t>(1 + (k * 37) % 300)};
    const ValueId x = m.add_argument(str_cat("x", k), TensorType{pairs[k].first, shape}, Role::kInput);
    emit(m, "cast", {x}, make_attrs({{"to", std::string(dtype_name(pairs[k].second))}}));
    xs.push_back(pairs[k].first == DType::kI64 ? Tensor::zeros(DType::kI64, shape) : testing::random_tensor(pairs[k].first, shape, rng, -1e4, 1e4));
    for (int64_t i = 0; i < xs.back().numel() && pairs[k].first == DType::kI64; ++i) xs.back().set_from_double(i, static_cast<double>(i * 7919 - 1000));
    fused.push_back(Tensor::zeros(pairs[k].second, shape));
    alone.push_back(Tensor::zeros(pairs[k].second, shape));
  }
  const std::vector<NodeId> order = m.schedule();
  ASSERT_EQ(order.size(), pairs.size());
  std::vector<KernelContext> contexts;
  for (size_t k = 0; k < order.size(); ++k) contexts.push_back(KernelContext{m.node(order[k]), {&xs[k]}, {&fused[k]}});
  CountingRunner counting;
  ASSERT_TRUE(cuda::ops::fused_casts(std::span<KernelContext>(contexts), counting).ok());
  // 165 f32 → bf16 in launches of multi_parts (64) parts; the two bf16 → f32 in one; i64 and f16 alone
  constexpr int kParts = cuda::ops::multi_parts<cuda::CastFloat<float, bf16_t>>();
  EXPECT_EQ(counting.launches, (165 + kParts - 1) / kParts + 3);
  for (size_t k = 0; k < order.size(); ++k) {
    KernelContext ctx{m.node(order[k]), {&xs[k]}, {&alone[k]}};
    CountingRunner one;
    ASSERT_TRUE(cuda::ops::cast_op(ctx, one).ok());
    ASSERT_EQ(std::memcmp(fused[k].raw(), alone[k].raw(), alone[k].nbytes()), 0) << "cast " << k;
  }
}

// A bf16-mixed GPU plan casts each linear's weight and bias one after the other: the executor
// runs such runs as one launch, and the step's results are bit-identical to every cast alone.
TEST(CudaCasts, AMixedPrecisionStepGroupsItsParameterCastsWithTheSameResults) {
  CompileOptions options;
  options.batch = 4;
  options.optimizer.kind = "adamw";
  options.precision = PrecisionKind::kBf16Mixed;
  options.target = "h200";
  const std::string model = source_path("models/vit_tiny.onnx");
  auto plan = compile_model(model, model + ".plan", options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const Module& m = plan->train;
  const std::vector<NodeId> order = m.schedule();
  int casts = 0, runs = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const bool cast = m.node(order[i]).op == "cast";
    casts += cast;
    runs += cast && (i == 0 || m.node(order[i - 1]).op != "cast");
  }
  std::printf("vit_tiny bf16-mixed (h200): %d casts in %d runs\n", casts, runs);
  EXPECT_LT(runs, casts);
  expect_fused_runs_match_each_node(m);
}

}  // namespace
}  // namespace memc
