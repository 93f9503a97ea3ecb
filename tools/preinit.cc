// Bounds the GEMM library's threads under an address-space limit before the library starts
// them. OpenBLAS starts its worker threads in its own constructor, before main(): each maps a
// 128 MiB buffer and spins forever when the mmap fails, and a failed pthread_create makes it
// raise SIGINT on itself (`ulimit -v` 60–300 MB). This library is linked into memc after
// libopenblas (CMakeLists.txt), so glibc runs this constructor first; it sets
// OPENBLAS_NUM_THREADS to what the limit holds. Plain libc only: it runs before libstdc++ may.
// It also names the kernels for an Intel CPU with AVX-512 that OpenBLAS 0.3.21 does not know by
// model number (it falls back to generic "Prescott" kernels there, 5x slower), and makes idle
// OpenMP threads (oneDNN's) sleep rather than spin; libgomp reads that in its own constructor.
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

namespace {

constexpr long long kMiB = 1 << 20;
constexpr long long kBufferBytes = 129 * kMiB;       // OpenBLAS's per-thread buffer (runtime/host_memory.h)
constexpr long long kStackBytes = 8 * kMiB + 4096;   // a worker's stack and guard page
constexpr long long kHeadroomBytes = 64 * kMiB;      // memc's own work beyond the first buffer

long long mapped_bytes() {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kib = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "VmSize: %lld kB", &kib) == 1) break;
  }
  fclose(f);
  return kib * 1024;
}

// OPENBLAS_CORETYPE=SkylakeX on Intel CPUs with AVX-512 (F, BW, DQ, VL), unless the user set it:
// every AVX-512 Intel core runs SkylakeX's sgemm/dgemm kernels in 0.3.21. Other CPUs keep
// OpenBLAS's own choice; runtime/host_memory.cc warns if that choice is generic.
void name_openblas_kernels() {
  __builtin_cpu_init();
  if (getenv("OPENBLAS_CORETYPE") || !__builtin_cpu_is("intel")) return;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
  }
}

// OMP_WAIT_POLICY=passive unless the user chose a policy: a thread spinning at a barrier takes
// the core that another thread (or another process) needs. vit_tiny b64, 2 threads, on 2 cores
// under load 7: 760–910 ms/step spinning (libgomp's default), 71–97 ms passive.
void idle_threads_sleep() {
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) setenv("OMP_WAIT_POLICY", "passive", 0);
}

__attribute__((constructor)) void memc_bound_gemm_threads() {
  name_openblas_kernels();
  idle_threads_sleep();
  struct rlimit limit;
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  long long wanted = sysconf(_SC_NPROCESSORS_ONLN);
  if (const char* given = getenv("OPENBLAS_NUM_THREADS"); given && atoll(given) > 0) wanted = atoll(given);
  const long long free_bytes = static_cast<long long>(limit.rlim_cur) - mapped_bytes();
  // The calling thread's buffer, then one buffer and one stack per extra thread.
  long long threads = 1;
  if (free_bytes > kBufferBytes + kHeadroomBytes) threads += (free_bytes - kBufferBytes - kHeadroomBytes) / (kBufferBytes + kStackBytes);
  if (threads >= wanted) return;
  char text[24];
  snprintf(text, sizeof text, "%lld", threads);
  setenv("OPENBLAS_NUM_THREADS", text, 1);
}

}  // namespace

// Referenced from main() so that no linker drops the library as unused.
extern "C" void memc_preinit_anchor() {}
