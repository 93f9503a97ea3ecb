// Matrix multiply used by matmul, linear, conv and attention.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ir/dtype.h"

namespace memc::cpu {

// `batch` row-major products c_i[m, n] (+)= op(a_i)[m, k] · op(b_i)[k, n] over contiguous
// matrices: a_i is stored [m, k] ([k, m] when trans_a) at a + i·batch_stride_a, b_i [k, n]
// ([n, k] when trans_b) at b + i·batch_stride_b, c_i at c + i·m·n. A batch stride of 0 shares
// one matrix across the batch.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool accumulate = false;  // c += product instead of c = product
  int64_t batch = 1, batch_stride_a = 0, batch_stride_b = 0;  // in elements
};

// f32 calls oneDNN's matmul (backends/cpu/onednn_matmul.h) where oneDNN runs the shape in its
// scratchpad alone (onednn_runs_in_scratchpad: brgemm, on AVX-512), OpenBLAS otherwise (AVX2:
// oneDNN 2.6's gemm driver mallocs per call, OpenBLAS reuses one buffer per thread), or a plain
// loop for products of at most 32³ multiply-adds per matrix; f64 calls OpenBLAS; bf16 calls
// oneDNN's bf16 matmul (f32 accumulation, one rounding on store) where the CPU has bf16 dot
// products (onednn_bf16_gemm) and brgemm runs the shape; otherwise f16/bf16 widen to f32 in
// `scratch`, multiply, and round once on store; integer dtypes use a plain loop (wrapping like
// repeated multiply-add). OpenBLAS runs single-threaded inside memc's own OpenMP threads, each
// taking a block of c's rows (so c's values do not depend on the thread count).
template <typename T>
void gemm(T* c, const T* a, const T* b, const GemmShape& s, float* scratch = nullptr);  // c: [batch, m, n], a, b: see GemmShape

// OpenBLAS keeps its buffers per calling thread (thread-local) and maps a 128 MiB one on a
// thread's first product, retrying forever where that fails (runtime/host_memory.h): this runs one
// small product on each of `threads` OpenMP threads, so each maps its buffer now.
void map_openblas_buffers(int64_t threads);

// a, b and c all of one type (bf16 accumulates in f32), or bf16 a and b with an f32 c.
enum class GemmType { kF32, kBf16, kBf16ToF32 };

// Bytes of user scratchpad oneDNN's matmul needs for this shape and type on this CPU (often 0).
int64_t onednn_scratchpad_bytes(const GemmShape& s, GemmType type);
// Whether oneDNN's kernels for this shape, accumulating or not, take all their memory from that
// scratchpad (else memc runs the product elsewhere: see gemm).
bool onednn_runs_in_scratchpad(GemmShape s, GemmType type);
// Whether bf16 GEMMs run natively in oneDNN (else they are widened to f32): pinned by the plan
// being run (pin_onednn_bf16_gemm), else MEMC_BF16_GEMM=0/1 where native is possible, else
// native where oneDNN supports it on this CPU and a probe measures it clearly faster than f32
// (backends/cpu/onednn_matmul.h). Decided once per process, before the first workspace is sized.
bool onednn_bf16_gemm();

// Up to 32³ multiply-adds per call a plain loop beats a oneDNN primitive call, whose fixed
// cost is ~8 µs (measured; attention's per-head blocks in small models are this size). The
// count is the whole batch's: a strided batch of many small matrices (attention's grouped
// heads) is one oneDNN call, not a loop per matrix (vit_tiny b64: 8.1 → 5.3 ms per step,
// bench/journal/2026.md §33).
inline bool small_gemm(const GemmShape& s) { return s.batch * s.m * s.n * s.k <= 32 * 32 * 32; }

// Bytes of oneDNN scratchpad for s with or without accumulation, whichever is more: a kernel
// that decides to accumulate at run time (a linear or conv with a bias written first) then
// never needs more than a workspace function sized without knowing.
inline int64_t onednn_scratch_either_way(GemmShape s, GemmType type) {
  s.accumulate = false;
  const int64_t plain = onednn_scratchpad_bytes(s, type);
  s.accumulate = true;
  return std::max(plain, onednn_scratchpad_bytes(s, type));
}

// Which library runs a product (gemm's comment): oneDNN in its scratchpad, or not.
inline bool onednn_f32_gemm(const GemmShape& s) {
  return s.k > 0 && !small_gemm(s) && onednn_runs_in_scratchpad(s, GemmType::kF32);
}
inline bool native_bf16_gemm(const GemmShape& s) {
  return s.k > 0 && onednn_bf16_gemm() && !small_gemm(s) && onednn_runs_in_scratchpad(s, GemmType::kBf16);
}

// Floats of `scratch` gemm<T> needs: oneDNN's planned scratchpad for f32 and native bf16
// (accumulating or not); for widened f16/bf16 that of the f32 product plus the f32 copies of
// one batch's a, b and c; none otherwise. Whole cache lines, so what follows stays aligned.
template <typename T>
int64_t gemm_scratch_floats(const GemmShape& s) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (native_bf16_gemm(s)) return (onednn_scratch_either_way(s, GemmType::kBf16) + 63) / 64 * 16;
  }
  if constexpr (std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>) {
    GemmShape one = s;
    one.batch = 1;
    return gemm_scratch_floats<float>(one) + s.m * s.k + s.k * s.n + s.m * s.n;
  } else if constexpr (std::is_same_v<T, float>) {
    return onednn_f32_gemm(s) ? (onednn_scratch_either_way(s, GemmType::kF32) + 63) / 64 * 16 : 0;
  } else {
    return 0;
  }
}

// c (f32) (+)= op(a)·op(b) with 16-bit a and b (matmul_acc over a mixed precision's operands):
// the product is summed in f32 and never rounded to 16 bits. bf16 runs oneDNN's bf16 matmul with
// an f32 destination where bf16 GEMMs run natively here (native_bf16_f32_gemm); otherwise a and b
// widen to f32 in `scratch` (gemm_f32_out_scratch_floats) for one sgemm into c.
template <typename T>
void gemm_f32_out(float* c, const T* a, const T* b, const GemmShape& s, float* scratch);

inline bool native_bf16_f32_gemm(const GemmShape& s) {
  return s.k > 0 && onednn_bf16_gemm() && !small_gemm(s) && onednn_runs_in_scratchpad(s, GemmType::kBf16ToF32);
}

template <typename T>
int64_t gemm_f32_out_scratch_floats(const GemmShape& s) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (native_bf16_f32_gemm(s)) return (onednn_scratch_either_way(s, GemmType::kBf16ToF32) + 63) / 64 * 16;
  }
  GemmShape one = s;
  one.batch = 1;
  return gemm_scratch_floats<float>(one) + s.m * s.k + s.k * s.n;
}

}  // namespace memc::cpu
