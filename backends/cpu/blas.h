// Matrix multiply used by matmul, linear, conv and attention.
#pragma once
#include <cstdint>
#include <type_traits>

#include "ir/dtype.h"

namespace memc::cpu {

// One row-major product c[m, n] (+)= op(a)[m, k] · op(b)[k, n] over contiguous matrices:
// a is stored [m, k] ([k, m] when trans_a), b is [k, n] ([n, k] when trans_b).
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool accumulate = false;  // c += product instead of c = product
};

// f32/f64 call OpenBLAS; f16/bf16 widen to f32 in `scratch`, multiply, and round once on store;
// integer dtypes use a plain loop (wrapping like repeated multiply-add).
template <typename T>
void gemm(T* c, const T* a, const T* b, const GemmShape& s, float* scratch = nullptr);  // c: [m, n], a, b: see GemmShape

// Floats of `scratch` gemm<T> needs: the f32 copies of a, b and c for f16/bf16, none otherwise.
template <typename T>
int64_t gemm_scratch_floats(const GemmShape& s) {
  if constexpr (std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>) return s.m * s.k + s.k * s.n + s.m * s.n;
  else return 0;
}

}  // namespace memc::cpu
