// Compute-heavy kernels: batched matmul, linear, N-d convolution (im2col + gemm) and its two
// backward ops (gemm + col2im, im2col + gemm). Attention and its backward live in attention.cc. Dimension letters: B batch, M/N/K gemm dims, C channels,
// G groups, P output positions.
#include <algorithm>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/loops.h"

namespace memc::cpu {
namespace {

// ---- matmul ---------------------------------------------------------------------------------

// Numpy matmul: 1-D operands are promoted to matrices (and the dim dropped from the result),
// batch dims broadcast. Matrices are contiguous, so each batch is one gemm; when b has no
// batch and a is not transposed, all batches fold into one gemm of B·M rows.
template <typename T>
void matmul(T* y, const T* a, const T* b, Shape a_shape, Shape b_shape, bool trans_a, bool trans_b) {
  if (a_shape.size() == 1) a_shape.insert(a_shape.begin(), 1);
  if (b_shape.size() == 1) b_shape.push_back(1);
  const size_t ra = a_shape.size(), rb = b_shape.size();
  GemmShape s;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.m = trans_a ? a_shape[ra - 1] : a_shape[ra - 2];
  s.k = trans_a ? a_shape[ra - 2] : a_shape[ra - 1];
  s.n = trans_b ? b_shape[rb - 2] : b_shape[rb - 1];
  const Shape a_batch(a_shape.begin(), a_shape.end() - 2), b_batch(b_shape.begin(), b_shape.end() - 2);
  const Shape batch = [&] {
    Shape out(std::max(a_batch.size(), b_batch.size()), 1);
    for (size_t i = 0; i < out.size(); ++i) {
      const size_t ia = i + a_batch.size(), ib = i + b_batch.size();
      const int64_t da = ia >= out.size() ? a_batch[ia - out.size()] : 1;
      const int64_t db = ib >= out.size() ? b_batch[ib - out.size()] : 1;
      out[i] = std::max(da, db);
    }
    return out;
  }();
  const int64_t batches = numel(batch);
  if (numel(b_batch) == 1 && numel(a_batch) == batches && !trans_a) {
    GemmShape folded = s;
    folded.m = batches * s.m;
    gemm(y, a, b, folded);
    return;
  }
  const std::vector<int64_t> a_strides = broadcast_strides(a_batch, batch), b_strides = broadcast_strides(b_batch, batch);
  for (int64_t i = 0; i < batches; ++i) {
    const T* a_i = a + strided_offset(i, batch, a_strides) * s.m * s.k;  // [M, K]
    const T* b_i = b + strided_offset(i, batch, b_strides) * s.k * s.n;  // [K, N]
    gemm(y + i * s.m * s.n, a_i, b_i, s);
  }
}

Status matmul_kernel(KernelContext& ctx) {
  const Tensor &a = *ctx.inputs[0], &b = *ctx.inputs[1];
  Tensor& y = *ctx.outputs[0];
  const bool trans_a = ctx.node.attrs.get_int("transpose_a", 0), trans_b = ctx.node.attrs.get_int("transpose_b", 0);
  return dispatch_dtype(a.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T>) {
      return unsupported_dtype(ctx, a.dtype());
    } else {
      matmul(y.data<T>(), a.data<T>(), b.data<T>(), a.shape(), b.shape(), trans_a, trans_b);
      return Status::Ok();
    }
  });
}

// ---- linear ---------------------------------------------------------------------------------

// y[R, N] = x[R, K] · wᵀ + bias, w [N, K] (transpose_w) or [K, N]; bias is written first and
// the gemm accumulates onto it.
template <typename T>
void linear(T* y, const T* x, const T* w, const T* bias, int64_t rows, int64_t n, int64_t k, bool transpose_w) {
  GemmShape s{.m = rows, .n = n, .k = k, .trans_a = false, .trans_b = transpose_w, .accumulate = bias != nullptr};
  if (bias) {
    for (int64_t r = 0; r < rows; ++r) std::copy(bias, bias + n, y + r * n);
  }
  gemm(y, x, w, s);
}

Status linear_kernel(KernelContext& ctx) {
  const Tensor &x = *ctx.inputs[0], &w = *ctx.inputs[1];
  const Tensor* bias = ctx.inputs.size() >= 3 ? ctx.inputs[2] : nullptr;
  Tensor& y = *ctx.outputs[0];
  const bool transpose_w = ctx.node.attrs.get_int("transpose_w", 1);
  const int64_t k = x.shape().back(), n = transpose_w ? w.shape()[0] : w.shape()[1];
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T>) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      linear(y.data<T>(), x.data<T>(), w.data<T>(), bias ? bias->data<T>() : nullptr, k ? x.numel() / k : 0, n, k,
             transpose_w);
      return Status::Ok();
    }
  });
}

// ---- conv -----------------------------------------------------------------------------------

// Geometry of one convolution; x [B, C, in...], w [M, C/G, kernel...], y [B, M, out...].
struct ConvGeometry {
  int64_t batch = 0, in_channels = 0, out_channels = 0, group = 1;
  Shape in, kernel, out;  // spatial extents
  std::vector<int64_t> strides, pads_begin, dilations;

  ConvGeometry(const Node& node, const Shape& x, const Shape& w, const Shape& y) {
    const size_t sd = x.size() - 2;
    batch = x[0];
    in_channels = x[1];
    out_channels = w[0];
    group = node.attrs.get_int("group", 1);
    in.assign(x.begin() + 2, x.end());
    kernel.assign(w.begin() + 2, w.end());
    out.assign(y.begin() + 2, y.end());
    strides = node.attrs.get_ints("strides", std::vector<int64_t>(sd, 1));
    dilations = node.attrs.get_ints("dilations", std::vector<int64_t>(sd, 1));
    const auto pads = node.attrs.get_ints("pads", std::vector<int64_t>(2 * sd, 0));
    pads_begin.assign(pads.begin(), pads.begin() + sd);
  }
  int64_t group_in() const { return in_channels / group; }
  int64_t group_out() const { return out_channels / group; }
  // A 1×…×1 kernel with unit strides and no padding reads x as the im2col matrix itself.
  bool pointwise() const {
    for (size_t d = 0; d < in.size(); ++d) {
      if (kernel[d] != 1 || strides[d] != 1 || pads_begin[d] != 0 || in[d] != out[d]) return false;
    }
    return true;
  }
};

// col[c·K + kk, p] = x[c, p·stride - pad + kk·dilation] (0 outside) for 2-D, one row at a time.
template <typename T>
void im2col_2d(T* col, const T* x, const ConvGeometry& g) {  // col: [Cg·KH·KW, OH·OW], x: [Cg, H, W]
  const int64_t h = g.in[0], w = g.in[1], kh_n = g.kernel[0], kw_n = g.kernel[1], oh_n = g.out[0], ow_n = g.out[1];
  for (int64_t c = 0; c < g.group_in(); ++c) {
    for (int64_t kh = 0; kh < kh_n; ++kh) {
      for (int64_t kw = 0; kw < kw_n; ++kw) {
        T* dst = col + ((c * kh_n + kh) * kw_n + kw) * oh_n * ow_n;
        for (int64_t oh = 0; oh < oh_n; ++oh, dst += ow_n) {
          const int64_t ih = oh * g.strides[0] - g.pads_begin[0] + kh * g.dilations[0];
          if (ih < 0 || ih >= h) {
            std::fill(dst, dst + ow_n, T{});
            continue;
          }
          const T* src = x + (c * h + ih) * w;
          for (int64_t ow = 0; ow < ow_n; ++ow) {
            const int64_t iw = ow * g.strides[1] - g.pads_begin[1] + kw * g.dilations[1];
            dst[ow] = (iw >= 0 && iw < w) ? src[iw] : T{};
          }
        }
      }
    }
  }
}

// Any spatial rank: unravels each output position per row (slower, but 1-D and 3-D are rare).
template <typename T>
void im2col_nd(T* col, const T* x, const ConvGeometry& g) {  // col: [Cg·K, P], x: [Cg, in...]
  const int64_t kernel_size = numel(g.kernel), positions = numel(g.out), in_size = numel(g.in);
  const std::vector<int64_t> in_strides = row_major_strides(g.in);
  const size_t sd = g.in.size();
  std::vector<int64_t> kpos(sd), opos(sd);
  for (int64_t c = 0; c < g.group_in(); ++c) {
    for (int64_t kk = 0; kk < kernel_size; ++kk) {
      int64_t rest = kk;
      for (int64_t d = static_cast<int64_t>(sd) - 1; d >= 0; --d) {
        kpos[d] = rest % g.kernel[d];
        rest /= g.kernel[d];
      }
      T* dst = col + (c * kernel_size + kk) * positions;
      for (int64_t p = 0; p < positions; ++p) {
        int64_t offset = 0, rest_p = p;
        bool inside = true;
        for (int64_t d = static_cast<int64_t>(sd) - 1; d >= 0; --d) {
          const int64_t o = rest_p % g.out[d];
          rest_p /= g.out[d];
          const int64_t i = o * g.strides[d] - g.pads_begin[d] + kpos[d] * g.dilations[d];
          inside = inside && i >= 0 && i < g.in[d];
          offset += i * in_strides[d];
        }
        dst[p] = inside ? x[c * in_size + offset] : T{};
      }
    }
  }
}

// Per image and group: y_g[Mg, P] = w_g[Mg, Cg·K] · col[Cg·K, P] (+ bias, written first).
template <typename T>
void conv(T* y, const T* x, const T* w, const T* bias, const ConvGeometry& g) {
  const int64_t kernel_size = numel(g.kernel), positions = numel(g.out), in_size = numel(g.in);
  const int64_t rows = g.group_in() * kernel_size;
  const bool pointwise = g.pointwise();
  std::vector<T> col(pointwise ? 0 : static_cast<size_t>(rows * positions));
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const T* x_g = x + (b * g.in_channels + grp * g.group_in()) * in_size;  // [Cg, in...]
      T* y_g = y + (b * g.out_channels + grp * g.group_out()) * positions;    // [Mg, P]
      const T* w_g = w + grp * g.group_out() * rows;                          // [Mg, Cg·K]
      if (!pointwise) {
        if (g.in.size() == 2) im2col_2d(col.data(), x_g, g);
        else im2col_nd(col.data(), x_g, g);
      }
      if (bias) {
        for (int64_t m = 0; m < g.group_out(); ++m) std::fill(y_g + m * positions, y_g + (m + 1) * positions, bias[grp * g.group_out() + m]);
      }
      gemm(y_g, w_g, pointwise ? x_g : col.data(),
           GemmShape{.m = g.group_out(), .n = positions, .k = rows, .accumulate = bias != nullptr});
    }
  }
}

Status conv_kernel(KernelContext& ctx) {
  const Tensor &x = *ctx.inputs[0], &w = *ctx.inputs[1];
  const Tensor* bias = ctx.inputs.size() >= 3 ? ctx.inputs[2] : nullptr;
  Tensor& y = *ctx.outputs[0];
  const ConvGeometry geometry(ctx.node, x.shape(), w.shape(), y.shape());
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T>) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      conv(y.data<T>(), x.data<T>(), w.data<T>(), bias ? bias->data<T>() : nullptr, geometry);
      return Status::Ok();
    }
  });
}

// ---- conv backward --------------------------------------------------------------------------

// col2im is im2col's adjoint: x[c, p·stride - pad + kk·dilation] += col[c·K + kk, p] (positions
// falling in the padding are dropped). `x` accumulates, so callers zero it once.
template <typename T>
void col2im_2d(T* x, const T* col, const ConvGeometry& g) {  // x: [Cg, H, W], col: [Cg·KH·KW, OH·OW]
  const int64_t h = g.in[0], w = g.in[1], kh_n = g.kernel[0], kw_n = g.kernel[1], oh_n = g.out[0], ow_n = g.out[1];
  for (int64_t c = 0; c < g.group_in(); ++c) {
    for (int64_t kh = 0; kh < kh_n; ++kh) {
      for (int64_t kw = 0; kw < kw_n; ++kw) {
        const T* src = col + ((c * kh_n + kh) * kw_n + kw) * oh_n * ow_n;
        for (int64_t oh = 0; oh < oh_n; ++oh, src += ow_n) {
          const int64_t ih = oh * g.strides[0] - g.pads_begin[0] + kh * g.dilations[0];
          if (ih < 0 || ih >= h) continue;
          T* dst = x + (c * h + ih) * w;
          for (int64_t ow = 0; ow < ow_n; ++ow) {
            const int64_t iw = ow * g.strides[1] - g.pads_begin[1] + kw * g.dilations[1];
            if (iw >= 0 && iw < w) dst[iw] += src[ow];
          }
        }
      }
    }
  }
}

template <typename T>
void col2im_nd(T* x, const T* col, const ConvGeometry& g) {  // x: [Cg, in...], col: [Cg·K, P]
  const int64_t kernel_size = numel(g.kernel), positions = numel(g.out), in_size = numel(g.in);
  const std::vector<int64_t> in_strides = row_major_strides(g.in);
  const size_t sd = g.in.size();
  std::vector<int64_t> kpos(sd);
  for (int64_t c = 0; c < g.group_in(); ++c) {
    for (int64_t kk = 0; kk < kernel_size; ++kk) {
      int64_t rest = kk;
      for (int64_t d = static_cast<int64_t>(sd) - 1; d >= 0; --d) {
        kpos[d] = rest % g.kernel[d];
        rest /= g.kernel[d];
      }
      const T* src = col + (c * kernel_size + kk) * positions;
      for (int64_t p = 0; p < positions; ++p) {
        int64_t offset = 0, rest_p = p;
        bool inside = true;
        for (int64_t d = static_cast<int64_t>(sd) - 1; d >= 0; --d) {
          const int64_t o = rest_p % g.out[d];
          rest_p /= g.out[d];
          const int64_t i = o * g.strides[d] - g.pads_begin[d] + kpos[d] * g.dilations[d];
          inside = inside && i >= 0 && i < g.in[d];
          offset += i * in_strides[d];
        }
        if (inside) x[c * in_size + offset] += src[p];
      }
    }
  }
}

// Per image and group: col[Cg·K, P] = w_gᵀ[Cg·K, Mg] · dy_g[Mg, P], then dx_g += col2im(col).
template <typename C>
void conv_grad_input(C* dx, const C* dy, const C* w, const ConvGeometry& g) {  // dx: [B, C, in...]
  const int64_t kernel_size = numel(g.kernel), positions = numel(g.out), in_size = numel(g.in);
  const int64_t rows = g.group_in() * kernel_size;
  const bool pointwise = g.pointwise();
  std::fill(dx, dx + g.batch * g.in_channels * in_size, C(0));
  std::vector<C> col(pointwise ? 0 : static_cast<size_t>(rows * positions));
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t grp = 0; grp < g.group; ++grp) {
      C* dx_g = dx + (b * g.in_channels + grp * g.group_in()) * in_size;               // [Cg, in...]
      const C* dy_g = dy + (b * g.out_channels + grp * g.group_out()) * positions;    // [Mg, P]
      const C* w_g = w + grp * g.group_out() * rows;                                  // [Mg, Cg·K]
      const GemmShape s{.m = rows, .n = positions, .k = g.group_out(), .trans_a = true};
      if (pointwise) {  // col is dx_g itself (P = in_size, K = 1)
        gemm(dx_g, w_g, dy_g, s);
        continue;
      }
      gemm(col.data(), w_g, dy_g, s);
      if (g.in.size() == 2) col2im_2d(dx_g, col.data(), g);
      else col2im_nd(dx_g, col.data(), g);
    }
  }
}

// Per group, summed over images: dw_g[Mg, Cg·K] += dy_g[Mg, P] · im2col(x_g)ᵀ[P, Cg·K].
template <typename C>
void conv_grad_weight(C* dw, const C* dy, const C* x, const ConvGeometry& g) {  // dw: [M, C/G, kernel...]
  const int64_t kernel_size = numel(g.kernel), positions = numel(g.out), in_size = numel(g.in);
  const int64_t rows = g.group_in() * kernel_size;
  const bool pointwise = g.pointwise();
  std::fill(dw, dw + g.out_channels * rows, C(0));
  std::vector<C> col(pointwise ? 0 : static_cast<size_t>(rows * positions));
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const C* x_g = x + (b * g.in_channels + grp * g.group_in()) * in_size;         // [Cg, in...]
      const C* dy_g = dy + (b * g.out_channels + grp * g.group_out()) * positions;   // [Mg, P]
      if (!pointwise) {
        if (g.in.size() == 2) im2col_2d(col.data(), x_g, g);
        else im2col_nd(col.data(), x_g, g);
      }
      gemm(dw + grp * g.group_out() * rows, dy_g, pointwise ? x_g : col.data(),
           GemmShape{.m = g.group_out(), .n = rows, .k = positions, .trans_b = true, .accumulate = true});
    }
  }
}

// Runs fn(out, a, b) on compute-type pointers: f32/f64 in place, f16/bf16 through f32 copies
// of the inputs and one rounding of the output.
template <typename T, typename Fn>
void run_in_compute_type(Tensor& out, const Tensor& a, const Tensor& b, Fn&& fn) {
  using C = typename Compute<T>::type;
  if constexpr (std::is_same_v<T, C>) {
    fn(out.data<T>(), a.data<T>(), b.data<T>());
  } else {
    auto widen = [](const Tensor& t) {
      std::vector<C> w(static_cast<size_t>(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i) w[i] = load<T>(t.data<T>()[i]);
      return w;
    };
    const std::vector<C> a_c = widen(a), b_c = widen(b);
    std::vector<C> out_c(static_cast<size_t>(out.numel()));
    fn(out_c.data(), a_c.data(), b_c.data());
    for (int64_t i = 0; i < out.numel(); ++i) out.data<T>()[i] = store<T>(out_c[i]);
  }
}

// (dy, w) → dx {input_shape, ...conv attrs}
Status conv_grad_input_kernel(KernelContext& ctx) {
  const Tensor &dy = *ctx.inputs[0], &w = *ctx.inputs[1];
  Tensor& dx = *ctx.outputs[0];
  const ConvGeometry geometry(ctx.node, dx.shape(), w.shape(), dy.shape());
  return dispatch_dtype(dy.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsFloatStorage<T>) {
      return unsupported_dtype(ctx, dy.dtype());
    } else {
      run_in_compute_type<T>(dx, dy, w, [&](auto* out, const auto* a, const auto* b) { conv_grad_input(out, a, b, geometry); });
      return Status::Ok();
    }
  });
}

// (dy, x) → dw {weight_shape, ...conv attrs}
Status conv_grad_weight_kernel(KernelContext& ctx) {
  const Tensor &dy = *ctx.inputs[0], &x = *ctx.inputs[1];
  Tensor& dw = *ctx.outputs[0];
  const ConvGeometry geometry(ctx.node, x.shape(), dw.shape(), dy.shape());
  return dispatch_dtype(dy.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsFloatStorage<T>) {
      return unsupported_dtype(ctx, dy.dtype());
    } else {
      run_in_compute_type<T>(dw, dy, x, [&](auto* out, const auto* a, const auto* b) { conv_grad_weight(out, a, b, geometry); });
      return Status::Ok();
    }
  });
}

}  // namespace

void register_linalg_kernels(KernelTable& t) {
  t.add("matmul", matmul_kernel);
  t.add("linear", linear_kernel);
  t.add("conv", conv_kernel);
  t.add("attention", attention_kernel);
  t.add("conv_grad_input", conv_grad_input_kernel);
  t.add("conv_grad_weight", conv_grad_weight_kernel);
  t.add("attention_grad", attention_grad_kernel);
}

}  // namespace memc::cpu
