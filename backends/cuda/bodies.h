// The CUDA backend's kernel bodies: what one thread computes for one index (an element, a row,
// a column). Each is a plain struct of device pointers and sizes with a `MEMC_HD` call
// operator, so the same code runs as a CUDA grid (backends/cuda/kernels.cu) and as a host loop
// (tests/cuda/ops_host_test.cc, which checks every op against the CPU backend without a GPU).
// Storage: f32, bf16 and f16 compute in f32 and round to nearest even (support/float16.h), as
// the CPU backend does; sums that the CPU keeps in f64 are f64 here too.
#pragma once
#include <cmath>
#include <cstdint>
#include <span>

#include "backends/kernel_math.h"
#include "ir/dtype.h"
#include "support/float16.h"
#include "support/hd.h"

namespace memc::cuda {

// ---- element access ---------------------------------------------------------------------------
MEMC_HD inline float ld(const float* p, int64_t i) { return p[i]; }
MEMC_HD inline float ld(const bf16_t* p, int64_t i) { return bf16_to_f32(p[i].bits); }
MEMC_HD inline float ld(const f16_t* p, int64_t i) { return f16_to_f32(p[i].bits); }
MEMC_HD inline void st(float* p, int64_t i, float v) { p[i] = v; }
MEMC_HD inline void st(bf16_t* p, int64_t i, float v) { p[i].bits = f32_to_bf16(v); }
MEMC_HD inline void st(f16_t* p, int64_t i, float v) { p[i].bits = f32_to_f16(v); }

// Any dtype read as a double and written from one, as the CPU's cast converts: float → integer
// saturates (NaN → 0), → bool is "≠ 0", 16-bit floats round from f32.
MEMC_HD inline double ld_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return f16_to_f32(static_cast<const f16_t*>(p)[i].bits);
    case DType::kBF16: return bf16_to_f32(static_cast<const bf16_t*>(p)[i].bits);
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kBool: return static_cast<const uint8_t*>(p)[i] ? 1.0 : 0.0;
    case DType::kU8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}
template <typename I>
MEMC_HD I saturate(double x, double lo, double hi) {
  if (x != x) return I(0);
  return x <= lo ? static_cast<I>(lo) : x >= hi ? static_cast<I>(hi) : static_cast<I>(x);
}
MEMC_HD inline void st_double(void* p, DType t, int64_t i, double x) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(x); return;
    case DType::kF16: static_cast<f16_t*>(p)[i].bits = f32_to_f16(static_cast<float>(x)); return;
    case DType::kBF16: static_cast<bf16_t*>(p)[i].bits = f32_to_bf16(static_cast<float>(x)); return;
    case DType::kF64: static_cast<double*>(p)[i] = x; return;
    case DType::kI64: static_cast<int64_t*>(p)[i] = saturate<int64_t>(x, -9223372036854775808.0, 9223372036854775807.0); return;
    case DType::kI32: static_cast<int32_t*>(p)[i] = saturate<int32_t>(x, -2147483648.0, 2147483647.0); return;
    case DType::kBool: static_cast<uint8_t*>(p)[i] = x != 0; return;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = saturate<uint8_t>(x, 0.0, 255.0); return;
  }
}
// An index tensor's element (i64 or i32), negative values wrapped by `dim`.
MEMC_HD inline int64_t ld_index(const void* p, bool wide, int64_t i, int64_t dim) {
  const int64_t v = wide ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
  return v < 0 ? v + dim : v;
}

// Float accumulation that other threads may share: atomic on a device, plain on the host.
MEMC_HD inline void accumulate(float* p, float v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}

// ---- index maps -------------------------------------------------------------------------------
constexpr int kMaxDims = 8;

// The offset of the i-th row-major position of `dims` under per-dim element strides (0 along
// broadcast dims): transposes, slices, expands and broadcasts are all one of these.
// Element i (row-major over dims, i < their product) at offset(i). The outermost dim takes what
// is left of i without a division: 64-bit divisions are most of an elementwise kernel's work on
// a GPU, so ops coalesce their maps first (coalesce()) and a contiguous map costs none.
struct Strided {
  int rank = 0;
  // Every element index and offset below 2³¹ (set by the ops' strided()): the divisions are then
  // 32-bit, several times cheaper than 64-bit ones on a GPU.
  bool narrow = false;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  MEMC_HD int64_t offset(int64_t i) const {
    if (narrow) {
      uint32_t j = static_cast<uint32_t>(i), off = 0;
      for (int d = rank - 1; d > 0; --d) {
        const uint32_t n = static_cast<uint32_t>(dims[d]);
        off += (j % n) * static_cast<uint32_t>(strides[d]);
        j /= n;
      }
      return rank > 0 ? off + j * static_cast<uint32_t>(strides[0]) : off;
    }
    int64_t off = 0;
    for (int d = rank - 1; d > 0; --d) {
      off += (i % dims[d]) * strides[d];
      i /= dims[d];
    }
    return rank > 0 ? off + i * strides[0] : off;
  }
};

// Maps over the same dims, rewritten over fewer: size-1 dims go, and a dim merges into the next
// inner one where every map steps through both as one (stride[d] = stride[d+1] · dims[d+1]).
// Every map's offset(i) is unchanged for every i.
inline void coalesce(Strided* const* maps, size_t count) {
  const std::span<Strided* const> all(maps, count);
  Strided& first = *maps[0];
  int rank = 0;
  for (int d = 0; d < first.rank; ++d) {
    if (first.dims[d] == 1) continue;
    bool merges = rank > 0;
    for (Strided* m : all) merges = merges && m->strides[rank - 1] == m->strides[d] * first.dims[d];
    for (Strided* m : all) {
      if (merges) {
        m->strides[rank - 1] = m->strides[d];
      } else {
        m->strides[rank] = m->strides[d];
      }
    }
    if (merges) {
      for (Strided* m : all) m->dims[rank - 1] *= first.dims[d];
    } else {
      for (Strided* m : all) m->dims[rank] = first.dims[d];
      ++rank;
    }
  }
  for (Strided* m : all) m->rank = rank;
}
template <size_t N>
void coalesce(Strided* const (&maps)[N]) { coalesce(maps, N); }

// ---- data movement ----------------------------------------------------------------------------
// E is an unsigned integer of the element's size: these bodies move bytes of any dtype.
template <typename E>
struct CopyStrided {
  const E* in;
  E* out;
  int64_t base;
  Strided src;
  MEMC_HD void operator()(int64_t i) const { out[i] = in[base + src.offset(i)]; }
};

// One input of a concat: [outer, chunk] elements into the output's [outer, out_chunk] at offset.
template <typename E>
struct ConcatPart {
  const E* in;
  E* out;
  int64_t chunk, out_chunk, offset;
  MEMC_HD void operator()(int64_t i) const { out[(i / chunk) * out_chunk + offset + i % chunk] = in[i]; }
};

// numpy take (gather): output element i of [outer, count, inner] reads data [outer, n, inner] at
// source(i), or -1 where its index is outside the dim (the CPU kernel rejects it; a device kernel
// cannot return an error mid-step, so the gather writes 0 and the scatter adds nothing).
struct TakeMap {
  const void* indices;
  bool wide_indices;
  int64_t n, count, inner;
  MEMC_HD int64_t source(int64_t i) const {
    const int64_t o = i / (count * inner), r = i % (count * inner);
    const int64_t k = ld_index(indices, wide_indices, r / inner, n);
    return (k < 0 || k >= n) ? -1 : (o * n + k) * inner + r % inner;
  }
};

// out[i] = data[map.source(i)] (0 where the source is -1), for gather and gather_elements.
template <typename E, class Map>
struct GatherBy {
  const E* data;
  E* out;
  Map map;
  MEMC_HD void operator()(int64_t i) const {
    const int64_t at = map.source(i);
    out[i] = at < 0 ? E(0) : data[at];
  }
};

// Their gradients: acc[map.source(i)] += dy[i] in f32 (acc zeroed first).
template <typename T, class Map>
struct ScatterAddBy {
  const T* dy;
  float* acc;
  Map map;
  MEMC_HD void operator()(int64_t i) const {
    const int64_t at = map.source(i);
    if (at >= 0) accumulate(acc + at, ld(dy, i));
  }
};

template <typename E>
struct Zero {
  E* out;
  MEMC_HD void operator()(int64_t i) const { out[i] = E(0); }
};

// The strided inverse of CopyStrided: out[base + dst.offset(i)] = in[i] (slice_grad's scatter into
// a zeroed dx).
template <typename E>
struct ScatterStrided {
  const E* in;
  E* out;
  int64_t base;
  Strided dst;
  MEMC_HD void operator()(int64_t i) const { out[base + dst.offset(i)] = in[i]; }
};

// gather_elements: element i of the index tensor reads data at i's coordinates with the axis
// coordinate replaced by its index. `index_dims` are the index tensor's dims, `data_strides` the
// data's row-major strides. -1 for an index outside the dim.
struct ElementsMap {
  const void* indices = nullptr;
  bool wide_indices = true;
  int rank = 0, axis = 0;
  int64_t index_dims[kMaxDims] = {}, data_strides[kMaxDims] = {};
  int64_t axis_dim = 0;
  MEMC_HD int64_t source(int64_t i) const {
    const int64_t index = ld_index(indices, wide_indices, i, axis_dim);
    if (index < 0 || index >= axis_dim) return -1;
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (d == axis ? index : i % index_dims[d]) * data_strides[d];
      i /= index_dims[d];
    }
    return off;
  }
};

// pad: each output coordinate's source along every dim (the CPU's pad_source): in range, or
// per mode constant (none: `value`), edge (clamped) or reflect (mirrored without the edge).
enum class PadMode : uint8_t { kConstant, kEdge, kReflect };
template <typename E>
struct Pad {
  const E* in;
  E* out;
  E value;
  PadMode mode;
  int rank;
  int64_t in_dims[kMaxDims], out_dims[kMaxDims], begin[kMaxDims];
  MEMC_HD void operator()(int64_t o) const {
    int64_t rest = o, offset = 0, stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t n = in_dims[d];
      int64_t i = rest % out_dims[d] - begin[d];
      rest /= out_dims[d];
      if (i < 0 || i >= n) {
        if (n == 0 || mode == PadMode::kConstant) {
          out[o] = value;
          return;
        }
        if (mode == PadMode::kEdge) {
          i = i < 0 ? 0 : n - 1;
        } else if (n == 1) {
          i = 0;
        } else {
          const int64_t period = 2 * (n - 1);
          i = ((i % period) + period) % period;
          if (i >= n) i = period - i;
        }
      }
      offset += i * stride;
      stride *= n;
    }
    out[o] = in[offset];
  }
};

// ---- elementwise ------------------------------------------------------------------------------
template <typename T>
struct Fill {
  T* out;
  float value;
  MEMC_HD void operator()(int64_t i) const { st(out, i, value); }
};

// A constant of any dtype (f64, integers, bool), converted as a cast would.
struct FillAny {
  void* out;
  DType dtype;
  double value;
  MEMC_HD void operator()(int64_t i) const { st_double(out, dtype, i, value); }
};

// out[i] = acc[i] rounded to T (an f32 accumulator's result in 16-bit storage).
template <typename T>
struct StoreF32 {
  const float* acc;
  T* out;
  MEMC_HD void operator()(int64_t i) const { st(out, i, acc[i]); }
};

struct Cast {
  const void* in;
  DType from;
  void* out;
  DType to;
  MEMC_HD void operator()(int64_t i) const { st_double(out, to, i, ld_double(in, from, i)); }
};
// Between the float storages (f32, bf16, f16) through f32, without Cast's dtype switches and f64:
// the same values (each source converts to f32 exactly).
template <typename From, typename To>
struct CastFloat {
  const From* in;
  To* out;
  MEMC_HD void operator()(int64_t i) const { st(out, i, ld(in, i)); }
};

enum class UnaryOp : uint8_t {
  kNeg, kAbs, kExp, kLog, kSqrt, kRsqrt, kReciprocal, kTanh, kSigmoid, kRelu, kErf, kGelu, kGeluTanh,
  kFloor, kCeil, kRound, kSin, kCos, kSoftplus, kSign, kLeakyRelu, kAsin, kAcos, kAtan,
};

// The CPU kernels' formulas (backends/cpu/elementwise.cc) in f32; `alpha` is leaky_relu's slope.
MEMC_HD inline float unary(UnaryOp op, float x, float alpha) {
  switch (op) {
    case UnaryOp::kFloor: return std::floor(x);
    case UnaryOp::kCeil: return std::ceil(x);
    case UnaryOp::kRound: return rintf(x);  // half to even
    case UnaryOp::kSin: return std::sin(x);
    case UnaryOp::kCos: return std::cos(x);
    case UnaryOp::kAsin: return std::asin(x);
    case UnaryOp::kAcos: return std::acos(x);
    case UnaryOp::kAtan: return std::atan(x);
    case UnaryOp::kSoftplus: return fmaxf(x, 0.f) + std::log1p(std::exp(-std::fabs(x)));
    case UnaryOp::kSign: return x != x ? x : static_cast<float>((0.f < x) - (x < 0.f));
    case UnaryOp::kLeakyRelu: return x >= 0.f ? x : alpha * x;
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kAbs: return std::fabs(x);
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kLog: return std::log(x);
    case UnaryOp::kSqrt: return std::sqrt(x);
    case UnaryOp::kRsqrt: return 1.f / std::sqrt(x);
    case UnaryOp::kReciprocal: return 1.f / x;
    case UnaryOp::kTanh: return std::tanh(x);
    case UnaryOp::kSigmoid: return 1.f / (1.f + std::exp(-x));
    case UnaryOp::kRelu: return x > 0.f ? x : (x != x ? x : 0.f);
    case UnaryOp::kErf: return std::erf(x);
    case UnaryOp::kGelu: return gelu<float>(x, false);
    case UnaryOp::kGeluTanh: return gelu<float>(x, true);
  }
  return x;
}

template <typename T>
struct Unary {
  const T* in;
  T* out;
  UnaryOp op;
  float alpha;
  MEMC_HD void operator()(int64_t i) const { st(out, i, unary(op, ld(in, i), alpha)); }
};

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin, kMod, kFmod };

// Python's remainder (the sign of b) or C's fmod (the sign of a), as the CPU's mod {fmod}.
MEMC_HD inline double remainder_of(double a, double b, bool c_fmod) {
  double r = std::fmod(a, b);
  if (!c_fmod && r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

MEMC_HD inline float binary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
    case BinaryOp::kPow: return std::pow(a, b);
    case BinaryOp::kMax: return (a > b || a != a) ? a : b;  // NaN propagates, as on the CPU
    case BinaryOp::kMin: return (a < b || a != a) ? a : b;
    case BinaryOp::kMod: return static_cast<float>(remainder_of(a, b, false));
    case BinaryOp::kFmod: return static_cast<float>(remainder_of(a, b, true));
  }
  return a;
}

// numpy-broadcast a ∘ b over the output's shape (sa, sb: each operand's strides over it).
template <typename T>
struct Binary {
  const T* a;
  const T* b;
  T* out;
  BinaryOp op;
  Strided sa, sb;
  MEMC_HD void operator()(int64_t i) const { st(out, i, binary(op, ld(a, sa.offset(i)), ld(b, sb.offset(i)))); }
};

// The same ops on integer dtypes, through doubles (exact below 2⁵³; a quotient truncates
// toward zero when stored, as integer division does).
struct BinaryAny {
  const void* a;
  const void* b;
  void* out;
  DType dtype;
  BinaryOp op;
  Strided sa, sb;
  MEMC_HD void operator()(int64_t i) const {
    const double x = ld_double(a, dtype, sa.offset(i)), y = ld_double(b, dtype, sb.offset(i));
    double r = 0;
    switch (op) {
      case BinaryOp::kAdd: r = x + y; break;
      case BinaryOp::kSub: r = x - y; break;
      case BinaryOp::kMul: r = x * y; break;
      case BinaryOp::kDiv: r = y != 0 ? x / y : 0; break;
      case BinaryOp::kPow: r = std::pow(x, y); break;
      case BinaryOp::kMax: r = x > y ? x : y; break;
      case BinaryOp::kMin: r = x < y ? x : y; break;
      case BinaryOp::kMod: r = y == -1 ? 0 : remainder_of(x, y, false); break;
      case BinaryOp::kFmod: r = y == -1 ? 0 : remainder_of(x, y, true); break;
    }
    st_double(out, dtype, i, r);
  }
};

enum class CompareOp : uint8_t { kEqual, kLess, kLessEqual, kGreater, kGreaterEqual, kAnd, kOr, kXor };

// Comparisons of any numeric dtype (read as doubles) and logical ops on i1, to i1.
struct Compare {
  const void* a;
  const void* b;
  DType dtype;
  uint8_t* out;
  CompareOp op;
  Strided sa, sb;
  MEMC_HD void operator()(int64_t i) const {
    const double x = ld_double(a, dtype, sa.offset(i)), y = ld_double(b, dtype, sb.offset(i));
    bool r = false;
    switch (op) {
      case CompareOp::kEqual: r = x == y; break;
      case CompareOp::kLess: r = x < y; break;
      case CompareOp::kLessEqual: r = x <= y; break;
      case CompareOp::kGreater: r = x > y; break;
      case CompareOp::kGreaterEqual: r = x >= y; break;
      case CompareOp::kAnd: r = x != 0 && y != 0; break;
      case CompareOp::kOr: r = x != 0 || y != 0; break;
      case CompareOp::kXor: r = (x != 0) != (y != 0); break;
    }
    out[i] = r;
  }
};

// where(cond, a, b), all broadcast to the output; E moves the bytes of any dtype.
template <typename E>
struct Where {
  const uint8_t* cond;
  const E* a;
  const E* b;
  E* out;
  Strided sc, sa, sb;
  MEMC_HD void operator()(int64_t i) const { out[i] = cond[sc.offset(i)] ? a[sa.offset(i)] : b[sb.offset(i)]; }
};

struct Not {
  const uint8_t* in;
  uint8_t* out;
  MEMC_HD void operator()(int64_t i) const { out[i] = !in[i]; }
};

// Training dropout: y = x·keep/(1 - ratio), keep = counter_random(seed, stream, offset + i) <
// threshold (backends/kernel_math.h): the CPU backend's masks, bit for bit.
// A random op's draw stream: dropout_stream(node seed, step), the step read from the run state
// in device memory when there is one (a replayed CUDA graph), else fixed at launch.
struct DrawStream {
  uint64_t fixed = 0;
  int64_t node_seed = 0;
  const int64_t* step = nullptr;
  MEMC_HD uint64_t get() const { return step ? dropout_stream(node_seed, *step) : fixed; }
};

template <typename T>
struct Dropout {
  const T* in;
  T* out;
  uint8_t* mask;  // optional
  uint64_t seed;
  DrawStream stream;
  uint64_t threshold, offset;
  float scale;
  MEMC_HD void operator()(int64_t i) const {
    const bool kept = counter_random(seed, stream.get(), offset + static_cast<uint64_t>(i)) < threshold;
    st(out, i, kept ? ld(in, i) * scale : 0.f);
    if (mask) mask[i] = kept;
  }
};

template <typename T>
struct GeluGrad {
  const T* dy;
  const T* x;
  T* dx;
  bool tanh_form;
  MEMC_HD void operator()(int64_t i) const { st(dx, i, ld(dy, i) * gelu_derivative<float>(ld(x, i), tanh_form)); }
};

// fused_elementwise (ir/fused_program.h): a chain of the elementwise bodies above, evaluated per
// output element in f32 registers. Each step is its op's own function (unary, binary, the
// comparisons, where, the f32 casts, gelu's derivative) and rounds to its dtype as that op's
// store does, so a fused node equals its unfused ops bit for bit. Inputs are read through their
// broadcast maps; every result is written at the element's own index.
constexpr int kFusedInputs = 8, kFusedSteps = 24, kFusedResults = 2, kFusedDropouts = 4;
enum class FusedKind : uint8_t { kUnary, kBinary, kCompare, kNot, kWhere, kCast, kGeluGrad, kDropout };
struct FusedCode {
  FusedKind kind = FusedKind::kCast;
  uint8_t op = 0;  // UnaryOp, BinaryOp or CompareOp; gelu_grad: 1 for the tanh form; dropout: its FusedDropout
  int8_t a = 0, b = 0, c = 0;  // operand slots
  DType dtype = DType::kF32;   // the step's result type, rounded to
  float alpha = 0.f;           // leaky_relu's slope
};
// A float storage or i1 element as f32 (i1: 0 or 1), and back (to i1: ≠ 0).
MEMC_HD inline float ld_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return bf16_to_f32(static_cast<const bf16_t*>(p)[i].bits);
    case DType::kF16: return f16_to_f32(static_cast<const f16_t*>(p)[i].bits);
    case DType::kBool: return static_cast<const uint8_t*>(p)[i] ? 1.f : 0.f;
    default: return static_cast<const float*>(p)[i];
  }
}
MEMC_HD inline float rounded(DType t, float v) {
  switch (t) {
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(v));
    case DType::kF16: return f16_to_f32(f32_to_f16(v));
    case DType::kBool: return v != 0.f ? 1.f : 0.f;
    default: return v;
  }
}
MEMC_HD inline void st_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kBF16: static_cast<bf16_t*>(p)[i].bits = f32_to_bf16(v); return;
    case DType::kF16: static_cast<f16_t*>(p)[i].bits = f32_to_f16(v); return;
    case DType::kBool: static_cast<uint8_t*>(p)[i] = v != 0.f; return;
    default: static_cast<float*>(p)[i] = v; return;
  }
}
MEMC_HD inline bool compare(CompareOp op, float x, float y) {
  switch (op) {
    case CompareOp::kEqual: return x == y;
    case CompareOp::kLess: return x < y;
    case CompareOp::kLessEqual: return x <= y;
    case CompareOp::kGreater: return x > y;
    case CompareOp::kGreaterEqual: return x >= y;
    case CompareOp::kAnd: return x != 0 && y != 0;
    case CompareOp::kOr: return x != 0 || y != 0;
    case CompareOp::kXor: return (x != 0) != (y != 0);
  }
  return false;
}
// A dropout step's draws, as Dropout's for the node it was (inference: threshold 2³², scale 1).
struct FusedDropout {
  uint64_t seed = 0;
  DrawStream stream;
  uint64_t threshold = 0, offset = 0;
  float scale = 1.f;
};
struct FusedElementwise {
  int inputs = 0, steps = 0, results = 0;
  FusedDropout dropout[kFusedDropouts];
  const void* in[kFusedInputs] = {};
  DType in_type[kFusedInputs] = {};
  Strided map[kFusedInputs];
  FusedCode step[kFusedSteps];
  void* out[kFusedResults] = {};
  int8_t result_slot[kFusedResults] = {};
  MEMC_HD float evaluate(const FusedCode& s, const float* v, int64_t i) const {
    switch (s.kind) {
      case FusedKind::kDropout: {
        const FusedDropout& d = dropout[s.op];
        return counter_random(d.seed, d.stream.get(), d.offset + static_cast<uint64_t>(i)) < d.threshold ? v[s.a] * d.scale : 0.f;
      }
      case FusedKind::kUnary: return unary(static_cast<UnaryOp>(s.op), v[s.a], s.alpha);
      case FusedKind::kBinary: return binary(static_cast<BinaryOp>(s.op), v[s.a], v[s.b]);
      case FusedKind::kCompare: return compare(static_cast<CompareOp>(s.op), v[s.a], v[s.b]) ? 1.f : 0.f;
      case FusedKind::kNot: return v[s.a] != 0.f ? 0.f : 1.f;
      case FusedKind::kWhere: return v[s.a] != 0.f ? v[s.b] : v[s.c];
      case FusedKind::kCast: return v[s.a];
      case FusedKind::kGeluGrad: return v[s.a] * gelu_derivative<float>(v[s.b], s.op != 0);
    }
    return 0.f;
  }
  MEMC_HD void operator()(int64_t i) const {
    float v[kFusedInputs + kFusedSteps];
    for (int k = 0; k < inputs; ++k) v[k] = ld_f32(in[k], in_type[k], map[k].offset(i));
    for (int s = 0; s < steps; ++s) v[inputs + s] = rounded(step[s].dtype, evaluate(step[s], v, i));
    for (int r = 0; r < results; ++r) {
      const FusedCode& last = step[result_slot[r] - inputs];
      st_f32(out[r], last.dtype, i, v[result_slot[r]]);
    }
  }
};

// A GEMM of integer (or f64) operands, which cuBLASLt does not take: one output element per
// thread, summed as doubles. Index arithmetic in exports (an einsum over positions) is tiny.
struct MatmulAny {
  const void* a;
  const void* b;
  void* y;
  DType dtype;
  int64_t m, n, k, stride_a, stride_b;
  bool trans_a, trans_b;
  MEMC_HD void operator()(int64_t i) const {
    const int64_t p = i / (m * n), row = (i / n) % m, col = i % n;
    double s = 0;
    for (int64_t q = 0; q < k; ++q) {
      s += ld_double(a, dtype, p * stride_a + (trans_a ? q * m + row : row * k + q)) *
           ld_double(b, dtype, p * stride_b + (trans_b ? col * k + q : q * n + col));
    }
    st_double(y, dtype, i, s);
  }
};

// ---- reductions -------------------------------------------------------------------------------
enum class ReduceOp : uint8_t { kSum, kMean, kMax, kMin, kProd, kSumSquare, kL2 };

// One output element: `kept` maps it to its first input element, `reduced` walks the reduced
// dims in row-major order (the CPU's order), accumulating in f64; any float dtype. The device
// runner splits a long reduction over a block's threads (start/take per element, merge of the
// partials, finish), in a fixed order: the same result every run.
struct Reduce {
  const void* in;
  void* out;
  DType dtype;
  ReduceOp op;
  Strided kept, reduced;
  int64_t count;  // elements per output
  MEMC_HD double start() const {
    return op == ReduceOp::kMax ? -INFINITY : op == ReduceOp::kMin ? INFINITY : op == ReduceOp::kProd ? 1.0 : 0.0;
  }
  // `acc` with element r of output o's run (at `base`, kept.offset(o)).
  MEMC_HD double take(double acc, int64_t base, int64_t r) const {
    const double x = ld_double(in, dtype, base + reduced.offset(r));
    return op == ReduceOp::kSumSquare || op == ReduceOp::kL2 ? acc + x * x : merge(acc, x);
  }
  // Two partial results (NaN wins a max or a min, as on the CPU).
  MEMC_HD double merge(double a, double b) const {
    if (op == ReduceOp::kMax) return (b > a || b != b) ? b : a;
    if (op == ReduceOp::kMin) return (b < a || b != b) ? b : a;
    if (op == ReduceOp::kProd) return a * b;
    return a + b;
  }
  MEMC_HD void finish(int64_t o, double acc) const {
    if (op == ReduceOp::kMean && count) acc /= static_cast<double>(count);
    if (op == ReduceOp::kL2) acc = std::sqrt(acc);
    st_double(out, dtype, o, acc);
  }
  MEMC_HD void operator()(int64_t o) const {
    const int64_t base = kept.offset(o);
    double acc = start();
    for (int64_t r = 0; r < count; ++r) acc = take(acc, base, r);
    finish(o, acc);
  }
};

// One line [outer, n, inner] → (o, j) of a softmax-family op or cumsum: element k is at
// o·n·inner + k·inner + j.
struct Lines {
  int64_t n = 1, inner = 1;
  MEMC_HD int64_t base(int64_t line) const { return (line / inner) * n * inner + line % inner; }
};

// Σ e^(x - m) along the line at `base`, in f64, with m its max (0 when every x is -inf, as on
// the CPU; 0/0 then gives NaN on both).
template <typename T>
MEMC_HD double exp_sum(const T* x, const Lines& lines, int64_t base, float& m) {
  m = -INFINITY;
  for (int64_t k = 0; k < lines.n; ++k) m = fmaxf(m, ld(x, base + k * lines.inner));
  if (m == -INFINITY) m = 0;
  double sum = 0;
  for (int64_t k = 0; k < lines.n; ++k) sum += std::exp(ld(x, base + k * lines.inner) - m);
  return sum;
}

// softmax along a line: e^(x - max) summed in f64, as the CPU (an all -inf line gives 0/0 = NaN
// on both).
template <typename T>
struct SoftmaxLine {
  const T* x;
  T* y;
  Lines lines;
  MEMC_HD void operator()(int64_t line) const {
    const int64_t base = lines.base(line), step = lines.inner;
    float m = 0;
    const double sum = exp_sum(x, lines, base, m);
    const float inv_sum = static_cast<float>(1.0 / sum);
    for (int64_t k = 0; k < lines.n; ++k) st(y, base + k * step, std::exp(ld(x, base + k * step) - m) * inv_sum);
  }
};

// dx = y·(dy - Σ dy·y) along a line.
template <typename T>
struct SoftmaxGradLine {
  const T* dy;
  const T* y;
  T* dx;
  Lines lines;
  MEMC_HD void operator()(int64_t line) const {
    const int64_t base = lines.base(line), step = lines.inner;
    float dot = 0;
    for (int64_t k = 0; k < lines.n; ++k) dot += ld(dy, base + k * step) * ld(y, base + k * step);
    for (int64_t k = 0; k < lines.n; ++k) {
      const int64_t i = base + k * step;
      st(dx, i, ld(y, i) * (ld(dy, i) - dot));
    }
  }
};

// log_softmax along a line: x - max - log Σ e^(x - max), the sum in f64.
template <typename T>
struct LogSoftmaxLine {
  const T* x;
  T* y;
  Lines lines;
  MEMC_HD void operator()(int64_t line) const {
    const int64_t base = lines.base(line), step = lines.inner;
    float m = 0;
    const float log_sum = static_cast<float>(std::log(exp_sum(x, lines, base, m)));
    for (int64_t k = 0; k < lines.n; ++k) st(y, base + k * step, ld(x, base + k * step) - m - log_sum);
  }
};

// dx = dy - e^y·Σ dy along a line (y = log_softmax(x)).
template <typename T>
struct LogSoftmaxGradLine {
  const T* dy;
  const T* y;
  T* dx;
  Lines lines;
  MEMC_HD void operator()(int64_t line) const {
    const int64_t base = lines.base(line), step = lines.inner;
    float sum = 0;
    for (int64_t k = 0; k < lines.n; ++k) sum += ld(dy, base + k * step);
    for (int64_t k = 0; k < lines.n; ++k) {
      const int64_t i = base + k * step;
      st(dx, i, ld(dy, i) - std::exp(ld(y, i)) * sum);
    }
  }
};

// argmax / argmin along a line, as the CPU: the first extreme (the last with select_last), NaN
// counting as the extreme.
struct ArgExtremeLine {
  const void* x;
  DType dtype;
  int64_t* y;
  Lines lines;
  bool is_max, select_last;
  MEMC_HD void operator()(int64_t line) const {
    const int64_t base = lines.base(line);
    double best = ld_double(x, dtype, base);
    int64_t best_index = 0;
    for (int64_t k = 1; k < lines.n; ++k) {
      const double value = ld_double(x, dtype, base + k * lines.inner);
      const bool best_nan = best != best, value_nan = value != value;
      bool better = is_max ? value > best : value < best;
      if (select_last && value == best) better = true;
      if (best_nan) better = select_last && value_nan;
      else if (value_nan) better = true;
      if (better) best = value, best_index = k;
    }
    y[line] = best_index;
  }
};

// torch.topk along a line, in order: each pick is the best element after the last pick in that
// order (the largest first unless !largest; NaN the largest; ties to the lower index), one scan
// a pick: O(n·k), no scratch. Values are copied as they are (elem_size bytes), indices i64.
struct TopKLine {
  const void* x;
  void* values;
  int64_t* indices;
  DType dtype;
  int elem_size;
  Lines in, out;  // out.n = k
  bool largest;
  MEMC_HD void operator()(int64_t line) const {
    const int64_t base = in.base(line), obase = out.base(line);
    double last = 0;
    int64_t last_index = -1;
    for (int64_t r = 0; r < out.n; ++r) {
      int64_t best = -1;
      double best_value = 0;
      for (int64_t i = 0; i < in.n; ++i) {
        const double v = ld_double(x, dtype, base + i * in.inner);
        if (last_index >= 0 && !topk_before(last, last_index, v, i, largest)) continue;  // at or before the last pick
        if (best < 0 || topk_before(v, i, best_value, best, largest)) best = i, best_value = v;
      }
      const int64_t from = base + best * in.inner, to = obase + r * out.inner;
      const char* src = static_cast<const char*>(x) + from * elem_size;
      char* dst = static_cast<char*>(values) + to * elem_size;
      for (int b = 0; b < elem_size; ++b) dst[b] = src[b];
      indices[to] = best;
      last = best_value, last_index = best;
    }
  }
};

// Running sums along a line, of any numeric dtype (accumulated as a double).
struct CumsumLine {
  const void* x;
  void* y;
  DType dtype;
  Lines lines;
  bool exclusive, reverse;
  MEMC_HD void operator()(int64_t line) const {
    const int64_t base = lines.base(line);
    double acc = 0;
    for (int64_t step = 0; step < lines.n; ++step) {
      const int64_t at = base + (reverse ? lines.n - 1 - step : step) * lines.inner;
      const double value = ld_double(x, dtype, at);
      if (!exclusive) acc += value;
      st_double(y, dtype, at, acc);
      if (exclusive) acc += value;
    }
  }
};

// ---- normalization ----------------------------------------------------------------------------
// v rounded to T's precision (T's store, then its load).
template <typename T>
MEMC_HD inline float as_stored(float v) {
  T t;
  st(&t, 0, v);
  return ld(&t, 0);
}

// One row of layernorm: mean and variance in f64 as the CPU; scale and bias (T, optional)
// broadcast to the row's n elements through `param`. operator() is one thread's row (the host
// runner's); a device takes a warp per row (backends/cuda/kernels.cu) through the same pieces.
// add_layernorm sets `residual` and `sum`: the first pass over a row (first()) writes
// sum = x + r, r rounded to T as a cast rounds it and the sum as the add kernel rounds it, and
// every later read is of the sum. Each element is read before its sum is written, by the same
// thread, so the sum may share x's or r's buffer.
template <typename T>
struct LayernormRow {
  const T* x;
  const T* scale;  // null: 1
  const T* bias;   // null: 0
  void* y;         // of y_type: T, or narrower (add_layernorm's y_dtype), stored as a cast stores
  DType y_type;
  float* mean_out;     // optional [rows]
  float* inv_std_out;  // optional [rows]
  int64_t n;
  double eps;
  Strided scale_map, bias_map;  // over the normalized dims
  const void* residual = nullptr;  // add_layernorm's r [rows, n], of residual_type
  DType residual_type = DType::kF32;
  T* sum = nullptr;  // add_layernorm's x + r [rows, n]
  MEMC_HD int64_t cols() const { return n; }
  MEMC_HD const T* source(int64_t r) const { return (sum ? sum : x) + r * n; }
  MEMC_HD double value(int64_t r, int64_t i) const { return ld(source(r), i); }
  MEMC_HD double first(int64_t r, int64_t i) const {
    if (!sum) return value(r, i);
    const int64_t at = r * n + i;
    const float v = as_stored<T>(ld(x, at) + as_stored<T>(ld_f32(residual, residual_type, at)));
    st(sum, at, v);
    return v;
  }
  MEMC_HD double inv_std(double square_sum) const { return 1.0 / std::sqrt((n ? square_sum / n : 0) + eps); }
  MEMC_HD void store(int64_t r, int64_t i, float mean, float inv) const {
    const float s = scale ? ld(scale, scale_map.offset(i)) : 1.f, b = bias ? ld(bias, bias_map.offset(i)) : 0.f;
    st_f32(y, y_type, r * n + i, (ld(source(r), i) - mean) * inv * s + b);
  }
  MEMC_HD void stats(int64_t r, float mean, float inv) const {
    if (mean_out) mean_out[r] = mean;
    if (inv_std_out) inv_std_out[r] = inv;
  }
  MEMC_HD void operator()(int64_t r) const {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += first(r, i);
    const double mean = n ? sum / n : 0;
    double square_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double c = value(r, i) - mean;
      square_sum += c * c;
    }
    const float mean_f = static_cast<float>(mean), inv_std_f = static_cast<float>(inv_std(square_sum));
    for (int64_t i = 0; i < n; ++i) store(r, i, mean_f, inv_std_f);
    stats(r, mean_f, inv_std_f);
  }
};

// A gradient read in its own float storage, widened as a cast widens it: an f32 parameter's
// update may read a bf16 or f16 gradient (passes/update_grad_casts.h), and so may an f32
// layernorm_grad its dy (passes/layernorm_grad_casts.h).
struct GradientIn {
  const void* data;
  DType dtype;
  MEMC_HD float operator[](int64_t i) const { return ld_f32(data, dtype, i); }
};

// layernorm_grad, per row: dx, and the row's mean and 1/std for the scale gradient's columns.
// As LayernormRow, a thread's row here and a warp's on a device, through the same pieces.
// With an addend, dx is rounded to T, then the addend added as the add kernel adds. With
// `copy`, dx is stored a second time in copy_type (16 bits, from f32), as a cast stores it.
template <typename T>
struct LayernormGradRow {
  GradientIn dy;  // T, or for an f32 x its 16-bit form (passes/layernorm_grad_casts.h)
  const T* x;
  const T* scale;
  T* dx;
  float* stats;  // [rows, 2]: mean, 1/std
  int64_t h;
  double eps;
  Strided scale_map;
  const T* addend = nullptr;  // [rows, h], or null
  void* copy = nullptr;       // [rows, h] of copy_type, or null
  DType copy_type = DType::kBF16;
  MEMC_HD int64_t cols() const { return h; }
  MEMC_HD float xv(int64_t r, int64_t j) const { return ld(x + r * h, j); }
  MEMC_HD float gv(int64_t r, int64_t j) const { return dy[r * h + j] * ld(scale, scale_map.offset(j)); }
  MEMC_HD float inv_std(float square) const { return 1.f / std::sqrt(square / static_cast<float>(h) + static_cast<float>(eps)); }
  // dx from the row's mean, 1/std and the means of g and g·x̂.
  MEMC_HD void store(int64_t r, int64_t j, float mean, float inv, float mean_g, float mean_gx) const {
    const float xhat = (xv(r, j) - mean) * inv, v = inv * (gv(r, j) - mean_g - xhat * mean_gx);
    const float value = addend ? as_stored<T>(v) + ld(addend + r * h, j) : v;
    st(dx + r * h, j, value);
    if (copy) st_f32(copy, copy_type, r * h + j, as_stored<T>(value));
  }
  MEMC_HD void operator()(int64_t r) const {
    float sum = 0;
    for (int64_t j = 0; j < h; ++j) sum += xv(r, j);
    const float mean = sum / static_cast<float>(h);
    float square = 0;
    for (int64_t j = 0; j < h; ++j) square += (xv(r, j) - mean) * (xv(r, j) - mean);
    const float inv = inv_std(square);
    float sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      const float g = gv(r, j);
      sum_g += g, sum_gx += g * (xv(r, j) - mean) * inv;
    }
    const float mean_g = sum_g / static_cast<float>(h), mean_gx = sum_gx / static_cast<float>(h);
    for (int64_t j = 0; j < h; ++j) store(r, j, mean, inv, mean_g, mean_gx);
    stats[2 * r] = mean, stats[2 * r + 1] = inv;
  }
};

// dscale[j] = Σ_rows dy·x̂ in two passes, the same sums in the same order every run: partial[p][j]
// over the rows of block p (kLayernormRowsPerPartial of them), one (p, j) per thread with
// adjacent threads on adjacent columns; then each column's partials in block order, into `out`
// (T) when scale covers the whole row, else into the f32 `acc` [h].
constexpr int64_t kLayernormRowsPerPartial = 32;
inline int64_t layernorm_partials(int64_t rows) { return (rows + kLayernormRowsPerPartial - 1) / kLayernormRowsPerPartial; }

// With `partial_bias`, the bias gradient's partials Σ dy alongside, in the same order.
template <typename T>
struct LayernormGradScalePartial {
  GradientIn dy;  // T, or for an f32 x its 16-bit form (passes/layernorm_grad_casts.h)
  const T* x;
  const float* stats;
  float* partial;  // [partials, h]
  int64_t rows, h;
  float* partial_bias = nullptr;  // [partials, h], or null
  MEMC_HD void operator()(int64_t i) const {
    const int64_t p = i / h, j = i % h;
    const int64_t end = (p + 1) * kLayernormRowsPerPartial < rows ? (p + 1) * kLayernormRowsPerPartial : rows;
    float s = 0, b = 0;
    for (int64_t r = p * kLayernormRowsPerPartial; r < end; ++r) {
      const float g = dy[r * h + j];
      s += g * ((ld(x, r * h + j) - stats[2 * r]) * stats[2 * r + 1]);
      b += g;
    }
    partial[i] = s;
    if (partial_bias) partial_bias[i] = b;
  }
};

template <typename T>
struct LayernormGradScale {
  const float* partial;  // [partials, h]
  T* out;
  float* acc;
  int64_t partials, h;
  const float* partial_bias = nullptr;  // with the bias gradient's partials, into out_bias
  T* out_bias = nullptr;
  MEMC_HD void operator()(int64_t j) const {
    float s = 0, b = 0;
    for (int64_t p = 0; p < partials; ++p) s += partial[p * h + j];
    if (out) st(out, j, s);
    else acc[j] = s;
    if (!partial_bias) return;
    for (int64_t p = 0; p < partials; ++p) b += partial_bias[p * h + j];
    st(out_bias, j, b);
  }
};

// A scale broadcast from fewer elements: out[s] = Σ acc[j] over the row positions j it covers.
template <typename T>
struct SumInto {
  const float* acc;
  T* out;
  int64_t h;
  Strided map;  // row position → out element
  MEMC_HD void operator()(int64_t s) const {
    float total = 0;
    for (int64_t j = 0; j < h; ++j) total += map.offset(j) == s ? acc[j] : 0.f;
    st(out, s, total);
  }
};

// ---- loss -------------------------------------------------------------------------------------
// Softmax cross-entropy of one row: logsumexp(z) - z[label], exp in f32 and the sum in f64 (the
// CPU kernel's precision), 0 on an ignored row. A label outside [0, C) gives NaN, so a bad label
// shows in the loss. operator() is one thread's row (the host runner's); a device takes a warp
// per row (backends/cuda/kernels.cu) through the same pieces: a language model's rows hold
// 50,257 classes.
template <typename T>
struct CrossEntropyRow {
  const T* logits;
  const int64_t* labels;
  double* row_loss;
  int64_t classes;
  bool has_ignore;
  int64_t ignore;
  MEMC_HD int64_t cols() const { return classes; }
  MEMC_HD float logit(int64_t n, int64_t c) const { return ld(logits + n * classes, c); }
  // Writes the loss of a row with nothing to compute (ignored: 0; a label outside: NaN).
  MEMC_HD bool settled(int64_t n) const {
    const int64_t label = labels[n];
    if (has_ignore && label == ignore) {
      row_loss[n] = 0;
      return true;
    }
    if (label < 0 || label >= classes) {
      row_loss[n] = NAN;
      return true;
    }
    return false;
  }
  MEMC_HD void finish(int64_t n, float m, double sum) const {
    row_loss[n] = static_cast<double>(m) + std::log(sum) - static_cast<double>(logit(n, labels[n]));
  }
  MEMC_HD void operator()(int64_t n) const {
    if (settled(n)) return;
    float m = -INFINITY;
    for (int64_t c = 0; c < classes; ++c) m = fmaxf(m, logit(n, c));
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(logit(n, c) - m);
    finish(n, m, sum);
  }
};

// The rows' losses summed in row order and divided, by one thread: the CPU's order.
struct CrossEntropySum {
  const double* row_loss;
  void* out;
  DType dtype;
  int64_t rows;
  double divisor;
  MEMC_HD void operator()(int64_t) const {
    double total = 0;
    for (int64_t n = 0; n < rows; ++n) total += row_loss[n];
    st_double(out, dtype, 0, total / divisor);
  }
};

// dz = dloss·(softmax(z) - onehot(label))/divisor per row, zero on ignored rows. As
// CrossEntropyRow: a thread's row here, a warp's on a device, through the same pieces.
template <typename T>
struct CrossEntropyGradRow {
  const void* dloss;
  DType dloss_dtype;
  const T* logits;
  const int64_t* labels;
  T* dz;
  int64_t classes;
  bool has_ignore;
  int64_t ignore;
  double divisor;
  MEMC_HD int64_t cols() const { return classes; }
  MEMC_HD bool ignored(int64_t n) const { return has_ignore && labels[n] == ignore; }
  MEMC_HD float logit(int64_t n, int64_t c) const { return ld(logits + n * classes, c); }
  MEMC_HD float scale() const { return static_cast<float>(ld_double(dloss, dloss_dtype, 0) / divisor); }
  MEMC_HD void store_zero(int64_t n, int64_t c) const { st(dz + n * classes, c, 0.f); }
  MEMC_HD void store(int64_t n, int64_t c, float m, float sum, float scale) const {
    st(dz + n * classes, c, scale * (std::exp(logit(n, c) - m) / sum - (c == labels[n] ? 1.f : 0.f)));
  }
  MEMC_HD void operator()(int64_t n) const {
    if (ignored(n)) {
      for (int64_t c = 0; c < classes; ++c) store_zero(n, c);
      return;
    }
    float m = -INFINITY;
    for (int64_t c = 0; c < classes; ++c) m = fmaxf(m, logit(n, c));
    float sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(logit(n, c) - m);
    const float s = scale();
    for (int64_t c = 0; c < classes; ++c) store(n, c, m, sum, s);
  }
};

// ---- optimizer --------------------------------------------------------------------------------
// An update's per-step scalars in device memory: the learning rate, the step (absent for plain
// SGD) and the optional skip flag (loss scaling's found_inf: outputs keep the inputs). Every
// thread reads them, so a step needs no host round trip and a replayed graph sees each step's.
struct StepScalars {
  const void *lr = nullptr, *step = nullptr, *skip = nullptr;
  DType lr_dtype = DType::kF32, step_dtype = DType::kF32, skip_dtype = DType::kF32;
  MEMC_HD bool skipped() const { return skip && ld_double(skip, skip_dtype, 0) >= 0.5; }
  MEMC_HD double lr_value() const { return ld_double(lr, lr_dtype, 0); }
  MEMC_HD double step_value() const { return ld_double(step, step_dtype, 0); }
  // Adam's settings with this step's learning rate and bias corrections.
  MEMC_HD AdamStep adam(AdamStep a) const {
    a.lr = lr_value();
    a.set_step(step_value());
    return a;
  }
};

// Adam(W) on one element (AdamStep, backends/kernel_math.h).
template <typename T>
struct AdamUpdate {
  const T* w;
  GradientIn g;
  const T *m, *v;
  T *w_out, *m_out, *v_out;
  StepScalars s;
  AdamStep adam;  // lr and step filled in per thread
  MEMC_HD void operator()(int64_t i) const {
    float wi = ld(w, i), mi = ld(m, i), vi = ld(v, i);
    if (!s.skipped()) s.adam(adam).apply<float>(wi, g[i], mi, vi);
    st(w_out, i, wi), st(m_out, i, mi), st(v_out, i, vi);
  }
};

// w ← w - lr·(g + λw)
template <typename T>
struct SgdUpdate {
  const T* w;
  GradientIn g;
  T* w_out;
  StepScalars s;
  float weight_decay;
  MEMC_HD void operator()(int64_t i) const {
    const float wi = ld(w, i);
    if (s.skipped()) {
      st(w_out, i, wi);
      return;
    }
    st(w_out, i, wi - static_cast<float>(s.lr_value()) * (g[i] + weight_decay * wi));
  }
};

// torch.optim.SGD with momentum: g ← g + λw; buf ← g on the first step, else μ·buf + (1-τ)·g;
// g ← g + μ·buf (Nesterov) or buf; w ← w - lr·g.
struct MomentumParams {
  float weight_decay = 0, momentum = 0.9f, dampening = 0;
  bool nesterov = false;
};
template <typename T>
struct MomentumUpdate {
  const T* w;
  GradientIn g;
  const T* buf;
  T *w_out, *buf_out;
  StepScalars s;
  MomentumParams p;
  MEMC_HD void operator()(int64_t i) const {
    const float wi = ld(w, i);
    if (s.skipped()) {
      st(w_out, i, wi), st(buf_out, i, ld(buf, i));
      return;
    }
    const float gi = g[i] + p.weight_decay * wi;
    const bool first = s.step_value() <= 1.0;
    const float b = first ? gi : p.momentum * ld(buf, i) + (1.f - p.dampening) * gi;
    const float direction = p.nesterov ? gi + p.momentum * b : b;
    st(w_out, i, wi - static_cast<float>(s.lr_value()) * direction);
    st(buf_out, i, b);
  }
};

// AdamW (or Adam) on moments stored as 8-bit codes per block of `block` elements, one thread per
// block: the first pass finds the new moments' absolute maxima, the second updates w and encodes
// against them (recomputing the moments, so an in-place update reads each element before
// writing it). maps[0] codes m (signed), maps[1] codes v (unsigned).
template <typename T>
struct Adam8bitBlock {
  const T *w, *g;
  const uint8_t *mq, *vq;
  const float *m_max, *v_max;
  T* w_out;
  uint8_t *mq_out, *vq_out;
  float *m_max_out, *v_max_out;
  const QuantMap* maps;
  StepScalars s;
  AdamStep adam;
  int64_t n, block;
  MEMC_HD void operator()(int64_t bi) const {
    const int64_t b0 = bi * block, end = b0 + block < n ? b0 + block : n;
    const float old_m_max = m_max[bi], old_v_max = v_max[bi];
    if (s.skipped()) {
      for (int64_t i = b0; i < end; ++i) st(w_out, i, ld(w, i)), mq_out[i] = mq[i], vq_out[i] = vq[i];
      m_max_out[bi] = old_m_max, v_max_out[bi] = old_v_max;
      return;
    }
    const AdamStep a = s.adam(adam);
    float new_m_max = 0, new_v_max = 0;
    for (int64_t i = b0; i < end; ++i) {
      float wi = ld(w, i), mi = maps[0].value[mq[i]] * old_m_max, vi = maps[1].value[vq[i]] * old_v_max;
      a.apply<float>(wi, ld(g, i), mi, vi);
      new_m_max = fmaxf(new_m_max, std::fabs(mi)), new_v_max = fmaxf(new_v_max, vi);
    }
    for (int64_t i = b0; i < end; ++i) {
      float wi = ld(w, i), mi = maps[0].value[mq[i]] * old_m_max, vi = maps[1].value[vq[i]] * old_v_max;
      a.apply<float>(wi, ld(g, i), mi, vi);
      st(w_out, i, wi);
      mq_out[i] = new_m_max > 0 ? maps[0].encode(mi / new_m_max) : 0;
      vq_out[i] = new_v_max > 0 ? maps[1].encode(vi / new_v_max) : 0;
    }
    m_max_out[bi] = new_m_max, v_max_out[bi] = new_v_max;
  }
};

// Adafactor (the CPU kernel's arithmetic), in passes over rows, columns, matrices and elements.
struct AdafactorScalars {
  StepScalars step;
  double decay, eps1, clip, weight_decay;
  MEMC_HD bool skipped() const { return step.skipped(); }
  MEMC_HD float beta() const { return static_cast<float>(1.0 - std::pow(step.step_value(), decay)); }
  MEMC_HD double lr_value() const { return step.lr_value(); }
};

// Factored second moment, one thread per row (rows = true) or column of each matrix [rows, cols]:
// its mean of g² + eps1 in f64, decayed into the f32 state.
template <typename T>
struct AdafactorFactor {
  const T* g;
  const float* state;
  float* state_out;
  int64_t rows, cols;
  bool along_rows;
  AdafactorScalars s;
  MEMC_HD void operator()(int64_t k) const {  // k: matrix·rows + row, or matrix·cols + col
    const int64_t count = along_rows ? cols : rows;
    const int64_t b = k / (along_rows ? rows : cols), idx = k % (along_rows ? rows : cols);
    if (s.skipped()) {
      state_out[k] = state[k];
      return;
    }
    double mean = 0;
    for (int64_t t = 0; t < count; ++t) {
      const int64_t e = along_rows ? (b * rows + idx) * cols + t : (b * rows + t) * cols + idx;
      const double gi = ld(g, e);
      mean += (gi * gi + s.eps1) / static_cast<double>(count);
    }
    const float beta = s.beta();
    state_out[k] = beta * state[k] + (1.0f - beta) * static_cast<float>(mean);
  }
};

// Per matrix: the mean of its row factors (f64).
struct AdafactorRowMean {
  const float* r;
  double* r_avg;
  int64_t rows;
  MEMC_HD void operator()(int64_t b) const {
    double sum = 0;
    for (int64_t i = 0; i < rows; ++i) sum += r[b * rows + i];
    r_avg[b] = sum / static_cast<double>(rows);
  }
};

// The update direction u = g/√v̂ per element: v̂ from the factors (factored) or the decayed v.
template <typename T>
struct AdafactorDirection {
  const T* g;
  const float *r, *c;  // factored: row and column factors; null otherwise
  const double* r_avg;
  const float* v;      // non-factored: the state, decayed here into v_out
  float* v_out;
  float* u;
  int64_t rows, cols;
  AdafactorScalars s;
  MEMC_HD void operator()(int64_t i) const {
    if (r) {
      const int64_t b = i / (rows * cols), row = (i / cols) % rows, col = i % cols;
      const double v_hat = static_cast<double>(r[b * rows + row]) / r_avg[b] * static_cast<double>(c[b * cols + col]);
      u[i] = static_cast<float>(static_cast<double>(ld(g, i)) / std::sqrt(v_hat));
      return;
    }
    const float gi = ld(g, i);
    if (s.skipped()) {
      v_out[i] = v[i];
      return;
    }
    const float beta = s.beta();
    const float vi = beta * v[i] + (1.0f - beta) * (gi * gi + static_cast<float>(s.eps1));
    v_out[i] = vi;
    u[i] = gi / std::sqrt(vi);
  }
};

// Σ u² over chunks of `chunk` elements (f64), then (count 1) the clip scale from their total.
struct SumSquares {
  const float* u;
  double* partial;
  int64_t n, chunk;
  MEMC_HD void operator()(int64_t p) const {
    double sum = 0;
    for (int64_t i = p * chunk; i < n && i < (p + 1) * chunk; ++i) sum += static_cast<double>(u[i]) * u[i];
    partial[p] = sum;
  }
};
struct AdafactorClip {
  double* partial;  // partial[0] becomes the scale
  int64_t parts, n;
  double clip;
  MEMC_HD void operator()(int64_t) const {
    double sq = 0;
    for (int64_t p = 0; p < parts; ++p) sq += partial[p];
    const double rms = std::sqrt(sq / static_cast<double>(n > 1 ? n : 1));
    partial[0] = 1.0 / (rms / clip > 1.0 ? rms / clip : 1.0);
  }
};

template <typename T>
struct AdafactorApply {
  const T* w;
  const float* u;
  const double* scale;
  T* w_out;
  AdafactorScalars s;
  MEMC_HD void operator()(int64_t i) const {
    const float wi = ld(w, i);
    if (s.skipped()) {
      st(w_out, i, wi);
      return;
    }
    const double lr = s.lr_value();
    st(w_out, i, wi - static_cast<float>(lr * s.weight_decay) * wi - static_cast<float>(lr) * static_cast<float>(*scale) * u[i]);
  }
};

// ---- convolution --------------------------------------------------------------------------------
// An N-d convolution's index geometry: P output positions, K = C_in·∏kernel taps per position.
struct ConvDims {
  int spatial = 0;  // number of spatial dims
  int64_t channels = 0, positions = 1, taps = 1;
  int64_t in_dims[kMaxDims] = {}, out_dims[kMaxDims] = {}, kernel[kMaxDims] = {};
  int64_t stride[kMaxDims] = {}, pad[kMaxDims] = {}, dilation[kMaxDims] = {};
};

// im2col: cols [N, P, K] from x [N, C_in, in...]; taps outside the padded input are 0. k runs
// over (channel, kernel offsets) in the weight's row-major order.
template <typename T>
struct Im2col {
  const T* x;
  T* cols;
  ConvDims g;
  MEMC_HD void operator()(int64_t i) const {
    const int64_t n = i / (g.positions * g.taps), p = (i / g.taps) % g.positions;
    int64_t pp = p, kk = i % g.taps, in_offset = 0, in_size = 1;
    bool inside = true;
    for (int d = g.spatial - 1; d >= 0; --d) {
      const int64_t o = pp % g.out_dims[d], kd = kk % g.kernel[d];
      pp /= g.out_dims[d], kk /= g.kernel[d];
      const int64_t c = o * g.stride[d] - g.pad[d] + kd * g.dilation[d];
      inside = inside && c >= 0 && c < g.in_dims[d];
      in_offset += c * in_size;
      in_size *= g.in_dims[d];
    }
    // kk is now the input channel
    st(cols, i, inside ? ld(x, (n * g.channels + kk) * in_size + in_offset) : 0.f);
  }
};

// y[n, c, p] += bias[c] over an [N, C, P] output.
template <typename T>
struct AddChannelBias {
  const T* bias;
  T* y;
  int64_t channels, positions;
  MEMC_HD void operator()(int64_t i) const { st(y, i, ld(y, i) + ld(bias, (i / positions) % channels)); }
};

}  // namespace memc::cuda
