// The CUDA backend's convolution and attention ops over a runner (backends/cuda/ops.h says what
// a runner provides). Convolution is im2col into the node's scratch and one cuBLASLt GEMM;
// attention is memc's own row kernel (backends/cuda/attention_bodies.h).
#pragma once
#include <optional>

#include "backends/cuda/cudnn_sdpa.h"
#include "backends/cuda/ops.h"
#include "ir/attention_layout.h"

namespace memc::cuda::ops {

// ---- convolution (group 1) ----------------------------------------------------------------------
// Geometry over (x [N, C, in...], w [Co, C, kernel...], y [N, Co, out...]).
struct ConvShape {
  int64_t batch = 0, out_channels = 0, group = 1;
  ConvDims dims;

  ConvShape(const Node& node, const Shape& x, const Shape& w, const Shape& y) {
    const int spatial = static_cast<int>(x.size()) - 2;
    batch = x[0], out_channels = w[0];
    group = node.attrs.get_int("group", 1);
    const auto strides = node.attrs.get_ints("strides", std::vector<int64_t>(spatial, 1));
    const auto dilations = node.attrs.get_ints("dilations", std::vector<int64_t>(spatial, 1));
    const auto pads = node.attrs.get_ints("pads", std::vector<int64_t>(2 * spatial, 0));
    dims.spatial = spatial, dims.channels = x[1], dims.taps = x[1];
    for (int d = 0; d < spatial && d < kMaxDims; ++d) {
      dims.in_dims[d] = x[2 + d], dims.out_dims[d] = y[2 + d], dims.kernel[d] = w[2 + d];
      dims.stride[d] = strides[d], dims.pad[d] = pads[d], dims.dilation[d] = dilations[d];
      dims.positions *= y[2 + d], dims.taps *= w[2 + d];
    }
  }
  Status check(const KernelContext& ctx) const {
    if (group != 1) return unsupported(ctx, str_cat("grouped convolution (group ", group, ")"));
    if (dims.spatial > kMaxDims) return unsupported(ctx, str_cat(dims.spatial, " spatial dims"));
    return Status::Ok();
  }
  int64_t positions() const { return dims.positions; }
  int64_t taps() const { return dims.taps; }
  int64_t cols() const { return batch * dims.positions * dims.taps; }
};

// Scratch: the im2col matrix, then (conv_grad_weight) dy transposed to [Co, N·P]; the rest is
// cuBLASLt's workspace.
inline int64_t conv_scratch(const ConvShape& s, DType dtype, bool grad_weight) {
  const int64_t element = static_cast<int64_t>(dtype_size(dtype));
  return scratch_piece(s.cols() * element) + (grad_weight ? scratch_piece(s.out_channels * s.batch * s.positions() * element) : 0);
}

// y_n [Co, P] = w [Co, K] · cols_nᵀ, cols_n [P, K]; then the bias per channel.
template <class R>
Status conv_op(KernelContext& ctx, R& run) {
  const Tensor &x = *ctx.inputs[0], &w = *ctx.inputs[1];
  const ConvShape s(ctx.node, x.shape(), w.shape(), ctx.outputs[0]->shape());
  MEMC_RETURN_IF_ERROR(s.check(ctx));
  Scratch scratch(ctx);
  return dispatch_float(ctx, x.dtype(), [&]<typename T>() -> Status {
    MEMC_ASSIGN_OR_RETURN(T* cols, scratch.take<T>(ctx, s.cols()));
    MEMC_RETURN_IF_ERROR(run(Im2col<T>{in<T>(ctx, 0), cols, s.dims}, s.cols()));
    GemmCall c{.dtype = x.dtype(), .m = s.out_channels, .n = s.positions(), .k = s.taps(), .trans_a = false, .trans_b = true};
    c.batch = s.batch, c.stride_a = 0, c.stride_b = s.positions() * s.taps();
    c.a = w.raw(), c.b = cols, c.y = ctx.outputs[0]->raw();
    MEMC_RETURN_IF_ERROR(run.gemm(c, scratch.next, scratch.left));
    if (const T* bias = in<T>(ctx, 2)) {
      return run(AddChannelBias<T>{bias, out<T>(ctx, 0), s.out_channels, s.positions()}, ctx.outputs[0]->numel());
    }
    return Status::Ok();
  });
}

// dw [Co, K] = dyᵀ [Co, N·P] · cols [N·P, K].
template <class R>
Status conv_grad_weight_op(KernelContext& ctx, R& run) {
  const Tensor &dy = *ctx.inputs[0], &x = *ctx.inputs[1];
  const ConvShape s(ctx.node, x.shape(), ctx.outputs[0]->shape(), dy.shape());
  MEMC_RETURN_IF_ERROR(s.check(ctx));
  MEMC_ASSIGN_OR_RETURN(const Strided transposed, strided(ctx, {s.out_channels, s.batch, s.positions()}, {s.positions(), s.out_channels * s.positions(), 1}));
  Scratch scratch(ctx);
  return dispatch_float(ctx, dy.dtype(), [&]<typename T>() -> Status {
    MEMC_ASSIGN_OR_RETURN(T* cols, scratch.take<T>(ctx, s.cols()));
    MEMC_ASSIGN_OR_RETURN(T* dy_t, scratch.take<T>(ctx, dy.numel()));
    MEMC_RETURN_IF_ERROR(run(Im2col<T>{in<T>(ctx, 1), cols, s.dims}, s.cols()));
    MEMC_RETURN_IF_ERROR(dispatch_bytes(dy.dtype(), [&]<typename E>() {
      return run(CopyStrided<E>{in<E>(ctx, 0), reinterpret_cast<E*>(dy_t), 0, transposed}, dy.numel());
    }));
    GemmCall c{.dtype = dy.dtype(), .m = s.out_channels, .n = s.taps(), .k = s.batch * s.positions(), .trans_a = false, .trans_b = false};
    c.a = dy_t, c.b = cols, c.y = ctx.outputs[0]->raw();
    return run.gemm(c, scratch.next, scratch.left);
  });
}

// ---- attention --------------------------------------------------------------------------------
// The geometry of attention(q, k, v, [bias]) with `out` the shape of y (or of dy, backward), in
// the node's layout (ir/attention_layout.h): bhtd [batch..., T, E], or bthd / tbhd over [B, H].
inline Expected<AttentionGeometry> attention_geometry(const KernelContext& ctx, size_t q_input, const Shape& out) {
  const Shape &q = ctx.inputs[q_input]->shape(), &k = ctx.inputs[q_input + 1]->shape(), &v = ctx.inputs[q_input + 2]->shape();
  const Tensor* bias = ctx.inputs.size() > q_input + 3 ? ctx.inputs[q_input + 3] : nullptr;
  const AttentionLayout layout = attention_layout_of(ctx.node.attrs);
  const AttentionOperand qo = attention_operand_of(layout, q), ko = attention_operand_of(layout, k), vo = attention_operand_of(layout, v),
                         yo = attention_operand_of(layout, out);
  AttentionGeometry g;
  const Shape& batch = yo.batch;
  g.batch = numel(batch), g.tq = qo.t, g.tk = ko.t, g.d = qo.e, g.dv = vo.e;
  if (g.d > kMaxHeadDim || g.dv > kMaxHeadDim) return unsupported(ctx, str_cat("head dims ", g.d, "/", g.dv, " above ", kMaxHeadDim));
  // An operand's entries: in the default layout packed matrices of its own (broadcasting is
  // refused); in the others the layout's steps over [B, H], rows a step apart.
  auto matrices = [&](const AttentionOperand& x, Strided& map, int64_t& row) -> Status {
    if (layout != AttentionLayout::kBHTD) {
      if (batch.size() != 2 || x.batch != batch) return unsupported(ctx, "q, k, v and y differ in their [B, H] entries");
      const std::array<int64_t, 4> steps = attention_steps(layout, batch[0], batch[1], x.t, x.e);
      row = steps[2];
      MEMC_ASSIGN_OR_RETURN(map, strided(ctx, batch, {steps[0], steps[1]}));
      return Status::Ok();
    }
    // Each entry its own matrix: every batch dim beyond 1 present in full (a dim of 1 is no
    // broadcast, though broadcast_strides gives it step 0).
    const std::vector<int64_t> steps = broadcast_strides(x.batch, batch);
    std::vector<int64_t> strides = row_major_strides(batch);
    for (size_t d = 0; d < batch.size(); ++d) {
      if (batch[d] > 1 && steps[d] != strides[d]) return unsupported(ctx, "q, k or v broadcast over the batch (each entry needs its own)");
    }
    for (int64_t& st : strides) st *= x.t * x.e;
    row = x.e;
    MEMC_ASSIGN_OR_RETURN(map, strided(ctx, batch, strides));
    return Status::Ok();
  };
  MEMC_RETURN_IF_ERROR(matrices(qo, g.q_map, g.q_row));
  MEMC_RETURN_IF_ERROR(matrices(ko, g.k_map, g.k_row));
  MEMC_RETURN_IF_ERROR(matrices(vo, g.v_map, g.v_row));
  MEMC_RETURN_IF_ERROR(matrices(yo, g.y_map, g.y_row));
  if (bias) {
    Shape scores = batch;
    scores.push_back(g.tq), scores.push_back(g.tk);
    const std::vector<int64_t> strides = broadcast_strides(bias->shape(), scores);
    g.bias = bias->raw(), g.bias_dtype = bias->dtype();
    g.bias_row = strides[strides.size() - 2], g.bias_col = strides.back();
    MEMC_ASSIGN_OR_RETURN(g.bias_map, strided(ctx, batch, std::vector<int64_t>(strides.begin(), strides.end() - 2)));
  }
  g.scale = static_cast<float>(ctx.node.attrs.get_float("scale", 1.0 / std::sqrt(static_cast<double>(g.d))));
  const double ratio = ctx.node.attrs.get_float("dropout_ratio", 0.0);
  if (ctx.training && ratio > 0.0) {
    g.dropout = true;
    g.seed = ctx.seed, g.stream = draw_stream(ctx);
    g.threshold = dropout_threshold(ratio), g.offset = random_draw_offset(ctx);
    g.inv_keep = static_cast<float>(1.0 / (1.0 - ratio));
  }
  return g;
}

// The cuDNN SDPA shape of an attention node, when cuDNN can take it: bf16/f16, entries [B, H]
// (each its own) in any layout, which cuDNN reads through strides, no active dropout (memc's
// masks are its own draws), and a bias of the same dtype shaped [B, 1|H, 1|Tq, Tk]. Anything
// else runs memc's kernel.
inline std::optional<SdpaShape> sdpa_shape(const KernelContext& ctx, size_t q_input, const AttentionGeometry& g) {
  const Tensor& q = *ctx.inputs[q_input];
  const Tensor* bias = ctx.inputs.size() > q_input + 3 ? ctx.inputs[q_input + 3] : nullptr;
  if ((q.dtype() != DType::kBF16 && q.dtype() != DType::kF16) || g.dropout || q.rank() != 4) return std::nullopt;
  const AttentionLayout layout = attention_layout_of(ctx.node.attrs);
  const Shape& entries = attention_operand_of(layout, q.shape()).batch;
  SdpaShape s{.batch = entries[0], .heads = entries[1], .tq = g.tq, .tk = g.tk, .d = g.d, .dv = g.dv, .dtype = q.dtype(), .layout = layout};
  s.scale = g.scale;
  if (bias) {
    const Shape& b = bias->shape();
    if (bias->dtype() != q.dtype() || b.size() != 4 || b[0] != s.batch || (b[1] != 1 && b[1] != s.heads) || (b[2] != 1 && b[2] != s.tq) ||
        b[3] != s.tk) {
      return std::nullopt;
    }
    s.has_bias = true, s.bias_broadcast_heads = b[1] == 1 && s.heads != 1, s.bias_broadcast_rows = b[2] == 1 && s.tq != 1;
  }
  return s;
}

// Attention through GEMMs (backends/cuda/attention_bodies.h) for q [entries, Tq, D] and k
// [entries, Tk, D] in `layout`: f32 operands, each batch entry its own (the geometry checks it),
// and a score chunk within kScoreChunkBytes. 0 entries per chunk where it does not apply.
inline int64_t gemm_attention_chunk(const TensorType& q, const TensorType& k, AttentionLayout layout = AttentionLayout::kBHTD) {
  if (q.dtype != DType::kF32 || q.shape.size() < 2 || k.shape.size() < 2) return 0;
  const AttentionOperand qo = attention_operand_of(layout, q.shape), ko = attention_operand_of(layout, k.shape);
  return attention_chunk(numel(qo.batch), qo.t, ko.t);
}
// Its scratch: `matrices` score chunks (1 forward, 2 backward), then cuBLASLt's workspace.
inline int64_t gemm_attention_scratch(const TensorType& q, const TensorType& k, int matrices, int64_t gemm_bytes,
                                      AttentionLayout layout = AttentionLayout::kBHTD) {
  const int64_t chunk = gemm_attention_chunk(q, k, layout);
  if (chunk == 0) return 0;
  const int64_t tq = attention_operand_of(layout, q.shape).t, tk = attention_operand_of(layout, k.shape).t;
  return matrices * scratch_piece(chunk * tq * tk * 4) + gemm_bytes;
}

// Scratch of the attention forward: on cuDNN (16-bit) the row statistics it writes (f32 per
// query row), then cuDNN's own workspace, given cuBLASLt's figure (the step's GEMMs plan it
// already); in f32 the GEMM path's score chunk.
inline int64_t attention_scratch(const TensorType& q, const TensorType& k, int64_t gemm_bytes, AttentionLayout layout = AttentionLayout::kBHTD) {
  const bool half = q.dtype == DType::kBF16 || q.dtype == DType::kF16;
  if (!half) return gemm_attention_scratch(q, k, 1, gemm_bytes, layout);
  return scratch_piece(numel(q.shape) / std::max<int64_t>(q.shape.back(), 1) * 4) + gemm_bytes;
}

// The entries one batched GEMM takes at a time: a run of consecutive entries whose matrices lie
// one step apart in q, k, v and y. The whole batch in bhtd and tbhd; in bthd one sample's heads,
// the sample's step being its T rows, not H matrices.
// Dims of size 1 take no part (bthd with one head is one stride per sample).
inline int64_t gemm_entry_run(const AttentionGeometry& g) {
  int64_t run = g.batch;
  for (const Strided* map : {&g.q_map, &g.k_map, &g.v_map, &g.y_map}) {
    int64_t own = 1, next = -1;  // entries so far, and the step the next outer dim must have
    for (int d = map->rank - 1; d >= 0; --d) {
      if (map->dims[d] == 1) continue;
      if (next >= 0 && map->strides[d] != next) break;
      own *= map->dims[d], next = map->strides[d] * map->dims[d];
    }
    run = std::min(run, own);
  }
  return std::max<int64_t>(run, 1);
}
// The step between consecutive entries' matrices within a run: the innermost dim's beyond 1.
inline int64_t entry_step(const Strided& map) {
  for (int d = map.rank - 1; d >= 0; --d) {
    if (map.dims[d] != 1) return map.strides[d];
  }
  return 0;
}

// Calls `chunk_fn(first, n)` over the batch in chunks of at most `chunk` entries that one batched
// GEMM can each take.
template <class F>
Status for_each_gemm_chunk(const AttentionGeometry& g, int64_t chunk, F&& chunk_fn) {
  const int64_t run = gemm_entry_run(g);
  for (int64_t first = 0; first < g.batch;) {
    const int64_t n = std::min({chunk, run - first % run, g.batch - first});
    MEMC_RETURN_IF_ERROR(chunk_fn(first, n));
    first += n;
  }
  return Status::Ok();
}

// One batched product over a chunk: each operand is a base pointer, its step between entries and
// its row step (0: packed).
struct GemmOperand {
  const void* data = nullptr;
  int64_t step = 0, row = 0;
};
template <class R>
Status chunk_gemm(R& run, Scratch& scratch, int64_t n, int64_t m, int64_t cols, int64_t inner, bool ta, bool tb, GemmOperand a, GemmOperand b,
                  float* y, int64_t y_step, int64_t y_row) {
  GemmCall c{.dtype = DType::kF32, .m = m, .n = cols, .k = inner, .trans_a = ta, .trans_b = tb};
  c.batch = n, c.stride_a = a.step, c.stride_b = b.step, c.stride_y = y_step;
  c.lda = a.row, c.ldb = b.row, c.ldy = y_row;
  c.a = a.data, c.b = b.data, c.y = y;
  return run.gemm(c, scratch.next, scratch.left);
}

// The forward through GEMMs, chunk by chunk (f32; gemm_attention_chunk > 0).
template <class R>
Status attention_by_gemm(KernelContext& ctx, R& run, const AttentionGeometry& g, int64_t chunk) {
  Scratch scratch(ctx);
  MEMC_ASSIGN_OR_RETURN(float* scores, scratch.take<float>(ctx, chunk * g.tq * g.tk));
  const float *q = in<float>(ctx, 0), *k = in<float>(ctx, 1), *v = in<float>(ctx, 2);
  float* y = out<float>(ctx, 0);
  return for_each_gemm_chunk(g, chunk, [&](int64_t first, int64_t n) -> Status {
    const GemmOperand qe{q + g.q_map.offset(first), entry_step(g.q_map), g.q_row}, ke{k + g.k_map.offset(first), entry_step(g.k_map), g.k_row};
    const GemmOperand ve{v + g.v_map.offset(first), entry_step(g.v_map), g.v_row}, se{scores, g.tq * g.tk, 0};
    MEMC_RETURN_IF_ERROR(chunk_gemm(run, scratch, n, g.tq, g.tk, g.d, false, true, qe, ke, scores, 0, 0));  // S = Q·Kᵀ
    MEMC_RETURN_IF_ERROR(run(ScoreSoftmax{scores, g, first, g.dropout}, n * g.tq));
    return chunk_gemm(run, scratch, n, g.tq, g.dv, g.tk, false, false, se, ve, y + g.y_map.offset(first), entry_step(g.y_map), g.y_row);
  });
}

// The backward through GEMMs, chunk by chunk (f32, no bias gradient).
template <class R>
Status attention_grad_by_gemm(KernelContext& ctx, R& run, const AttentionGeometry& g, int64_t chunk) {
  Scratch scratch(ctx);
  MEMC_ASSIGN_OR_RETURN(float* probs, scratch.take<float>(ctx, chunk * g.tq * g.tk));
  MEMC_ASSIGN_OR_RETURN(float* grads, scratch.take<float>(ctx, chunk * g.tq * g.tk));
  const float *dy = in<float>(ctx, 0), *q = in<float>(ctx, 1), *k = in<float>(ctx, 2), *v = in<float>(ctx, 3);
  float *dq = out<float>(ctx, 0), *dk = out<float>(ctx, 1), *dv = out<float>(ctx, 2);
  const int64_t scores = g.tq * g.tk;
  return for_each_gemm_chunk(g, chunk, [&](int64_t first, int64_t n) -> Status {
    const int64_t qo = g.q_map.offset(first), ko = g.k_map.offset(first), vo = g.v_map.offset(first);
    const int64_t q_step = entry_step(g.q_map), k_step = entry_step(g.k_map), v_step = entry_step(g.v_map);
    const GemmOperand qe{q + qo, q_step, g.q_row}, ke{k + ko, k_step, g.k_row}, ve{v + vo, v_step, g.v_row};
    const GemmOperand dye{dy + g.y_map.offset(first), entry_step(g.y_map), g.y_row}, pe{probs, scores, 0}, ge{grads, scores, 0};
    MEMC_RETURN_IF_ERROR(chunk_gemm(run, scratch, n, g.tq, g.tk, g.d, false, true, qe, ke, probs, 0, 0));     // S = Q·Kᵀ
    MEMC_RETURN_IF_ERROR(run(ScoreSoftmax{probs, g, first, false}, n * g.tq));                              // P
    MEMC_RETURN_IF_ERROR(chunk_gemm(run, scratch, n, g.tq, g.tk, g.dv, false, true, dye, ve, grads, 0, 0));  // G = dY·Vᵀ
    MEMC_RETURN_IF_ERROR(run(ScoreGrad{probs, grads, g, first}, n * g.tq));                                 // dS, P∘F
    MEMC_RETURN_IF_ERROR(chunk_gemm(run, scratch, n, g.tk, g.dv, g.tq, true, false, pe, dye, dv + vo, v_step, g.v_row));  // dV = P̃ᵀ·dY
    MEMC_RETURN_IF_ERROR(chunk_gemm(run, scratch, n, g.tq, g.d, g.tk, false, false, ge, ke, dq + qo, q_step, g.q_row));   // dQ = dS·K
    return chunk_gemm(run, scratch, n, g.tk, g.d, g.tq, true, false, ge, qe, dk + ko, k_step, g.k_row);                    // dK = dSᵀ·Q
  });
}

// Whether a cuDNN refusal (bad input: no engine, too little workspace, not built) leaves the
// node to memc's own kernel; any other failure is an error.
inline bool fall_back(const Status& st) { return !st.ok() && st.kind() == ErrorKind::kBadInput; }

template <class R>
Status attention_op(KernelContext& ctx, R& run) {
  MEMC_ASSIGN_OR_RETURN(const AttentionGeometry g, attention_geometry(ctx, 0, ctx.outputs[0]->shape()));
  if (const std::optional<SdpaShape> shape = sdpa_shape(ctx, 0, g)) {
    Scratch scratch(ctx);
    MEMC_ASSIGN_OR_RETURN(float* stats, scratch.take<float>(ctx, g.batch * g.tq));
    SdpaPointers p{.q = in<void>(ctx, 0), .k = in<void>(ctx, 1), .v = in<void>(ctx, 2), .bias = in<void>(ctx, 3)};
    p.o = ctx.outputs[0]->raw(), p.stats = stats;
    const Status st = run.sdpa(*shape, false, p, scratch.next, scratch.left);
    if (!fall_back(st)) return st;
  }
  const TensorType q_type{ctx.inputs[0]->dtype(), ctx.inputs[0]->shape()}, k_type{ctx.inputs[1]->dtype(), ctx.inputs[1]->shape()};
  if (const int64_t chunk = gemm_attention_chunk(q_type, k_type, attention_layout_of(ctx.node.attrs))) return attention_by_gemm(ctx, run, g, chunk);
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    return run(AttentionRow<T>{in<T>(ctx, 0), in<T>(ctx, 1), in<T>(ctx, 2), out<T>(ctx, 0), g}, g.batch * g.tq);
  });
}

// Scratch of the fallback attention backward: per query row (log-sum-exp, D), and an f32 dbias
// accumulator when the node has one.
inline int64_t attention_grad_scratch(int64_t query_rows, int64_t dbias_numel) {
  return scratch_piece(query_rows * 2 * 4) + (dbias_numel ? scratch_piece(dbias_numel * 4) : 0);
}

// (dy, q, k, v, [bias]) → dq, dk, dv, [dbias]
// Scratch of the backward on cuDNN (attention_grad_on_cudnn carves it): memc's forward keeps no
// softmax statistics, so the forward runs again into scratch for o [.., Tq, Dv] (data dtype) and
// the row statistics [.., Tq] (f32). cuDNN's own workspace (its dQ accumulator, f32 [.., Tq, D],
// at least) is only known on a device: it gets the larger of that accumulator and cuBLASLt's
// figure, which the step's GEMMs already plan; where its engine wants more, run_sdpa refuses and
// memc's own kernel runs. 0 for f32: cuDNN takes 16-bit attention only.
inline int64_t attention_grad_cudnn_scratch(const TensorType& q, const TensorType& v, int64_t gemm_bytes) {
  if (q.dtype != DType::kBF16 && q.dtype != DType::kF16) return 0;
  const int64_t head_dim = q.shape.back(), rows = numel(q.shape) / std::max<int64_t>(head_dim, 1);  // batch × heads × Tq
  const int64_t output = rows * v.shape.back() * static_cast<int64_t>(dtype_size(q.dtype));
  return scratch_piece(output) + scratch_piece(rows * 4) + std::max(scratch_piece(rows * head_dim * 4), gemm_bytes);
}

// cuDNN's backward: the forward again into scratch (o, stats), then the backward.
template <class R>
Status attention_grad_on_cudnn(KernelContext& ctx, R& run, const SdpaShape& shape) {
  const int64_t rows = shape.batch * shape.heads * shape.tq;
  Scratch scratch(ctx);
  MEMC_ASSIGN_OR_RETURN(char* o, scratch.take<char>(ctx, rows * shape.dv * static_cast<int64_t>(dtype_size(shape.dtype))));
  MEMC_ASSIGN_OR_RETURN(float* stats, scratch.take<float>(ctx, rows));
  SdpaPointers p{.q = in<void>(ctx, 1), .k = in<void>(ctx, 2), .v = in<void>(ctx, 3), .bias = in<void>(ctx, 4)};
  p.o = o, p.stats = stats, p.d_o = in<void>(ctx, 0);
  p.dq = ctx.outputs[0]->raw(), p.dk = ctx.outputs[1]->raw(), p.dv = ctx.outputs[2]->raw();
  MEMC_RETURN_IF_ERROR(run.sdpa(shape, false, p, scratch.next, scratch.left));
  return run.sdpa(shape, true, p, scratch.next, scratch.left);
}

template <class R>
Status attention_grad_op(KernelContext& ctx, R& run) {
  MEMC_ASSIGN_OR_RETURN(const AttentionGeometry g, attention_geometry(ctx, 1, ctx.inputs[0]->shape()));
  if (const std::optional<SdpaShape> shape = sdpa_shape(ctx, 1, g); shape && ctx.outputs.size() == 3) {
    const Status st = attention_grad_on_cudnn(ctx, run, *shape);
    if (!fall_back(st)) return st;
  }
  const TensorType q_type{ctx.inputs[1]->dtype(), ctx.inputs[1]->shape()}, k_type{ctx.inputs[2]->dtype(), ctx.inputs[2]->shape()};
  if (const int64_t chunk = gemm_attention_chunk(q_type, k_type, attention_layout_of(ctx.node.attrs)); chunk && ctx.outputs.size() == 3) {
    return attention_grad_by_gemm(ctx, run, g, chunk);
  }
  const int64_t rows = g.batch * g.tq;
  Scratch scratch(ctx);
  MEMC_ASSIGN_OR_RETURN(float* stats, scratch.take<float>(ctx, rows * 2));
  return dispatch_float(ctx, ctx.inputs[1]->dtype(), [&]<typename T>() -> Status {
    const T *dy = in<T>(ctx, 0), *q = in<T>(ctx, 1), *k = in<T>(ctx, 2), *v = in<T>(ctx, 3);
    MEMC_RETURN_IF_ERROR(run(AttentionGradStats<T>{dy, q, k, v, stats, g}, rows));
    MEMC_RETURN_IF_ERROR(run(AttentionGradQ<T>{dy, q, k, v, stats, out<T>(ctx, 0), g}, rows));
    MEMC_RETURN_IF_ERROR(run(AttentionGradKV<T>{dy, q, k, v, stats, out<T>(ctx, 1), out<T>(ctx, 2), g}, g.batch * g.tk));
    if (ctx.outputs.size() < 4) return Status::Ok();
    const int64_t n = ctx.outputs[3]->numel();
    MEMC_ASSIGN_OR_RETURN(float* acc, scratch.take<float>(ctx, n));
    MEMC_RETURN_IF_ERROR(run(Fill<float>{acc, 0.f}, n));
    MEMC_RETURN_IF_ERROR(run(AttentionGradBias<T>{dy, q, k, v, stats, acc, g}, rows * g.tk));
    return run(StoreF32<T>{acc, out<T>(ctx, 3)}, n);
  });
}

}  // namespace memc::cuda::ops
