// Kernel math shared by the CPU and CUDA backends (support/hd.h): the counter-based RNG and
// dropout's draws, GELU and its derivative, and the Adam(W) update of one element. The CPU
// kernels call these, so every CPU test covers what the CUDA kernels compute.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "support/hd.h"

namespace memc {

// Counter-based RNG (SplitMix64 over a combined counter): the same (seed, stream, index) gives
// the same bits on every run, every recomputation and every backend. It is two steps, so a loop
// over indices computes the key once and its draws vectorize (no 64-bit multiply of the key
// per element): counter_random(seed, stream, i) == counter_draw(counter_key(seed, stream), i).
MEMC_HD inline uint64_t counter_key(uint64_t seed, uint64_t stream) {
  return seed * 0x9E3779B97F4A7C15ull ^ (stream + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
}
MEMC_HD inline uint32_t counter_draw(uint64_t key, uint64_t index) {
  uint64_t z = (key ^ index) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 16);
}
MEMC_HD inline uint32_t counter_random(uint64_t seed, uint64_t stream, uint64_t index) {
  return counter_draw(counter_key(seed, stream), index);
}

// Dropout keeps an element when its counter-RNG draw falls below (1 - ratio)·2³²; the stream
// mixes the node's "seed" attribute with the step so masks differ across steps but a
// recomputation in the same step reproduces them.
MEMC_HD inline uint64_t dropout_stream(int64_t node_seed, int64_t step) {
  return static_cast<uint64_t>(node_seed) * 0xD1B54A32D192ED03ull ^ (static_cast<uint64_t>(step) + 0x8CB92BA72F3D8DD7ull);
}
MEMC_HD inline uint64_t dropout_threshold(double ratio) { return static_cast<uint64_t>((1.0 - ratio) * 4294967296.0); }

// GELU: x·Φ(x), or 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in the tanh form.
template <typename C>
MEMC_HD C gelu(C x, bool tanh_form) {
  if (tanh_form) return C(0.5) * x * (C(1) + std::tanh(C(0.7978845608028654) * (x + C(0.044715) * x * x * x)));
  return C(0.5) * x * (C(1) + std::erf(x * C(0.7071067811865476)));
}

// gelu'(x) = Φ(x) + x·φ(x), or the derivative of the tanh form.
template <typename C>
MEMC_HD C gelu_derivative(C x, bool tanh_form) {
  const C k = C(0.7978845608028654), a = C(0.044715);
  if (tanh_form) {
    const C t = std::tanh(k * (x + a * x * x * x));
    return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k * (C(1) + C(3) * a * x * x);
  }
  return C(0.5) * (C(1) + std::erf(x * C(0.7071067811865476))) + x * std::exp(C(-0.5) * x * x) * C(0.3989422804014327);
}

// torch.optim.Adam (L2: g ← g + λw) or AdamW (decoupled: w ← w·(1 - lr·λ)), then
// m ← β1·m + (1-β1)·g; v ← β2·v + (1-β2)·g²; w ← w - (lr/(1-β1ᵗ))·m / (√v/√(1-β2ᵗ) + ε).
struct AdamStep {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, lr = 0;
  bool decoupled = false;
  double bc2_sqrt = 1, step_size = 0;  // √(1-β2ᵗ) and lr/(1-β1ᵗ)

  MEMC_HD void set_step(double t) {
    bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, t));
    step_size = lr / (1.0 - std::pow(beta1, t));
  }
  // The step's factors, rounded once to the compute type C. A loop over many elements copies
  // them into locals and calls update<kDecoupled>: then GCC keeps them in registers and
  // vectorizes the loop (through `this` it reloads them after every store, since an output
  // might alias them, and tests `decoupled` per element).
  template <typename C>
  struct Factors {
    C decay, weight_decay, beta1, rest1, beta2, rest2, bc2_sqrt, eps, step_size;
  };
  template <typename C>
  MEMC_HD Factors<C> factors() const {
    return {static_cast<C>(1.0 - lr * weight_decay), static_cast<C>(weight_decay), static_cast<C>(beta1), static_cast<C>(1.0 - beta1),
            static_cast<C>(beta2), static_cast<C>(1.0 - beta2), static_cast<C>(bc2_sqrt), static_cast<C>(eps), static_cast<C>(step_size)};
  }
  // Updates one element in the compute type C; w, m and v are read and written.
  template <bool kDecoupled, typename C>
  MEMC_HD static void update(const Factors<C>& f, C& w, C g, C& m, C& v) {
    if constexpr (kDecoupled) w *= f.decay;
    else g += f.weight_decay * w;
    m = f.beta1 * m + f.rest1 * g;
    v = f.beta2 * v + f.rest2 * g * g;
    const C denom = std::sqrt(v) / f.bc2_sqrt + f.eps;
    w = w - f.step_size * m / denom;
  }
  template <typename C>
  MEMC_HD void apply(C& w, C g, C& m, C& v) const {
    if (decoupled) update<true>(factors<C>(), w, g, m, v);
    else update<false>(factors<C>(), w, g, m, v);
  }
};

// 8-bit codes of a dynamic quantization map (after Dettmers et al., "8-bit optimizers via
// block-wise quantization"): a value normalized by its block's absolute maximum is coded by
// decade (1e-6 … 1) and a linear fraction within the decade, with more fraction steps for the
// larger decades, so small moments keep relative precision. Code 0 is 0 (zero-filled state
// decodes to zero). Signed: 127 magnitudes per sign; unsigned: 254 magnitudes. Plain data, so a
// device kernel reads it from device memory.
struct QuantMap {
  float value[256] = {};         // by code
  float sorted_value[256] = {};  // ascending, with their codes
  uint8_t sorted_code[256] = {};
  int count = 0;

  static QuantMap dynamic(bool is_signed) {
    QuantMap map;
    std::vector<float> magnitudes;
    for (int d = 0; d < 7; ++d) {  // decade 10^(d-6): fractions (0.1, 1] in 2^d (signed) or 2^(d+1) steps
      const int steps = is_signed ? (1 << d) : (2 << d);
      const double scale = std::pow(10.0, d - 6);
      for (int k = 1; k <= steps; ++k) magnitudes.push_back(static_cast<float>(scale * (0.1 + 0.9 * k / steps)));
    }
    int code = 1;
    for (float m : magnitudes) {
      map.value[code++] = m;
      if (is_signed) map.value[code++] = -m;
      if (code > 255) break;
    }
    std::vector<std::pair<float, uint8_t>> sorted;
    for (int c = 0; c < code; ++c) sorted.push_back({map.value[c], static_cast<uint8_t>(c)});
    std::sort(sorted.begin(), sorted.end());
    map.count = code;
    for (int i = 0; i < code; ++i) map.sorted_value[i] = sorted[i].first, map.sorted_code[i] = sorted[i].second;
    return map;
  }
  // The code of the nearest value (the lower one on a tie).
  MEMC_HD uint8_t encode(float x) const {
    // The first sorted value ≥ x is found by halving without a branch on the data: the loop
    // runs log2(count) times whatever x is, and each step's choice is a select. A branching
    // search mispredicted about half its steps and cost ≈ 140 ns per element on a Xeon
    // (bench/journal/2026.md §34).
    int lo = 0;
    for (int n = count; n > 1;) {
      const int half = n / 2;
      lo = sorted_value[lo + half] < x ? lo + half : lo;
      n -= half;
    }
    return nearest(lo, x);
  }
  // The code of the nearest value, from where the halving ended (`last`: the first sorted value
  // ≥ x is there or right after it): the nearer of the two sorted values around x.
  MEMC_HD uint8_t nearest(int last, float x) const {
    const int lo = last + (sorted_value[last] < x ? 1 : 0);  // the first sorted value ≥ x, or count
    if (lo == count) return sorted_code[count - 1];
    if (lo == 0) return sorted_code[0];
    return (x - sorted_value[lo - 1]) <= (sorted_value[lo] - x) ? sorted_code[lo - 1] : sorted_code[lo];
  }
};

// QuantMap's encode for many values on the host, by a table instead of the halving: floats that
// share their top 16 bits (sign, exponent, 7 mantissa bits) share the first sorted value ≥ the
// smallest of them, so each value starts there and steps past the sorted values below it: at
// most as many as one bucket holds (steps(); the dynamic maps: 2). Then `nearest` as encode:
// the same codes, NaN included.
// The halving took 8 dependent loads per value, ~50 ns on a Xeon even 16 values in lockstep
// (bench/journal/2026.md §34, §57); the table is 128 KiB.
class QuantIndex {
 public:
  explicit QuantIndex(const QuantMap& map) : map_(map), first_(size_t{1} << 16) {
    std::fill(std::begin(padded_), std::end(padded_), INFINITY);  // past the last value: never below x
    std::copy(map.sorted_value, map.sorted_value + map.count, padded_);
    for (uint32_t key = 0; key < (1u << 16); ++key) {
      // The bucket's smallest and largest floats: the low bits clear and set for a positive
      // sign, set and clear for a negative one.
      const bool negative = key & 0x8000u;
      const float least = from_bits(key << 16 | (negative ? 0xFFFFu : 0u)), most = from_bits(key << 16 | (negative ? 0u : 0xFFFFu));
      int i = 0, inside = 0;
      while (i < map.count && map.sorted_value[i] < least) ++i;
      for (int j = i; j < map.count && map.sorted_value[j] <= most; ++j) ++inside;
      first_[key] = static_cast<uint16_t>(i);
      steps_ = std::max(steps_, inside);
    }
  }
  uint8_t encode(float x) const {
    if (x != x) return map_.nearest(0, x);  // NaN: where the halving ends (an infinity's bucket holds NaNs too)
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    int first = first_[bits >> 16];
    while (padded_[first] < x) ++first;  // steps() at most; +∞ ends it
    return map_.nearest(first > 0 ? first - 1 : 0, x);
  }
  void encode_many(const float* x, uint8_t* out, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) out[i] = encode(x[i]);
  }
  int steps() const { return steps_; }  // the most sorted values one bucket holds

 private:
  static float from_bits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  QuantMap map_;
  std::vector<uint16_t> first_;  // by a float's top 16 bits: the first sorted value ≥ any float there
  float padded_[256 + 8];        // the sorted values, then +∞ (a scan never runs past the end)
  int steps_ = 0;
};

// torch.topk's and torch.sort's order: does value va at position a come before vb at b? The
// largest first (the smallest unless `largest`), NaN the largest, ties to the lower position.
template <typename V>
MEMC_HD inline bool topk_before(V va, int64_t a, V vb, int64_t b, bool largest) {
  const bool nan_a = va != va, nan_b = vb != vb;
  if (nan_a || nan_b) return nan_a == nan_b ? a < b : (largest ? nan_a : nan_b);
  if (va != vb) return largest ? va > vb : va < vb;
  return a < b;
}

}  // namespace memc
