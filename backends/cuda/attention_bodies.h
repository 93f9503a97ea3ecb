// memc's own CUDA attention (the fallback where cuDNN's SDPA does not apply, e.g. f32): one
// thread per query row keeps an online softmax over the keys (a running max and sum, as the CPU
// kernel's blocks do), so no [Tq, Tk] matrix exists. The backward is three passes without
// atomics: per query row its log-sum-exp and D = Σ P∘dP (stats), then dq per query row, then
// dk and dv per key row, each recomputing the scores it needs. A bias gradient, when asked for,
// accumulates per score into an f32 buffer. Bodies as in backends/cuda/bodies.h: host-testable.
#pragma once
#include "backends/cuda/bodies.h"

namespace memc::cuda {

constexpr int64_t kMaxHeadDim = 256;  // per-thread accumulators (d and dv)

// Where batch entry b's matrices sit, how bias broadcasts, and the dropout draws: the CPU
// kernel's geometry (backends/cpu/attention.cc), flattened for a device. The operands may be in
// any of ir/attention_layout.h's layouts: an entry's matrix starts at its map's offset and its
// rows are a row step apart (the row's elements contiguous). y and dy (and dq, dk, dv beside q,
// k, v) share a layout.
struct AttentionGeometry {
  int64_t batch = 0, tq = 0, tk = 0, d = 0, dv = 0;
  Strided q_map, k_map, v_map, y_map;  // flat batch index → element offset of its matrix
  int64_t q_row = 0, k_row = 0, v_row = 0, y_row = 0;  // elements between consecutive rows
  const void* bias = nullptr;   // any float dtype (a mask often stays f32 under bf16)
  DType bias_dtype = DType::kF32;
  Strided bias_map;             // flat batch index → bias element of its score [0, 0]
  int64_t bias_row = 0, bias_col = 0;
  float scale = 1.f;
  bool dropout = false;
  uint64_t seed = 0, threshold = 0, offset = 0;
  DrawStream stream;
  float inv_keep = 1.f;

  // dropout(softmax)'s factor of score (b, r, c): the draw (b·Tq + r)·Tk + c of the CPU kernel.
  MEMC_HD float factor(int64_t b, int64_t r, int64_t c) const {
    if (!dropout) return 1.f;
    const uint64_t index = offset + static_cast<uint64_t>((b * tq + r) * tk + c);
    return counter_random(seed, stream.get(), index) < threshold ? inv_keep : 0.f;
  }
  // scale·q_r·k_c + bias, the dot product in f64 (the softmax and its gradient cancel terms).
  template <typename T>
  MEMC_HD float score(const T* q, const T* k, int64_t b, int64_t r, int64_t c) const {
    const T* qr = q + q_map.offset(b) + r * q_row;
    const T* kc = k + k_map.offset(b) + c * k_row;
    double s = 0;
    for (int64_t j = 0; j < d; ++j) s += static_cast<double>(ld(qr, j)) * ld(kc, j);
    s *= scale;
    if (bias) s += ld_double(bias, bias_dtype, bias_map.offset(b) + r * bias_row + c * bias_col);
    return static_cast<float>(s);
  }
  // dy_r · v_c
  template <typename T>
  MEMC_HD float dy_dot_v(const T* dy, const T* v, int64_t b, int64_t r, int64_t c) const {
    const T* dyr = dy + y_map.offset(b) + r * y_row;
    const T* vc = v + v_map.offset(b) + c * v_row;
    double s = 0;
    for (int64_t j = 0; j < dv; ++j) s += static_cast<double>(ld(dyr, j)) * ld(vc, j);
    return static_cast<float>(s);
  }
};

// y row (b, r) = Σ_c softmax(s)_c·f_c·v_c with a running max m and sum l.
template <typename T>
struct AttentionRow {
  const T *q, *k, *v;
  T* y;
  AttentionGeometry g;
  MEMC_HD void operator()(int64_t row) const {
    const int64_t b = row / g.tq, r = row % g.tq;
    float acc[kMaxHeadDim];
    for (int64_t j = 0; j < g.dv; ++j) acc[j] = 0.f;
    float m = -INFINITY, l = 0.f;
    const T* vb = v + g.v_map.offset(b);
    for (int64_t c = 0; c < g.tk; ++c) {
      const float s = g.score(q, k, b, r, c);
      const float m_new = fmaxf(m, s);
      if (m_new == -INFINITY) continue;  // every score so far masked out
      const float correction = std::exp(m - m_new), p = std::exp(s - m_new);
      l = l * correction + p;
      const float w = p * g.factor(b, r, c);
      for (int64_t j = 0; j < g.dv; ++j) acc[j] = acc[j] * correction + w * ld(vb, c * g.v_row + j);
      m = m_new;
    }
    T* out = y + g.y_map.offset(b) + r * g.y_row;
    for (int64_t j = 0; j < g.dv; ++j) st(out, j, acc[j] / l);
  }
};

// Per query row: stats[2·row] = log-sum-exp of its scores (an online pass, as the forward's),
// stats[2·row + 1] = D = Σ_c P_c·dP_c where dP_c = f_c·(dy·v_c) is the gradient of P_c.
template <typename T>
struct AttentionGradStats {
  const T *dy, *q, *k, *v;
  float* stats;
  AttentionGeometry g;
  MEMC_HD void operator()(int64_t row) const {
    const int64_t b = row / g.tq, r = row % g.tq;
    float m = -INFINITY, l = 0.f;  // the running max and sum, one pass over the keys
    for (int64_t c = 0; c < g.tk; ++c) {
      const float s = g.score(q, k, b, r, c), m_new = fmaxf(m, s);
      if (m_new == -INFINITY) continue;
      l = l * std::exp(m - m_new) + std::exp(s - m_new);
      m = m_new;
    }
    const float lse = m + std::log(l);
    float d_sum = 0.f;
    for (int64_t c = 0; c < g.tk; ++c) {
      const float p = std::exp(g.score(q, k, b, r, c) - lse);
      d_sum += p * g.factor(b, r, c) * g.dy_dot_v(dy, v, b, r, c);
    }
    stats[2 * row] = lse, stats[2 * row + 1] = d_sum;
  }
};

// The score gradient dS = P·(dP - D) of (b, r, c), from the row's stats.
template <typename T>
MEMC_HD float attention_dscore(const AttentionGeometry& g, const T* dy, const T* q, const T* k, const T* v, const float* stats, int64_t b, int64_t r, int64_t c, float* p_out) {
  const int64_t row = b * g.tq + r;
  const float p = std::exp(g.score(q, k, b, r, c) - stats[2 * row]);
  const float f = g.factor(b, r, c);
  if (p_out) *p_out = p * f;
  return p * (f * g.dy_dot_v(dy, v, b, r, c) - stats[2 * row + 1]);
}

// dq row (b, r) = scale·Σ_c dS_c·k_c.
template <typename T>
struct AttentionGradQ {
  const T *dy, *q, *k, *v;
  const float* stats;
  T* dq;
  AttentionGeometry g;
  MEMC_HD void operator()(int64_t row) const {
    const int64_t b = row / g.tq, r = row % g.tq;
    float acc[kMaxHeadDim];
    for (int64_t j = 0; j < g.d; ++j) acc[j] = 0.f;
    const T* kb = k + g.k_map.offset(b);
    for (int64_t c = 0; c < g.tk; ++c) {
      const float ds = attention_dscore(g, dy, q, k, v, stats, b, r, c, nullptr);
      for (int64_t j = 0; j < g.d; ++j) acc[j] += ds * ld(kb, c * g.k_row + j);
    }
    T* out = dq + g.q_map.offset(b) + r * g.q_row;
    for (int64_t j = 0; j < g.d; ++j) st(out, j, g.scale * acc[j]);
  }
};

// dk and dv of key row (b, c): dv = Σ_r P_r·f_r·dy_r, dk = scale·Σ_r dS_r·q_r. Needs every batch
// entry to own its k and v (the op refuses broadcast k/v), so no two threads share a row.
template <typename T>
struct AttentionGradKV {
  const T *dy, *q, *k, *v;
  const float* stats;
  T *dk, *dv;
  AttentionGeometry g;
  MEMC_HD void operator()(int64_t key_row) const {
    const int64_t b = key_row / g.tk, c = key_row % g.tk;
    float acc_k[kMaxHeadDim], acc_v[kMaxHeadDim];
    for (int64_t j = 0; j < g.d; ++j) acc_k[j] = 0.f;
    for (int64_t j = 0; j < g.dv; ++j) acc_v[j] = 0.f;
    const T* qb = q + g.q_map.offset(b);
    for (int64_t r = 0; r < g.tq; ++r) {
      float pf = 0.f;
      const float ds = attention_dscore(g, dy, q, k, v, stats, b, r, c, &pf);
      const T* dyr = dy + g.y_map.offset(b) + r * g.y_row;
      for (int64_t j = 0; j < g.dv; ++j) acc_v[j] += pf * ld(dyr, j);
      for (int64_t j = 0; j < g.d; ++j) acc_k[j] += ds * ld(qb, r * g.q_row + j);
    }
    T* out_k = dk + g.k_map.offset(b) + c * g.k_row;
    T* out_v = dv + g.v_map.offset(b) + c * g.v_row;
    for (int64_t j = 0; j < g.d; ++j) st(out_k, j, g.scale * acc_k[j]);
    for (int64_t j = 0; j < g.dv; ++j) st(out_v, j, acc_v[j]);
  }
};

// dbias: each score's dS added into the f32 accumulator at its bias element (broadcast bias
// sums over the dims it lacks).
template <typename T>
struct AttentionGradBias {
  const T *dy, *q, *k, *v;
  const float* stats;
  float* acc;
  AttentionGeometry g;
  MEMC_HD void operator()(int64_t i) const {
    const int64_t c = i % g.tk, r = (i / g.tk) % g.tq, b = i / (g.tk * g.tq);
    const float ds = attention_dscore(g, dy, q, k, v, stats, b, r, c, nullptr);
    accumulate(acc + g.bias_map.offset(b) + r * g.bias_row + c * g.bias_col, ds);
  }
};

// ---- attention through GEMMs (f32) ---------------------------------------------------------------
// Where cuDNN does not take a shape (f32 above all), attention runs as batched cuBLASLt products
// over a chunk of batch entries at a time, the score matrices [entries, Tq, Tk] (f32) in the
// node's planned scratch (backends/cuda/ops_conv_attention.h):
//   forward   S = Q·Kᵀ; P̃ = softmax(scale·S + bias)∘F (ScoreSoftmax); Y = P̃·V
//   backward  S = Q·Kᵀ; P = softmax(scale·S + bias) (ScoreSoftmax, no F); G = dY·Vᵀ; per row
//             D = Σ P∘F∘G, then dS = scale·P∘(F∘G − D) over G and P̃ = P∘F over P (ScoreGrad);
//             dV = P̃ᵀ·dY, dQ = dS·K, dK = dSᵀ·Q
// F is dropout's factor, the same draws as the CPU kernel's (1 without dropout). On a device a
// warp takes a row (backends/cuda/kernels.cu); the bodies' operator() is the one-thread form
// the host runner runs. The softmax's max and sum are f32 (PyTorch's are too).
constexpr int64_t kScoreChunkBytes = int64_t{256} << 20;  // one chunk's score matrices, at most

// Batch entries per chunk: as many as fit kScoreChunkBytes, 0 when one entry's scores do not
// (then memc's row kernel runs, which keeps no score matrix).
inline int64_t attention_chunk(int64_t batch, int64_t tq, int64_t tk) {
  const int64_t entry = tq * tk * 4;
  if (batch <= 0 || entry <= 0 || entry > kScoreChunkBytes) return 0;
  return batch < kScoreChunkBytes / entry ? batch : kScoreChunkBytes / entry;
}

struct ScoreSoftmax {
  float* s;             // [rows, Tk]: Q·Kᵀ in, probabilities out
  AttentionGeometry g;
  int64_t first = 0;    // the chunk's first batch entry
  bool dropout = false;  // multiply by F (the forward)
  MEMC_HD int64_t cols() const { return g.tk; }
  MEMC_HD float logit(int64_t row, int64_t c) const {
    float x = s[row * g.tk + c] * g.scale;
    if (g.bias) {
      const int64_t b = first + row / g.tq, r = row % g.tq;
      x += static_cast<float>(ld_double(g.bias, g.bias_dtype, g.bias_map.offset(b) + r * g.bias_row + c * g.bias_col));
    }
    return x;
  }
  // p = e^(x − m)/Σ, times F when asked.
  MEMC_HD void store(int64_t row, int64_t c, float m, float inv_sum) const {
    const float f = dropout ? g.factor(first + row / g.tq, row % g.tq, c) : 1.f;
    s[row * g.tk + c] = std::exp(logit(row, c) - m) * inv_sum * f;
  }
  MEMC_HD void operator()(int64_t row) const {
    float m = -INFINITY;
    for (int64_t c = 0; c < g.tk; ++c) m = fmaxf(m, logit(row, c));
    if (m == -INFINITY) m = 0;  // a row masked everywhere: 0/0, NaN, as on the CPU
    float sum = 0.f;
    for (int64_t c = 0; c < g.tk; ++c) sum += std::exp(logit(row, c) - m);
    const float inv_sum = 1.f / sum;
    for (int64_t c = 0; c < g.tk; ++c) store(row, c, m, inv_sum);
  }
};

struct ScoreGrad {
  float* p;             // [rows, Tk]: P in, P∘F out
  float* grad;          // [rows, Tk]: G = dY·Vᵀ in, dS out
  AttentionGeometry g;
  int64_t first = 0;
  MEMC_HD int64_t cols() const { return g.tk; }
  MEMC_HD float factor(int64_t row, int64_t c) const { return g.factor(first + row / g.tq, row % g.tq, c); }
  MEMC_HD float term(int64_t row, int64_t c) const {
    const int64_t i = row * g.tk + c;
    return p[i] * factor(row, c) * grad[i];
  }
  MEMC_HD void store(int64_t row, int64_t c, float d) const {
    const int64_t i = row * g.tk + c;
    const float f = factor(row, c), pi = p[i];
    grad[i] = g.scale * pi * (f * grad[i] - d);
    p[i] = pi * f;
  }
  MEMC_HD void operator()(int64_t row) const {
    float d = 0.f;
    for (int64_t c = 0; c < g.tk; ++c) d += term(row, c);
    for (int64_t c = 0; c < g.tk; ++c) store(row, c, d);
  }
};

}  // namespace memc::cuda
