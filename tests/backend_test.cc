// The Backend seam (backends/backend.h): the planned executor and the device-memory accountant
// reach memory, copies, streams and kernels only through it, and the planner counts the plan's
// target's kernel workspaces. A recording backend wrapped around the CPU one shows what crosses
// the seam during a real training step of the digits ViT.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "backends/backend.h"
#include "backends/comm/communicator.h"
#include "backends/cpu/kernels.h"
#include "backends/cuda/target.h"
#include "backends/cuda_module.h"
#include "planner/compile.h"
#include "runtime/planned_executor.h"
#include "tests/test_util.h"

namespace memc {
namespace {

using testing::source_path;

// Counts everything that crosses the seam, delegating to the CPU backend.
class RecordingBackend final : public Backend {
 public:
  struct Counts {
    int64_t allocations[3] = {0, 0, 0};  // by MemoryKind
    int64_t allocated_bytes[3] = {0, 0, 0};
    int64_t deallocations = 0, fills = 0, copies = 0, async_copies = 0, synchronizes = 0, lookups = 0;
  };
  static inline int64_t launches = 0;  // kernels are plain functions: counted by a trampoline

  std::string_view name() const override { return "recording"; }
  const Kernel* find_kernel(std::string_view op) const override {
    ++const_cast<Counts&>(counts).lookups;
    return cpu_backend().find_kernel(op) ? &kTrampoline : nullptr;
  }
  int64_t workspace_bytes(const Module& module, const Node& node) const override {
    return cpu_backend().workspace_bytes(module, node);
  }
  Expected<void*> allocate(MemoryKind kind, int64_t bytes) override {
    ++counts.allocations[static_cast<int>(kind)];
    counts.allocated_bytes[static_cast<int>(kind)] += bytes;
    return cpu_backend().allocate(kind, bytes);
  }
  void deallocate(MemoryKind kind, void* p) override {
    ++counts.deallocations;
    cpu_backend().deallocate(kind, p);
  }
  Status fill(void* p, uint8_t byte, int64_t bytes) override {
    ++counts.fills;
    return cpu_backend().fill(p, byte, bytes);
  }
  Status copy(void* dst, const void* src, int64_t bytes) override {
    ++counts.copies;
    return cpu_backend().copy(dst, src, bytes);
  }
  Status copy_async(void* dst, const void* src, int64_t bytes, Stream stream) override {
    ++counts.async_copies;
    return cpu_backend().copy_async(dst, src, bytes, stream);
  }
  Stream compute_stream() override { return {}; }
  Stream copy_stream() override { return {}; }
  Expected<Event> record(Stream) override { return Event{}; }
  Status wait(Stream, Event) override { return Status::Ok(); }
  void destroy(Event) override {}
  Status synchronize(Stream) override {
    ++counts.synchronizes;
    if (log) log->push_back("synchronize");
    return Status::Ok();
  }

  Counts counts;
  std::vector<std::string>* log = nullptr;  // synchronize() appends to it when set

 private:
  static Status trampoline(KernelContext& ctx) {
    ++launches;
    return (*cpu_backend().find_kernel(ctx.node.op))(ctx);
  }
  static constexpr Kernel kTrampoline = &trampoline;
};

// gpu_rewrites: the rewrites a GPU target runs (planner/compile.cc), on any target.
Plan compile_vit(const std::string& offload, const std::string& target = "cpu", bool gpu_rewrites = false) {
  CompileOptions options;
  options.batch = 8;
  options.optimizer.kind = "adamw";
  options.offload = *parse_offload_level(offload);
  options.target = target;
  options.patch_gemm = options.bias_grad_gemm = options.update_grad_casts = options.narrow_transposes = gpu_rewrites;
  options.add_layernorm = options.layernorm_bias_grad = options.layernorm_grad_casts = options.fuse_elementwise = gpu_rewrites;
  options.gather_transposes = options.concat_gather_grads = gpu_rewrites;
  const std::string model = source_path("models/vit_tiny.onnx");
  auto plan = compile_model(model, model + ".plan", options);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return std::move(*plan);
}

// Seeded random data (labels 0..9, scalars positive), so the step is real: every argument, or
// (per_step) only the data and scalars, whose arena bytes the plan reuses within a step.
void feed_all(PlannedExecutor& exec, std::mt19937& rng, bool per_step = false) {
  for (ValueId a : exec.module().arguments()) {
    const Value& v = exec.module().value(a);
    if (per_step && v.role != Role::kInput && v.role != Role::kScalar) continue;
    Tensor t = v.type.dtype == DType::kI64 ? Tensor::zeros(DType::kI64, v.type.shape)
                                           : testing::random_tensor(v.type.dtype, v.type.shape, rng, 0.01, 0.5);
    if (v.type.dtype == DType::kI64) {
      for (int64_t i = 0; i < t.numel(); ++i) t.set_from_double(i, static_cast<double>(i % 10));
    }
    ASSERT_TRUE(exec.set_argument(v.name, t).ok()) << v.name;
  }
}

TEST(BackendSeam, TrainingStepCrossesOnlyTheSeam) {
  const Plan plan = compile_vit("optimizer");
  ASSERT_GT(plan.memory.host_bytes, 0);
  RecordingBackend backend;
  DeviceMemory memory(backend);
  auto exec = PlannedExecutor::create(plan.train, memory);
  ASSERT_TRUE(exec.ok()) << exec.status().message();
  // Two device blocks (the arena and the kernel workspace), exactly the planned peak; one pinned
  // host block, exactly the planned host arena; nothing else.
  const auto& c = backend.counts;
  EXPECT_EQ(c.allocations[static_cast<int>(MemoryKind::kDevice)], 2);
  EXPECT_EQ(c.allocated_bytes[static_cast<int>(MemoryKind::kDevice)], plan.memory.predicted_peak_bytes);
  EXPECT_EQ(c.allocations[static_cast<int>(MemoryKind::kPinnedHost)], 1);
  EXPECT_EQ(c.allocated_bytes[static_cast<int>(MemoryKind::kPinnedHost)], plan.memory.host_bytes);
  EXPECT_EQ(c.allocations[static_cast<int>(MemoryKind::kHost)], 0);
  EXPECT_EQ(c.lookups, static_cast<int64_t>(plan.train.schedule().size()));  // resolved once, at create
  EXPECT_EQ(memory.peak_bytes(), plan.memory.predicted_peak_bytes);
  EXPECT_EQ(memory.host_peak_bytes(), plan.memory.host_bytes);

  std::mt19937 rng(7);
  const int64_t copies_before = c.copies;
  feed_all(*exec, rng);
  EXPECT_EQ(c.copies - copies_before, static_cast<int64_t>(plan.train.arguments().size()));  // set_argument copies through the seam

  const int64_t fills_after_create = c.fills;
  const auto counts_before = c;
  RecordingBackend::launches = 0;
  double first_loss = 0;
  for (int step = 1; step <= 3; ++step) {
    if (step > 1) feed_all(*exec, rng, /*per_step=*/true);
    const Status st = exec->run(ExecOptions{.training = true, .seed = 1, .step = step});
    ASSERT_TRUE(st.ok()) << st.message();
    auto loss = exec->fetch_output(0);
    ASSERT_TRUE(loss.ok());
    if (step == 1) first_loss = loss->get_as_double(0);
    EXPECT_TRUE(std::isfinite(loss->get_as_double(0)));
  }
  // No allocation and no clearing while training: kernels write their whole outputs. (Each
  // step's data went in by copies through the seam too.)
  for (int k = 0; k < 3; ++k) EXPECT_EQ(c.allocations[k], counts_before.allocations[k]);
  EXPECT_EQ(c.fills, fills_after_create);
  EXPECT_EQ(c.synchronizes - counts_before.synchronizes, 3);  // one per step, at its end
  EXPECT_EQ(RecordingBackend::launches % 3, 0);
  EXPECT_LE(RecordingBackend::launches / 3, static_cast<int64_t>(plan.train.schedule().size()));
  EXPECT_GT(RecordingBackend::launches / 3, static_cast<int64_t>(plan.train.schedule().size()) / 2);

  // The same step on the CPU backend itself gives the same loss, bit for bit.
  DeviceMemory cpu_memory;
  auto cpu_exec = PlannedExecutor::create(plan.train, cpu_memory);
  ASSERT_TRUE(cpu_exec.ok());
  std::mt19937 rng2(7);
  feed_all(*cpu_exec, rng2);
  ASSERT_TRUE(cpu_exec->run(ExecOptions{.training = true, .seed = 1, .step = 1}).ok());
  EXPECT_EQ(cpu_exec->fetch_output(0)->get_as_double(0), first_loss);
}

// Check mode fills every output that does not share an input's bytes with NaN before its
// kernel runs: a kernel that left part of its output unwritten would turn the loss into NaN.
// Rank 0 of two whose peer's blocks equal its own; logs each call, and settle() fails on demand.
class LoggingCommunicator final : public comm::Communicator {
 public:
  explicit LoggingCommunicator(std::vector<std::string>& log) : log_(log) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string_view transport() const override { return "logging"; }
  comm::BufferSpace buffers() const override { return comm::BufferSpace::kHost; }
  Expected<comm::RequestId> start_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    std::memcpy(recv, send, bytes);
    std::memcpy(static_cast<char*>(recv) + bytes, send, bytes);
    return started();
  }
  Expected<comm::RequestId> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp) override {
    std::memmove(recv, send, static_cast<size_t>(count) * dtype_size(dtype));
    return started();
  }
  Expected<comm::RequestId> start_all_reduce(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp) override {
    std::memmove(recv, send, static_cast<size_t>(count) * dtype_size(dtype));
    return started();
  }
  Expected<comm::RequestId> start_broadcast(void*, int64_t, DType, int) override { return started(); }
  Status wait(comm::RequestId) override {
    log_.push_back("wait");
    return Status::Ok();
  }
  Status wait_on(comm::RequestId, void*) override {
    log_.push_back("wait_on");
    return Status::Ok();
  }
  Status settle() override {
    log_.push_back("settle");
    return settle_status;
  }
  Status barrier() override { return Status::Ok(); }
  [[noreturn]] void abort(int) override { std::abort(); }

  Status settle_status = Status::Ok();

 private:
  comm::RequestId started() {
    log_.push_back("start");
    return next_++;
  }
  std::vector<std::string>& log_;
  comm::RequestId next_ = 1;
};

// A done node leaves its wait to the stream (Communicator::wait_on: NCCL's compute stream waits
// on the collective's event and the host goes on launching), and the step settles every such
// wait, with the deadline, before it waits for the compute stream: a peer that never finishes
// fails the step there instead of hanging the synchronize.
TEST(BackendSeam, DonesWaitOnTheStreamAndTheStepSettlesBeforeSynchronizing) {
  CompileOptions options;
  options.batch = 8;
  options.optimizer.kind = "adamw";
  options.shard = *parse_shard("zero3", 2);
  const std::string model = source_path("models/vit_tiny.onnx");
  auto plan = compile_model(model, model + ".plan", options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  int64_t dones = 0;
  for (NodeId n : plan->train.schedule()) dones += plan->train.node(n).op.ends_with("_done");
  ASSERT_GT(dones, 4);

  std::vector<std::string> log;
  RecordingBackend backend;
  backend.log = &log;
  DeviceMemory memory(backend);
  auto exec = PlannedExecutor::create(plan->train, memory);
  ASSERT_TRUE(exec.ok()) << exec.status().message();
  std::mt19937 rng(3);
  feed_all(*exec, rng);
  LoggingCommunicator comm(log);
  log.clear();
  ASSERT_TRUE(exec->run(ExecOptions{.training = true, .seed = 1, .step = 1, .comm = &comm}).ok());
  EXPECT_EQ(std::count(log.begin(), log.end(), "wait_on"), dones);
  ASSERT_GE(log.size(), 2u);
  EXPECT_EQ(std::count(log.begin(), log.end(), "settle"), 1);
  EXPECT_EQ(log[log.size() - 2], "settle");
  EXPECT_EQ(log.back(), "synchronize");

  feed_all(*exec, rng, /*per_step=*/true);
  log.clear();
  comm.settle_status = Status::Internal("rank 0 of 2: nccl reduce_scatter did not complete within 1 s");
  const Status failed = exec->run(ExecOptions{.training = true, .seed = 1, .step = 2, .comm = &comm});
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("did not complete within 1 s"), std::string::npos) << failed.message();
  EXPECT_EQ(std::count(log.begin(), log.end(), "synchronize"), 0);  // the stream may wait on it forever
}

TEST(BackendSeam, PoisonedOutputsChangeNothing) {
  const Plan plan = compile_vit("none");
  DeviceMemory a, b;
  auto plain = PlannedExecutor::create(plan.train, a);
  auto checked = PlannedExecutor::create(plan.train, b);
  ASSERT_TRUE(plain.ok() && checked.ok());
  std::mt19937 r1(3), r2(3);
  feed_all(*plain, r1);
  feed_all(*checked, r2);
  for (int step = 1; step <= 2; ++step) {
    if (step > 1) feed_all(*plain, r1, true), feed_all(*checked, r2, true);
    ASSERT_TRUE(plain->run(ExecOptions{.training = true, .seed = 5, .step = step}).ok());
    ASSERT_TRUE(checked->run(ExecOptions{.training = true, .seed = 5, .step = step, .check_workspace = true}).ok());
    EXPECT_EQ(plain->fetch_output(0)->get_as_double(0), checked->fetch_output(0)->get_as_double(0)) << "step " << step;
  }
}

TEST(BackendSeam, GpuTargetsPlanCudaWorkspaces) {
  // The largest CUDA kernel scratch is f32 attention's backward through GEMMs: cuBLASLt's
  // recommended 32 MiB on Hopper (4 MiB on Ampere) and two score chunks (8 images · 2 heads = 16
  // entries of 17 × 17 f32 = 18,496 B, each in a 256-byte piece: 18,688 B), after the run state's
  // 256 bytes (the step, read by kernels replayed from a CUDA graph). The patch convolution's
  // weight gradient comes next: the im2col matrix (8 images · 16 positions · 4 taps · 4 B =
  // 2,048 B) and dy transposed (32 channels · 8 · 16 · 4 B = 16,384 B).
  const Plan h200 = compile_vit("none", "h200"), a100 = compile_vit("none", "a100"), cpu = compile_vit("none", "cpu");
  const int64_t attention_scratch = 256 + 2 * 18688, conv_scratch = 256 + 2048 + 16384;
  ASSERT_GT(attention_scratch, conv_scratch);
  EXPECT_EQ(h200.memory.breakdown.at("workspace"), (int64_t{32} << 20) + attention_scratch);
  EXPECT_EQ(a100.memory.breakdown.at("workspace"), (int64_t{4} << 20) + attention_scratch);
  EXPECT_EQ(cpu.memory.breakdown.at("workspace"), max_workspace_bytes(cpu_backend(), cpu.train));
  // The arena is the same plan as the CPU target's with the same rewrites (group_updates aside,
  // which costs no memory): only the workspace region above it differs.
  const Plan rewritten = compile_vit("none", "cpu", true);
  EXPECT_EQ(h200.memory.predicted_peak_bytes - h200.memory.breakdown.at("workspace"),
            rewritten.memory.predicted_peak_bytes - rewritten.memory.breakdown.at("workspace"));
  EXPECT_STREQ(std::string(planning_backend("cpu").name()).c_str(), "cpu");
  EXPECT_STREQ(std::string(planning_backend("h200").name()).c_str(), "cuda");
}

TEST(BackendSeam, CudaAttentionBackwardWorkspaceIsTheArithmetic) {
  // attention_grad(dy, q, k, v) with q, k, v bf16 [2, 3, 64, 16]: rows = 2·3·64 = 384.
  // cuDNN's: O: 384·16·2 = 12,288; stats: 384·4 = 1,536; its own workspace: the larger of the
  // dQ accumulator (384·16·4 = 24,576) and cuBLASLt's 32 MiB — more than memc's own kernel's
  // (384·2 f32 = 3,072), so it is the one planned, after the run state's 256 bytes.
  const Module m = testing::parse_ok(R"(
func.func @main(%dy: tensor<2x3x64x16xbf16> {memc.role = "input", memc.name = "dy"}, %q: tensor<2x3x64x16xbf16> {memc.role = "input", memc.name = "q"}, %k: tensor<2x3x64x16xbf16> {memc.role = "input", memc.name = "k"}, %v: tensor<2x3x64x16xbf16> {memc.role = "input", memc.name = "v"}) -> (tensor<2x3x64x16xbf16>, tensor<2x3x64x16xbf16>, tensor<2x3x64x16xbf16>) {
  %dq, %dk, %dv = "memc.attention_grad"(%dy, %q, %k, %v) {scale = 0.25 : f64} : (tensor<2x3x64x16xbf16>, tensor<2x3x64x16xbf16>, tensor<2x3x64x16xbf16>, tensor<2x3x64x16xbf16>) -> (tensor<2x3x64x16xbf16>, tensor<2x3x64x16xbf16>, tensor<2x3x64x16xbf16>)
  "func.return"(%dq, %dk, %dv) : (tensor<2x3x64x16xbf16>, tensor<2x3x64x16xbf16>, tensor<2x3x64x16xbf16>) -> ()
}
)");
  const Node& node = m.node(m.schedule().at(0));
  EXPECT_EQ(planning_backend("h200").workspace_bytes(m, node), 256 + 12288 + 1536 + (int64_t{32} << 20));
  EXPECT_GT(cpu_backend().workspace_bytes(m, node), 0);  // the CPU's own tiled backward differs
}

TEST(BackendSeam, CpuBackendMemoryAndCopies) {
  Backend& cpu = cpu_backend();
  for (MemoryKind kind : {MemoryKind::kDevice, MemoryKind::kHost, MemoryKind::kPinnedHost}) {
    auto p = cpu.allocate(kind, 1000);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u) << memory_kind_name(kind);
    ASSERT_TRUE(cpu.fill(*p, 0xAB, 1000).ok());
    std::vector<uint8_t> host(1000);
    ASSERT_TRUE(cpu.copy(host.data(), *p, 1000).ok());
    EXPECT_EQ(host[0], 0xAB);
    EXPECT_EQ(host[999], 0xAB);
    host[5] = 7;
    ASSERT_TRUE(cpu.copy_async(*p, host.data(), 1000, cpu.copy_stream()).ok());
    auto event = cpu.record(cpu.copy_stream());
    ASSERT_TRUE(event.ok());
    ASSERT_TRUE(cpu.wait(cpu.compute_stream(), *event).ok());
    ASSERT_TRUE(cpu.synchronize(cpu.compute_stream()).ok());
    EXPECT_EQ(static_cast<uint8_t*>(*p)[5], 7);
    cpu.destroy(*event);
    cpu.deallocate(kind, *p);
  }
}

TEST(BackendSeam, OpeningADeviceSaysWhyNot) {
  EXPECT_EQ(*open_backend("cpu"), &cpu_backend());
  auto bad = open_backend("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().kind(), ErrorKind::kBadInput);
  EXPECT_NE(bad.status().message().find("cpu, cuda or cuda:K"), std::string::npos);
  // Where the CUDA module loads and finds a device, opening one works (tests/cuda/); elsewhere
  // the reason is one line: no module, or no driver or device behind it.
  if (Expected<const cuda::ModuleApi*> module = cuda::load_module(); module.ok()) {
    const cuda::DeviceInfo info = (*module)->probe();
    if (info.count > 0) GTEST_SKIP() << "a CUDA device is present: " << info.name;
  }
  auto cuda = open_backend("cuda:0");
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().kind(), ErrorKind::kBadInput);
  EXPECT_EQ(cuda.status().message().find('\n'), std::string::npos);  // one line
  EXPECT_EQ(cuda.status().message().rfind("--device cuda:0: ", 0), 0u) << cuda.status().message();
  // A planning target holds no device: memory calls fail with a status, never crash, and it has
  // no kernels (the module's backend has them: tests/cuda/ops_host_test.cc).
  cuda::CudaTarget planning(9);
  EXPECT_FALSE(planning.allocate(MemoryKind::kDevice, 16).ok());
  EXPECT_EQ(planning.find_kernel("matmul"), nullptr);
}

}  // namespace
}  // namespace memc
