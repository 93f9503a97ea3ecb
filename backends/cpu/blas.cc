#include "backends/cpu/blas.h"

#include <cblas.h>

#include <algorithm>

#include "support/status.h"

namespace memc::cpu {
namespace {

// Loop order i, p, j keeps the innermost access to b and c contiguous when b is not transposed.
template <typename T>
void naive_gemm(T* c, const T* a, const T* b, const GemmShape& s) {  // c: [m, n]
  const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
  if (!s.accumulate) std::fill(c, c + s.m * s.n, T(0));
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t p = 0; p < s.k; ++p) {
      const T a_ip = s.trans_a ? a[p * lda + i] : a[i * lda + p];
      T* c_row = c + i * s.n;
      if (s.trans_b) {
        for (int64_t j = 0; j < s.n; ++j) c_row[j] = static_cast<T>(c_row[j] + a_ip * b[j * ldb + p]);
      } else {
        const T* b_row = b + p * ldb;
        for (int64_t j = 0; j < s.n; ++j) c_row[j] = static_cast<T>(c_row[j] + a_ip * b_row[j]);
      }
    }
  }
}

template <typename T>
float* widen(float* out, const T* x, int64_t n) {  // out: [n]
  for (int64_t i = 0; i < n; ++i) out[i] = load<T>(x[i]);
  return out;
}

}  // namespace

template <>
void gemm<float>(float* c, const float* a, const float* b, const GemmShape& s, float*) {
  if (s.m == 0 || s.n == 0) return;
  cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(s.m), static_cast<blasint>(s.n), static_cast<blasint>(s.k), 1.0f, a,
              static_cast<blasint>(s.trans_a ? s.m : s.k), b, static_cast<blasint>(s.trans_b ? s.k : s.n),
              s.accumulate ? 1.0f : 0.0f, c, static_cast<blasint>(s.n));
}

template <>
void gemm<double>(double* c, const double* a, const double* b, const GemmShape& s, float*) {
  if (s.m == 0 || s.n == 0) return;
  cblas_dgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(s.m), static_cast<blasint>(s.n), static_cast<blasint>(s.k), 1.0, a,
              static_cast<blasint>(s.trans_a ? s.m : s.k), b, static_cast<blasint>(s.trans_b ? s.k : s.n),
              s.accumulate ? 1.0 : 0.0, c, static_cast<blasint>(s.n));
}

namespace {
// 16-bit floats: widen once, one sgemm, round once. scratch: [m·k + k·n + m·n] floats.
template <typename T>
void half_gemm(T* c, const T* a, const T* b, const GemmShape& s, float* scratch) {
  if (s.m == 0 || s.n == 0) return;
  MEMC_CHECK(scratch, "16-bit gemm needs ", gemm_scratch_floats<T>(s), " floats of workspace");
  float* a32 = widen(scratch, a, s.m * s.k);
  float* b32 = widen(a32 + s.m * s.k, b, s.k * s.n);
  float* c32 = b32 + s.k * s.n;
  if (s.accumulate) widen(c32, c, s.m * s.n);
  gemm<float>(c32, a32, b32, s);
  for (int64_t i = 0; i < s.m * s.n; ++i) c[i] = store<T>(c32[i]);
}
}  // namespace
template <>
void gemm<f16_t>(f16_t* c, const f16_t* a, const f16_t* b, const GemmShape& s, float* scratch) { half_gemm(c, a, b, s, scratch); }
template <>
void gemm<bf16_t>(bf16_t* c, const bf16_t* a, const bf16_t* b, const GemmShape& s, float* scratch) { half_gemm(c, a, b, s, scratch); }

template <>
void gemm<int64_t>(int64_t* c, const int64_t* a, const int64_t* b, const GemmShape& s, float*) { naive_gemm(c, a, b, s); }
template <>
void gemm<int32_t>(int32_t* c, const int32_t* a, const int32_t* b, const GemmShape& s, float*) { naive_gemm(c, a, b, s); }
template <>
void gemm<uint8_t>(uint8_t* c, const uint8_t* a, const uint8_t* b, const GemmShape& s, float*) { naive_gemm(c, a, b, s); }

}  // namespace memc::cpu
