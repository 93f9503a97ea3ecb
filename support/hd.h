// Functions compiled for both the host and CUDA devices (`MEMC_HD`): the kernel math the CPU and
// CUDA backends share (support/float16.h, backends/kernel_math.h), so the CPU tests cover it.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MEMC_HD __host__ __device__
#else
#define MEMC_HD
#endif

namespace memc {

MEMC_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
#endif
}

MEMC_HD inline float bits_float(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(x);
#else
  float f;
  std::memcpy(&f, &x, 4);
  return f;
#endif
}

}  // namespace memc
