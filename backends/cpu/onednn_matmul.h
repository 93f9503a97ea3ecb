// f32 and bf16 GEMMs through oneDNN's matmul primitive, which picks its kernels from the CPU's feature
// flags (AVX2, AVX-512, AMX) rather than from a table of model names. Primitives are created
// once per GemmShape and cached. Scratchpads are user-managed: the caller passes a block of
// onednn_scratchpad_bytes(s) from its planned workspace, so oneDNN allocates none of its own
// there. Its jit gemm driver (every shape on AVX2) still mallocs packing buffers per call outside
// any scratchpad (bench/journal/2026.md §20, §41), so gemm runs those shapes on OpenBLAS instead
// (onednn_runs_in_scratchpad, backends/cpu/blas.h).
#pragma once
#include <cstdint>
#include <string>

#include "backends/cpu/blas.h"

namespace memc::cpu {

// c[batch][m, n] (+)= op(a)[batch][m, k] · op(b)[batch][k, n]; see GemmShape.
void onednn_gemm(GemmType type, void* c, const void* a, const void* b, const GemmShape& s, void* scratchpad);

// oneDNN's effective ISA ("avx512_core_bf16", "avx2"...): the CPU's, or less under ONEDNN_MAX_CPU_ISA.
const char* onednn_isa();
// Whether the CPU itself reports bf16 dot products (avx512_bf16 or amx_bf16), read from CPUID.
bool cpu_has_bf16_dot();
// Whether oneDNN can run bf16 GEMMs natively here: the CPU reports bf16 dot products and
// oneDNN's effective ISA agrees (avx512_core_bf16 or avx512_core_amx).
bool onednn_bf16_gemm_supported();

// A CPU with bf16 dot products is not always faster with them: on a Xeon whose hypervisor hides
// AMX, oneDNN's avx512_bf16 kernels ran a linear layer's shapes at 66–82 GFLOP/s against 107–147
// in f32 (bench/journal/2026.md §33). So the flags only make native bf16 possible; a probe times one
// kBf16ProbeSize³ product both ways in kBf16ProbeRounds rounds on one thread, by that thread's
// CPU clock (≈40 ms, once per process, only where native is possible), and native is taken when
// the median round's bf16 rate is at least kBf16NativeMinRatio of its f32 rate. Wall-clock
// timing was not stable on a busy machine (one round's ratio 0.31–0.86 against 0.72 idle, and
// compiles on one machine chose differently); the thread's CPU clock gave 0.52–0.70 under the
// same load. The margin keeps a near tie widened: the CPUs where native pays (AMX: 3–4×) clear
// it by far, and where the two run about even widening costs only conversions and scratch.
inline constexpr int64_t kBf16ProbeSize = 512;
inline constexpr int kBf16ProbeRounds = 5;
inline constexpr double kBf16NativeMinRatio = 1.1;
struct Bf16GemmProbe {
  double f32_gflops = 0, bf16_gflops = 0;  // the best round's rates; 0: not measured (no native bf16 here)
  double ratio = 0;                        // the median round's bf16 rate over its f32 rate
};
Bf16GemmProbe bf16_gemm_probe();
// Pins the process's bf16 GEMM path (a plan records the one its workspaces were sized for);
// false when native was asked for and this CPU cannot run it (then bf16 is widened).
bool pin_onednn_bf16_gemm(bool native);

// What oneDNN runs on: "oneDNN 2.6.3, ISA avx2, bf16 GEMMs widened to f32 (...)".
std::string onednn_description();
// The threads oneDNN's parallel regions use (its OpenMP runtime).
void set_onednn_threads(int threads);
int onednn_threads();

}  // namespace memc::cpu
