// GELU and its derivative over a chunk of floats, erf or tanh through the vector math: the gelu
// and gelu_grad kernels and fused_elementwise's steps run these same loops, so a fused step
// equals its op's own kernel bit for bit.
#pragma once
#include <cstdint>

#include "backends/cpu/vector_math.h"

namespace memc::cpu {

// x[i] = gelu(x[i]) for i < n ≤ kVectorChunk.
inline void gelu_floats(float* x, int64_t n, bool tanh_form) {
  float t[kVectorChunk];
  if (tanh_form) {  // one loop per form, without a branch inside, so GCC vectorizes it
    for (int64_t i = 0; i < n; ++i) t[i] = 0.7978845608028654f * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    tanh_in_place(t, n);
  } else {
    for (int64_t i = 0; i < n; ++i) t[i] = x[i] * 0.7071067811865476f;
    erf_in_place(t, n);
  }
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + t[i]);
}

// v[i] = gelu'(v[i]) for i < n ≤ kVectorChunk: Φ(x) + x·φ(x), or the tanh form's derivative.
inline void gelu_derivative_floats(float* v, int64_t n, bool tanh_form) {
  constexpr float k = 0.7978845608028654f, a = 0.044715f;
  float t[kVectorChunk], e[kVectorChunk];
  if (tanh_form) {
    for (int64_t j = 0; j < n; ++j) t[j] = k * (v[j] + a * v[j] * v[j] * v[j]);
    tanh_in_place(t, n);
    for (int64_t j = 0; j < n; ++j) v[j] = 0.5f * (1.0f + t[j]) + 0.5f * v[j] * (1.0f - t[j] * t[j]) * k * (1.0f + 3.0f * a * v[j] * v[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) {
      t[j] = v[j] * 0.7071067811865476f;
      e[j] = -0.5f * v[j] * v[j];
    }
    erf_in_place(t, n);
    exp_in_place(e, n);
    for (int64_t j = 0; j < n; ++j) v[j] = 0.5f * (1.0f + t[j]) + v[j] * e[j] * 0.3989422804014327f;
  }
}

}  // namespace memc::cpu
