// memc-gemm-bench: f32 GEMM speed of memc's gemm (oneDNN) against OpenBLAS's sgemm on this CPU,
// and the heap that oneDNN takes outside its planned scratchpad (malloc is counted here).
//   memc-gemm-bench [N=1536] [THREADS=1]   → one JSON line (bench/cpu_speed.sh)
#include <cblas.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/blas.h"
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

// Median GFLOP/s of `reps` runs of an n³ product, after one warm-up run.
template <typename Fn>
double gflops(int64_t n, int reps, Fn&& fn) {
  fn();
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * n * n * n / s / 1e9);
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

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 1536;
  const int64_t threads = argc > 2 ? std::atoll(argv[2]) : 1;
  memc::set_compute_threads(threads);
  const memc::HostMemory host = *memc::prepare_host_memory();
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const memc::cpu::GemmShape s{.m = n, .n = n, .k = n};
  std::vector<float> scratch(memc::cpu::gemm_scratch_floats<float>(s) + 16);
  const int reps = 5;
  const double openblas = gflops(n, reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  const auto onednn_run = [&] { memc::cpu::gemm(c.data(), a.data(), b.data(), s, scratch.data()); };
  onednn_run();
  g_counting = true;
  const double onednn = gflops(n, reps, onednn_run);
  g_counting = false;
  std::printf("{\"n\": %lld, \"threads\": %lld, \"cpu\": \"%s\", \"gemm_library\": \"%s\", \"onednn_gflops\": %.1f, "
              "\"openblas_core\": \"%s\", \"openblas_threads\": %lld, \"openblas_gflops\": %.1f, "
              "\"onednn_scratchpad_bytes\": %lld, \"onednn_malloc_peak_bytes\": %lld, \"onednn_malloc_calls\": %lld}\n",
              static_cast<long long>(n), static_cast<long long>(threads), cpu_model().c_str(), host.gemm_library.c_str(), onednn,
              host.openblas_core.c_str(), static_cast<long long>(host.gemm_threads), openblas,
              static_cast<long long>(memc::cpu::onednn_scratchpad_bytes(s)), g_peak_bytes, g_calls / (reps + 1));
  return 0;
}
