// Host memory outside the planned arena: the GEMM library's buffers. OpenBLAS (f64 GEMMs, and
// f32 where oneDNN would allocate per call: backends/cpu/blas.h) maps a 128 MiB buffer for each
// thread that runs a GEMM at the same time, on first use, keeps it, and retries a failed mmap
// forever (a run under `ulimit -v` spun at 100% CPU). prepare_host_memory() runs before any
// GEMM: under a finite address-space limit (RLIMIT_AS) it lowers the compute thread count to
// what the limit holds, checks that their buffers can be mapped, and maps them with one tiny
// GEMM, so no later GEMM allocates. Without a limit it changes nothing.
#pragma once
#include <cstdint>
#include <string>

#include "support/status.h"

namespace memc {

// OpenBLAS's per-thread buffer (BUFFER_SIZE of Debian's x86_64 build, measured with strace:
// 134,217,728 bytes, tried again up to 135,266,304 with its alignment slack).
inline constexpr int64_t kGemmBufferBytes = int64_t{129} << 20;

struct HostMemory {
  int64_t address_limit_bytes = -1;  // RLIMIT_AS; -1: unlimited
  int64_t threads = 0;               // compute threads: oneDNN's and memc's, set by set_compute_threads
  int64_t gemm_threads = 0;          // of them, those that may hold an OpenBLAS buffer at once
  std::string vector_math;           // "avx512f (16 lanes)": the width of exp/erf/tanh (backends/cpu/vector_math.h)
  std::string vector_loops;          // "x86-64-v4 (AVX-512)": the build of memc's own kernel loops (backends/cpu/parallel.h)
  std::string openblas_core;         // OpenBLAS's kernel choice ("Haswell", "SkylakeX", ...)
  std::string omp_wait;              // how idle OpenMP threads wait: "passive", "spin 30000" (runtime/preinit/preinit.cc)
  int64_t gemm_buffer_bytes = 0;     // their buffers, outside the arena: threads × kGemmBufferBytes (mapped up
                                     // front under a limit, lazily by OpenBLAS without one)
};

// The cores this process may run on (sched_getaffinity).
int64_t available_cores();
// One thread count for oneDNN's OpenMP threads and memc's; OpenBLAS runs single-threaded inside
// them (backends/cpu/blas.cc). Call before prepare_host_memory.
void set_compute_threads(int64_t threads);

// Exit 1 with one line when even one GEMM buffer does not fit under the limit. Warns in one
// line when OpenBLAS picked generic kernels on a CPU with AVX2 (runtime/preinit/preinit.cc fixes the
// AVX-512 case before OpenBLAS starts).
Expected<HostMemory> prepare_host_memory();
// What prepare_host_memory() settled (for reports).
const HostMemory& host_memory();
// The bf16 GEMM path a plan's workspaces were sized for ("native" or "widened"; empty: the
// process's own choice stands). False when the plan's native path cannot run here: bf16 GEMMs
// are then widened to f32, whose workspace is larger.
bool pin_bf16_gemm(const std::string& path);
// This process's bf16 GEMM path: "native" or "widened".
std::string bf16_gemm_path();
// What runs the f32 and bf16 GEMMs, "oneDNN 2.6.3, ISA avx2, bf16 GEMMs ...", for reports. Asked
// for when reporting, not at start-up: it settles the bf16 path (a probe) if nothing has yet.
std::string gemm_library();

}  // namespace memc
