// Threads for memc's own CPU kernels: OpenMP (libgomp, the runtime oneDNN already uses), with the
// thread count that `memc run --threads` sets for both (runtime/host_memory.h).
//
// Work is split into contiguous index ranges whose results land in disjoint outputs, so what a
// kernel computes does not depend on how many threads ran it. Kernels that need per-thread
// scratch size it for kMaxKernelSlots slots, a constant, so that a plan's workspace (and so its
// peak) is the same whatever --threads the run is given.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace memc::cpu {

// Most per-thread scratch slots a kernel plans; kernels with per-thread scratch use at most this
// many threads.
inline constexpr int64_t kMaxKernelSlots = 8;

// Elements of streaming elementwise work below which one thread is faster than waking others
// (a parallel region costs a few microseconds).
inline constexpr int64_t kElementwiseGrain = 1 << 15;

// Each range's loop is built three times, for AVX-512 (x86-64-v4), AVX2 + FMA (x86-64-v3) and
// baseline x86-64 (SSE2), and the CPU's own CPUID flags pick one when memc loads (GCC's
// target_clones: an ifunc resolver), so the loops GCC vectorizes use the widest vectors the CPU
// has (vector_loops_isa() names the one taken). The build keeps a*b + c unfused
// (-ffp-contract=off), so every clone computes the same bits.
// A build configured with MEMC_VECTOR_ISA_CAP=x86-64-v3 leaves the AVX-512 clone out (CMakeLists.txt).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(MEMC_VECTOR_ISA_CAP_V3)
#define MEMC_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define MEMC_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MEMC_VECTOR_CLONES
#endif

template <typename Body>
MEMC_VECTOR_CLONES __attribute__((flatten)) void run_range(Body& body, int64_t slot, int64_t begin, int64_t end) {
  body(slot, begin, end);
}

// Calls body(slot, begin, end) for contiguous ranges covering [0, n), each at least `grain`
// long, on at most `max_slots` threads (slot < max_slots names the range's thread). One thread
// when the work is too small or we are already inside a parallel region.
template <typename Body>
void parallel_ranges(int64_t n, int64_t grain, int64_t max_slots, Body&& body) {
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t slots = std::max<int64_t>(1, std::min({threads, max_slots, grain > 0 ? n / grain : n}));
  if (slots <= 1) {
    if (n > 0) run_range(body, int64_t{0}, int64_t{0}, n);
    return;
  }
#pragma omp parallel for num_threads(slots) schedule(static, 1)
  for (int64_t s = 0; s < slots; ++s) run_range(body, s, n * s / slots, n * (s + 1) / slots);
}

// body(begin, end) over [0, n) for independent elementwise work.
template <typename Body>
void parallel_elementwise(int64_t n, Body&& body) {
  parallel_ranges(n, kElementwiseGrain, INT64_MAX, [&](int64_t, int64_t begin, int64_t end) { body(begin, end); });
}

}  // namespace memc::cpu
