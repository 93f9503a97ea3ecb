#include "backends/cpu/vector_math.h"

#include <immintrin.h>

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

}  // namespace

void exp_in_place(float* x, int64_t n, int lanes) { map<_ZGVbN4v_expf, _ZGVdN8v_expf, _ZGVeN16v_expf>(x, n, lanes); }
void erf_in_place(float* x, int64_t n, int lanes) { map<_ZGVbN4v_erff, _ZGVdN8v_erff, _ZGVeN16v_erff>(x, n, lanes); }
void tanh_in_place(float* x, int64_t n, int lanes) { map<_ZGVbN4v_tanhf, _ZGVdN8v_tanhf, _ZGVeN16v_tanhf>(x, n, lanes); }

int vector_lanes() {
  static const int lanes = __builtin_cpu_supports("avx512f") ? 16 : __builtin_cpu_supports("avx2") ? 8 : 4;
  return lanes;
}

const char* vector_math_isa() {
  switch (vector_lanes()) {
    case 16: return "avx512f (16 lanes)";
    case 8: return "avx2 (8 lanes)";
    default: return "sse2 (4 lanes)";
  }
}

}  // namespace memc::cpu
