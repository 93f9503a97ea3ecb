// Reductions and normalizations: reduce_*, argmax/argmin, softmax, log_softmax, layernorm.
// Sums accumulate in f64 (integers in i64) so long rows keep f32 accuracy; exponentials
// subtract the row max first.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/loops.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/workspace.h"

namespace memc::cpu {
namespace {

// ---- reduce_* -------------------------------------------------------------------------------

enum class Reduction { kSum, kMean, kMax, kMin, kProd, kSumSquare, kL2 };

template <Reduction R, typename A>
A reduction_identity() {
  if constexpr (R == Reduction::kMax) return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::lowest();
  else if constexpr (R == Reduction::kMin) return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
  else if constexpr (R == Reduction::kProd) return A(1);
  else return A(0);
}

// Max and min propagate NaN: once the accumulator is NaN it stays NaN.
template <Reduction R, typename A>
A reduction_combine(A acc, A x) {
  if constexpr (R == Reduction::kMax) return (x > acc || x != x) ? x : acc;
  else if constexpr (R == Reduction::kMin) return (x < acc || x != x) ? x : acc;
  else if constexpr (R == Reduction::kProd) return acc * x;
  else if constexpr (R == Reduction::kSumSquare || R == Reduction::kL2) return acc + x * x;
  else return acc + x;
}

// Element strides of the output over the input's dims: 0 along reduced axes, so every input
// element lands on its output slot during one walk of the input.
std::vector<int64_t> reduced_strides(const Shape& in, const std::vector<int64_t>& axes) {
  Shape kept = in;
  for (size_t d = 0; d < in.size(); ++d) {
    if (axes.empty() || std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end()) kept[d] = 1;
  }
  return broadcast_strides(kept, in);
}

// How many leading dims `axes` reduces when it is exactly {0, 1, ..., k-1} with k < rank and
// something left to keep; 0 otherwise.
int64_t leading_axes(const Shape& in, std::vector<int64_t> axes) {
  if (axes.empty() || axes.size() >= in.size()) return 0;
  std::sort(axes.begin(), axes.end());
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] != static_cast<int64_t>(i)) return 0;
  }
  return static_cast<int64_t>(axes.size());
}

// Accumulator type: f64 for floats, i64 for integers.
template <typename T>
using ReduceAcc = std::conditional_t<kIsFloatStorage<T>, double, int64_t>;

// Workspace: one accumulator per output element, acc [out_count].
template <Reduction R, typename T>
void reduce(T* y, const T* x, const Shape& in_shape, const std::vector<int64_t>& axes, int64_t out_count, Workspace& ws) {
  // y: [out_count], x: [in_shape]
  using A = ReduceAcc<T>;
  A* acc = ws.take<A>(out_count);
  std::fill(acc, acc + out_count, reduction_identity<R, A>());
  if (const int64_t lead = leading_axes(in_shape, axes); lead > 0) {
    // Reducing the leading dims ([rows, cols] → [cols], e.g. a bias gradient): columns split over
    // threads, each column summed in row order as the walk below would.
    const int64_t cols = out_count, rows = cols ? numel(in_shape) / cols : 0;
    parallel_ranges(cols, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(rows, 1)), INT64_MAX,
                    [&](int64_t, int64_t begin, int64_t end) {
                      for (int64_t r = 0; r < rows; ++r) {
                        const T* xr = x + r * cols;
                        for (int64_t c = begin; c < end; ++c) acc[c] = reduction_combine<R>(acc[c], static_cast<A>(load<T>(xr[c])));
                      }
                    });
  } else {
    for_each_row<2>(in_shape, {reduced_strides(in_shape, axes), row_major_strides(in_shape)},
                    [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
                      A* a = acc + off[0];
                      const T* xr = x + off[1];
                      if (st[0] == 0) {  // reducing along the run: one accumulator
                        A total = a[0];
                        for (int64_t i = 0; i < n; ++i) total = reduction_combine<R>(total, static_cast<A>(load<T>(xr[i * st[1]])));
                        a[0] = total;
                      } else {
                        for (int64_t i = 0; i < n; ++i) a[i * st[0]] = reduction_combine<R>(a[i * st[0]], static_cast<A>(load<T>(xr[i * st[1]])));
                      }
                    });
  }
  const int64_t count = out_count ? numel(in_shape) / out_count : 0;
  for (int64_t i = 0; i < out_count; ++i) {
    A v = acc[i];
    if constexpr (R == Reduction::kMean) v = count ? static_cast<A>(v / static_cast<A>(count)) : v;
    if constexpr (R == Reduction::kL2) v = static_cast<A>(std::sqrt(static_cast<double>(v)));
    y[i] = store<T>(static_cast<typename Compute<T>::type>(v));
  }
}

template <Reduction R>
Status reduce_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  const auto axes = ctx.node.attrs.get_ints("axes");
  Workspace ws(ctx);
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T>) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      reduce<R>(y.data<T>(), x.data<T>(), x.shape(), axes, y.numel(), ws);
      return Status::Ok();
    }
  });
}

int64_t reduce_workspace(const Node&, std::span<const TensorType> in, std::span<const TensorType> out) {
  return layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) {
    if constexpr (kIsNumeric<T>) ws.take<ReduceAcc<T>>(out[0].numel());
  });
}

// ---- cumsum --------------------------------------------------------------------------------

// y[o, i, j] = Σ x[o, k, j] over k ≤ i (k < i exclusive; k ≥ i / k > i reversed), accumulated
// in the compute type (f32 for 16-bit floats, i64 for integers).
Status cumsum_kernel(KernelContext& ctx);

// ---- argmax / argmin ------------------------------------------------------------------------

// The input viewed as [outer, n, inner] around `axis`.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
  AxisView(const Shape& shape, int64_t axis) {
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      if (d < axis) outer *= shape[d];
      else if (d == axis) n = shape[d];
      else inner *= shape[d];
    }
  }
};

// NaN counts as the extreme (numpy); ties keep the first index unless select_last_index.
template <bool kMax, typename T>
void arg_extreme(int64_t* y, const T* x, const AxisView& v, bool select_last) {  // y: [outer, inner], x: [outer, n, inner]
  for (int64_t o = 0; o < v.outer; ++o) {
    for (int64_t j = 0; j < v.inner; ++j) {
      const T* col = x + o * v.n * v.inner + j;
      auto best = load<T>(col[0]);
      int64_t best_index = 0;
      for (int64_t i = 1; i < v.n; ++i) {
        const auto value = load<T>(col[i * v.inner]);
        const bool best_nan = best != best, value_nan = value != value;
        bool better = kMax ? value > best : value < best;
        if (select_last && value == best) better = true;
        if (best_nan) better = select_last && value_nan;
        else if (value_nan) better = true;
        if (better) {
          best = value;
          best_index = i;
        }
      }
      y[o * v.inner + j] = best_index;
    }
  }
}

template <bool kMax>
Status arg_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  const AxisView view(x.shape(), ctx.node.attrs.get_int("axis", 0));
  const bool select_last = ctx.node.attrs.get_int("select_last_index", 0);
  if (view.n == 0) return Status::BadInput("argmax/argmin over an empty axis");
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    arg_extreme<kMax>(ctx.outputs[0]->data<int64_t>(), x.data<T>(), view, select_last);
  });
  return Status::Ok();
}

// ---- topk ------------------------------------------------------------------------------------

// The k largest (smallest) along the axis, in torch.topk's order (topk_before, shared with the
// CUDA body). A partial sort of each line's positions (workspace [n]).
Status topk_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  const int64_t axis = ctx.node.attrs.get_int("axis", 0), k = ctx.node.attrs.get_int("k", 1);
  const bool largest = ctx.node.attrs.get_int("largest", 1) != 0;
  const AxisView v(x.shape(), axis);
  if (k < 1 || k > v.n) return Status::BadInput(str_cat("topk: k = ", k, " outside [1, ", v.n, "]"));
  Workspace ws(ctx);
  int64_t* order = ws.take<int64_t>(v.n);
  int64_t* indices = ctx.outputs[1]->data<int64_t>();
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    const T* src = x.data<T>();
    T* values = ctx.outputs[0]->data<T>();
    for (int64_t o = 0; o < v.outer; ++o) {
      for (int64_t j = 0; j < v.inner; ++j) {
        const T* line = src + o * v.n * v.inner + j;
        const auto before = [&](int64_t a, int64_t b) { return topk_before(load<T>(line[a * v.inner]), a, load<T>(line[b * v.inner]), b, largest); };
        for (int64_t i = 0; i < v.n; ++i) order[i] = i;
        std::partial_sort(order, order + k, order + v.n, before);
        for (int64_t r = 0; r < k; ++r) {
          const int64_t at = o * k * v.inner + r * v.inner + j;
          values[at] = line[order[r] * v.inner];
          indices[at] = order[r];
        }
      }
    }
  });
  return Status::Ok();
}

int64_t topk_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType>) {
  Workspace counter;
  counter.take<int64_t>(in[0].shape[node.attrs.get_int("axis", 0)]);
  return counter.used_bytes();
}

// ---- softmax / log_softmax ------------------------------------------------------------------

// One row of n values at stride `inner`: softmax = e^(x - max) / Σ, log_softmax = x - max - ln Σ.
// Workspace: one row in compute type, row [n].
template <bool kLog, typename T>
void softmax(T* y, const T* x, const AxisView& v, Workspace& ws) {  // y, x: [outer, n, inner]
  using C = typename Compute<T>::type;
  C* row = ws.take<C>(v.n);
  for (int64_t o = 0; o < v.outer; ++o) {
    for (int64_t j = 0; j < v.inner; ++j) {
      const int64_t base = o * v.n * v.inner + j;
      C row_max = -std::numeric_limits<C>::infinity();
      for (int64_t i = 0; i < v.n; ++i) {
        row[i] = load<T>(x[base + i * v.inner]);
        row_max = std::max(row_max, row[i]);
      }
      if (row_max == -std::numeric_limits<C>::infinity()) row_max = 0;  // all -inf: avoid inf - inf
      // One exponential per element: softmax keeps e^(x - max) in the row buffer.
      double sum = 0;
      for (int64_t i = 0; i < v.n; ++i) {
        const C e = std::exp(row[i] - row_max);
        sum += e;
        if constexpr (!kLog) row[i] = e;
      }
      const C log_sum = static_cast<C>(std::log(sum)), inv_sum = static_cast<C>(1.0 / sum);
      for (int64_t i = 0; i < v.n; ++i) {
        y[base + i * v.inner] = store<T>(kLog ? row[i] - row_max - log_sum : row[i] * inv_sum);
      }
    }
  }
}

template <bool kLog>
Status softmax_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  const AxisView view(x.shape(), ctx.node.attrs.get_int("axis", x.rank() - 1));
  Workspace ws(ctx);
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsFloatStorage<T>) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      softmax<kLog>(ctx.outputs[0]->data<T>(), x.data<T>(), view, ws);
      return Status::Ok();
    }
  });
}

int64_t softmax_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType>) {
  const AxisView view(in[0].shape, node.attrs.get_int("axis", static_cast<int64_t>(in[0].shape.size()) - 1));
  return layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) {
    if constexpr (kIsFloatStorage<T>) ws.take<typename Compute<T>::type>(view.n);
  });
}

// ---- layernorm ------------------------------------------------------------------------------

// `param` broadcast to the normalized dims, as n values of compute type C in `out` [n].
template <typename T, typename C>
const C* expand_param(C* out, const Tensor* param, const Shape& normalized, C fallback) {
  const int64_t n = numel(normalized);
  if (!param) {
    std::fill(out, out + n, fallback);
    return out;
  }
  const std::vector<int64_t> strides = broadcast_strides(param->shape(), normalized);  // O(rank)
  for (int64_t i = 0; i < n; ++i) out[i] = load<T>(param->data<T>()[strided_offset(i, normalized, strides)]);
  return out;
}

// Σ (x[i] − shift) (kSquare: Σ (x[i] − shift)²) over a row, in f64 with 8 interleaved partial
// sums combined in a fixed order: GCC vectorizes the lanes, where one running sum is a serial
// chain. The result depends only on the row, never on alignment or threads.
template <bool kSquare, typename T>
double row_moment(const T* x, int64_t n, double shift) {
  constexpr int kParts = 8;
  double part[kParts] = {};
  int64_t i = 0;
  for (; i + kParts <= n; i += kParts) {
    for (int k = 0; k < kParts; ++k) {
      const double v = static_cast<double>(load<T>(x[i + k])) - shift;
      part[k] += kSquare ? v * v : v;
    }
  }
  double total = 0;
  for (int k = 0; k < kParts; ++k) total += part[k];
  for (; i < n; ++i) {
    const double v = static_cast<double>(load<T>(x[i])) - shift;
    total += kSquare ? v * v : v;
  }
  return total;
}

// y = (x - mean)·inv_std·scale + bias per row of n normalized elements; mean and
// inv_std = 1/√(var + eps) are also written out (f32) when asked for.
template <typename T, typename Y = T>
void layernorm(Y* y, float* mean_out, float* inv_std_out, const T* x, const typename Compute<T>::type* scale,
               const typename Compute<T>::type* bias, int64_t rows, int64_t n, double eps) {
  // y, x: [rows, n], mean_out, inv_std_out: [rows] or null, scale, bias: [n]
  using C = typename Compute<T>::type;
  parallel_ranges(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n, 1)), INT64_MAX,
                  [&](int64_t, int64_t begin, int64_t end) {  // rows are independent
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      const double mean = n ? row_moment<false>(xr, n, 0.0) / n : 0;
      const double square_sum = row_moment<true>(xr, n, mean);
      const double inv_std = 1.0 / std::sqrt((n ? square_sum / n : 0) + eps);
      const C mean_c = static_cast<C>(mean), inv_std_c = static_cast<C>(inv_std);
      Y* yr = y + r * n;
      for (int64_t i = 0; i < n; ++i) yr[i] = store<Y, C>((load<T>(xr[i]) - mean_c) * inv_std_c * scale[i] + bias[i]);
      if (mean_out) mean_out[r] = static_cast<float>(mean);
      if (inv_std_out) inv_std_out[r] = static_cast<float>(inv_std);
    }
  });
}

// layernorm over x, or over s = x + r written first (add_layernorm, whose outputs are s and y).
// r is rounded to x's dtype as a cast rounds it, then added as the add kernel adds; s may share
// x's buffer (each element is read before it is written).
Status layernorm_rows(KernelContext& ctx, bool residual) {
  const Tensor& x = *ctx.inputs[0];
  const size_t params = residual ? 2 : 1, y_out = residual ? 1 : 0;
  const Tensor* scale = ctx.inputs[params];
  const Tensor* bias = ctx.inputs.size() > params + 1 ? ctx.inputs[params + 1] : nullptr;
  const int64_t axis = ctx.node.attrs.get_int("axis", x.rank() - 1);
  const double eps = ctx.node.attrs.get_float("eps", 1e-5);
  const Shape normalized(x.shape().begin() + axis, x.shape().end());
  const int64_t n = numel(normalized), rows = n ? x.numel() / n : 0;
  auto stat = [&](size_t i) { return ctx.outputs.size() > i && ctx.outputs[i] ? ctx.outputs[i]->data<float>() : nullptr; };
  Workspace ws(ctx);
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsFloatStorage<T>) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      using C = typename Compute<T>::type;
      const T* source = x.data<T>();
      if (residual) {
        T* sum = ctx.outputs[0]->data<T>();
        const Status added = dispatch_dtype(ctx.inputs[1]->dtype(), [&]<typename U>() -> Status {
          if constexpr (!kIsFloatStorage<U>) {
            return unsupported_dtype(ctx, ctx.inputs[1]->dtype());
          } else {
            const U* r = ctx.inputs[1]->data<U>();
            parallel_ranges(x.numel(), kElementwiseGrain, INT64_MAX, [&](int64_t, int64_t begin, int64_t end) {
              for (int64_t i = begin; i < end; ++i) sum[i] = store<T, C>(load(source[i]) + load(store<T, float>(load(r[i]))));
            });
            return Status::Ok();
          }
        });
        MEMC_RETURN_IF_ERROR(added);
        source = sum;
      }
      C* scale_n = ws.take<C>(n);  // scale and bias broadcast to [n]
      C* bias_n = ws.take<C>(n);
      const C* scale_c = expand_param<T>(scale_n, scale, normalized, C(1));
      const C* bias_c = expand_param<T>(bias_n, bias, normalized, C(0));
      // y in x's dtype, or (add_layernorm's y_dtype, from f32) narrower: each value stored once,
      // as the cast would store it
      Tensor& y = *ctx.outputs[y_out];
      return dispatch_dtype(y.dtype(), [&]<typename Y>() -> Status {
        if constexpr (std::is_same_v<Y, T> || (std::is_same_v<C, float> && kIsFloatStorage<Y> && sizeof(Y) == 2)) {
          layernorm(y.data<Y>(), stat(y_out + 1), stat(y_out + 2), source, scale_c, bias_c, rows, n, eps);
          return Status::Ok();
        } else {
          return unsupported_dtype(ctx, y.dtype());
        }
      });
    }
  });
}

Status layernorm_kernel(KernelContext& ctx) { return layernorm_rows(ctx, false); }
Status add_layernorm_kernel(KernelContext& ctx) { return layernorm_rows(ctx, true); }

int64_t layernorm_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType>) {
  const Shape& x = in[0].shape;
  const int64_t axis = node.attrs.get_int("axis", static_cast<int64_t>(x.size()) - 1);
  const int64_t n = numel(Shape(x.begin() + axis, x.end()));
  return layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) {
    if constexpr (kIsFloatStorage<T>) {
      ws.take<typename Compute<T>::type>(n);
      ws.take<typename Compute<T>::type>(n);
    }
  });
}

Status cumsum_kernel(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  const AxisView v(x.shape(), ctx.node.attrs.get_int("axis", 0));
  const bool exclusive = ctx.node.attrs.get_int("exclusive", 0), reverse = ctx.node.attrs.get_int("reverse", 0);
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T>) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      const T* in = x.data<T>();  // [outer, n, inner]
      T* out = y.data<T>();       // [outer, n, inner]
      for (int64_t o = 0; o < v.outer; ++o) {
        for (int64_t j = 0; j < v.inner; ++j) {
          decltype(load<T>(in[0])) acc{};
          for (int64_t step = 0; step < v.n; ++step) {
            const int64_t i = reverse ? v.n - 1 - step : step;
            const int64_t at = (o * v.n + i) * v.inner + j;
            const auto value = load<T>(in[at]);
            if (!exclusive) acc += value;
            out[at] = store<T>(acc);
            if (exclusive) acc += value;
          }
        }
      }
      return Status::Ok();
    }
  });
}

}  // namespace

void register_reduce_kernels(KernelTable& t) {
  t.add("reduce_sum", reduce_kernel<Reduction::kSum>, reduce_workspace);
  t.add("cumsum", cumsum_kernel);
  t.add("reduce_mean", reduce_kernel<Reduction::kMean>, reduce_workspace);
  t.add("reduce_max", reduce_kernel<Reduction::kMax>, reduce_workspace);
  t.add("reduce_min", reduce_kernel<Reduction::kMin>, reduce_workspace);
  t.add("reduce_prod", reduce_kernel<Reduction::kProd>, reduce_workspace);
  t.add("reduce_sum_square", reduce_kernel<Reduction::kSumSquare>, reduce_workspace);
  t.add("reduce_l2", reduce_kernel<Reduction::kL2>, reduce_workspace);
  t.add("argmax", arg_kernel<true>);
  t.add("argmin", arg_kernel<false>);
  t.add("topk", topk_kernel, topk_workspace);
  t.add("softmax", softmax_kernel<false>, softmax_workspace);
  t.add("log_softmax", softmax_kernel<true>, softmax_workspace);
  t.add("layernorm", layernorm_kernel, layernorm_workspace);
  t.add("add_layernorm", add_layernorm_kernel, layernorm_workspace);
}

}  // namespace memc::cpu
