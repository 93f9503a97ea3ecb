// f32 and bf16 GEMMs through oneDNN's matmul primitive, which picks its kernels from the CPU's feature
// flags (AVX2, AVX-512, AMX) rather than from a table of model names. Primitives are created
// once per GemmShape and cached. Scratchpads are user-managed: the caller passes a block of
// onednn_scratchpad_bytes(s) from its planned workspace, so oneDNN allocates none of its own
// there. (Its jit gemm driver still mallocs packing buffers per call outside any scratchpad:
// measured in bench/RESULTS.md §20.)
#pragma once
#include <cstdint>
#include <string>

#include "backends/cpu/blas.h"

namespace memc::cpu {

// c[batch][m, n] (+)= op(a)[batch][m, k] · op(b)[batch][k, n]; see GemmShape.
void onednn_gemm(GemmType type, void* c, const void* a, const void* b, const GemmShape& s, void* scratchpad);

// Whether the CPU itself reports bf16 dot products (avx512_bf16 or amx_bf16), read from CPUID.
bool cpu_has_bf16_dot();

// What oneDNN runs on: "oneDNN 2.6.3, ISA avx2, bf16 GEMMs widened to f32 (...)".
std::string onednn_description();
// The threads oneDNN's parallel regions use (its OpenMP runtime).
void set_onednn_threads(int threads);
int onednn_threads();

}  // namespace memc::cpu
