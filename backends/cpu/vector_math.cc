#include "backends/cpu/vector_math.h"

#include <immintrin.h>

#include <cmath>

#include "support/status.h"

// glibc's vector ABI names (x86_64 vector function ABI): b = SSE 4 lanes, d = AVX2 8 lanes,
// e = AVX-512 16 lanes. Each is an ifunc or a wrapper that runs on any CPU with that ISA.
extern "C" {
__m128 _ZGVbN4v_expf(__m128);
__m128 _ZGVbN4v_erff(__m128);
__m128 _ZGVbN4v_tanhf(__m128);
__attribute__((target("avx2"))) __m256 _ZGVdN8v_expf(__m256);
__attribute__((target("avx2"))) __m256 _ZGVdN8v_erff(__m256);
__attribute__((target("avx2"))) __m256 _ZGVdN8v_tanhf(__m256);
__attribute__((target("avx512f"))) __m512 _ZGVeN16v_expf(__m512);
__attribute__((target("avx512f"))) __m512 _ZGVeN16v_erff(__m512);
__attribute__((target("avx512f"))) __m512 _ZGVeN16v_tanhf(__m512);
}

namespace memc::cpu {
namespace {


// The tail is padded into a full vector (zeros are in every function's domain) and only its
// first elements are stored back.
template <__m128 (*F)(__m128)>
void map4(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, F(_mm_loadu_ps(x + i)));
  if (i < n) {
    alignas(16) float tail[4] = {};
    for (int64_t j = i; j < n; ++j) tail[j - i] = x[j];
    _mm_store_ps(tail, F(_mm_load_ps(tail)));
    for (int64_t j = i; j < n; ++j) x[j] = tail[j - i];
  }
}

template <__m256 (*F)(__m256)>
__attribute__((target("avx2"))) void map8(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, F(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float tail[8] = {};
    for (int64_t j = i; j < n; ++j) tail[j - i] = x[j];
    _mm256_store_ps(tail, F(_mm256_load_ps(tail)));
    for (int64_t j = i; j < n; ++j) x[j] = tail[j - i];
  }
}

template <__m512 (*F)(__m512)>
__attribute__((target("avx512f"))) void map16(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, F(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, F(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

template <__m128 (*F4)(__m128), __m256 (*F8)(__m256), __m512 (*F16)(__m512)>
void map(float* x, int64_t n, int lanes) {
  MEMC_CHECK(lanes <= vector_lanes(), lanes, "-lane vector math asked of a CPU with ", vector_lanes());
  switch (lanes ? lanes : vector_lanes()) {
    case 16: return map16<F16>(x, n);
    case 8: return map8<F8>(x, n);
    default: return map4<F4>(x, n);
  }
}

// libmvec's expf takes a scalar path for a whole vector when one lane lies outside about
// [-87.3, 88], where the result is subnormal, zero or near overflow: 10 to 40 times slower per
// element (a masked attention score at -inf, or a GELU gradient's e^(-x²/2) at |x| > 13, meets
// it). Lanes below -104, whose result rounds to 0, are set to 0; lanes in [-104, -87] are
// evaluated as (e^(x/2))², inside the fast range, the square rounding once into the subnormals.
// Lanes above 88, which only a result near FLT_MAX or inf has, take the scalar expf.
constexpr float kExpLow = -87.0f, kExpHigh = 88.0f, kExpZero = -104.0f;

// ys[lane] = expf(xs[lane]) for each lane set in `high` (plain arrays: a vector passed by value
// to a function built for another ISA would change its calling convention).
void exp_lanes_scalar(float* ys, const float* xs, unsigned high) {
  for (unsigned lane = 0; high; ++lane, high >>= 1)
    if (high & 1u) ys[lane] = std::exp(xs[lane]);
}

__m128 exp4(__m128 x) {
  const __m128 low = _mm_cmplt_ps(x, _mm_set1_ps(kExpLow)), high = _mm_cmpgt_ps(x, _mm_set1_ps(kExpHigh));
  const __m128 edge = _mm_or_ps(low, high);
  if (_mm_movemask_ps(edge) == 0) return _ZGVbN4v_expf(x);
  const __m128 sub = _mm_andnot_ps(_mm_cmplt_ps(x, _mm_set1_ps(kExpZero)), low);  // subnormal results
  const __m128 half = _ZGVbN4v_expf(_mm_and_ps(sub, _mm_mul_ps(x, _mm_set1_ps(0.5f))));
  const __m128 full = _ZGVbN4v_expf(_mm_andnot_ps(edge, x));  // edge lanes at e^0
  alignas(16) float xs[4], ys[4];
  _mm_store_ps(xs, x);
  _mm_store_ps(ys, _mm_or_ps(_mm_and_ps(sub, _mm_mul_ps(half, half)), _mm_andnot_ps(low, full)));
  exp_lanes_scalar(ys, xs, static_cast<unsigned>(_mm_movemask_ps(high)));
  return _mm_load_ps(ys);
}

__attribute__((target("avx2"))) __m256 exp8(__m256 x) {
  const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLow), _CMP_LT_OQ);
  const __m256 high = _mm256_cmp_ps(x, _mm256_set1_ps(kExpHigh), _CMP_GT_OQ);
  const __m256 edge = _mm256_or_ps(low, high);
  if (_mm256_movemask_ps(edge) == 0) return _ZGVdN8v_expf(x);
  const __m256 sub = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(kExpZero), _CMP_LT_OQ), low);
  const __m256 half = _ZGVdN8v_expf(_mm256_and_ps(sub, _mm256_mul_ps(x, _mm256_set1_ps(0.5f))));
  const __m256 full = _ZGVdN8v_expf(_mm256_andnot_ps(edge, x));
  alignas(32) float xs[8], ys[8];
  _mm256_store_ps(xs, x);
  _mm256_store_ps(ys, _mm256_or_ps(_mm256_and_ps(sub, _mm256_mul_ps(half, half)), _mm256_andnot_ps(low, full)));
  exp_lanes_scalar(ys, xs, static_cast<unsigned>(_mm256_movemask_ps(high)));
  return _mm256_load_ps(ys);
}

__attribute__((target("avx512f"))) __m512 exp16(__m512 x) {
  const __mmask16 low = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLow), _CMP_LT_OQ);
  const __mmask16 high = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpHigh), _CMP_GT_OQ);
  if ((low | high) == 0) return _ZGVeN16v_expf(x);
  const __mmask16 sub = low & ~_mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpZero), _CMP_LT_OQ);
  const __m512 half = _ZGVeN16v_expf(_mm512_maskz_mul_ps(sub, x, _mm512_set1_ps(0.5f)));
  const __m512 full = _ZGVeN16v_expf(_mm512_mask_mov_ps(x, low | high, _mm512_setzero_ps()));
  alignas(64) float xs[16], ys[16];
  _mm512_store_ps(xs, x);
  _mm512_store_ps(ys, _mm512_mask_mov_ps(full, low, _mm512_maskz_mul_ps(sub, half, half)));
  exp_lanes_scalar(ys, xs, high);
  return _mm512_load_ps(ys);
}

}  // namespace

void exp_in_place(float* x, int64_t n, int lanes) { map<exp4, exp8, exp16>(x, n, lanes); }
void erf_in_place(float* x, int64_t n, int lanes) { map<_ZGVbN4v_erff, _ZGVdN8v_erff, _ZGVeN16v_erff>(x, n, lanes); }
void tanh_in_place(float* x, int64_t n, int lanes) { map<_ZGVbN4v_tanhf, _ZGVdN8v_tanhf, _ZGVeN16v_tanhf>(x, n, lanes); }

#ifdef MEMC_VECTOR_ISA_CAP_V3
constexpr bool kAvx512Built = false;  // a build as an AVX2-only CPU runs (CMakeLists.txt)
#else
constexpr bool kAvx512Built = true;
#endif

int vector_lanes() {
  static const int lanes = kAvx512Built && __builtin_cpu_supports("avx512f") ? 16 : __builtin_cpu_supports("avx2") ? 8 : 4;
  return lanes;
}

const char* vector_loops_isa() {  // the same test GCC's target_clones resolver makes
  if (kAvx512Built && __builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX-512)";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2 + FMA)";
  return "x86-64 (SSE2)";
}

const char* vector_math_isa() {
  switch (vector_lanes()) {
    case 16: return "avx512f (16 lanes)";
    case 8: return "avx2 (8 lanes)";
    default: return "sse2 (4 lanes)";
  }
}

}  // namespace memc::cpu
