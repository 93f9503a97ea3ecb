// Bounds the GEMM library's threads under an address-space limit before the library starts
// them. OpenBLAS starts its worker threads in its own constructor, before main(): each maps a
// 128 MiB buffer and spins forever when the mmap fails, and a failed pthread_create makes it
// raise SIGINT on itself (`ulimit -v` 60–300 MB). This library is linked into libmemc after
// libopenblas (CMakeLists.txt), so the loader maps it later and glibc runs this constructor
// first, in memc and in any process that loads libmemc (the Python package); under a limit it
// sets OPENBLAS_NUM_THREADS=1 and keeps malloc to one arena. Plain libc only: it runs before
// libstdc++ may.
// It also names the kernels for an Intel CPU with AVX-512 that OpenBLAS 0.3.21 does not know by
// model number (it falls back to generic "Prescott" kernels there, 5x slower), and chooses how
// idle OpenMP threads wait (choose_wait_policy); libgomp reads that in its own constructor.
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

namespace {

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

// All CPUs' busy and total jiffies from /proc/stat's first line; false when unreadable.
bool cpu_jiffies(long long& busy, long long& total) {
  FILE* f = fopen("/proc/stat", "r");
  if (!f) return false;
  long long v[8] = {};
  const int n = fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
  fclose(f);
  if (n < 5) return false;
  total = 0;
  for (long long x : v) total += x;
  busy = total - v[3] - v[4];  // less idle and iowait
  return true;
}

// This process's CPU time (all its threads, user and system) in the same jiffies; 0 when unreadable.
long long own_jiffies() {
  FILE* f = fopen("/proc/self/stat", "r");
  if (!f) return 0;
  char text[1024];
  const size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  const char* p = strrchr(text, ')');  // the command name may hold spaces; fields 3.. follow it
  long long utime = 0, stime = 0;
  if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &utime, &stime) != 2) return 0;
  return utime + stime;
}

// Whether the other cores are idle: under a tenth of the machine busy over 20 ms with this
// process's own threads left out. This thread sleeps meanwhile, but others of the process may
// not: in Python, NumPy's OpenBLAS threads spin for a while after `import numpy`, and counting
// them as someone else's made every step's threads sleep (vit_small32 4-8 % slower).
bool cores_idle() {
  long long busy0 = 0, total0 = 0, busy1 = 0, total1 = 0;
  if (!cpu_jiffies(busy0, total0)) return false;
  const long long own0 = own_jiffies();
  usleep(20000);
  if (!cpu_jiffies(busy1, total1) || total1 <= total0) return false;
  const long long others = (busy1 - busy0) - (own_jiffies() - own0);
  return 10 * others < total1 - total0;
}

// How idle OpenMP threads (oneDNN's and memc's kernels') wait, unless the user chose
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT). Both pure policies have a bad case, measured on 2-core
// VMs (bench/journal/2026.md §33):
// - spinning at a barrier takes the core another process needs: vit_tiny b64, 2 threads, under
//   load 7: 760–910 ms/step with libgomp's default spin, 71–97 ms passive;
// - sleeping on an idle VM halts the vCPU, and waking it costs tens of microseconds per parallel
//   region: the same step, machine idle, 25–28 ms passive against 5.5 ms with a bounded spin
//   (and 5.4 ms on one thread).
// So: where the other cores are idle when memc starts, threads spin a bounded while (30,000
// pauses, about a millisecond) before they sleep; where something else runs, they sleep at once.
void choose_wait_policy() {
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
  if (sysconf(_SC_NPROCESSORS_ONLN) > 1 && cores_idle()) {
    setenv("GOMP_SPINCOUNT", "30000", 0);
  } else {
    setenv("OMP_WAIT_POLICY", "passive", 0);
  }
}

__attribute__((constructor)) void memc_bound_gemm_threads() {
  name_openblas_kernels();
  choose_wait_policy();
  struct rlimit limit;
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  // memc calls OpenBLAS single-threaded from its own threads (backends/cpu/blas.cc): OpenBLAS's
  // worker threads would only cost stacks under the limit. runtime/host_memory.cc bounds memc's
  // threads by the buffers the limit holds.
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  // Each thread that mallocs while another holds the main arena gets an arena of its own, which
  // reserves 64 MiB of address space: under a limit, a few threads' timing decided whether a
  // plan's arena still fit (tests/python/test_package.py, data four times the limit, AVX2: 621
  // of 640 MiB without a second arena). One arena for all (unless the user chose a number): memc's
  // threads do not malloc in a step.
  const char* tunables = getenv("GLIBC_TUNABLES");
  if (!getenv("MALLOC_ARENA_MAX") && !(tunables && strstr(tunables, "arena_max"))) mallopt(M_ARENA_MAX, 1);
}

}  // namespace

// Referenced from main() so that no linker drops the library as unused.
extern "C" void memc_preinit_anchor() {}
