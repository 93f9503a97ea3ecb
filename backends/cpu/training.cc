// CPU kernels of the training ops (ir/ops/training.cc): loss, fills and fused backward ops.
// Float work is done in the compute type of the storage (f32 for f16/bf16, f64 for f64).
#include <algorithm>
#include <cmath>
#include <optional>

#include "backends/cpu/gelu.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/vector_math.h"
#include "backends/cpu/workspace.h"
#include "ir/ops/ops.h"  // kGatherNoRow

namespace memc::cpu {
namespace {


// Splits a shape at `axis` into [outer, inner] for ops that work over dims axis..end.
std::pair<int64_t, int64_t> split_at(const Shape& s, int64_t axis) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) (d < axis ? outer : inner) *= s[d];
  return {outer, inner};
}

// Softmax-family ops reduce over one axis: [outer, n, inner] with stride `inner` along n.
struct AxisView {
  int64_t outer, n, inner;
};
AxisView axis_view(const Shape& s, int64_t axis) {
  AxisView v{1, s.empty() ? 1 : s[axis], 1};
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < axis) v.outer *= s[d];
    if (d > axis) v.inner *= s[d];
  }
  return v;
}

Status full_kernel(KernelContext& ctx) {
  Tensor& out = *ctx.outputs[0];
  const double value = ctx.node.attrs.get_float("value", 0.0);
  for (int64_t i = 0, count = out.numel(); i < count; ++i) out.set_from_double(i, value);
  return Status::Ok();
}

// CrossEntropyRows: backends/kernel_attrs.h (shared with CUDA).
Status check_labels(const Tensor& labels, int64_t classes, const CrossEntropyRows& rows) {
  for (int64_t i = 0, count = labels.numel(); i < count; ++i) {
    const int64_t l = labels.data<int64_t>()[i];
    if ((l < 0 || l >= classes) && !rows.ignored(l)) {
      return Status::BadInput(str_cat("label ", l, " at row ", i, " is outside [0, ", classes, ")"));
    }
  }
  return Status::Ok();
}

// Max and f64 sum of n floats in 16 and 8 lanes: a fixed association (the result does not depend
// on threads) that the compiler can vectorize, where one running value is latency-bound.
inline float lane_max(const float* x, int64_t n) {
  float lane[16];
  std::fill(lane, lane + 16, -INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) lane[j] = lane[j] < x[i + j] ? x[i + j] : lane[j];
  }
  for (; i < n; ++i) lane[0] = lane[0] < x[i] ? x[i] : lane[0];
  float m = lane[0];
  for (int j = 1; j < 16; ++j) m = m < lane[j] ? lane[j] : m;
  return m;
}

inline double lane_sum(const float* x, int64_t n) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += x[i + j];
  }
  for (; i < n; ++i) lane[0] += x[i];
  double sum = 0;
  for (int j = 0; j < 8; ++j) sum += lane[j];
  return sum;
}

// A row's max and Σ exp(z - max) in f32 compute: exp in vectors (vector_math.h), the sum in f64
// lanes. f64 rows keep f64 throughout.
template <typename T>
std::pair<double, double> row_max_and_sum(const T* row, int64_t classes) {
  using C = typename Compute<T>::type;
  if constexpr (std::is_same_v<C, float>) {
    float v[kVectorChunk], m = -INFINITY;
    for (int64_t c0 = 0; c0 < classes; c0 += kVectorChunk) {
      const int64_t len = std::min(kVectorChunk, classes - c0);
      for (int64_t j = 0; j < len; ++j) v[j] = load(row[c0 + j]);
      m = std::max(m, lane_max(v, len));
    }
    double sum = 0;
    for (int64_t c0 = 0; c0 < classes; c0 += kVectorChunk) {
      const int64_t len = std::min(kVectorChunk, classes - c0);
      for (int64_t j = 0; j < len; ++j) v[j] = load(row[c0 + j]) - m;
      exp_in_place(v, len);
      sum += lane_sum(v, len);
    }
    return {static_cast<double>(m), sum};
  } else {
    C m = -INFINITY;
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, load(row[c]));
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(load(row[c]) - m);
    return {static_cast<double>(m), sum};
  }
}

// Rows a parallel region takes at a time: their losses are summed in row order after it.
constexpr int64_t kLossRowBlock = 1024;

// loss = (1/N) Σ_n [logsumexp(z_n) - z_n[label_n]], over rows not ignored; rows in parallel.
Status softmax_cross_entropy_kernel(KernelContext& ctx) {
  const Tensor &logits = *ctx.inputs[0], &labels = *ctx.inputs[1];
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  const CrossEntropyRows loss_rows(ctx.node, rows);
  MEMC_RETURN_IF_ERROR(check_labels(labels, classes, loss_rows));
  return dispatch_float(ctx, logits.dtype(), [&]<typename T>() {
    const T* z = logits.data<T>();  // [N, C]
    const int64_t* label = labels.data<int64_t>();
    double total = 0, row_loss[kLossRowBlock];
    for (int64_t b0 = 0; b0 < rows; b0 += kLossRowBlock) {
      const int64_t block = std::min(kLossRowBlock, rows - b0);
      parallel_ranges(block, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(classes, 1)), INT64_MAX,
                      [&](int64_t, int64_t begin, int64_t end) {
                        for (int64_t i = begin; i < end; ++i) {
                          const int64_t n = b0 + i;
                          row_loss[i] = 0;
                          if (loss_rows.ignored(label[n])) continue;
                          const auto [m, sum] = row_max_and_sum(z + n * classes, classes);
                          row_loss[i] = m + std::log(sum) - static_cast<double>(load(z[n * classes + label[n]]));
                        }
                      });
      for (int64_t i = 0; i < block; ++i) total += row_loss[i];
    }
    ctx.outputs[0]->set_from_double(0, total / loss_rows.divisor);  // f32 or f64
  });
}

// dz = dloss·(softmax(z) - onehot(label))/N, zero on ignored rows; rows in parallel.
Status softmax_cross_entropy_grad_kernel(KernelContext& ctx) {
  const Tensor &dloss = *ctx.inputs[0], &logits = *ctx.inputs[1], &labels = *ctx.inputs[2];
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  const CrossEntropyRows loss_rows(ctx.node, rows);
  MEMC_RETURN_IF_ERROR(check_labels(labels, classes, loss_rows));
  const double scale = dloss.get_as_double(0) / loss_rows.divisor;
  return dispatch_float(ctx, logits.dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* z = logits.data<T>();       // [N, C]
    T* dz = ctx.outputs[0]->data<T>();   // [N, C]
    const int64_t* label = labels.data<int64_t>();
    parallel_ranges(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(classes, 1)), INT64_MAX,
                    [&](int64_t, int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        T* out = dz + n * classes;
        if (loss_rows.ignored(label[n])) {
          std::fill(out, out + classes, store<T, C>(C(0)));
          continue;
        }
        const T* row = z + n * classes;
        if constexpr (std::is_same_v<T, float>) {  // exp once, into dz, then scaled there
          const float m = lane_max(row, classes);
          for (int64_t c = 0; c < classes; ++c) out[c] = row[c] - m;
          exp_in_place(out, classes);
          const double sum = lane_sum(out, classes);
          const float factor = static_cast<float>(scale / sum);
          for (int64_t c = 0; c < classes; ++c) out[c] *= factor;
          out[label[n]] -= static_cast<float>(scale);
          continue;
        }
        const auto [m, sum] = row_max_and_sum(row, classes);
        const C factor = static_cast<C>(scale / sum), s = static_cast<C>(scale);
        if constexpr (std::is_same_v<C, float>) {
          float v[kVectorChunk];
          for (int64_t c0 = 0; c0 < classes; c0 += kVectorChunk) {
            const int64_t len = std::min(kVectorChunk, classes - c0);
            for (int64_t j = 0; j < len; ++j) v[j] = load(row[c0 + j]) - static_cast<float>(m);
            exp_in_place(v, len);
            for (int64_t j = 0; j < len; ++j) out[c0 + j] = store<T, C>(factor * v[j] - (c0 + j == label[n] ? s : C(0)));
          }
        } else {
          for (int64_t c = 0; c < classes; ++c) {
            out[c] = store<T, C>(factor * std::exp(load(row[c]) - static_cast<C>(m)) - (c == label[n] ? s : C(0)));
          }
        }
      }
    });
  });
}

// gelu'(x) = Φ(x) + x·φ(x), or the derivative of the tanh approximation.
Status gelu_grad_kernel(KernelContext& ctx) {
  const bool tanh_form = ctx.node.attrs.get_string("approximate", "none") == "tanh";
  return dispatch_float(ctx, ctx.inputs[1]->dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* dy = ctx.inputs[0]->data<T>();
    const T* x = ctx.inputs[1]->data<T>();
    T* dx = ctx.outputs[0]->data<T>();
    const int64_t n = ctx.outputs[0]->numel();
    parallel_elementwise(n, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<C, float>) {  // the same formulas, tanh or erf and exp in vectors
        float v[kVectorChunk];
        for (int64_t i0 = begin; i0 < end; i0 += kVectorChunk) {
          const int64_t len = std::min(kVectorChunk, end - i0);
          for (int64_t j = 0; j < len; ++j) v[j] = load(x[i0 + j]);
          gelu_derivative_floats(v, len, tanh_form);  // backends/cpu/gelu.h
          for (int64_t j = 0; j < len; ++j) dx[i0 + j] = store<T, C>(load(dy[i0 + j]) * v[j]);
        }
      } else {
        for (int64_t i = begin; i < end; ++i) {
          const C d = gelu_derivative<C>(load(x[i]), tanh_form);
          dx[i] = store<T, C>(load(dy[i]) * d);
        }
      }
    });
  });
}

// softmax: dx = y·(dy - Σ dy·y);  log_softmax: dx = dy - e^y·Σ dy
template <bool kLog>
Status softmax_grad_kernel(KernelContext& ctx) {
  // Same default as the forward softmax (ir/ops/reduce.cc): the last axis.
  const AxisView v = axis_view(ctx.inputs[1]->shape(), ctx.node.attrs.get_int("axis", ctx.inputs[1]->rank() - 1));
  return dispatch_float(ctx, ctx.inputs[1]->dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* dy = ctx.inputs[0]->data<T>();
    const T* y = ctx.inputs[1]->data<T>();
    T* dx = ctx.outputs[0]->data<T>();
    for (int64_t o = 0; o < v.outer; ++o) {
      for (int64_t in = 0; in < v.inner; ++in) {
        const int64_t base = o * v.n * v.inner + in;
        C dot = 0;
        for (int64_t k = 0; k < v.n; ++k) {
          const int64_t i = base + k * v.inner;
          dot += kLog ? load(dy[i]) : load(dy[i]) * load(y[i]);
        }
        for (int64_t k = 0; k < v.n; ++k) {
          const int64_t i = base + k * v.inner;
          dx[i] = store<T, C>(kLog ? load(dy[i]) - std::exp(load(y[i])) * dot : load(y[i]) * (load(dy[i]) - dot));
        }
      }
    }
  });
}

// layernorm_grad splits the rows into at most kLayernormBlocks blocks of whole rows, a count
// from the shape alone: blocks run on parallel threads, each with its own x̂ and g rows and its
// own partial dscale, and the partials are summed in block order, so dscale does not depend on
// --threads.
constexpr int64_t kLayernormBlocks = 64;

int64_t layernorm_block_rows(int64_t rows) { return std::max<int64_t>(1, (rows + kLayernormBlocks - 1) / kLayernormBlocks); }

// layernorm_grad's workspace in compute type C: scale broadcast to [H]; per slot (one per thread,
// at most kMaxKernelSlots) x̂ and g rows [H]; per block a partial dscale [H]; and, when scale
// broadcasts from fewer elements, dscale in scale's layout [ds_n].
template <typename C>
struct LayernormGradScratch {
  C *scale_h, *xhat, *g, *partial, *acc, *partial_bias;
  int64_t blocks;
  LayernormGradScratch(Workspace& ws, int64_t rows, int64_t h, int64_t ds_n, bool bias)
      : blocks(rows > 0 ? (rows + layernorm_block_rows(rows) - 1) / layernorm_block_rows(rows) : 0) {
    const int64_t slots = std::max<int64_t>(1, std::min(blocks, kMaxKernelSlots));
    scale_h = ws.take<C>(h);
    xhat = ws.take<C>(slots * h);
    g = ws.take<C>(slots * h);
    partial = ws.take<C>(blocks * h);
    acc = ws.take<C>(ds_n == h ? 0 : ds_n);
    partial_bias = ws.take<C>(bias ? blocks * h : 0);  // per block: Σ dy (the bias gradient's partials)
  }
};

// With x̂ = (x - μ)·r over the normalized dims (size H), g = dy·scale:
//   dx = r·(g - mean(g) - x̂·mean(g·x̂)),  dscale = Σ_rows dy·x̂ (scale's full broadcast shape).
// One row: dx[r] and its dy·x̂ added into `dscale`; xr, dyr in T, xhat and g scratch rows [H].
// With an addend row, dx is stored, then the addend added as the add kernel adds two T values;
// with `dbias`, dy is added into it. dy is T, or (f32 x) its 16-bit form D, read as its cast reads it.
template <typename T, typename D, typename C>
void layernorm_grad_row(T* dx, const T* xr, const D* dyr, const T* addend, const C* scale_h, C* xhat, C* g, C* dscale, C* dbias,
                        int64_t h, double eps) {
  if (dbias) {
    for (int64_t j = 0; j < h; ++j) dbias[j] += load(dyr[j]);
  }
  for (int64_t j = 0; j < h; ++j) xhat[j] = load(xr[j]);
  const C mean = interleaved_dot<C>(xhat, nullptr, h) / static_cast<C>(h);
  for (int64_t j = 0; j < h; ++j) xhat[j] -= mean;
  const C inv_std = C(1) / std::sqrt(interleaved_dot<C>(xhat, xhat, h) / static_cast<C>(h) + static_cast<C>(eps));
  for (int64_t j = 0; j < h; ++j) {
    xhat[j] *= inv_std;
    g[j] = load(dyr[j]) * scale_h[j];
    dscale[j] += load(dyr[j]) * xhat[j];
  }
  const C mean_g = interleaved_dot<C>(g, nullptr, h) / static_cast<C>(h);
  const C mean_gx = interleaved_dot<C>(g, xhat, h) / static_cast<C>(h);
  for (int64_t j = 0; j < h; ++j) dx[j] = store<T, C>(inv_std * (g[j] - mean_g - xhat[j] * mean_gx));
  if (addend) {
    for (int64_t j = 0; j < h; ++j) dx[j] = store<T, C>(load(dx[j]) + load(addend[j]));
  }
}

// dx's 16-bit copy (layernorm_grad's {dx_copy}), each value stored as the cast kernel stores it.
template <typename T>
void store_copy(Tensor* copy, const T* dx, int64_t begin, int64_t end) {
  if constexpr (std::is_same_v<T, float>) {
    dispatch_dtype(copy->dtype(), [&]<typename N>() {
      if constexpr (std::is_same_v<N, bf16_t> || std::is_same_v<N, f16_t>) {
        N* out = copy->data<N>();
        for (int64_t i = begin; i < end; ++i) out[i] = store<N, float>(dx[i]);
      }
    });
  }
}

Status layernorm_grad_kernel(KernelContext& ctx) {
  const Tensor &dy_t = *ctx.inputs[0], &x_t = *ctx.inputs[1], &scale_t = *ctx.inputs[2];
  const int64_t axis = ctx.node.attrs.get_int("axis", x_t.rank() - 1);  // forward's default: the last dim
  const double eps = ctx.node.attrs.get_float("eps", 1e-5);
  // Plain variables, not a structured binding: clang 14 (the fuzz build) cannot capture those.
  const std::pair<int64_t, int64_t> rows_h = split_at(x_t.shape(), axis);
  const int64_t rows = rows_h.first, h = rows_h.second;
  const Shape normalized(x_t.shape().begin() + axis, x_t.shape().end());
  const auto scale_strides = broadcast_strides(scale_t.shape(), normalized);
  Workspace ws(ctx);
  // dbias (the shape function made scale span the rows), and dx's 16-bit copy: the last output
  const bool bias = ctx.node.attrs.get_int("bias_grad", 0) && ctx.outputs.size() > 2 && ctx.outputs[2];
  Tensor* copy = ctx.node.attrs.has("dx_copy") ? ctx.outputs.back() : nullptr;
  const bool narrow_dy = dy_t.dtype() != x_t.dtype();
  if (narrow_dy && !(x_t.dtype() == DType::kF32 && is_16bit_float(dy_t.dtype()))) return unsupported_dtype(ctx, dy_t.dtype());
  if (copy && !(x_t.dtype() == DType::kF32 && is_16bit_float(copy->dtype()))) return unsupported_dtype(ctx, copy->dtype());
  return dispatch_float(ctx, x_t.dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* x = x_t.data<T>();          // [rows, H]
    const T* scale = scale_t.data<T>();  // broadcast to [H]
    T* dx = ctx.outputs[0]->data<T>();   // [rows, H]
    const T* addend = ctx.inputs.size() > 3 && ctx.inputs[3] ? ctx.inputs[3]->data<T>() : nullptr;  // [rows, H]
    const int64_t ds_n = ctx.outputs[1]->numel();
    const LayernormGradScratch<C> w(ws, rows, h, ds_n, bias);
    for (int64_t j = 0; j < h; ++j) w.scale_h[j] = load(scale[strided_offset(j, normalized, scale_strides)]);
    const int64_t per_block = layernorm_block_rows(rows);
    std::fill(w.partial, w.partial + w.blocks * h, C(0));
    if (bias) std::fill(w.partial_bias, w.partial_bias + w.blocks * h, C(0));
    // dy [rows, H]: T, or the 16-bit D of an f32 x
    auto blocks = [&]<typename D>(const D* dy) {
      parallel_ranges(w.blocks, 1, kMaxKernelSlots, [&](int64_t slot, int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          const int64_t first = b * per_block, last = std::min(rows, (b + 1) * per_block);
          for (int64_t r = first; r < last; ++r) {
            layernorm_grad_row<T, D, C>(dx + r * h, x + r * h, dy + r * h, addend ? addend + r * h : nullptr, w.scale_h, w.xhat + slot * h,
                                        w.g + slot * h, w.partial + b * h, bias ? w.partial_bias + b * h : nullptr, h, eps);
          }
          if (copy) store_copy(copy, dx, first * h, last * h);
        }
      });
    };
    if constexpr (std::is_same_v<T, float>) {
      if (dy_t.dtype() == DType::kBF16) blocks(dy_t.data<bf16_t>());
      else if (dy_t.dtype() == DType::kF16) blocks(dy_t.data<f16_t>());
      else blocks(dy_t.data<T>());
    } else {
      blocks(dy_t.data<T>());
    }
    C* dscale = w.partial;  // the blocks' partials summed into the first, in block order
    for (int64_t b = 1; b < w.blocks; ++b) {
      for (int64_t j = 0; j < h; ++j) dscale[j] += w.partial[b * h + j];
    }
    if (bias) {  // dbias likewise: the blocks' partials in block order
      T* db = ctx.outputs[2]->data<T>();
      for (int64_t j = 0; j < h; ++j) {
        C sum = 0;
        for (int64_t b = 0; b < w.blocks; ++b) sum += w.partial_bias[b * h + j];
        db[j] = store<T, C>(sum);
      }
    }
    // dscale has the normalized dims' full shape; the rule sums it down to scale's shape.
    T* ds = ctx.outputs[1]->data<T>();
    if (ds_n == h) {
      for (int64_t j = 0; j < h; ++j) ds[j] = store<T, C>(rows > 0 ? dscale[j] : C(0));
    } else {  // scale broadcast from fewer elements: accumulate into its own layout
      C* acc = w.acc;
      std::fill(acc, acc + ds_n, C(0));
      for (int64_t j = 0; rows > 0 && j < h; ++j) acc[strided_offset(j, normalized, scale_strides)] += dscale[j];
      for (int64_t j = 0; j < ds_n; ++j) ds[j] = store<T, C>(acc[j]);
    }
  });
}

// (dy, x, scale, [addend]) → (dx [+ addend], dscale[, dbias][, dx's copy])
int64_t layernorm_grad_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const Shape& x = in[1].shape;
  const int64_t axis = node.attrs.get_int("axis", static_cast<int64_t>(x.size()) - 1);
  const int64_t h = split_at(x, axis).second, ds_n = out[1].numel();
  return layout_bytes(in[1].dtype, [&]<typename T>(Workspace& ws) {
    if constexpr (kIsFloatStorage<T>) {
      const LayernormGradScratch<typename Compute<T>::type> scratch(ws, split_at(x, axis).first, h, ds_n, node.attrs.get_int("bias_grad", 0) != 0);
      (void)scratch;
    }
  });
}

// Where gather_grad accumulates: dx itself when T is its compute type, else the workspace.
template <typename T, typename C = typename Compute<T>::type>
C* gather_grad_accumulator(Workspace& ws, Tensor& dx) {
  if constexpr (std::is_same_v<T, C>) return dx.data<T>();
  else return ws.take<C>(dx.numel());
}

// dx = zeros(input_shape); dx[..., idx[j], ...] += dy[..., j, ...]. f32/f64 accumulate in dx
// itself; f16/bf16 in an f32 workspace copy [numel(dx)], rounded once.
Status gather_grad_kernel(KernelContext& ctx) {
  const Tensor &dy_t = *ctx.inputs[0], &idx_t = *ctx.inputs[1];
  Tensor& dx_t = *ctx.outputs[0];
  const int64_t axis = ctx.node.attrs.get_int("axis", 0);
  const Shape& in_shape = dx_t.shape();
  const std::pair<int64_t, int64_t> outer_rest = split_at(in_shape, axis);
  const int64_t outer = outer_rest.first, rest = outer_rest.second;
  const int64_t dim = in_shape[axis], inner = rest / std::max<int64_t>(dim, 1);
  const int64_t count = idx_t.numel();
  // As the gather checks its indices: a scatter the step computes (ScatterND with runtime
  // indices) has no gather before it to refuse a bad one.
  for (int64_t j = 0; j < count; ++j) {
    const int64_t k = idx_t.get_as_int(j);
    if (k == kGatherNoRow) return Status::BadInput(str_cat("index tuple ", j, " lies outside the data's dims"));
    if (k < -dim || k >= dim) return Status::BadInput(str_cat("scatter index ", k, " out of range for dim ", dim, " (axis ", axis, ")"));
  }
  Workspace ws(ctx);
  return dispatch_float(ctx, dx_t.dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* dy = dy_t.data<T>();  // [outer, count, inner]
    C* acc = gather_grad_accumulator<T>(ws, dx_t);
    int64_t* rows = ws.take<int64_t>(count);  // each index, wrapped
    for (int64_t j = 0; j < count; ++j) {
      const int64_t k = idx_t.get_as_int(j);
      rows[j] = k < 0 ? k + dim : k;
    }
    // Split over (outer, inner) positions: each position's sum runs over the indices in their
    // order on one thread, so repeated indices add as they would serially.
    parallel_elementwise(outer * inner, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin / inner; o * inner < end; ++o) {
        const int64_t i0 = std::max(begin - o * inner, int64_t{0}), i1 = std::min(end - o * inner, inner);
        for (int64_t k = 0; k < dim; ++k) std::fill(acc + (o * dim + k) * inner + i0, acc + (o * dim + k) * inner + i1, C(0));
        for (int64_t j = 0; j < count; ++j) {
          if (rows[j] < 0) continue;
          C* a = acc + (o * dim + rows[j]) * inner;
          const T* g = dy + (o * count + j) * inner;
          for (int64_t i = i0; i < i1; ++i) a[i] += load(g[i]);
        }
        if constexpr (!std::is_same_v<T, C>) {
          T* dx = dx_t.data<T>();
          for (int64_t k = 0; k < dim; ++k) {
            for (int64_t i = i0; i < i1; ++i) dx[(o * dim + k) * inner + i] = store<T, C>(acc[(o * dim + k) * inner + i]);
          }
        }
      }
    });
  });
}

// (dy, indices) → dx
// The f32 accumulator (16-bit dx only).
int64_t gather_elements_grad_workspace(const Node&, std::span<const TensorType>, std::span<const TensorType> out) {
  return layout_bytes(out[0].dtype, [&]<typename T>(Workspace& ws) {
    if constexpr (kIsFloatStorage<T> && !std::is_same_v<T, typename Compute<T>::type>) ws.take<typename Compute<T>::type>(out[0].numel());
  });
}

// The accumulator as gather_elements_grad's, then the wrapped indices [numel(idx)].
int64_t gather_grad_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  Workspace counter;
  counter.take<char>(gather_elements_grad_workspace(node, in, out));
  counter.take<int64_t>(numel(in[1].shape));
  return counter.used_bytes();
}

// dx = zeros(input_shape); dx[i, axis ← idx[i]] += dy[i] over idx's elements; accumulates as
// gather_grad does (f32/f64 in dx, f16/bf16 in an f32 workspace copy, rounded once).
Status gather_elements_grad_kernel(KernelContext& ctx) {
  const Tensor &dy_t = *ctx.inputs[0], &idx_t = *ctx.inputs[1];
  Tensor& dx_t = *ctx.outputs[0];
  const int64_t axis = ctx.node.attrs.get_int("axis", 0);
  const int64_t dim = dx_t.shape()[axis];
  for (int64_t i = 0, count = idx_t.numel(); i < count; ++i) {  // as gather_grad's
    if (const int64_t k = idx_t.get_as_int(i); k < -dim || k >= dim) {
      return Status::BadInput(str_cat("scatter index ", k, " out of range for dim ", dim, " (axis ", axis, ")"));
    }
  }
  Workspace ws(ctx);
  return dispatch_float(ctx, dx_t.dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* dy = dy_t.data<T>();  // [idx shape]
    C* acc = gather_grad_accumulator<T>(ws, dx_t);
    std::fill(acc, acc + dx_t.numel(), C(0));
    for (int64_t i = 0, count = idx_t.numel(); i < count; ++i) {
      acc[gather_elements_offset(i, idx_t.shape(), dx_t.shape(), axis, idx_t.get_as_int(i))] += load(dy[i]);
    }
    if constexpr (!std::is_same_v<T, C>) {
      T* dx = dx_t.data<T>();
      for (int64_t i = 0, count = dx_t.numel(); i < count; ++i) dx[i] = store<T, C>(acc[i]);
    }
  });
}

// dx = zeros(input_shape); dx[slice] = dy
Status slice_grad_kernel(KernelContext& ctx) {
  const Tensor& dy = *ctx.inputs[0];
  Tensor& dx = *ctx.outputs[0];
  const Shape& in_shape = dx.shape();
  const auto axes = ctx.node.attrs.get_ints("axes"), starts = ctx.node.attrs.get_ints("starts"),
             steps = ctx.node.attrs.get_ints("steps");
  std::vector<int64_t> strides = row_major_strides(in_shape);
  int64_t base = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    base += starts[i] * strides[axes[i]];
    strides[axes[i]] *= steps[i];
  }
  std::memset(dx.raw(), 0, dx.nbytes());
  dispatch_element_size(dy.dtype(), [&]<typename E>() {
    const E* src = static_cast<const E*>(dy.raw());
    E* dst = static_cast<E*>(dx.raw());
    for_each_row<2>(dy.shape(), {row_major_strides(dy.shape()), strides},
                    [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
                      for (int64_t i = 0; i < n; ++i) dst[off[1] + i * st[1]] = src[off[0] + i * st[0]];
                    },
                    {0, base});
  });
  return Status::Ok();
}

}  // namespace

void register_training_kernels(KernelTable& t) {
  t.add("full", full_kernel);
  t.add("softmax_cross_entropy", softmax_cross_entropy_kernel);
  t.add("softmax_cross_entropy_grad", softmax_cross_entropy_grad_kernel);
  t.add("gelu_grad", gelu_grad_kernel);
  t.add("softmax_grad", softmax_grad_kernel<false>);
  t.add("log_softmax_grad", softmax_grad_kernel<true>);
  t.add("layernorm_grad", layernorm_grad_kernel, layernorm_grad_workspace);
  t.add("gather_grad", gather_grad_kernel, gather_grad_workspace);
  t.add("gather_elements_grad", gather_elements_grad_kernel, gather_elements_grad_workspace);
  t.add("slice_grad", slice_grad_kernel);
}

}  // namespace memc::cpu
