// Elementwise kernels: unary math, numpy-broadcast binary ops, where, cast, copy, dropout.
// Each op is a small functor; one template per arity turns it into a kernel for every dtype
// it supports. f16/bf16 load to f32, compute, and round to nearest even on store.
#include <algorithm>
#include <functional>
#include <map>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backends/cpu/gelu.h"
#include "backends/cpu/loops.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/vector_math.h"
#include "ir/fused_program.h"

namespace memc::cpu {
namespace {

// ---- unary ----------------------------------------------------------------------------------

// Ops marked kFloatOnly reject integer and bool inputs; the others reject only bool. Ops with a
// floats(buf, n) member also map a chunk of f32 values in place in vectors (vector_math.h);
// map_unary uses it for every dtype that computes in f32.
struct Neg {
  static constexpr bool kFloatOnly = false;
  explicit Neg(const Node&) {}
  template <typename C> C operator()(C x) const { return static_cast<C>(-x); }
};
struct Abs {
  static constexpr bool kFloatOnly = false;
  explicit Abs(const Node&) {}
  template <typename C> C operator()(C x) const {
    if constexpr (std::is_unsigned_v<C>) return x;
    else return x < 0 ? static_cast<C>(-x) : x;
  }
};
struct Sign {
  static constexpr bool kFloatOnly = false;
  explicit Sign(const Node&) {}
  template <typename C> C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>) {
      if (std::isnan(x)) return x;
    }
    return static_cast<C>((C(0) < x) - (x < C(0)));
  }
};
struct Relu {
  static constexpr bool kFloatOnly = false;
  explicit Relu(const Node&) {}
  template <typename C> C operator()(C x) const { return x > C(0) ? x : (x != x ? x : C(0)); }
};
struct LeakyRelu {
  static constexpr bool kFloatOnly = true;
  explicit LeakyRelu(const Node& n) : alpha(n.attrs.get_float("alpha", 0.01)) {}
  template <typename C> C operator()(C x) const { return x >= C(0) ? x : static_cast<C>(alpha) * x; }
  double alpha;
};
struct Gelu {
  static constexpr bool kFloatOnly = true;
  explicit Gelu(const Node& n) : tanh_form(n.attrs.get_string("approximate", "none") == "tanh") {}
  template <typename C> C operator()(C x) const { return gelu<C>(x, tanh_form); }  // backends/kernel_math.h
  void floats(float* x, int64_t n) const { gelu_floats(x, n, tanh_form); }  // backends/cpu/gelu.h
  bool tanh_form;
};

// exp, erf and tanh: std:: for f64, vectors for f32.
#define MEMC_VECTOR_UNARY(Name, std_fn, vector_fn)                      \
  struct Name {                                                         \
    static constexpr bool kFloatOnly = true;                            \
    explicit Name(const Node&) {}                                       \
    template <typename C> C operator()(C x) const { return std_fn(x); } \
    void floats(float* x, int64_t n) const { vector_fn(x, n); }         \
  };
MEMC_VECTOR_UNARY(Exp, std::exp, exp_in_place)
MEMC_VECTOR_UNARY(Erf, std::erf, erf_in_place)
MEMC_VECTOR_UNARY(Tanh, std::tanh, tanh_in_place)
#undef MEMC_VECTOR_UNARY

// Float-only math without attributes: one functor type per std function.
#define MEMC_FLOAT_UNARY(Name, expr)                              \
  struct Name {                                                   \
    static constexpr bool kFloatOnly = true;                      \
    explicit Name(const Node&) {}                                 \
    template <typename C> C operator()(C x) const { return expr; } \
  };
MEMC_FLOAT_UNARY(Log, std::log(x))
MEMC_FLOAT_UNARY(Sqrt, std::sqrt(x))
MEMC_FLOAT_UNARY(Rsqrt, C(1) / std::sqrt(x))
MEMC_FLOAT_UNARY(Reciprocal, C(1) / x)
// Stable for large |x|: never evaluates e^x for large positive x.
MEMC_FLOAT_UNARY(Sigmoid, x >= C(0) ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x)))
MEMC_FLOAT_UNARY(Floor, std::floor(x))
MEMC_FLOAT_UNARY(Ceil, std::ceil(x))
MEMC_FLOAT_UNARY(Round, std::nearbyint(x))  // default rounding mode: half to even
MEMC_FLOAT_UNARY(Sin, std::sin(x))
MEMC_FLOAT_UNARY(Cos, std::cos(x))
MEMC_FLOAT_UNARY(Asin, std::asin(x))
MEMC_FLOAT_UNARY(Acos, std::acos(x))
MEMC_FLOAT_UNARY(Atan, std::atan(x))
// ln(1+e^x) = max(x, 0) + ln(1 + e^-|x|), stable on both sides.
MEMC_FLOAT_UNARY(Softplus, std::max(x, C(0)) + std::log1p(std::exp(-std::abs(x))))
#undef MEMC_FLOAT_UNARY

// y[i] = op(x[i]) over n contiguous elements, in parallel ranges; through op.floats in chunks
// when the op has one and T computes in f32.
template <typename T, typename Op>
void map_unary(T* y, const T* x, int64_t n, const Op& op) {  // y, x: [n]
  parallel_elementwise(n, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<typename Compute<T>::type, float> && requires(float* b) { op.floats(b, int64_t{1}); }) {
      float chunk[kVectorChunk];
      for (int64_t i = begin; i < end; i += kVectorChunk) {
        const int64_t len = std::min(kVectorChunk, end - i);
        for (int64_t j = 0; j < len; ++j) chunk[j] = load<T>(x[i + j]);
        op.floats(chunk, len);
        for (int64_t j = 0; j < len; ++j) y[i + j] = store<T>(chunk[j]);
      }
    } else {
      for (int64_t i = begin; i < end; ++i) y[i] = store<T>(op(load<T>(x[i])));
    }
  });
}

template <typename Op>
Status unary_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  const Op op(ctx.node);
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T> || (Op::kFloatOnly && !kIsFloatStorage<T>)) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      map_unary(y.data<T>(), x.data<T>(), x.numel(), op);
      return Status::Ok();
    }
  });
}

Status not_kernel(KernelContext& ctx) {
  const bool* x = ctx.inputs[0]->data<bool>();  // [n]
  bool* y = ctx.outputs[0]->data<bool>();       // [n]
  for (int64_t i = 0, n = ctx.inputs[0]->numel(); i < n; ++i) y[i] = !x[i];
  return Status::Ok();
}

// ---- binary ---------------------------------------------------------------------------------

// kind: arithmetic ops map C×C→C on numeric dtypes; comparisons map any dtype to bool;
// logical ops map bool×bool→bool.
enum class BinaryKind { kArithmetic, kComparison, kLogical };

struct Add { static constexpr auto kKind = BinaryKind::kArithmetic; template <typename C> C operator()(C a, C b) const { return a + b; } };
struct Sub { static constexpr auto kKind = BinaryKind::kArithmetic; template <typename C> C operator()(C a, C b) const { return a - b; } };
struct Mul { static constexpr auto kKind = BinaryKind::kArithmetic; template <typename C> C operator()(C a, C b) const { return a * b; } };
struct Div {
  static constexpr auto kKind = BinaryKind::kArithmetic;
  template <typename C> C operator()(C a, C b) const {
    // Integer division truncates (C, ONNX); MIN / -1 would trap, so negate with wraparound.
    if constexpr (std::is_signed_v<C> && std::is_integral_v<C>) {
      if (b == C(-1)) return static_cast<C>(-static_cast<std::make_unsigned_t<C>>(a));
    }
    return static_cast<C>(a / b);
  }
};
struct Max { static constexpr auto kKind = BinaryKind::kArithmetic; template <typename C> C operator()(C a, C b) const { return (a > b || a != a) ? a : b; } };
struct Min { static constexpr auto kKind = BinaryKind::kArithmetic; template <typename C> C operator()(C a, C b) const { return (a < b || a != a) ? a : b; } };
struct Pow {
  static constexpr auto kKind = BinaryKind::kArithmetic;
  template <typename C> C operator()(C a, C b) const {
    if constexpr (std::is_floating_point_v<C>) {
      return std::pow(a, b);
    } else {  // exact integer power by squaring, wrapping like repeated multiplication
      using U = std::make_unsigned_t<C>;
      if (b < C(0)) return a == C(1) ? C(1) : (a == C(-1) ? ((b & 1) ? a : C(1)) : C(0));
      U base = static_cast<U>(a), result = 1;
      for (U e = static_cast<U>(b); e; e >>= 1, base *= base) {
        if (e & 1) result *= base;
      }
      return static_cast<C>(result);
    }
  }
};
// fmod = 1: remainder takes the dividend's sign (C fmod); fmod = 0: the divisor's (Python).
struct Mod {
  static constexpr auto kKind = BinaryKind::kArithmetic;
  template <typename C> C operator()(C a, C b) const {
    C r;
    if constexpr (std::is_floating_point_v<C>) {
      r = std::fmod(a, b);
    } else if constexpr (std::is_signed_v<C>) {
      r = b == C(-1) ? C(0) : static_cast<C>(a % b);
    } else {
      r = static_cast<C>(a % b);
    }
    if (!c_fmod && r != C(0) && ((r < C(0)) != (b < C(0)))) r = static_cast<C>(r + b);
    return r;
  }
  bool c_fmod = false;
};
struct Equal { static constexpr auto kKind = BinaryKind::kComparison; template <typename C> bool operator()(C a, C b) const { return a == b; } };
struct Less { static constexpr auto kKind = BinaryKind::kComparison; template <typename C> bool operator()(C a, C b) const { return a < b; } };
struct LessEqual { static constexpr auto kKind = BinaryKind::kComparison; template <typename C> bool operator()(C a, C b) const { return a <= b; } };
struct Greater { static constexpr auto kKind = BinaryKind::kComparison; template <typename C> bool operator()(C a, C b) const { return a > b; } };
struct GreaterEqual { static constexpr auto kKind = BinaryKind::kComparison; template <typename C> bool operator()(C a, C b) const { return a >= b; } };
struct And { static constexpr auto kKind = BinaryKind::kLogical; bool operator()(bool a, bool b) const { return a && b; } };
struct Or { static constexpr auto kKind = BinaryKind::kLogical; bool operator()(bool a, bool b) const { return a || b; } };
struct Xor { static constexpr auto kKind = BinaryKind::kLogical; bool operator()(bool a, bool b) const { return a != b; } };

template <typename Op>
Op make_binary_op(const Node& node) {
  Op op{};
  if constexpr (std::is_same_v<Op, Mod>) op.c_fmod = node.attrs.get_int("fmod", 0) != 0;
  return op;
}

// y = op(a, b) with numpy broadcasting. One walk for every shape; the innermost run picks a
// loop with constant strides so the common cases (same shape, scalar or row operand) vectorize.
template <typename Y, typename T, typename Op>
void broadcast_binary(Tensor& out, const Tensor& a, const Tensor& b, const Op& op) {
  Y* y = out.data<Y>();              // [out shape]
  const T* pa = a.data<T>();         // [a shape], broadcast to out
  const T* pb = b.data<T>();         // [b shape], broadcast to out
  auto apply = [&](T x0, T x1) { return store<Y>(op(load<T>(x0), load<T>(x1))); };
  if (a.shape() == out.shape() && b.shape() == out.shape()) {  // same-shape contiguous fast path
    parallel_elementwise(out.numel(), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = apply(pa[i], pb[i]);
    });
    return;
  }
  const Shape& shape = out.shape();
  // A long run (a scalar or a row operand merged into one run) is split across threads too.
  for_each_row<3>(shape, {row_major_strides(shape), broadcast_strides(a.shape(), shape), broadcast_strides(b.shape(), shape)},
                  [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
                    parallel_elementwise(n, [&](int64_t begin, int64_t end) {
                      Y* yr = y + off[0];
                      const T* ar = pa + off[1];
                      const T* br = pb + off[2];
                      if (st[1] == 1 && st[2] == 1) {
                        for (int64_t i = begin; i < end; ++i) yr[i] = apply(ar[i], br[i]);
                      } else if (st[1] == 1 && st[2] == 0) {
                        for (int64_t i = begin; i < end; ++i) yr[i] = apply(ar[i], br[0]);
                      } else if (st[1] == 0 && st[2] == 1) {
                        for (int64_t i = begin; i < end; ++i) yr[i] = apply(ar[0], br[i]);
                      } else {
                        for (int64_t i = begin; i < end; ++i) yr[i] = apply(ar[i * st[1]], br[i * st[2]]);
                      }
                    });
                  });
}

template <typename T>
bool has_zero(const Tensor& t) {
  const T* p = t.data<T>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    if (p[i] == T(0)) return true;
  }
  return false;
}

template <typename Op>
Status binary_kernel(KernelContext& ctx) {
  const Tensor &a = *ctx.inputs[0], &b = *ctx.inputs[1];
  Tensor& out = *ctx.outputs[0];
  const Op op = make_binary_op<Op>(ctx.node);
  if constexpr (Op::kKind == BinaryKind::kLogical) {
    if (a.dtype() != DType::kBool) return unsupported_dtype(ctx, a.dtype());
    broadcast_binary<bool, bool>(out, a, b, op);
    return Status::Ok();
  } else {
    return dispatch_dtype(a.dtype(), [&]<typename T>() -> Status {
      if constexpr (Op::kKind == BinaryKind::kComparison) {
        broadcast_binary<bool, T>(out, a, b, op);
        return Status::Ok();
      } else if constexpr (!kIsNumeric<T>) {
        return unsupported_dtype(ctx, a.dtype());
      } else {
        // Integer x / 0 traps the CPU; user data must not crash us.
        if constexpr (std::is_integral_v<T> && (std::is_same_v<Op, Div> || std::is_same_v<Op, Mod>)) {
          if (has_zero<T>(b)) return Status::BadInput("integer division by zero");
        }
        broadcast_binary<T, T>(out, a, b, op);
        return Status::Ok();
      }
    });
  }
}

// ---- where, cast, copy, dropout -------------------------------------------------------------

// y = cond ? a : b with numpy broadcasting; copies elements by size, so every dtype works.
Status where_kernel(KernelContext& ctx) {
  const Tensor &cond = *ctx.inputs[0], &a = *ctx.inputs[1], &b = *ctx.inputs[2];
  Tensor& out = *ctx.outputs[0];
  const Shape& shape = out.shape();
  dispatch_element_size(a.dtype(), [&]<typename E>() {
    E* y = static_cast<E*>(out.raw());              // [out shape]
    const bool* c = cond.data<bool>();              // broadcast to out
    const E* pa = static_cast<const E*>(a.raw());   // broadcast to out
    const E* pb = static_cast<const E*>(b.raw());   // broadcast to out
    for_each_row<4>(shape, {row_major_strides(shape), broadcast_strides(cond.shape(), shape),
                            broadcast_strides(a.shape(), shape), broadcast_strides(b.shape(), shape)},
                    [&](const std::array<int64_t, 4>& off, int64_t n, const std::array<int64_t, 4>& st) {
                      for (int64_t i = 0; i < n; ++i) {
                        y[off[0] + i] = c[off[1] + i * st[1]] ? pa[off[2] + i * st[2]] : pb[off[3] + i * st[3]];
                      }
                    });
  });
  return Status::Ok();
}

// Float → integer saturates (NaN → 0) instead of invoking undefined behaviour.
template <typename D, typename S>
D convert(S v) {
  using C = typename Compute<D>::type;
  if constexpr (std::is_integral_v<C> && !std::is_same_v<C, bool> && std::is_floating_point_v<decltype(load<S>(v))>) {
    const auto x = load<S>(v);
    if (x != x) return D(0);
    if (x <= static_cast<decltype(x)>(std::numeric_limits<C>::lowest())) return std::numeric_limits<C>::lowest();
    if (x >= static_cast<decltype(x)>(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
    return static_cast<D>(x);
  } else if constexpr (std::is_same_v<C, bool>) {
    return load<S>(v) != decltype(load<S>(v))(0);
  } else {
    return store<D>(static_cast<C>(load<S>(v)));
  }
}

Status cast_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  const int64_t n = x.numel();
  dispatch_dtype(x.dtype(), [&]<typename S>() {
    dispatch_dtype(y.dtype(), [&]<typename D>() {
      const S* src = x.data<S>();  // [n]
      D* dst = y.data<D>();        // [n]
      parallel_elementwise(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = convert<D>(src[i]);
      });
    });
  });
  return Status::Ok();
}

Status copy_kernel(KernelContext& ctx) {
  if (ctx.inputs[0]->nbytes()) std::memcpy(ctx.outputs[0]->raw(), ctx.inputs[0]->raw(), ctx.inputs[0]->nbytes());
  return Status::Ok();
}

// A transfer's async pair: the CPU's streams are synchronous, so the start copies at once and
// the done has nothing to wait for (it copies only where the plan did not put it in place).
Status copy_done_kernel(KernelContext& ctx) {
  const Tensor& pending = *ctx.inputs[0];
  if (ctx.outputs[0]->raw() != pending.raw() && pending.nbytes()) std::memcpy(ctx.outputs[0]->raw(), pending.raw(), pending.nbytes());
  return Status::Ok();
}

// Training: y = x·keep/(1 - ratio), keep[i] = counter_random(seed, stream, i) < threshold.
// Inference: y = x and the mask is all true.
Status dropout_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  Tensor* mask = ctx.outputs.size() >= 2 ? ctx.outputs[1] : nullptr;
  const double ratio = ctx.node.attrs.get_float("ratio", 0.5);
  const int64_t n = x.numel();
  bool* keep = mask ? mask->data<bool>() : nullptr;  // [n] or absent
  if (!ctx.training || ratio == 0.0) {
    copy_kernel(ctx);
    if (keep) std::fill(keep, keep + n, true);
    return Status::Ok();
  }
  const uint64_t stream = dropout_stream(ctx.node.attrs.get_int("seed", 0), ctx.step);
  const uint64_t threshold = dropout_threshold(ratio);
  // A micro-batch's copy draws the counters of its rows in the full batch (passes/microbatch.h).
  const uint64_t offset = random_draw_offset(ctx);
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsFloatStorage<T>) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      using C = typename Compute<T>::type;
      const C scale = static_cast<C>(1.0 / (1.0 - ratio));
      const T* px = x.data<T>();  // [n]
      T* py = y.data<T>();        // [n]
      const uint64_t key = counter_key(ctx.seed, stream);
      parallel_elementwise(n, [&, key, offset, threshold, scale](int64_t begin, int64_t end) {
        // By value: a store through keep (bool) may alias anything, so captures by reference
        // would be reloaded per element and the loop would not vectorize.
        // Every element is loaded and scaled, then selected (a load on the kept branch only is
        // control flow GCC does not vectorize), and the mask is read as bytes (GCC has no
        // vector type for bool).
        auto kept = [=](int64_t i) { return counter_draw(key, offset + static_cast<uint64_t>(i)) < threshold; };
        if (keep) {
          for (int64_t i = begin; i < end; ++i) keep[i] = kept(i);
          const auto* bytes = reinterpret_cast<const uint8_t*>(keep);
          for (int64_t i = begin; i < end; ++i) {
            const C scaled = load<T>(px[i]) * scale;
            py[i] = store<T>(bytes[i] != 0 ? scaled : C(0));
          }
        } else {
          for (int64_t i = begin; i < end; ++i) {
            const C scaled = load<T>(px[i]) * scale;
            py[i] = store<T>(kept(i) ? scaled : C(0));
          }
        }
      });
      return Status::Ok();
    }
  });
}

// ---- fused_elementwise (ir/fused_program.h) ------------------------------------------------

// The program runs over chunks of kVectorChunk output elements: every input is gathered into a
// chunk of floats (bool as 0/1), each step maps its operands' chunks with its op's own functor
// (through floats() where the op's kernel uses it) and rounds to its dtype, as that op's kernel
// computes in f32 and stores. So a fused node equals its unfused ops bit for bit.
// A step over elements [i0, i0 + n) of the node's output: slot[k] holds slot k's chunk.
using FusedChunkFn = std::function<void(float* const* slot, float* y, int64_t i0, int64_t n)>;

template <typename Op>
FusedChunkFn fused_unary(const Node& step, std::vector<int> args) {
  const Op op(step);
  return [op, a = args[0]](float* const* s, float* y, int64_t, int64_t n) {
    std::copy(s[a], s[a] + n, y);
    if constexpr (requires(float* b) { op.floats(b, int64_t{1}); }) {
      op.floats(y, n);
    } else {
      for (int64_t i = 0; i < n; ++i) y[i] = op(y[i]);
    }
  };
}

template <typename Op>
FusedChunkFn fused_binary(const Node&, std::vector<int> args) {
  return [a = args[0], b = args[1]](float* const* s, float* y, int64_t, int64_t n) {
    const Op op{};
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (Op::kKind == BinaryKind::kLogical) {
        y[i] = op(s[a][i] != 0.f, s[b][i] != 0.f) ? 1.f : 0.f;
      } else {
        y[i] = static_cast<float>(op(s[a][i], s[b][i]));
      }
    }
  };
}

// dropout_kernel's draws for element i of the node it was (its output is the fused node's shape).
FusedChunkFn fused_dropout(const KernelContext& ctx, const Node& step, int a) {
  const double ratio = step.attrs.get_float("ratio", 0.5);
  if (!ctx.training || ratio == 0.0) {
    return [a](float* const* s, float* y, int64_t, int64_t n) { std::copy(s[a], s[a] + n, y); };
  }
  const uint64_t key = counter_key(ctx.seed, dropout_stream(step.attrs.get_int("seed", 0), ctx.step));
  const uint64_t threshold = dropout_threshold(ratio), offset = random_draw_offset(step.attrs, ctx.batch_row_offset);
  const float scale = static_cast<float>(1.0 / (1.0 - ratio));
  return [a, key, threshold, offset, scale](float* const* s, float* y, int64_t i0, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float scaled = s[a][i] * scale;
      y[i] = counter_draw(key, offset + static_cast<uint64_t>(i0 + i)) < threshold ? scaled : 0.f;
    }
  };
}

FusedChunkFn fused_step_fn(const KernelContext& ctx, const Node& step, const std::vector<int>& args) {
  using Make = FusedChunkFn (*)(const Node&, std::vector<int>);
  static const std::map<std::string, Make> table = {
      {"neg", fused_unary<Neg>}, {"abs", fused_unary<Abs>}, {"sign", fused_unary<Sign>}, {"exp", fused_unary<Exp>},
      {"log", fused_unary<Log>}, {"sqrt", fused_unary<Sqrt>}, {"rsqrt", fused_unary<Rsqrt>},
      {"reciprocal", fused_unary<Reciprocal>}, {"tanh", fused_unary<Tanh>}, {"sigmoid", fused_unary<Sigmoid>},
      {"relu", fused_unary<Relu>}, {"leaky_relu", fused_unary<LeakyRelu>}, {"erf", fused_unary<Erf>},
      {"gelu", fused_unary<Gelu>}, {"floor", fused_unary<Floor>}, {"ceil", fused_unary<Ceil>}, {"round", fused_unary<Round>},
      {"sin", fused_unary<Sin>}, {"cos", fused_unary<Cos>}, {"asin", fused_unary<Asin>}, {"acos", fused_unary<Acos>},
      {"atan", fused_unary<Atan>}, {"softplus", fused_unary<Softplus>},
      {"add", fused_binary<Add>}, {"sub", fused_binary<Sub>}, {"mul", fused_binary<Mul>}, {"div", fused_binary<Div>},
      {"pow", fused_binary<Pow>}, {"max", fused_binary<Max>}, {"min", fused_binary<Min>},
      {"equal", fused_binary<Equal>}, {"less", fused_binary<Less>}, {"less_equal", fused_binary<LessEqual>},
      {"greater", fused_binary<Greater>}, {"greater_equal", fused_binary<GreaterEqual>},
      {"and", fused_binary<And>}, {"or", fused_binary<Or>}, {"xor", fused_binary<Xor>},
  };
  if (auto it = table.find(step.op); it != table.end()) return it->second(step, args);
  if (step.op == "dropout") return fused_dropout(ctx, step, args[0]);
  if (step.op == "not") {
    return [a = args[0]](float* const* s, float* y, int64_t, int64_t n) {
      for (int64_t i = 0; i < n; ++i) y[i] = s[a][i] != 0.f ? 0.f : 1.f;
    };
  }
  if (step.op == "where") {
    return [c = args[0], a = args[1], b = args[2]](float* const* s, float* y, int64_t, int64_t n) {
      for (int64_t i = 0; i < n; ++i) y[i] = s[c][i] != 0.f ? s[a][i] : s[b][i];
    };
  }
  if (step.op == "cast") {  // the conversion is the step's rounding to its dtype
    return [a = args[0]](float* const* s, float* y, int64_t, int64_t n) { std::copy(s[a], s[a] + n, y); };
  }
  if (step.op == "gelu_grad") {
    const bool tanh_form = step.attrs.get_string("approximate", "none") == "tanh";
    return [dy = args[0], x = args[1], tanh_form](float* const* s, float* y, int64_t, int64_t n) {
      std::copy(s[x], s[x] + n, y);
      gelu_derivative_floats(y, n, tanh_form);
      for (int64_t i = 0; i < n; ++i) y[i] = s[dy][i] * y[i];
    };
  }
  return nullptr;
}

// v = the value a store to `t` keeps, read back as f32 (bool: 0 or 1).
void round_to(DType t, float* v, int64_t n) {
  switch (t) {  // one loop per dtype, so each vectorizes
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) v[i] = load(store<bf16_t, float>(v[i]));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) v[i] = load(store<f16_t, float>(v[i]));
      return;
    case DType::kBool:
      for (int64_t i = 0; i < n; ++i) v[i] = v[i] != 0.f ? 1.f : 0.f;
      return;
    default: return;
  }
}

// Chunk [begin, begin + n) of `t` (broadcast to `shape` by `strides`) as floats. A broadcast
// input walks the output's row-major index from the chunk's first element, carrying into outer
// dims, so its offsets take no division per element.
void gather_floats(const Tensor& t, const Shape& shape, const std::vector<int64_t>& strides, bool contiguous, int64_t begin,
                   int64_t n, float* dst) {
  dispatch_dtype(t.dtype(), [&]<typename T>() {
    if constexpr (kIsFloatStorage<T> || std::is_same_v<T, bool>) {
      const T* p = t.data<T>();
      auto value = [](T v) { if constexpr (std::is_same_v<T, bool>) return v ? 1.f : 0.f; else return static_cast<float>(load(v)); };
      if (contiguous) {
        for (int64_t i = 0; i < n; ++i) dst[i] = value(p[begin + i]);
        return;
      }
      const int rank = static_cast<int>(shape.size());
      std::vector<int64_t> index(rank);
      int64_t rest = begin, offset = 0;
      for (int d = rank - 1; d >= 0; --d) {
        index[d] = rest % shape[d];
        rest /= shape[d];
        offset += index[d] * strides[d];
      }
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = value(p[offset]);
        for (int d = rank - 1; d >= 0; --d) {  // the next element's index and offset
          offset += strides[d];
          if (++index[d] < shape[d]) break;
          offset -= index[d] * strides[d];
          index[d] = 0;
        }
      }
    }
  });
}

Status fused_elementwise_kernel(KernelContext& ctx) {
  const int inputs = static_cast<int>(ctx.inputs.size());
  MEMC_ASSIGN_OR_RETURN(const FusedProgram program, fused_program(ctx));  // backends/kernel_attrs.h
  const std::vector<TensorType>& types = program.types;
  std::vector<FusedChunkFn> steps;
  for (const FusedStep& s : program.steps) {
    Node step;
    step.op = s.op, step.attrs = s.attrs;
    steps.push_back(fused_step_fn(ctx, step, s.args));
    if (!steps.back()) return Status::BadInput(str_cat("CPU kernel memc.fused_elementwise: no step for memc.", s.op));
  }
  const Shape& shape = ctx.outputs[0]->shape();
  std::vector<std::vector<int64_t>> strides;
  std::vector<bool> contiguous;
  for (const Tensor* t : ctx.inputs) {
    strides.push_back(broadcast_strides(t->shape(), shape));
    contiguous.push_back(t->numel() == ctx.outputs[0]->numel());
  }
  const int slots = program.slots();
  parallel_elementwise(ctx.outputs[0]->numel(), [&](int64_t begin, int64_t end) {
    std::vector<float> storage(static_cast<size_t>(slots) * kVectorChunk);
    std::vector<float*> slot(slots);
    for (int k = 0; k < slots; ++k) slot[k] = storage.data() + static_cast<size_t>(k) * kVectorChunk;
    for (int64_t i0 = begin; i0 < end; i0 += kVectorChunk) {
      const int64_t n = std::min(kVectorChunk, end - i0);
      for (int k = 0; k < inputs; ++k) gather_floats(*ctx.inputs[k], shape, strides[k], contiguous[k], i0, n, slot[k]);
      for (size_t s = 0; s < steps.size(); ++s) {
        float* y = slot[inputs + s];
        steps[s](slot.data(), y, i0, n);
        round_to(types[inputs + s].dtype, y, n);
      }
      for (size_t r = 0; r < program.results.size(); ++r) {
        const float* v = slot[program.results[r]];
        dispatch_dtype(ctx.outputs[r]->dtype(), [&]<typename T>() {
          T* out = ctx.outputs[r]->data<T>() + i0;
          if constexpr (std::is_same_v<T, bool>) {
            for (int64_t i = 0; i < n; ++i) out[i] = v[i] != 0.f;
          } else if constexpr (kIsFloatStorage<T>) {
            for (int64_t i = 0; i < n; ++i) out[i] = store<T>(static_cast<typename Compute<T>::type>(v[i]));
          }
        });
      }
    }
  });
  return Status::Ok();
}

}  // namespace

void register_elementwise_kernels(KernelTable& t) {
  t.add("neg", unary_kernel<Neg>);
  t.add("abs", unary_kernel<Abs>);
  t.add("sign", unary_kernel<Sign>);
  t.add("exp", unary_kernel<Exp>);
  t.add("log", unary_kernel<Log>);
  t.add("sqrt", unary_kernel<Sqrt>);
  t.add("rsqrt", unary_kernel<Rsqrt>);
  t.add("reciprocal", unary_kernel<Reciprocal>);
  t.add("tanh", unary_kernel<Tanh>);
  t.add("sigmoid", unary_kernel<Sigmoid>);
  t.add("relu", unary_kernel<Relu>);
  t.add("leaky_relu", unary_kernel<LeakyRelu>);
  t.add("erf", unary_kernel<Erf>);
  t.add("gelu", unary_kernel<Gelu>);
  t.add("floor", unary_kernel<Floor>);
  t.add("ceil", unary_kernel<Ceil>);
  t.add("round", unary_kernel<Round>);
  t.add("sin", unary_kernel<Sin>);
  t.add("cos", unary_kernel<Cos>);
  t.add("asin", unary_kernel<Asin>);
  t.add("acos", unary_kernel<Acos>);
  t.add("atan", unary_kernel<Atan>);
  t.add("softplus", unary_kernel<Softplus>);
  t.add("not", not_kernel);

  t.add("add", binary_kernel<Add>);
  t.add("sub", binary_kernel<Sub>);
  t.add("mul", binary_kernel<Mul>);
  t.add("div", binary_kernel<Div>);
  t.add("pow", binary_kernel<Pow>);
  t.add("max", binary_kernel<Max>);
  t.add("min", binary_kernel<Min>);
  t.add("mod", binary_kernel<Mod>);
  t.add("equal", binary_kernel<Equal>);
  t.add("less", binary_kernel<Less>);
  t.add("less_equal", binary_kernel<LessEqual>);
  t.add("greater", binary_kernel<Greater>);
  t.add("greater_equal", binary_kernel<GreaterEqual>);
  t.add("and", binary_kernel<And>);
  t.add("or", binary_kernel<Or>);
  t.add("xor", binary_kernel<Xor>);

  t.add("where", where_kernel);
  t.add("cast", cast_kernel);
  t.add("copy", copy_kernel);
  t.add("copy_to_host", copy_kernel);  // host and "device" are both RAM on the CPU backend
  t.add("copy_to_device", copy_kernel);
  for (const char* start : {"copy_to_host_start", "copy_to_device_start"}) t.add(start, copy_kernel);
  for (const char* done : {"copy_to_host_done", "copy_to_device_done"}) t.add(done, copy_done_kernel);
  t.add("dropout", dropout_kernel);
  t.add("fused_elementwise", fused_elementwise_kernel);
}

}  // namespace memc::cpu
