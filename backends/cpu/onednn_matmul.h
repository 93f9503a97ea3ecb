// f32 GEMMs through oneDNN's matmul primitive, which picks its kernels from the CPU's feature
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
void onednn_sgemm(float* c, const float* a, const float* b, const GemmShape& s, void* scratchpad);
// Bytes of user scratchpad onednn_sgemm needs for this shape on this CPU (often 0).
int64_t onednn_scratchpad_bytes(const GemmShape& s);

// What oneDNN runs on: "oneDNN 2.6.3, ISA avx2" (the effective ISA of its jit kernels).
std::string onednn_description();
// The threads oneDNN's parallel regions use (its OpenMP runtime).
void set_onednn_threads(int threads);
int onednn_threads();

}  // namespace memc::cpu
