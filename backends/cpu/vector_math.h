// exp, erf and tanh over arrays of floats, in the widest vectors the CPU has. The math is glibc's
// libmvec (the vector variants GCC itself calls under -ffast-math; at most 4 ulp from the
// correctly rounded result per glibc's manual), so memc writes no polynomial of its own. The
// width is chosen from the CPU's own CPUID flags: 16 lanes with AVX-512F, 8 with AVX2, else 4
// (SSE2, every x86-64).
#pragma once
#include <cstdint>

namespace memc::cpu {

// x[i] = f(x[i]) for i < n, in place, `lanes` wide: 0 picks the CPU's widest; 4, 8 or 16 force
// one (tests compare every width the CPU has; asking for more than it has is a bug).
void exp_in_place(float* x, int64_t n, int lanes = 0);
void erf_in_place(float* x, int64_t n, int lanes = 0);
void tanh_in_place(float* x, int64_t n, int lanes = 0);

// 16, 8 or 4: the widest vector this CPU runs.
int vector_lanes();
// "avx512f (16 lanes)", "avx2 (8 lanes)" or "sse2 (4 lanes)": what the functions above run.
const char* vector_math_isa();
// "x86-64-v4 (AVX-512)", "x86-64-v3 (AVX2 + FMA)" or "x86-64 (SSE2)": the build of memc's own
// kernel loops this CPU runs (run_range in backends/cpu/parallel.h).
const char* vector_loops_isa();

// Elements per chunk when a kernel stages values in a stack buffer for the functions above.
inline constexpr int64_t kVectorChunk = 256;

}  // namespace memc::cpu
