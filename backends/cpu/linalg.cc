// Compute-heavy kernels: batched matmul, linear, N-d convolution (im2col + gemm) and its two
// backward ops (gemm + col2im, im2col + gemm). Attention and its backward live in attention.cc. Dimension letters: B batch, M/N/K gemm dims, C channels,
// G groups, P output positions.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/loops.h"
#include "backends/cpu/workspace.h"
#include "backends/kernel_attrs.h"

namespace memc::cpu {
namespace {

// ---- matmul ---------------------------------------------------------------------------------

// Numpy matmul: 1-D operands are promoted to matrices (and the dim dropped from the result),
// batch dims broadcast. Matrices are contiguous, so each batch is one gemm; when b has no
// batch and a is not transposed, all batches fold into one gemm of B·M rows; when each
// operand's batches are all distinct or all shared, they are one strided-batched gemm.
struct MatmulPlan {
  GemmShape s;          // one gemm call (the folded or batched one when one call covers all)
  Shape batch;          // broadcast batch dims
  bool one_call = false;  // one gemm covers every batch
  std::vector<int64_t> a_strides, b_strides;  // batch strides in matrices; O(rank)

  MatmulPlan(Shape a_shape, Shape b_shape, bool trans_a, bool trans_b) {
    if (a_shape.size() == 1) a_shape.insert(a_shape.begin(), 1);
    if (b_shape.size() == 1) b_shape.push_back(1);
    const size_t ra = a_shape.size(), rb = b_shape.size();
    s.trans_a = trans_a;
    s.trans_b = trans_b;
    s.m = trans_a ? a_shape[ra - 1] : a_shape[ra - 2];
    s.k = trans_a ? a_shape[ra - 2] : a_shape[ra - 1];
    s.n = trans_b ? b_shape[rb - 2] : b_shape[rb - 1];
    const Shape a_batch(a_shape.begin(), a_shape.end() - 2), b_batch(b_shape.begin(), b_shape.end() - 2);
    batch.assign(std::max(a_batch.size(), b_batch.size()), 1);
    for (size_t i = 0; i < batch.size(); ++i) {
      const size_t ia = i + a_batch.size(), ib = i + b_batch.size();
      const int64_t da = ia >= batch.size() ? a_batch[ia - batch.size()] : 1;
      const int64_t db = ib >= batch.size() ? b_batch[ib - batch.size()] : 1;
      batch[i] = std::max(da, db);
    }
    one_call = numel(b_batch) == 1 && numel(a_batch) == numel(batch) && !trans_a;
    if (one_call) {
      s.m *= numel(batch);
      return;
    }
    a_strides = broadcast_strides(a_batch, batch);
    b_strides = broadcast_strides(b_batch, batch);
    const std::vector<int64_t> distinct = broadcast_strides(batch, batch);
    const auto uniform = [&](const std::vector<int64_t>& st) { return st == distinct || st == std::vector<int64_t>(st.size(), 0); };
    if (uniform(a_strides) && uniform(b_strides)) {
      one_call = true;
      s.batch = numel(batch);
      s.batch_stride_a = a_strides == distinct && numel(a_batch) > 1 ? s.m * s.k : 0;
      s.batch_stride_b = b_strides == distinct && numel(b_batch) > 1 ? s.k * s.n : 0;
    }
  }
  explicit MatmulPlan(const Node& node, const Shape& a, const Shape& b)
      : MatmulPlan(a, b, node.attrs.get_int("transpose_a", 0), node.attrs.get_int("transpose_b", 0)) {}
};

// Workspace: the gemm's scratch for one call's shape, reused by every batch.
template <typename T>
void matmul(T* y, const T* a, const T* b, const MatmulPlan& p, Workspace& ws) {
  float* gemm_scratch = ws.take<float>(gemm_scratch_floats<T>(p.s));
  if (p.one_call) {
    gemm(y, a, b, p.s, gemm_scratch);
    return;
  }
  for (int64_t i = 0, batches = numel(p.batch); i < batches; ++i) {
    const T* a_i = a + strided_offset(i, p.batch, p.a_strides) * p.s.m * p.s.k;  // [M, K]
    const T* b_i = b + strided_offset(i, p.batch, p.b_strides) * p.s.k * p.s.n;  // [K, N]
    gemm(y + i * p.s.m * p.s.n, a_i, b_i, p.s, gemm_scratch);
  }
}

Status matmul_kernel(KernelContext& ctx) {
  const Tensor &a = *ctx.inputs[0], &b = *ctx.inputs[1];
  Tensor& y = *ctx.outputs[0];
  const MatmulPlan plan(ctx.node, a.shape(), b.shape());
  Workspace ws(ctx);
  return dispatch_dtype(a.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T>) {
      return unsupported_dtype(ctx, a.dtype());
    } else {
      matmul(y.data<T>(), a.data<T>(), b.data<T>(), plan, ws);
      return Status::Ok();
    }
  });
}

int64_t matmul_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType>) {
  const MatmulPlan plan(node, in[0].shape, in[1].shape);
  return layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) { ws.take<float>(gemm_scratch_floats<T>(plan.s)); });
}

// matmul_bgrad: the matmul, then the reduce_sum kernel over the summed operand's contraction axis
// (the unfused plan's sums, in its order). The plans that hold this op are GPU plans; the CPU
// runs them as the reference their tests compare with.
Status matmul_bgrad_kernel(KernelContext& ctx) {
  MEMC_RETURN_IF_ERROR(matmul_kernel(ctx));
  const BiasGradSums sums(ctx.node);
  KernelContext reduce{sums.reduce, {ctx.inputs[sums.operand]}, {ctx.outputs[1]}};
  reduce.workspace = ctx.workspace, reduce.workspace_bytes = ctx.workspace_bytes;
  return (*find_kernel("reduce_sum"))(reduce);
}

// The matmul's scratch, or the sums' accumulators (reduce_sum's: one f64 per sum), whichever is larger.
int64_t matmul_bgrad_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const int64_t sums = layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) { ws.take<double>(out[1].numel()); });
  return std::max(matmul_workspace(node, in, out), sums);
}

// matmul_acc: y = [acc +] op(a)·op(b). y is acc's buffer where the plan let it take it over;
// otherwise acc is copied into y first. Either way the gemm accumulates onto y; without acc it
// writes y whole.
GemmShape matmul_acc_shape(const Node& node, const Shape& a, const Shape& b, bool has_acc) {
  const MatmulAccDims d(node, a, b);
  return GemmShape{.m = d.m, .n = d.n, .k = d.k, .trans_a = d.ta, .trans_b = d.tb, .accumulate = has_acc};
}

// The gemm's scratch: an f32 sum over 16-bit operands widens them (gemm_f32_out), any other
// sum is gemm<T>'s.
template <typename T>
float* matmul_acc_scratch(Workspace& ws, const GemmShape& s, bool f32_sum_of_16bit) {
  if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) {
    if (f32_sum_of_16bit) return ws.take<float>(gemm_f32_out_scratch_floats<T>(s));
  }
  return ws.take<float>(gemm_scratch_floats<T>(s));
}

Status matmul_acc_kernel(KernelContext& ctx) {
  const Tensor *acc = ctx.inputs[0], &a = *ctx.inputs[1], &b = *ctx.inputs[2];
  Tensor& y = *ctx.outputs[0];
  if (acc != nullptr && y.raw() != acc->raw()) std::memcpy(y.raw(), acc->raw(), y.nbytes());
  const GemmShape s = matmul_acc_shape(ctx.node, a.shape(), b.shape(), acc != nullptr);
  const bool widened = y.dtype() != a.dtype();  // an f32 sum of 16-bit operands (the op's only mixed form)
  Workspace ws(ctx);
  return dispatch_dtype(a.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T>) {
      return unsupported_dtype(ctx, a.dtype());
    } else {
      float* scratch = matmul_acc_scratch<T>(ws, s, widened);
      if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) {
        if (widened) {
          gemm_f32_out(y.data<float>(), a.data<T>(), b.data<T>(), s, scratch);
          return Status::Ok();
        }
      }
      gemm(y.data<T>(), a.data<T>(), b.data<T>(), s, scratch);
      return Status::Ok();
    }
  });
}

int64_t matmul_acc_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const GemmShape s = matmul_acc_shape(node, in[1].shape, in[2].shape, !in[0].shape.empty());  // an absent acc: TensorType{}
  return layout_bytes(in[1].dtype, [&]<typename T>(Workspace& ws) { matmul_acc_scratch<T>(ws, s, out[0].dtype != in[1].dtype); });
}

// ---- linear ---------------------------------------------------------------------------------

// y[R, N] = x[R, K] · wᵀ + bias, w [N, K] (transpose_w) or [K, N]; bias is written first and
// the gemm accumulates onto it.
// The one gemm of a linear node (accumulate: whether a bias is written first).
GemmShape linear_shape(const Node& node, const Shape& x, const Shape& w, bool has_bias) {
  const bool transpose_w = node.attrs.get_int("transpose_w", 1);
  const int64_t k = x.back(), n = transpose_w ? w[0] : w[1];
  return GemmShape{.m = k ? numel(x) / k : 0, .n = n, .k = k, .trans_a = false, .trans_b = transpose_w, .accumulate = has_bias};
}

// Workspace: the 16-bit gemm's f32 copies.
template <typename T>
void linear(T* y, const T* x, const T* w, const T* bias, const GemmShape& s, Workspace& ws) {
  float* gemm_scratch = ws.take<float>(gemm_scratch_floats<T>(s));
  if (bias) {
    for (int64_t r = 0; r < s.m; ++r) std::copy(bias, bias + s.n, y + r * s.n);
  }
  gemm(y, x, w, s, gemm_scratch);
}

Status linear_kernel(KernelContext& ctx) {
  const Tensor &x = *ctx.inputs[0], &w = *ctx.inputs[1];
  const Tensor* bias = ctx.inputs.size() >= 3 ? ctx.inputs[2] : nullptr;
  Tensor& y = *ctx.outputs[0];
  const GemmShape s = linear_shape(ctx.node, x.shape(), w.shape(), bias != nullptr);
  Workspace ws(ctx);
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T>) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      linear(y.data<T>(), x.data<T>(), w.data<T>(), bias ? bias->data<T>() : nullptr, s, ws);
      return Status::Ok();
    }
  });
}

// The bias only changes accumulate, which gemm_scratch_floats covers either way.
int64_t linear_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType>) {
  const GemmShape s = linear_shape(node, in[0].shape, in[1].shape, false);
  return layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) { ws.take<float>(gemm_scratch_floats<T>(s)); });
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
  // Rows of one group's im2col matrix [Cg·K, P]; 0 when pointwise (x is read in place).
  int64_t col_rows() const { return pointwise() ? 0 : group_in() * numel(kernel); }
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

// One group's gemm: y_g[Mg, P] = w_g[Mg, Cg·K] · col[Cg·K, P].
GemmShape conv_gemm_shape(const ConvGeometry& g) {
  return GemmShape{.m = g.group_out(), .n = numel(g.out), .k = g.group_in() * numel(g.kernel)};
}

// Per image and group: y_g[Mg, P] = w_g[Mg, Cg·K] · col[Cg·K, P] (+ bias, written first).
// Workspace: col [Cg·K, P] in T (none when pointwise), then the 16-bit gemm's f32 copies.
template <typename T>
void conv(T* y, const T* x, const T* w, const T* bias, const ConvGeometry& g, Workspace& ws) {
  const int64_t kernel_size = numel(g.kernel), positions = numel(g.out), in_size = numel(g.in);
  const int64_t rows = g.group_in() * kernel_size;
  const bool pointwise = g.pointwise();
  T* col = ws.take<T>(g.col_rows() * positions);
  float* gemm_scratch = ws.take<float>(gemm_scratch_floats<T>(conv_gemm_shape(g)));
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const T* x_g = x + (b * g.in_channels + grp * g.group_in()) * in_size;  // [Cg, in...]
      T* y_g = y + (b * g.out_channels + grp * g.group_out()) * positions;    // [Mg, P]
      const T* w_g = w + grp * g.group_out() * rows;                          // [Mg, Cg·K]
      if (!pointwise) {
        if (g.in.size() == 2) im2col_2d(col, x_g, g);
        else im2col_nd(col, x_g, g);
      }
      if (bias) {
        for (int64_t m = 0; m < g.group_out(); ++m) std::fill(y_g + m * positions, y_g + (m + 1) * positions, bias[grp * g.group_out() + m]);
      }
      gemm(y_g, w_g, pointwise ? x_g : col,
           GemmShape{.m = g.group_out(), .n = positions, .k = rows, .accumulate = bias != nullptr}, gemm_scratch);
    }
  }
}

Status conv_kernel(KernelContext& ctx) {
  const Tensor &x = *ctx.inputs[0], &w = *ctx.inputs[1];
  const Tensor* bias = ctx.inputs.size() >= 3 ? ctx.inputs[2] : nullptr;
  Tensor& y = *ctx.outputs[0];
  const ConvGeometry geometry(ctx.node, x.shape(), w.shape(), y.shape());
  Workspace ws(ctx);
  return dispatch_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsNumeric<T>) {
      return unsupported_dtype(ctx, x.dtype());
    } else {
      conv(y.data<T>(), x.data<T>(), w.data<T>(), bias ? bias->data<T>() : nullptr, geometry, ws);
      return Status::Ok();
    }
  });
}

// (x, w, [bias]) → y
int64_t conv_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const ConvGeometry g(node, in[0].shape, in[1].shape, out[0].shape);
  return layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) {
    ws.take<T>(g.col_rows() * numel(g.out));
    ws.take<float>(gemm_scratch_floats<T>(conv_gemm_shape(g)));
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

// The gemms of the two conv backward ops, per image and group (see below).
GemmShape conv_grad_input_gemm(const ConvGeometry& g) {
  return GemmShape{.m = g.group_in() * numel(g.kernel), .n = numel(g.out), .k = g.group_out(), .trans_a = true};
}
GemmShape conv_grad_weight_gemm(const ConvGeometry& g) {
  return GemmShape{.m = g.group_out(), .n = g.group_in() * numel(g.kernel), .k = numel(g.out), .trans_b = true, .accumulate = true};
}

// Per image and group: col[Cg·K, P] = w_gᵀ[Cg·K, Mg] · dy_g[Mg, P], then dx_g += col2im(col).
template <typename C>
void conv_grad_input(C* dx, const C* dy, const C* w, C* col, float* gemm_scratch, const ConvGeometry& g) {  // dx: [B, C, in...], col: [Cg·K, P]
  const int64_t kernel_size = numel(g.kernel), positions = numel(g.out), in_size = numel(g.in);
  const int64_t rows = g.group_in() * kernel_size;
  const bool pointwise = g.pointwise();
  std::fill(dx, dx + g.batch * g.in_channels * in_size, C(0));
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t grp = 0; grp < g.group; ++grp) {
      C* dx_g = dx + (b * g.in_channels + grp * g.group_in()) * in_size;               // [Cg, in...]
      const C* dy_g = dy + (b * g.out_channels + grp * g.group_out()) * positions;    // [Mg, P]
      const C* w_g = w + grp * g.group_out() * rows;                                  // [Mg, Cg·K]
      const GemmShape s = conv_grad_input_gemm(g);
      if (pointwise) {  // col is dx_g itself (P = in_size, K = 1)
        gemm(dx_g, w_g, dy_g, s, gemm_scratch);
        continue;
      }
      gemm(col, w_g, dy_g, s, gemm_scratch);
      if (g.in.size() == 2) col2im_2d(dx_g, col, g);
      else col2im_nd(dx_g, col, g);
    }
  }
}

// Per group, summed over images: dw_g[Mg, Cg·K] += dy_g[Mg, P] · im2col(x_g)ᵀ[P, Cg·K].
template <typename C>
void conv_grad_weight(C* dw, const C* dy, const C* x, C* col, float* gemm_scratch, const ConvGeometry& g) {  // dw: [M, C/G, kernel...], col: [Cg·K, P]
  const int64_t kernel_size = numel(g.kernel), positions = numel(g.out), in_size = numel(g.in);
  const int64_t rows = g.group_in() * kernel_size;
  const bool pointwise = g.pointwise();
  std::fill(dw, dw + g.out_channels * rows, C(0));
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const C* x_g = x + (b * g.in_channels + grp * g.group_in()) * in_size;         // [Cg, in...]
      const C* dy_g = dy + (b * g.out_channels + grp * g.group_out()) * positions;   // [Mg, P]
      if (!pointwise) {
        if (g.in.size() == 2) im2col_2d(col, x_g, g);
        else im2col_nd(col, x_g, g);
      }
      gemm(dw + grp * g.group_out() * rows, dy_g, pointwise ? x_g : col, conv_grad_weight_gemm(g), gemm_scratch);
    }
  }
}

// Workspace of both conv backward ops, in compute type C: f32 copies of (a, b, out) when T is
// 16-bit (f32/f64 run in place), then the im2col buffer col [Cg·K, P] (none when pointwise),
// then the gemm's scratch (the more of the two ops').
template <typename T>
struct ConvGradScratch {
  using C = typename Compute<T>::type;
  C *a = nullptr, *b = nullptr, *out = nullptr, *col = nullptr;
  float* gemm = nullptr;
  ConvGradScratch(Workspace& ws, int64_t a_count, int64_t b_count, int64_t out_count, const ConvGeometry& g) {
    if constexpr (!std::is_same_v<T, C>) {
      a = ws.take<C>(a_count);
      b = ws.take<C>(b_count);
      out = ws.take<C>(out_count);
    }
    col = ws.take<C>(g.col_rows() * numel(g.out));
    gemm = ws.take<float>(std::max(gemm_scratch_floats<C>(conv_grad_input_gemm(g)), gemm_scratch_floats<C>(conv_grad_weight_gemm(g))));
  }
};

// Runs fn(out, a, b, col) on compute-type pointers: f32/f64 in place, f16/bf16 through the
// scratch copies of the inputs and one rounding of the output.
template <typename T, typename Fn>
void run_in_compute_type(Tensor& out, const Tensor& a, const Tensor& b, const ConvGradScratch<T>& w, Fn&& fn) {
  using C = typename Compute<T>::type;
  if constexpr (std::is_same_v<T, C>) {
    fn(out.data<T>(), a.data<T>(), b.data<T>(), w.col);
  } else {
    for (int64_t i = 0, count = a.numel(); i < count; ++i) w.a[i] = load<T>(a.data<T>()[i]);
    for (int64_t i = 0, count = b.numel(); i < count; ++i) w.b[i] = load<T>(b.data<T>()[i]);
    fn(w.out, w.a, w.b, w.col);
    for (int64_t i = 0, count = out.numel(); i < count; ++i) out.data<T>()[i] = store<T>(w.out[i]);
  }
}

// (dy, w) → dx {input_shape, ...conv attrs}
Status conv_grad_input_kernel(KernelContext& ctx) {
  const Tensor &dy = *ctx.inputs[0], &w = *ctx.inputs[1];
  Tensor& dx = *ctx.outputs[0];
  const ConvGeometry geometry(ctx.node, dx.shape(), w.shape(), dy.shape());
  Workspace ws(ctx);
  return dispatch_dtype(dy.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsFloatStorage<T>) {
      return unsupported_dtype(ctx, dy.dtype());
    } else {
      const ConvGradScratch<T> scratch(ws, dy.numel(), w.numel(), dx.numel(), geometry);
      run_in_compute_type<T>(dx, dy, w, scratch, [&](auto* out, const auto* a, const auto* b, auto* col) {
        conv_grad_input(out, a, b, col, scratch.gemm, geometry);
      });
      return Status::Ok();
    }
  });
}

// (dy, x) → dw {weight_shape, ...conv attrs}
Status conv_grad_weight_kernel(KernelContext& ctx) {
  const Tensor &dy = *ctx.inputs[0], &x = *ctx.inputs[1];
  Tensor& dw = *ctx.outputs[0];
  const ConvGeometry geometry(ctx.node, x.shape(), dw.shape(), dy.shape());
  Workspace ws(ctx);
  return dispatch_dtype(dy.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsFloatStorage<T>) {
      return unsupported_dtype(ctx, dy.dtype());
    } else {
      const ConvGradScratch<T> scratch(ws, dy.numel(), x.numel(), dw.numel(), geometry);
      run_in_compute_type<T>(dw, dy, x, scratch, [&](auto* out, const auto* a, const auto* b, auto* col) {
        conv_grad_weight(out, a, b, col, scratch.gemm, geometry);
      });
      return Status::Ok();
    }
  });
}

// (dy, w) → dx: geometry over (dx, w, dy).
int64_t conv_grad_input_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const ConvGeometry g(node, out[0].shape, in[1].shape, in[0].shape);
  return layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) {
    if constexpr (kIsFloatStorage<T>) {
      const ConvGradScratch<T> scratch(ws, in[0].numel(), in[1].numel(), out[0].numel(), g);
      (void)scratch;
    }
  });
}

// (dy, x) → dw: geometry over (x, dw, dy).
int64_t conv_grad_weight_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const ConvGeometry g(node, in[1].shape, out[0].shape, in[0].shape);
  return layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) {
    if constexpr (kIsFloatStorage<T>) {
      const ConvGradScratch<T> scratch(ws, in[0].numel(), in[1].numel(), out[0].numel(), g);
      (void)scratch;
    }
  });
}

}  // namespace

void register_linalg_kernels(KernelTable& t) {
  t.add("matmul", matmul_kernel, matmul_workspace);
  t.add("matmul_bgrad", matmul_bgrad_kernel, matmul_bgrad_workspace);
  t.add("matmul_acc", matmul_acc_kernel, matmul_acc_workspace);
  t.add("linear", linear_kernel, linear_workspace);
  t.add("conv", conv_kernel, conv_workspace);
  t.add("attention", attention_kernel, attention_workspace);
  t.add("conv_grad_input", conv_grad_input_kernel, conv_grad_input_workspace);
  t.add("conv_grad_weight", conv_grad_weight_kernel, conv_grad_weight_workspace);
  t.add("attention_grad", attention_grad_kernel, attention_grad_workspace);
}

}  // namespace memc::cpu
