#include "backends/cpu/blas.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backends/cpu/onednn_matmul.h"
#include "backends/cpu/parallel.h"
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

// Runs one(c_i, a_i, b_i) for each matrix of a strided batch.
template <typename T, typename One>
void for_each_batch(T* c, const T* a, const T* b, const GemmShape& s, One&& one) {
  for (int64_t i = 0; i < s.batch; ++i) one(c + i * s.m * s.n, a + i * s.batch_stride_a, b + i * s.batch_stride_b);
}

template <typename T>
void batched_naive_gemm(T* c, const T* a, const T* b, const GemmShape& s) {
  for_each_batch(c, a, b, s, [&](T* c_i, const T* a_i, const T* b_i) { naive_gemm(c_i, a_i, b_i, s); });
}

// f32 products of at most 32³ multiply-adds (small_gemm): b is packed to [k, n] on the stack
// when transposed, so the innermost loop is a contiguous c_row += a_ip · b_row that the
// compiler vectorizes (16 wide with AVX-512, 8 with AVX2; no FMA, so every clone rounds as the
// plain loop does).
#ifdef MEMC_VECTOR_ISA_CAP_V3
#define MEMC_SMALL_GEMM_CLONES target_clones("avx2", "default")
#else
#define MEMC_SMALL_GEMM_CLONES target_clones("arch=x86-64-v4", "avx2", "default")
#endif
__attribute__((MEMC_SMALL_GEMM_CLONES, optimize("tree-vectorize"))) void small_sgemm(float* c, const float* a, const float* b,
                                                                   const GemmShape& s) {  // c: [m, n]
  float packed[32 * 32 * 32];
  const float* b_rows = b;
  if (s.trans_b) {
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t p = 0; p < s.k; ++p) packed[p * s.n + j] = b[j * s.k + p];
    }
    b_rows = packed;
  }
  if (!s.accumulate) std::fill(c, c + s.m * s.n, 0.0f);
  for (int64_t i = 0; i < s.m; ++i) {
    float* c_row = c + i * s.n;
    for (int64_t p = 0; p < s.k; ++p) {
      const float a_ip = s.trans_a ? a[p * s.m + i] : a[i * s.k + p];
      const float* b_row = b_rows + p * s.n;
      for (int64_t j = 0; j < s.n; ++j) c_row[j] += a_ip * b_row[j];
    }
  }
}

template <typename T>
float* widen(float* out, const T* x, int64_t n) {  // out: [n]
  for (int64_t i = 0; i < n; ++i) out[i] = load<T>(x[i]);
  return out;
}

void blas_call(float* c, const float* a, const float* b, const GemmShape& s, int64_t m, int64_t n, int64_t lda, int64_t ldb) {
  cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(s.k), 1.0f, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb),
              s.accumulate ? 1.0f : 0.0f, c, static_cast<blasint>(s.n));
}
void blas_call(double* c, const double* a, const double* b, const GemmShape& s, int64_t m, int64_t n, int64_t lda, int64_t ldb) {
  cblas_dgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(s.k), 1.0, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb),
              s.accumulate ? 1.0 : 0.0, c, static_cast<blasint>(s.n));
}

// Multiply-adds below which a block is not worth another thread (a parallel region costs a few
// microseconds, a 64³ product about ten).
constexpr int64_t kBlasBlockGrain = 64 * 64 * 64;

// OpenBLAS's kernels sum an element of c in an order that depends on where its row falls in the
// kernel's register tile (measured on Zen's sgemm: c's rows split at multiples of 12 give the
// same bits, other splits and any split of its columns do not). So blocks of rows start at
// multiples of kBlasRowAlign, a multiple of 12 and 16 (checked with the Zen, Haswell,
// Sandybridge and Nehalem cores: tests/cpu_linalg_test.cc).
constexpr int64_t kBlasRowAlign = 48;

// OpenBLAS, one single-threaded call per block of each matrix's rows of c, taken by memc's
// OpenMP threads: c is the same bits whatever the thread count. Each thread uses one OpenBLAS
// buffer, mapped up front and kept (map_openblas_buffers), so a step allocates nothing.
template <typename T>
void openblas_gemm(T* c, const T* a, const T* b, const GemmShape& s) {  // c: [batch, m, n]
  const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t wanted = (threads + s.batch - 1) / s.batch;
  const int64_t blocks = std::max<int64_t>(1, std::min({wanted, s.m / kBlasRowAlign, s.m * s.n * s.k / kBlasBlockGrain}));
  const int64_t tiles = (s.m + kBlasRowAlign - 1) / kBlasRowAlign;
  parallel_ranges(s.batch * blocks, 1, INT64_MAX, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / blocks, block = item % blocks;
      const int64_t lo = std::min(s.m, tiles * block / blocks * kBlasRowAlign);
      const int64_t hi = block + 1 == blocks ? s.m : std::min(s.m, tiles * (block + 1) / blocks * kBlasRowAlign);
      if (hi <= lo) continue;
      const T* a_i = a + i * s.batch_stride_a;
      blas_call(c + i * s.m * s.n + lo * s.n, s.trans_a ? a_i + lo : a_i + lo * lda, b + i * s.batch_stride_b, s, hi - lo, s.n, lda, ldb);
    }
  });
}

}  // namespace

template <>
void gemm<float>(float* c, const float* a, const float* b, const GemmShape& s, float* scratch) {
  if (s.m == 0 || s.n == 0 || s.batch == 0) return;
  if (s.k == 0 || small_gemm(s)) {  // oneDNN also wants no zero-sized dims
    for_each_batch(c, a, b, s, [&](float* c_i, const float* a_i, const float* b_i) { small_sgemm(c_i, a_i, b_i, s); });
    return;
  }
  if (onednn_f32_gemm(s)) {
    onednn_gemm(GemmType::kF32, c, a, b, s, scratch);
  } else {
    openblas_gemm(c, a, b, s);
  }
}

void map_openblas_buffers(int64_t threads) {
  constexpr int n = 64;  // large enough that OpenBLAS takes its buffer
  const std::vector<float> a(static_cast<size_t>(n) * n, 0.0f);
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    std::vector<float> c(static_cast<size_t>(n) * n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
  }
}

template <>
void gemm<double>(double* c, const double* a, const double* b, const GemmShape& s, float*) {
  if (s.m == 0 || s.n == 0 || s.batch == 0) return;
  if (s.k == 0) {
    batched_naive_gemm(c, a, b, s);
    return;
  }
  openblas_gemm(c, a, b, s);
}

namespace {
// 16-bit floats, per batch: widen once, one sgemm, round once. scratch: the sgemm's scratchpad,
// then [m·k + k·n + m·n] floats.
template <typename T>
void half_gemm(T* c, const T* a, const T* b, const GemmShape& s, float* scratch) {
  if (s.m == 0 || s.n == 0) return;
  MEMC_CHECK(scratch, "16-bit gemm needs ", gemm_scratch_floats<T>(s), " floats of workspace");
  GemmShape one = s;
  one.batch = 1;
  float* a32 = scratch + gemm_scratch_floats<float>(one);
  float* b32 = a32 + s.m * s.k;
  float* c32 = b32 + s.k * s.n;
  for_each_batch(c, a, b, s, [&](T* c_i, const T* a_i, const T* b_i) {
    widen(a32, a_i, s.m * s.k);
    widen(b32, b_i, s.k * s.n);
    if (s.accumulate) widen(c32, c_i, s.m * s.n);
    gemm<float>(c32, a32, b32, one, scratch);
    for (int64_t i = 0; i < s.m * s.n; ++i) c_i[i] = store<T>(c32[i]);
  });
}
}  // namespace
template <>
void gemm<f16_t>(f16_t* c, const f16_t* a, const f16_t* b, const GemmShape& s, float* scratch) { half_gemm(c, a, b, s, scratch); }
template <>
void gemm<bf16_t>(bf16_t* c, const bf16_t* a, const bf16_t* b, const GemmShape& s, float* scratch) {
  if (s.m == 0 || s.n == 0 || s.batch == 0) return;
  if (native_bf16_gemm(s)) {
    onednn_gemm(GemmType::kBf16, c, a, b, s, scratch);
    return;
  }
  half_gemm(c, a, b, s, scratch);
}

template <typename T>
void gemm_f32_out(float* c, const T* a, const T* b, const GemmShape& s, float* scratch) {
  if (s.m == 0 || s.n == 0 || s.batch == 0) return;
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (native_bf16_f32_gemm(s)) {
      onednn_gemm(GemmType::kBf16ToF32, c, a, b, s, scratch);
      return;
    }
  }
  MEMC_CHECK(scratch, "a 16-bit gemm into f32 needs ", gemm_f32_out_scratch_floats<T>(s), " floats of workspace");
  GemmShape one = s;
  one.batch = 1;
  float* a32 = scratch + gemm_scratch_floats<float>(one);
  float* b32 = a32 + s.m * s.k;
  for (int64_t i = 0; i < s.batch; ++i) {
    widen(a32, a + i * s.batch_stride_a, s.m * s.k);
    widen(b32, b + i * s.batch_stride_b, s.k * s.n);
    gemm<float>(c + i * s.m * s.n, a32, b32, one, scratch);
  }
}
template void gemm_f32_out<bf16_t>(float*, const bf16_t*, const bf16_t*, const GemmShape&, float*);
template void gemm_f32_out<f16_t>(float*, const f16_t*, const f16_t*, const GemmShape&, float*);

template <>
void gemm<int64_t>(int64_t* c, const int64_t* a, const int64_t* b, const GemmShape& s, float*) { batched_naive_gemm(c, a, b, s); }
template <>
void gemm<int32_t>(int32_t* c, const int32_t* a, const int32_t* b, const GemmShape& s, float*) { batched_naive_gemm(c, a, b, s); }
template <>
void gemm<uint8_t>(uint8_t* c, const uint8_t* a, const uint8_t* b, const GemmShape& s, float*) { batched_naive_gemm(c, a, b, s); }

}  // namespace memc::cpu
