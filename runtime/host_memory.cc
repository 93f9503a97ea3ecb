#include "runtime/host_memory.h"

#include <cblas.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/blas.h"
#include "backends/cpu/onednn_matmul.h"
#include "backends/cpu/vector_math.h"

namespace memc {

namespace {

HostMemory g_host_memory;

// VmSize of this process: the address space already counted against RLIMIT_AS.
int64_t mapped_bytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "VmSize: %lld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return static_cast<int64_t>(kib) * 1024;
}

// Whether `bytes` more of address space can be mapped now (a reservation, released at once).
bool can_map(int64_t bytes) {
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  ::munmap(p, static_cast<size_t>(bytes));
  return true;
}

std::string mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// OpenBLAS's names for its pre-AVX2 kernels, which it falls back to on a CPU model it does not know.
bool generic_openblas_core(const std::string& core) {
  for (const char* name : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai", "Coppermine",
                           "Northwood", "Banias", "Opteron", "Barcelona", "Generic", "Unknown"}) {
    if (core == name) return true;
  }
  return false;
}

void warn_on_generic_openblas() {
  const std::string core = openblas_get_corename();
  if (!generic_openblas_core(core) || !__builtin_cpu_supports("avx2")) return;
  std::fprintf(stderr, "memc: warning: OpenBLAS runs its generic '%s' kernels on a CPU with %s (f64 GEMMs are slow; "
               "set OPENBLAS_CORETYPE=%s)\n", core.c_str(), __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2",
               __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
}

}  // namespace

const HostMemory& host_memory() { return g_host_memory; }

int64_t available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

void set_compute_threads(int64_t threads) {
  cpu::set_onednn_threads(static_cast<int>(threads));
  openblas_set_num_threads(1);  // memc's own threads call it, one block each (backends/cpu/blas.cc)
  g_host_memory.threads = threads;
}

extern "C" void memc_preinit_anchor();  // runtime/preinit/preinit.cc: a call keeps it among libmemc's needs

Expected<HostMemory> prepare_host_memory() {
  memc_preinit_anchor();
  warn_on_generic_openblas();
  HostMemory hm;
  hm.threads = g_host_memory.threads ? g_host_memory.threads : cpu::onednn_threads();
  hm.gemm_threads = hm.threads;  // each compute thread may hold an OpenBLAS buffer (backends/cpu/blas.cc)
  hm.vector_math = cpu::vector_math_isa();
  hm.vector_loops = cpu::vector_loops_isa();
  hm.openblas_core = openblas_get_corename();
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  hm.omp_wait = spin ? std::string("spin ") + spin : policy ? policy : "libgomp's default";
  hm.gemm_buffer_bytes = hm.gemm_threads * kGemmBufferBytes;  // the bound: mapped lazily by OpenBLAS
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return g_host_memory = hm;
  hm.address_limit_bytes = static_cast<int64_t>(limit.rlim_cur);
  const int64_t free_bytes = hm.address_limit_bytes - mapped_bytes();
  // Room left after the buffers for memc's own work and oneDNN's JIT-compiled kernels (code
  // buffers of 256 KiB each, mapped as primitives are made: 143 of them, 36 MiB, for vit_small32
  // on an AVX-512 CPU), which oneDNN 2.6 does not survive failing to map (SIGSEGV in its code
  // generator). Fewer threads rather than none of it, and none at all without it.
  constexpr int64_t kHeadroom = int64_t{64} << 20;
  // A process that ran memc before (the Python package runs a command per call) holds the
  // buffers it mapped then: OpenBLAS keeps them, and only more threads need more.
  static int64_t buffers_mapped = 0;
  auto unmapped = [](int64_t threads) { return std::max<int64_t>(threads - buffers_mapped, 0) * kGemmBufferBytes; };
  int64_t threads = hm.threads;
  while (threads > 1 && unmapped(threads) + kHeadroom > free_bytes) --threads;
  hm.gemm_threads = threads;
  if (hm.threads != threads) {
    cpu::set_onednn_threads(static_cast<int>(threads));
    hm.threads = threads;
  }
  if (!can_map(unmapped(threads) + kHeadroom)) {
    const int64_t need = hm.address_limit_bytes - std::max<int64_t>(free_bytes, 0) + unmapped(1) + kHeadroom;
    return Status::Internal("out of host memory: the address-space limit (ulimit -v " + std::to_string(hm.address_limit_bytes >> 10) +
                            ") leaves " + mib(std::max<int64_t>(free_bytes, 0)) + " free, and the GEMM libraries need " +
                            mib(kGemmBufferBytes) + " per thread (OpenBLAS's buffer) and " + mib(kHeadroom) +
                            " for their kernels: give memc at least ulimit -v " + std::to_string(need >> 10));
  }
  cpu::map_openblas_buffers(threads);
  buffers_mapped = std::max(buffers_mapped, threads);
  hm.gemm_buffer_bytes = threads * kGemmBufferBytes;
  return g_host_memory = hm;
}

bool pin_bf16_gemm(const std::string& path) { return path.empty() || cpu::pin_onednn_bf16_gemm(path == "native"); }

std::string bf16_gemm_path() { return cpu::onednn_bf16_gemm() ? "native" : "widened"; }

std::string gemm_library() { return cpu::onednn_description(); }

}  // namespace memc
