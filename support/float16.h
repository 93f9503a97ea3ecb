// 16-bit float conversions with round-to-nearest-even, one definition for the host and CUDA
// devices (support/hd.h): the CPU and CUDA backends round bit for bit alike.
#pragma once
#include <cmath>
#include <cstdint>

#include "support/hd.h"

namespace memc {

// Branch-free (a select, not a branch, for NaN), so loops over bf16 vectorize.
MEMC_HD inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

MEMC_HD inline float bf16_to_f32(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

MEMC_HD inline uint16_t f32_to_f16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past max half
  if (abs < 0x38800000u) {  // subnormal half (or zero): scale into integer and round
    // 2^24 maps the smallest subnormal half to 1; rintf rounds half to even.
    const auto mant = static_cast<uint32_t>(rintf(bits_float(abs) * 16777216.0f));
    return static_cast<uint16_t>(sign | mant);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits, nearest even.
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

MEMC_HD inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    return bits_float(float_bits(static_cast<float>(mant) * 5.9604644775390625e-8f) | sign);  // subnormal: mant·2⁻²⁴
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace memc
