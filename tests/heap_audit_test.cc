// Nothing outside the plan: a training step allocates no heap memory of its own. The planned
// executor takes its arena and kernel workspace once, through the device accountant, and the
// planned peak counts exactly those (memory_measure_test). A kernel that took scratch from the
// heap instead (a std::vector the size of a tensor, a library's own scratchpad) would use memory
// no plan counts, and the peak memc proves would be short by it. This test replaces the process's
// malloc family with counting wrappers around glibc's, and holds the heap's high-water mark
// during steps 2 and 3 (after step 1 has created the GEMM primitives and the thread team) to a
// small constant, for every optimizer, precision, attention with dropout, and offload.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <algorithm>
#include <cmath>
#include <random>

#include "passes/training_step.h"
#include "planner/compile.h"
#include "runtime/device_memory.h"
#include "runtime/host_memory.h"
#include "runtime/planned_executor.h"
#include "tests/test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define MEMC_HEAP_AUDIT 0  // the sanitizer owns malloc
#else
#define MEMC_HEAP_AUDIT 1
#include <malloc.h>

// The live heap bytes (malloc_usable_size of each block) and their high-water mark since the
// last reset.
namespace {
std::atomic<int64_t> g_live{0}, g_high{0}, g_largest{0};  // g_largest: the largest block since the reset

void note_alloc(void* p) {
  if (!p) return;
  const auto size = static_cast<int64_t>(malloc_usable_size(p));
  int64_t largest = g_largest.load(std::memory_order_relaxed);
  while (size > largest && !g_largest.compare_exchange_weak(largest, size, std::memory_order_relaxed)) {
  }
  const int64_t now = g_live.fetch_add(size, std::memory_order_relaxed) + size;
  int64_t high = g_high.load(std::memory_order_relaxed);
  while (now > high && !g_high.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
  }
}
void note_free(void* p) {
  if (p) g_live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
}
}  // namespace

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);

void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  note_alloc(p);
  return p;
}
void* calloc(size_t count, size_t n) {
  void* p = __libc_calloc(count, n);
  note_alloc(p);
  return p;
}
void* realloc(void* old, size_t n) {
  note_free(old);
  void* p = __libc_realloc(old, n);
  note_alloc(p ? p : (n == 0 ? nullptr : old));  // a failed realloc keeps the old block
  return p;
}
void free(void* p) {
  note_free(p);
  __libc_free(p);
}
void* memalign(size_t alignment, size_t n) {
  void* p = __libc_memalign(alignment, n);
  note_alloc(p);
  return p;
}
void* aligned_alloc(size_t alignment, size_t n) { return memalign(alignment, n); }
int posix_memalign(void** out, size_t alignment, size_t n) {
  void* p = memalign(alignment, n);
  if (!p) return 12;  // ENOMEM
  *out = p;
  return 0;
}
}  // extern "C"
#endif

namespace memc {
namespace {

using testing::source_path;

// Most heap a step may hold beyond what it held when it started: small bookkeeping (3 KB was
// measured, the same for every model), nothing that grows with a tensor. vit_small32's tensors
// are up to 2.4 MB, so scratch the size of any of them would show.
constexpr int64_t kStepHeapBytes = 8 << 10;

struct Case {
  std::string name, model;
  int64_t batch, seq;
  std::string optimizer, precision, offload;
};

std::vector<Case> cases() {
  return {
      {"vit_tiny_adamw", "vit_tiny", 32, -1, "adamw", "fp32", "none"},
      {"vit_tiny_momentum", "vit_tiny", 32, -1, "momentum", "fp32", "none"},
      {"vit_tiny_adam8bit", "vit_tiny", 32, -1, "adam8bit", "fp32", "none"},
      {"vit_tiny_adafactor", "vit_tiny", 32, -1, "adafactor", "fp32", "none"},
      {"vit_tiny_bf16_mixed", "vit_tiny", 32, -1, "adamw", "bf16-mixed", "none"},
      {"vit_tiny_offload", "vit_tiny", 32, -1, "adamw", "fp32", "optimizer"},
      {"text_encoder_adamw", "text_encoder", 8, 32, "adamw", "fp32", "none"},
      {"bigbird_full_adafactor", "bigbird_full", 8, 32, "adafactor", "fp32", "none"},
      {"bigbird_sparse_adamw", "bigbird_sparse", 4, 64, "adamw", "fp32", "none"},  // block-sparse gathers
      {"vit_small32_adafactor", "vit_small32", 4, -1, "adafactor", "fp32", "none"},
      {"vit_small32_adam8bit_bf16", "vit_small32", 4, -1, "adam8bit", "bf16-mixed", "none"},
  };
}

// Seeded data (labels and tokens 0 or 1, valid for any model here) and the step's scalars (lr,
// step number, loss scale): every argument, or only the per-step ones.
void feed(PlannedExecutor& exec, std::mt19937& rng, bool per_step, int step) {
  for (ValueId a : exec.module().arguments()) {
    const Value& v = exec.module().value(a);
    if (per_step && v.role != Role::kInput && v.role != Role::kScalar) continue;
    if (v.role == Role::kScalar) {
      Tensor s = Tensor::zeros(DType::kF32, {});
      s.set_from_double(0, v.name == kStepArg ? step : v.name == kLrArg ? 1e-3 : 1024.0);
      const Status st = exec.set_argument(v.name, s);
      ASSERT_TRUE(st.ok()) << v.name << ": " << st.message();
      continue;
    }
    Tensor t = v.type.dtype == DType::kI64 || v.type.dtype == DType::kBool
                   ? Tensor::zeros(v.type.dtype, v.type.shape)
                   : testing::random_tensor(v.type.dtype, v.type.shape, rng, 0.01, 0.5);
    if (v.type.dtype == DType::kI64 || v.type.dtype == DType::kBool) {
      for (int64_t i = 0; i < t.numel(); ++i) t.set_from_double(i, v.type.dtype == DType::kBool ? 1.0 : static_cast<double>(i % 2));
    }
    const Status st = exec.set_argument(v.name, t);
    ASSERT_TRUE(st.ok()) << v.name << ": " << st.message();
  }
}

class HeapAudit : public ::testing::TestWithParam<Case> {};

TEST_P(HeapAudit, StepsAllocateNothingOutsideThePlan) {
#if !MEMC_HEAP_AUDIT
  GTEST_SKIP() << "built with AddressSanitizer, which owns malloc";
#else
  const Case& c = GetParam();
  CompileOptions options;
  options.batch = c.batch;
  options.seq = c.seq;
  options.optimizer.kind = c.optimizer;
  auto precision = parse_precision(c.precision);
  ASSERT_TRUE(precision.ok()) << precision.status().message();
  options.precision = *precision;
  options.offload = *parse_offload_level(c.offload);
  const std::string model = source_path("models/" + c.model + ".onnx");
  auto plan = compile_model(model, model + ".plan", options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  set_compute_threads(2);  // threads' scratch shows too
  DeviceMemory memory(cpu_backend());
  auto exec = PlannedExecutor::create(plan->train, memory);
  ASSERT_TRUE(exec.ok()) << exec.status().message();
  std::mt19937 rng(3);
  feed(*exec, rng, false, 1);
  const Status first = exec->run(ExecOptions{.training = true, .seed = 1, .step = 1});
  ASSERT_TRUE(first.ok()) << first.message();
  int64_t most = 0, largest = 0;
  for (int step = 2; step <= 3; ++step) {
    feed(*exec, rng, true, step);
    const int64_t start = g_live.load();
    g_high.store(start);
    g_largest.store(0);
    const Status st = exec->run(ExecOptions{.training = true, .seed = 1, .step = step});
    const int64_t high = g_high.load();
    ASSERT_TRUE(st.ok()) << st.message();
    most = std::max(most, high - start);
    largest = std::max(largest, g_largest.load());
  }
  auto loss = exec->fetch_output(0);
  ASSERT_TRUE(loss.ok());
  EXPECT_TRUE(std::isfinite(loss->get_as_double(0)));
  std::printf("[heap] %s: planned peak %lld B; heap held during a step beyond its start: %lld B, largest block %lld B\n",
              c.name.c_str(), static_cast<long long>(plan->memory.predicted_peak_bytes), static_cast<long long>(most),
              static_cast<long long>(largest));
  EXPECT_LE(most, kStepHeapBytes) << "a step allocated heap memory the plan does not count";
#endif
}

INSTANTIATE_TEST_SUITE_P(Plans, HeapAudit, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace memc
