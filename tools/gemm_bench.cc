// memc-gemm-bench: f32 GEMM speed of memc's gemm (oneDNN) against OpenBLAS's sgemm on this CPU,
// memc's bf16 GEMM (native oneDNN bf16 where the CPU has bf16 dot products, else widened), and
// the heap that oneDNN takes outside its planned scratchpad (malloc is counted here).
//   memc-gemm-bench [N=1536] [THREADS=1]   → one JSON line (bench/cpu_speed.sh)
//   memc-gemm-bench vit_b16 [THREADS=1]    → one JSON line per GEMM shape of a ViT-B/16 step at
//                                            batch 8 (forward, input and weight gradients)
//   memc-gemm-bench attention [T=197] [THREADS=1] [PRECISION=f32|bf16]
//                                          → one JSON line: memc's fused attention, forward and
//                                            backward, at ViT-B/16's batch 8 × 12 heads × T × 64
#include <cblas.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/blas.h"
#include "ir/grad.h"  // make_attrs
#include "ir/op_registry.h"
#include "runtime/device_memory.h"
#include "runtime/planned_executor.h"
#include "ir/graph.h"
#include "runtime/executor.h"
#include "runtime/host_memory.h"

extern "C" void* __libc_malloc(size_t);
extern "C" void* __libc_memalign(size_t, size_t);
extern "C" void __libc_free(void*);

namespace {
bool g_counting = false;
long long g_live_bytes = 0, g_peak_bytes = 0, g_calls = 0;

void* counted(void* p) {
  if (g_counting && p) {
    g_live_bytes += static_cast<long long>(malloc_usable_size(p));
    g_peak_bytes = std::max(g_peak_bytes, g_live_bytes);
    ++g_calls;
  }
  return p;
}
}  // namespace

// Heap bytes allocated (and not yet freed) while g_counting, through malloc and the aligned
// allocators oneDNN uses; blocks from before count only when freed.
extern "C" void* malloc(size_t n) { return counted(__libc_malloc(n)); }
extern "C" int posix_memalign(void** out, size_t alignment, size_t n) {
  *out = counted(__libc_memalign(alignment, n));
  return *out ? 0 : 12;  // ENOMEM
}
extern "C" void* aligned_alloc(size_t alignment, size_t n) { return counted(__libc_memalign(alignment, n)); }
extern "C" void free(void* p) {
  if (g_counting && p) g_live_bytes -= static_cast<long long>(malloc_usable_size(p));
  __libc_free(p);
}

namespace {

// Median GFLOP/s of `reps` runs of a product of `flop` floating-point operations, after one
// warm-up run.
template <typename Fn>
double gflops(double flop, int reps, Fn&& fn) {
  fn();
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(flop / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

std::string cpu_model() {
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  char line[512];
  std::string model = "unknown";
  while (f && std::fgets(line, sizeof line, f)) {
    std::string s(line);
    if (s.rfind("model name", 0) == 0) {
      model = s.substr(s.find(':') + 2);
      model.pop_back();
      break;
    }
  }
  if (f) std::fclose(f);
  return model;
}

}  // namespace

// The linear layers of ViT-B/16 at batch 8 (1576 tokens): qkv 768→2304, proj 768→768, MLP
// 768→3072→768, as y = x·Wᵀ; their input gradients dx = dy·W and weight gradients dW = dyᵀ·x.
void vit_b16_shapes(int64_t threads) {
  const int64_t rows = 8 * 197;
  const int64_t layers[][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};  // {in, out}
  std::vector<std::pair<const char*, memc::cpu::GemmShape>> shapes;
  for (const auto& l : layers) {
    shapes.push_back({"forward", {.m = rows, .n = l[1], .k = l[0], .trans_b = true}});
    shapes.push_back({"grad_input", {.m = rows, .n = l[0], .k = l[1]}});
    shapes.push_back({"grad_weight", {.m = l[1], .n = l[0], .k = rows, .trans_a = true}});
  }
  for (const auto& [role, s] : shapes) {
    std::vector<float> a(s.m * s.k, 0.5f), b(s.k * s.n, 0.25f), c(s.m * s.n);
    std::vector<memc::bf16_t> a16(a.size(), memc::store<memc::bf16_t>(0.5f)), b16(b.size(), memc::store<memc::bf16_t>(0.25f)),
        c16(c.size());
    std::vector<float> scratch(memc::cpu::gemm_scratch_floats<float>(s) + 16), scratch16(memc::cpu::gemm_scratch_floats<memc::bf16_t>(s) + 16);
    const double flop = 2.0 * s.m * s.n * s.k;
    const auto rate = [&](auto&& fn) { return gflops(flop, 5, fn); };
    const double onednn = rate([&] { memc::cpu::gemm(c.data(), a.data(), b.data(), s, scratch.data()); });
    const double openblas = rate([&] {
      cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.0f,
                  a.data(), s.trans_a ? s.m : s.k, b.data(), s.trans_b ? s.k : s.n, 0.0f, c.data(), s.n);
    });
    const double bf16 = rate([&] { memc::cpu::gemm(c16.data(), a16.data(), b16.data(), s, scratch16.data()); });
    std::printf("{\"threads\": %lld, \"role\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"trans_a\": %d, \"trans_b\": %d, "
                "\"onednn_f32_gflops\": %.1f, \"openblas_f32_gflops\": %.1f, \"bf16_gflops\": %.1f}\n",
                static_cast<long long>(threads), role, static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
                s.trans_a, s.trans_b, onednn, openblas, bf16);
  }
}

// Milliseconds of the median of 5 runs of `module` on `feeds`, after one warm-up run.
double median_ms(const memc::Module& module, const std::map<std::string, memc::Tensor>& feeds) {
  (void)memc::execute(module, feeds, {});
  std::vector<double> ms;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)memc::execute(module, feeds, {});
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The fused attention op (backends/cpu/attention.cc) on ViT-B/16's shapes at batch 8: the
// forward alone, then the forward and attention_grad as one module (a training step runs both).
int attention_bench(int64_t t, int64_t threads, const std::string& precision) {
  const memc::DType dtype = precision == "bf16" ? memc::DType::kBF16 : memc::DType::kF32;
  const memc::TensorType type{dtype, {8, 12, t, 64}};
  std::map<std::string, memc::Tensor> feeds;
  uint64_t state = 1;
  for (const char* name : {"q", "k", "v", "dy"}) {
    memc::Tensor x = memc::Tensor::zeros(dtype, type.shape);
    for (int64_t i = 0; i < x.numel(); ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;  // a fixed LCG: the same inputs every run
      x.set_from_double(i, static_cast<double>(state >> 40) / static_cast<double>(1 << 24) * 2.0 - 1.0);
    }
    feeds[name] = x;
  }
  auto build = [&](bool backward) {
    memc::Module m;
    const memc::ValueId q = m.add_argument("q", type, memc::Role::kInput), k = m.add_argument("k", type, memc::Role::kInput),
                        v = m.add_argument("v", type, memc::Role::kInput);
    std::vector<memc::ValueId> outs = m.add_node("attention", {q, k, v}, {}, "attention").value();
    if (backward) {
      const memc::ValueId dy = m.add_argument("dy", type, memc::Role::kInput);
      const std::vector<memc::ValueId> grads = m.add_node("attention_grad", {dy, q, k, v}, {}, "attention_grad", 3).value();
      outs.insert(outs.end(), grads.begin(), grads.end());
    }
    m.set_outputs(outs);
    return m;
  };
  std::map<std::string, memc::Tensor> forward_feeds = feeds;
  forward_feeds.erase("dy");
  const double forward = median_ms(build(false), forward_feeds), both = median_ms(build(true), feeds);
  const double flop = 4.0 * 8 * 12 * t * t * 64;  // q·kᵀ and p·v; the backward's minimum is twice that
  std::printf("{\"threads\": %lld, \"precision\": \"%s\", \"shape\": [8, 12, %lld, 64], \"cpu\": \"%s\", \"forward_ms\": %.2f, "
              "\"forward_backward_ms\": %.2f, \"forward_gflops\": %.1f, \"forward_backward_gflops\": %.1f}\n",
              static_cast<long long>(threads), precision.c_str(), static_cast<long long>(t), cpu_model().c_str(), forward, both,
              flop / forward / 1e6, 3 * flop / both / 1e6);
  return 0;
}

// The step's non-GEMM kernels on ViT-B/16 b8's shapes, one node per module, run by the planned
// executor training uses: milliseconds per call (median of 7 after one warm-up) and the bytes the
// node reads and writes per second (node_bytes, as the cost model counts them). An update op's
// outputs may replace its inputs (in place, as in training), so later calls see updated values.
int ops_bench(int64_t threads) {
  using memc::DType;
  using memc::Role;
  using memc::TensorType;
  const int64_t rows = 8 * 197;
  struct Case {
    const char* name;
    std::vector<TensorType> inputs;
    memc::Attrs attrs;
    int outputs = 1;
  };
  const TensorType act{DType::kF32, {rows, 3072}}, hidden{DType::kF32, {rows, 768}}, vec{DType::kF32, {768}}, scalar{DType::kF32, {}},
      w{DType::kF32, {768, 3072}}, heads{DType::kF32, {8, 197, 12, 64}}, codes{DType::kU8, {768, 3072}},
      blocks{DType::kF32, {768 * 3072 / 2048}}, rows_stat{DType::kF32, {768}}, cols_stat{DType::kF32, {3072}};
  const std::vector<Case> cases = {
      {"gelu", {act}, {}},
      {"gelu_grad", {act, act}, {}},
      {"add", {hidden, hidden}, {}},
      {"layernorm", {hidden, vec, vec}, memc::make_attrs({{"axis", int64_t{1}}}), 1},
      {"layernorm_grad", {hidden, hidden, vec}, memc::make_attrs({{"axis", int64_t{1}}}), 2},
      {"transpose", {heads}, memc::make_attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}})},
      {"adam_update", {w, w, w, w, scalar, scalar}, memc::make_attrs({{"weight_decay", 0.01}, {"decoupled", int64_t{1}}}), 3},
      {"sgd_update", {w, w, scalar}, memc::make_attrs({{"weight_decay", 0.01}}), 1},
      {"momentum_update", {w, w, w, scalar, scalar}, memc::make_attrs({{"weight_decay", 0.01}, {"momentum", 0.9}}), 2},
      {"adam8bit_update", {w, w, codes, blocks, codes, blocks, scalar, scalar}, memc::make_attrs({{"weight_decay", 0.01}, {"decoupled", int64_t{1}}}), 5},
      {"adafactor_update", {w, w, rows_stat, cols_stat, scalar, scalar}, memc::make_attrs({{"factored", int64_t{1}}}), 3},
  };
  for (const Case& c : cases) {
    memc::Module m;
    std::vector<memc::ValueId> in;
    for (size_t i = 0; i < c.inputs.size(); ++i) in.push_back(m.add_argument("x" + std::to_string(i), c.inputs[i], Role::kInput));
    memc::Expected<std::vector<memc::ValueId>> out = m.add_node(c.name, in, c.attrs, c.name, c.outputs);
    if (!out.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name, out.status().message().c_str());
      return 1;
    }
    m.set_outputs(*out);
    memc::DeviceMemory memory;
    memc::PlannedExecutor ex = memc::PlannedExecutor::create(m, memory).value();
    // Inputs from a fixed LCG: floats in [0, 1) (a second moment must not be negative), codes in
    // [0, 256), scalars (lr, step) 1, so every kernel computes on ordinary finite values.
    uint64_t state = 7;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      memc::Tensor t = memc::Tensor::zeros(c.inputs[i].dtype, c.inputs[i].shape);
      for (int64_t e = 0; e < t.numel(); ++e) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const double u = static_cast<double>(state >> 40) / static_cast<double>(1 << 24);
        t.set_from_double(e, c.inputs[i].shape.empty() ? 1.0 : c.inputs[i].dtype == DType::kU8 ? std::floor(u * 256) : u);
      }
      (void)ex.set_argument("x" + std::to_string(i), t);
    }
    (void)ex.run({});
    std::vector<double> ms;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      (void)ex.run({});
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double bytes = static_cast<double>(memc::node_bytes(m, m.node(m.schedule()[0])));
    std::printf("{\"threads\": %lld, \"op\": \"%s\", \"ms\": %.3f, \"gb_per_s\": %.1f}\n", static_cast<long long>(threads), c.name,
                ms[3], bytes / ms[3] / 1e6);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "attention") {
    const int64_t threads = argc > 3 ? std::atoll(argv[3]) : 1;
    memc::set_compute_threads(threads);
    (void)*memc::prepare_host_memory();
    return attention_bench(argc > 2 ? std::atoll(argv[2]) : 197, threads, argc > 4 ? argv[4] : "f32");
  }
  if (argc > 1 && std::string(argv[1]) == "ops") {
    const int64_t threads = argc > 2 ? std::atoll(argv[2]) : 1;
    memc::set_compute_threads(threads);
    const memc::HostMemory host = *memc::prepare_host_memory();
    std::printf("{\"cpu\": \"%s\", \"vector_math\": \"%s\", \"vector_loops\": \"%s\"}\n", cpu_model().c_str(), host.vector_math.c_str(),
                host.vector_loops.c_str());
    return ops_bench(threads);
  }
  if (argc > 1 && std::string(argv[1]) == "vit_b16") {
    const int64_t threads = argc > 2 ? std::atoll(argv[2]) : 1;
    memc::set_compute_threads(threads);
    (void)*memc::prepare_host_memory();
    vit_b16_shapes(threads);
    return 0;
  }
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 1536;
  const int64_t threads = argc > 2 ? std::atoll(argv[2]) : 1;
  memc::set_compute_threads(threads);
  const memc::HostMemory host = *memc::prepare_host_memory();
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const memc::cpu::GemmShape s{.m = n, .n = n, .k = n};
  std::vector<float> scratch(memc::cpu::gemm_scratch_floats<float>(s) + 16);
  const int reps = 5;
  const double openblas = gflops(2.0 * n * n * n, reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  const auto onednn_run = [&] { memc::cpu::gemm(c.data(), a.data(), b.data(), s, scratch.data()); };
  onednn_run();
  g_counting = true;
  const double onednn = gflops(2.0 * n * n * n, reps, onednn_run);
  g_counting = false;
  std::vector<memc::bf16_t> a16(n * n, memc::store<memc::bf16_t>(0.5f)), b16(n * n, memc::store<memc::bf16_t>(0.25f)), c16(n * n);
  std::vector<float> scratch16(memc::cpu::gemm_scratch_floats<memc::bf16_t>(s) + 16);
  const double bf16 = gflops(2.0 * n * n * n, reps, [&] { memc::cpu::gemm(c16.data(), a16.data(), b16.data(), s, scratch16.data()); });
  std::printf("{\"n\": %lld, \"threads\": %lld, \"cpu\": \"%s\", \"gemm_library\": \"%s\", \"onednn_gflops\": %.1f, \"bf16_gflops\": %.1f, "
              "\"openblas_core\": \"%s\", \"openblas_threads\": %lld, \"openblas_gflops\": %.1f, "
              "\"onednn_scratchpad_bytes\": %lld, \"onednn_malloc_peak_bytes\": %lld, \"onednn_malloc_calls\": %lld}\n",
              static_cast<long long>(n), static_cast<long long>(threads), cpu_model().c_str(), memc::gemm_library().c_str(), onednn, bf16,
              host.openblas_core.c_str(), static_cast<long long>(host.gemm_threads), openblas,
              static_cast<long long>(memc::cpu::onednn_scratchpad_bytes(s, memc::cpu::GemmType::kF32)), g_peak_bytes, g_calls / (reps + 1));
  return 0;
}
