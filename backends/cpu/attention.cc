// Fused attention y = softmax(scale·q·kᵀ + bias)·v, tiled FlashAttention-style: for each
// block of queries it walks the keys in blocks, keeping a running max m and sum l per query
// row (online softmax), so only a [kQueryBlock, kKeyBlock] block of scores ever exists. The
// backward (attention_grad) replays that forward per query block and keeps the same bound.
// Batch entries (batch × heads) run on parallel threads, each with its own scratch slot; short
// sequences, whose whole head fits one block, run G heads per strided-batched product instead
// (the grouped section). Slot and group counts come from shapes alone, never from --threads.
// Operands in a layout other than the default (ir/attention_layout.h: bthd, tbhd) are gathered
// entry by entry into the slot's scratch, and outputs and gradients stored back the same way.
// Dimension letters: Tq queries, Tk keys, D head dim, Dv value dim.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "backends/cpu/attention.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/loops.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/vector_math.h"
#include "backends/cpu/workspace.h"
#include "ir/attention_layout.h"

namespace memc::cpu {
namespace {

// Each block costs a few GEMM calls, and a oneDNN call has a fixed cost of ≈8 µs, more than a
// 64×64×64 product's arithmetic: with 64×64 blocks ViT-B/16's attention (T = 197) made ≈150k
// calls per step and took 1.5 s of a 9.1 s step (bench/journal/2026.md §23). Larger blocks cut the
// calls ~8× for a block scratch of ≈0.4 MB per thread, still independent of the sequence length.
constexpr int64_t kQueryBlock = 128;
constexpr int64_t kKeyBlock = 256;

// Where each operand's matrices sit for a flat batch index, and how bias broadcasts.
struct AttentionGeometry {
  AttentionLayout layout = AttentionLayout::kBHTD;  // ir/attention_layout.h
  Shape batch;  // broadcast batch dims of the output; [B, H] in the other layouts
  int64_t tq = 0, tk = 0, d = 0, dv = 0;
  std::vector<int64_t> q_strides, k_strides, v_strides;  // batch strides in matrices; O(rank)
  std::vector<int64_t> bias_strides;                     // element strides over [batch..., Tq, Tk]
  std::vector<int64_t> bias_batch_strides;               // the same, batch dims only
  double scale = 1.0;

  // `out` is y (forward) or dy (backward): [batch..., Tq, Dv]; bias is null when absent.
  AttentionGeometry(const Shape& q, const Shape& k, const Shape& v, const Shape* bias, const Shape& out, const Attrs& attrs)
      : layout(attention_layout_of(attrs)) {
    const AttentionOperand qo = attention_operand_of(layout, q), ko = attention_operand_of(layout, k),
                           vo = attention_operand_of(layout, v);
    batch = attention_operand_of(layout, out).batch;
    tq = qo.t;
    tk = ko.t;
    d = qo.e;
    dv = vo.e;
    q_strides = broadcast_strides(qo.batch, batch);
    k_strides = broadcast_strides(ko.batch, batch);
    v_strides = broadcast_strides(vo.batch, batch);
    if (bias) {
      Shape scores = batch;
      scores.push_back(tq);
      scores.push_back(tk);
      bias_strides = broadcast_strides(*bias, scores);
      bias_batch_strides.assign(bias_strides.begin(), bias_strides.end() - 2);
    }
    scale = attrs.get_float("scale", 1.0 / std::sqrt(static_cast<double>(d)));
  }
  int64_t q_offset(int64_t i) const { return strided_offset(i, batch, q_strides) * tq * d; }
  int64_t k_offset(int64_t i) const { return strided_offset(i, batch, k_strides) * tk * d; }
  int64_t v_offset(int64_t i) const { return strided_offset(i, batch, v_strides) * tk * dv; }
  // Bias element of batch i's score [0, 0], and the strides along Tq and Tk.
  int64_t bias_offset(int64_t i) const {
    return strided_offset(i, batch, bias_batch_strides);
  }
  // Whether every batch entry has its own q, k and v (none broadcast), so entries' gradients
  // land in disjoint matrices and entries can run on different threads.
  bool entries_disjoint() const {
    const std::vector<int64_t> own = broadcast_strides(batch, batch);
    return q_strides == own && k_strides == own && v_strides == own;
  }
  // Whether the operands sit in a layout other than the default: each entry's rows are then
  // gathered into scratch, and the outputs written back, with the steps below.
  bool strided() const { return layout != AttentionLayout::kBHTD; }
  // Where entry i's matrix of t rows × e starts in an operand, and the step between its rows
  // (ir/attention_layout.h's steps; in the default layout, whose batch dims may be any, the
  // entries are consecutive matrices).
  int64_t at(int64_t i, int64_t t, int64_t e) const {
    if (!strided()) return i * t * e;
    const std::array<int64_t, 4> s = attention_steps(layout, batch[0], batch[1], t, e);
    return (i / batch[1]) * s[0] + (i % batch[1]) * s[1];
  }
  int64_t row_step(int64_t t, int64_t e) const { return strided() ? attention_steps(layout, batch[0], batch[1], t, e)[2] : e; }
  int64_t bias_row() const { return bias_strides[bias_strides.size() - 2]; }
  int64_t bias_col() const { return bias_strides.back(); }
};

// Dropout on the attention probabilities: applied to the weights that multiply v, not to the
// normalizer l, so the result equals dropout(softmax(s))·v. The keep draw of score (i, r, c) is
// counter_random(seed, stream, (i·Tq + r)·Tk + c), so forward and backward replay one mask.
struct AttentionDropout {
  bool active = false;
  uint64_t seed = 0, stream = 0, threshold = 0;
  uint64_t offset = 0;  // a micro-batch's first draw in the full batch (passes/microbatch.h)
  double inv_keep = 1.0;

  // Whether dropout can be on at all (the workspace is sized for it even when not training).
  static bool possible(const Node& node) { return node.attrs.get_float("dropout_ratio", 0.0) > 0.0; }

  explicit AttentionDropout(const KernelContext& ctx) {
    const double ratio = ctx.node.attrs.get_float("dropout_ratio", 0.0);
    if (!ctx.training || ratio <= 0.0) return;
    active = true;
    seed = ctx.seed;
    stream = dropout_stream(ctx.node.attrs.get_int("seed", 0), ctx.step);
    threshold = dropout_threshold(ratio);
    offset = random_draw_offset(ctx);
    inv_keep = 1.0 / (1.0 - ratio);
  }
  // factor[r, c] = kept ? 1/(1 - ratio) : 0 for one block of batch entry `batch_index`.
  template <typename C>
  void factors(C* factor, int64_t batch_index, int64_t q0, int64_t k0, int64_t rows, int64_t cols,
               int64_t tq, int64_t tk) const {  // factor: [rows, cols]
    const uint64_t key = counter_key(seed, stream), limit = threshold;
    const C kept = static_cast<C>(inv_keep);
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t first = offset + static_cast<uint64_t>(((batch_index * tq) + q0 + r) * tk + k0);
      C* row = factor + r * cols;
      for (int64_t c = 0; c < cols; ++c) row[c] = counter_draw(key, first + static_cast<uint64_t>(c)) < limit ? kept : C(0);
    }
  }
};

// scores[r, c] += bias[base + r·row_stride + c·col_stride] for one block; bias may have any
// float dtype, converted once per element.
template <typename C>
void add_bias_block(C* scores, const Tensor& bias, int64_t base, int64_t row_stride, int64_t col_stride, int64_t rows,
                    int64_t cols) {  // scores: [rows, cols]
  dispatch_dtype(bias.dtype(), [&]<typename B>() {
    const B* p = bias.data<B>() + base;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) scores[r * cols + c] += static_cast<C>(load<B>(p[r * row_stride + c * col_stride]));
    }
  });
}

// s[i] = e^s[i]: libmvec's vector exp for f32, std::exp for f64.
template <typename C>
void exp_row(C* s, int64_t n) {
  if constexpr (std::is_same_v<C, float>) {
    exp_in_place(s, n);
  } else {
    for (int64_t i = 0; i < n; ++i) s[i] = std::exp(s[i]);
  }
}

// A row's max in 16 interleaved partial results combined in a fixed order (as interleaved_dot,
// backends/cpu/loops.h, does for sums): GCC vectorizes the lanes; a plain loop is one serial
// chain (ViT-B/16's softmax rows spent more time in those chains than in their products).
template <typename C>
C row_max(const C* s, int64_t n) {
  constexpr int kLanes = 16;
  C part[kLanes];
  std::fill(part, part + kLanes, -std::numeric_limits<C>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) part[j] = part[j] < s[i + j] ? s[i + j] : part[j];
  }
  C m = -std::numeric_limits<C>::infinity();
  for (int j = 0; j < kLanes; ++j) m = std::max(m, part[j]);
  for (; i < n; ++i) m = std::max(m, s[i]);
  return m;
}

// Online-softmax update of one block: turns scores into unnormalized weights e^(s - m_new),
// rescales the running output rows by e^(m_old - m_new) and folds the block's sum into l.
template <typename C>
void online_softmax_block(C* scores, C* out, C* row_max, C* row_sum, int64_t rows, int64_t cols, int64_t dv) {
  // scores: [rows, cols], out: [rows, Dv], row_max, row_sum: [rows]
  const C neg_inf = -std::numeric_limits<C>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    C* s = scores + r * cols;
    const C new_max = std::max(row_max[r], memc::cpu::row_max(s, cols));
    if (new_max == neg_inf) {  // every key so far masked out: nothing to add
      std::fill(s, s + cols, C(0));
      continue;
    }
    const C rescale = std::exp(row_max[r] - new_max);
    for (int64_t c = 0; c < cols; ++c) s[c] -= new_max;
    exp_row(s, cols);
    row_sum[r] = row_sum[r] * rescale + interleaved_dot<C>(s, nullptr, cols);
    row_max[r] = new_max;
    C* o = out + r * dv;
    for (int64_t j = 0; j < dv; ++j) o[j] *= rescale;
  }
}

// The matrices of one batch entry in compute type C, and where its scores' bias starts.
template <typename C>
struct AttentionOperands {
  const C *q = nullptr, *k = nullptr, *v = nullptr;  // [Tq, D], [Tk, D], [Tk, Dv]
  const Tensor* bias = nullptr;
  int64_t bias_base = 0, batch_index = 0;
};

// s[rows, cols] = scale·q_blk·k_blkᵀ (+ bias) for queries q0.. and keys k0..
template <typename C>
void score_block(C* s, const AttentionOperands<C>& x, int64_t q0, int64_t k0, int64_t rows, int64_t cols,
                 const AttentionGeometry& g, float* gemm_scratch) {
  gemm(s, x.q + q0 * g.d, x.k + k0 * g.d, GemmShape{.m = rows, .n = cols, .k = g.d, .trans_b = true}, gemm_scratch);
  for (int64_t i = 0; i < rows * cols; ++i) s[i] *= static_cast<C>(g.scale);
  if (x.bias) {
    add_bias_block(s, *x.bias, x.bias_base + q0 * g.bias_row() + k0 * g.bias_col(), g.bias_row(), g.bias_col(), rows, cols);
  }
}

// The gemm scratch of the block products, the most over every block shape (full and edge
// blocks) of the forward and backward.
template <typename C>
int64_t block_gemm_scratch_floats(const AttentionGeometry& g) {
  int64_t most = 0;
  for (int64_t rows : {std::min(kQueryBlock, g.tq), g.tq % kQueryBlock}) {
    for (int64_t cols : {std::min(kKeyBlock, g.tk), g.tk % kKeyBlock}) {
      for (const GemmShape& s : {GemmShape{.m = rows, .n = cols, .k = g.d, .trans_b = true},
                                 GemmShape{.m = rows, .n = g.dv, .k = cols, .accumulate = true},
                                 GemmShape{.m = cols, .n = g.dv, .k = rows, .trans_a = true, .accumulate = true},
                                 GemmShape{.m = rows, .n = cols, .k = g.dv, .trans_b = true},
                                 GemmShape{.m = rows, .n = g.d, .k = cols, .accumulate = true},
                                 GemmShape{.m = cols, .n = g.d, .k = rows, .trans_a = true, .accumulate = true}}) {
        most = std::max(most, gemm_scratch_floats<C>(s));
      }
    }
  }
  return most;
}

// Per-query-block scratch: a block of scores and dropout factors (only when dropout is
// possible), output rows, row max and sum, and the block gemms' scratch. Blocks are at most
// [min(64, Tq), min(64, Tk)].
template <typename C>
struct QueryBlockScratch {
  int64_t rows = 0;                // capacity in query rows
  C *scores, *factor, *out;        // [rows, cols], [rows, cols], [rows, Dv]
  C *row_max, *row_sum;            // [rows]
  float* gemm_scratch;             // block_gemm_scratch_floats
  QueryBlockScratch(Workspace& ws, const AttentionGeometry& g, bool dropout_possible)
      : rows(std::min(kQueryBlock, g.tq)), scores(ws.take<C>(rows * std::min(kKeyBlock, g.tk))),
        factor(ws.take<C>(dropout_possible ? rows * std::min(kKeyBlock, g.tk) : 0)), out(ws.take<C>(rows * g.dv)),
        row_max(ws.take<C>(rows)), row_sum(ws.take<C>(rows)), gemm_scratch(ws.take<float>(block_gemm_scratch_floats<C>(g))) {}
};

// The forward pass over all keys for queries q0..q0+rows: leaves the unnormalized output rows
// Σ_j dropout(e^(s_j - m))·v_j in w.out, the row max m in w.row_max and l = Σ_j e^(s_j - m) in
// w.row_sum (l = 0 for a row whose every key is masked).
template <typename C>
void attend_query_block(QueryBlockScratch<C>& w, const AttentionOperands<C>& x, int64_t q0, int64_t rows,
                        const AttentionGeometry& g, const AttentionDropout& dropout) {
  std::fill(w.out, w.out + rows * g.dv, C(0));
  std::fill(w.row_max, w.row_max + rows, -std::numeric_limits<C>::infinity());
  std::fill(w.row_sum, w.row_sum + rows, C(0));
  for (int64_t k0 = 0; k0 < g.tk; k0 += kKeyBlock) {
    const int64_t cols = std::min(kKeyBlock, g.tk - k0);
    score_block(w.scores, x, q0, k0, rows, cols, g, w.gemm_scratch);
    online_softmax_block(w.scores, w.out, w.row_max, w.row_sum, rows, cols, g.dv);
    if (dropout.active) {
      dropout.factors(w.factor, x.batch_index, q0, k0, rows, cols, g.tq, g.tk);
      for (int64_t i = 0; i < rows * cols; ++i) w.scores[i] *= w.factor[i];
    }
    // out[rows, Dv] += p[rows, cols] · v_blk[cols, Dv]
    gemm(w.out, w.scores, x.v + k0 * g.dv, GemmShape{.m = rows, .n = g.dv, .k = cols, .accumulate = true}, w.gemm_scratch);
  }
}

// One batch entry: y[Tq, Dv] from q[Tq, D], k[Tk, D], v[Tk, Dv] in compute type C.
template <typename T, typename C>
void attention_matrix(T* y, const AttentionOperands<C>& x, QueryBlockScratch<C>& w, const AttentionGeometry& g,
                      const AttentionDropout& dropout) {
  for (int64_t q0 = 0; q0 < g.tq; q0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, g.tq - q0);
    attend_query_block(w, x, q0, rows, g, dropout);
    // Rows whose every key was masked (-inf bias) have l = 0 and produce 0, not NaN.
    for (int64_t r = 0; r < rows; ++r) {
      const C inv_sum = w.row_sum[r] > C(0) ? C(1) / w.row_sum[r] : C(0);
      T* y_row = y + (q0 + r) * g.row_step(g.tq, g.dv);
      for (int64_t j = 0; j < g.dv; ++j) y_row[j] = store<T>(w.out[r * g.dv + j] * inv_sum);
    }
  }
}

// `count` elements of compute type C for a copy of 16-bit T; none when T is C (used in place).
template <typename T, typename C = typename Compute<T>::type>
C* take_widened(Workspace& ws, int64_t count) {
  if constexpr (std::is_same_v<T, C>) return nullptr;
  else return ws.take<C>(count);
}

// An operand buffer of `count` compute-type elements, when one is needed: T is 16-bit (widened)
// or the layout is not the default (gathered).
template <typename T, typename C = typename Compute<T>::type>
C* take_operand(Workspace& ws, int64_t count, const AttentionGeometry& g) {
  if (g.strided()) return ws.take<C>(count);
  return take_widened<T>(ws, count);
}

// A matrix of `count` T in compute type C: the data itself when T is C, else widened into buffer.
template <typename T, typename C>
const C* as_compute(const T* x, int64_t count, C* buffer) {
  if constexpr (std::is_same_v<T, C>) {
    return x;
  } else {
    for (int64_t i = 0; i < count; ++i) buffer[i] = load<T>(x[i]);
    return buffer;
  }
}

// Entries [i0, i0 + n) of operand x (t rows of e each; in the default layout the first starts at
// `offset`) in compute type C, entry after entry: the data itself when T is C in the default
// layout, else widened or gathered into buffer.
template <typename T, typename C>
const C* load_entries(const T* x, int64_t offset, int64_t i0, int64_t n, int64_t t, int64_t e, const AttentionGeometry& g, C* buffer) {
  if (!g.strided()) return as_compute(x + offset, n * t * e, buffer);
  const int64_t step = g.row_step(t, e);
  for (int64_t j = 0; j < n; ++j) {
    const T* src = x + g.at(i0 + j, t, e);
    C* dst = buffer + j * t * e;
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t c = 0; c < e; ++c) dst[r * e + c] = load<T>(src[r * step + c]);
    }
  }
  return buffer;
}

// Entries [i0, i0 + n) of an output (t rows of e each) from their values in compute type C,
// consecutive in `values`, rounded once, to where the layout puts them.
template <typename T, typename C>
void store_entries(T* y, const C* values, int64_t i0, int64_t n, int64_t t, int64_t e, const AttentionGeometry& g) {
  const int64_t step = g.row_step(t, e);
  for (int64_t j = 0; j < n; ++j) {
    T* dst = y + g.at(i0 + j, t, e);
    const C* src = values + j * t * e;
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t c = 0; c < e; ++c) dst[r * step + c] = store<T>(src[r * e + c]);
    }
  }
}

// One batch entry's q, k, v in compute type C: workspace buffers when T is 16-bit or the layout
// is not the default, else null.
template <typename T, typename C>
struct WidenedOperands {
  C *q, *k, *v;  // [Tq, D], [Tk, D], [Tk, Dv] or null
  WidenedOperands(Workspace& ws, const AttentionGeometry& g)
      : q(take_operand<T>(ws, g.tq * g.d, g)), k(take_operand<T>(ws, g.tk * g.d, g)), v(take_operand<T>(ws, g.tk * g.dv, g)) {}
};

// Batch entry i's q, k, v (widened into `buf` when T is 16-bit) and bias position.
template <typename T, typename C>
struct OperandLoader {
  const Tensor &q, &k, &v;
  const Tensor* bias;
  const AttentionGeometry& g;
  const WidenedOperands<T, C>& buf;

  AttentionOperands<C> operator()(int64_t i) const {
    AttentionOperands<C> x;
    x.q = load_entries(q.data<T>(), g.q_offset(i), i, 1, g.tq, g.d, g, buf.q);
    x.k = load_entries(k.data<T>(), g.k_offset(i), i, 1, g.tk, g.d, g, buf.k);
    x.v = load_entries(v.data<T>(), g.v_offset(i), i, 1, g.tk, g.dv, g, buf.v);
    x.bias = bias;
    x.bias_base = bias ? g.bias_offset(i) : 0;
    x.batch_index = i;
    return x;
  }
};

// ---- backward -------------------------------------------------------------------------------
// Per query block: replay the forward block (m, l and the output rows o), then D_r = dy_r·o_r
// (= Σ_c P_rc·dP_rc, dropout included), and per key block with P = e^(s - m)/l and
// P̃ = P∘dropout factor:
//   dv += P̃ᵀ·dy,  dP = (dy·vᵀ)∘factor,  dS = P∘(dP - D),  dbias += dS,
//   dq += scale·dS·k,  dk += scale·dSᵀ·q.

// One gradient output, accumulated in compute type C: in place when T is C, else in a
// workspace buffer (take_widened) rounded once by finish(). Broadcast batch entries add into
// the same matrices.
// The default layout only: the other layouts' entries accumulate in slot scratch (BackwardSlot,
// GroupScratch) and are stored entry by entry.
template <typename T, typename C>
class GradAccumulator {
 public:
  GradAccumulator(Tensor& out, C* buffer) : out_(out), buffer_(buffer) {
    if constexpr (std::is_same_v<T, C>) std::fill(out.data<T>(), out.data<T>() + out.numel(), T(0));
    else std::fill(buffer_, buffer_ + out.numel(), C(0));
  }
  C* data() {
    if constexpr (std::is_same_v<T, C>) return out_.data<T>();
    else return buffer_;
  }
  void finish() {
    if constexpr (!std::is_same_v<T, C>) {
      for (int64_t i = 0, count = out_.numel(); i < count; ++i) out_.data<T>()[i] = store<T>(buffer_[i]);
    }
  }

 private:
  Tensor& out_;
  C* buffer_;  // [out.numel()] when T is 16-bit
};

// Entries [i0, i0 + n)'s gradients from slot scratch (consecutive matrices) to dq, dk, dv where
// the layout puts them, rounded once.
template <typename T, typename C>
void store_grads(KernelContext& ctx, const C* dq, const C* dk, const C* dv, int64_t i0, int64_t n, const AttentionGeometry& g) {
  store_entries(ctx.outputs[0]->data<T>(), dq, i0, n, g.tq, g.d, g);
  store_entries(ctx.outputs[1]->data<T>(), dk, i0, n, g.tk, g.d, g);
  store_entries(ctx.outputs[2]->data<T>(), dv, i0, n, g.tk, g.dv, g);
}

template <typename C>
struct AttentionGrads {
  C *dq, *dk, *dv;  // batch entry's [Tq, D], [Tk, D], [Tk, Dv]
  C* dbias;         // whole bias layout (nullptr: not wanted), indexed like the bias
};

template <typename C>
struct BackwardScratch : QueryBlockScratch<C> {
  C *prob, *dprob;    // [rows, cols]
  C *inv_sum, *delta;  // [rows]
  BackwardScratch(Workspace& ws, const AttentionGeometry& g, bool dropout_possible)
      : QueryBlockScratch<C>(ws, g, dropout_possible), prob(ws.take<C>(this->rows * std::min(kKeyBlock, g.tk))),
        dprob(ws.take<C>(this->rows * std::min(kKeyBlock, g.tk))), inv_sum(ws.take<C>(this->rows)), delta(ws.take<C>(this->rows)) {}
};

// p[rows, cols] = softmax of each row of s (a row whose every key is masked: 0, not NaN); p may
// be s.
template <typename C>
void softmax_rows(C* p, const C* s, int64_t rows, int64_t cols) {
  const C neg_inf = -std::numeric_limits<C>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const C m = row_max(s + r * cols, cols);
    for (int64_t c = 0; c < cols; ++c) p[r * cols + c] = m == neg_inf ? neg_inf : s[r * cols + c] - m;
  }
  exp_row(p, rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const C l = interleaved_dot<C>(p + r * cols, nullptr, cols);
    const C inv = l > C(0) ? C(1) / l : C(0);
    for (int64_t c = 0; c < cols; ++c) p[r * cols + c] *= inv;
  }
}

// dS = P∘(dP - D) in place of dP, with D_r = Σ_c P_rc·dP_rc = dy_r·o_r: the rows are whole, so
// D needs no replayed output o. dP already carries the dropout factors.
template <typename C>
void softmax_grad_rows(C* dp, const C* p, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const C delta = interleaved_dot<C>(p + r * cols, dp + r * cols, cols);
    for (int64_t c = 0; c < cols; ++c) dp[r * cols + c] = p[r * cols + c] * (dp[r * cols + c] - delta);
  }
}

// P from the scores of the key block with the replayed row stats (w.row_max, w.inv_sum).
template <typename C>
void probabilities_from_stats(BackwardScratch<C>& w, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const C m = w.row_max[r];
    for (int64_t c = 0; c < cols; ++c) w.prob[r * cols + c] = w.scores[r * cols + c] - m;
  }
  exp_row(w.prob, rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    C* p = w.prob + r * cols;
    const C inv = w.inv_sum[r];
    if (inv > C(0)) {
      for (int64_t c = 0; c < cols; ++c) p[c] *= inv;
    } else {
      std::fill(p, p + cols, C(0));
    }
  }
}

// The key block k0..k0+cols of query block q0..q0+rows. With `whole_rows` (the block holds every
// key: k0 = 0, cols = Tk) P is the softmax of whole rows and D_r = Σ_c P_rc·dP_rc, so nothing of
// the forward is replayed: five products where replaying the online forward (scores, o) first
// takes seven. Otherwise w holds the replayed row stats and D (w.delta).
template <typename C>
void attention_grad_block(const C* dy, const AttentionOperands<C>& x, const AttentionGrads<C>& d, BackwardScratch<C>& w,
                          int64_t q0, int64_t rows, int64_t k0, int64_t cols, const AttentionGeometry& g,
                          const AttentionDropout& dropout, bool whole_rows) {  // dy: [Tq, Dv]
  score_block(w.scores, x, q0, k0, rows, cols, g, w.gemm_scratch);
  if (whole_rows) {
    softmax_rows(w.prob, w.scores, rows, cols);
  } else {
    probabilities_from_stats(w, rows, cols);
  }
  const C* dropped = w.prob;  // P̃[rows, cols]
  if (dropout.active) {
    dropout.factors(w.factor, x.batch_index, q0, k0, rows, cols, g.tq, g.tk);
    for (int64_t i = 0; i < rows * cols; ++i) w.scores[i] = w.prob[i] * w.factor[i];
    dropped = w.scores;
  }
  const C* dy_blk = dy + q0 * g.dv;
  // dv[cols, Dv] += P̃ᵀ[cols, rows]·dy[rows, Dv];  dP[rows, cols] = dy[rows, Dv]·v_blkᵀ
  gemm(d.dv + k0 * g.dv, dropped, dy_blk, GemmShape{.m = cols, .n = g.dv, .k = rows, .trans_a = true, .accumulate = true}, w.gemm_scratch);
  gemm(w.dprob, dy_blk, x.v + k0 * g.dv, GemmShape{.m = rows, .n = cols, .k = g.dv, .trans_b = true}, w.gemm_scratch);
  C* ds = w.dprob;
  if (dropout.active) {
    for (int64_t i = 0; i < rows * cols; ++i) ds[i] *= w.factor[i];
  }
  if (whole_rows) {
    softmax_grad_rows(ds, w.prob, rows, cols);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      const C delta = w.delta[r];
      for (int64_t c = 0; c < cols; ++c) ds[r * cols + c] = w.prob[r * cols + c] * (ds[r * cols + c] - delta);
    }
  }
  if (d.dbias) {
    C* db = d.dbias + x.bias_base + q0 * g.bias_row() + k0 * g.bias_col();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) db[r * g.bias_row() + c * g.bias_col()] += ds[r * cols + c];
    }
  }
  for (int64_t i = 0; i < rows * cols; ++i) ds[i] *= static_cast<C>(g.scale);
  // dq[rows, D] += dS·k_blk;  dk[cols, D] += dSᵀ·q_blk
  gemm(d.dq + q0 * g.d, ds, x.k + k0 * g.d, GemmShape{.m = rows, .n = g.d, .k = cols, .accumulate = true}, w.gemm_scratch);
  gemm(d.dk + k0 * g.d, ds, x.q + q0 * g.d, GemmShape{.m = cols, .n = g.d, .k = rows, .trans_a = true, .accumulate = true}, w.gemm_scratch);
}

// One batch entry; only one [kQueryBlock, kKeyBlock] block of probabilities exists at a time.
template <typename C>
void attention_grad_matrix(const C* dy, const AttentionOperands<C>& x, const AttentionGrads<C>& d, BackwardScratch<C>& w,
                           const AttentionGeometry& g, const AttentionDropout& dropout) {  // dy: [Tq, Dv]
  for (int64_t q0 = 0; q0 < g.tq; q0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, g.tq - q0);
    if (g.tk <= kKeyBlock) {
      attention_grad_block(dy, x, d, w, q0, rows, 0, g.tk, g, dropout, true);
      continue;
    }
    attend_query_block(w, x, q0, rows, g, dropout);
    for (int64_t r = 0; r < rows; ++r) {  // D_r = dy_r·o_r with o_r = out_r / l_r
      w.inv_sum[r] = w.row_sum[r] > C(0) ? C(1) / w.row_sum[r] : C(0);
      w.delta[r] = interleaved_dot<C>(dy + (q0 + r) * g.dv, w.out + r * g.dv, g.dv) * w.inv_sum[r];
    }
    for (int64_t k0 = 0; k0 < g.tk; k0 += kKeyBlock) {
      attention_grad_block(dy, x, d, w, q0, rows, k0, std::min(kKeyBlock, g.tk - k0), g, dropout, false);
    }
  }
}

// One thread's backward scratch: a batch entry's operands and dy widened (16-bit only), and the
// block scratch.
template <typename T, typename C>
struct BackwardSlot {
  WidenedOperands<T, C> operands;
  BackwardScratch<C> scratch;
  C* dy;  // [Tq, Dv] or null
  // Outside the default layout: the entry's dq, dk, dv, stored where the layout puts them once
  // the entry is done ([Tq, D], [Tk, D], [Tk, Dv]); null in the default layout.
  C *dq, *dk, *dv;
  BackwardSlot(Workspace& ws, const AttentionGeometry& g, bool dropout_possible)
      : operands(ws, g), scratch(ws, g, dropout_possible), dy(take_operand<T>(ws, g.tq * g.dv, g)),
        dq(g.strided() ? ws.take<C>(g.tq * g.d) : nullptr), dk(g.strided() ? ws.take<C>(g.tk * g.d) : nullptr),
        dv(g.strided() ? ws.take<C>(g.tk * g.dv) : nullptr) {}
};

// What the backward carves after its slots: the dq, dk, dv accumulators (16-bit in the default
// layout only: entries that broadcast add into one matrix; the other layouts' entries are their
// own, done in slot scratch) and dbias in the bias layout (when dbias is wanted).
template <typename T, typename C>
struct GradBuffers {
  C *dq, *dk, *dv, *dbias;
  GradBuffers(Workspace& ws, const AttentionGeometry& g, int64_t dq_count, int64_t dk_count, int64_t dv_count, int64_t dbias_count)
      : dq(g.strided() ? nullptr : take_widened<T>(ws, dq_count)), dk(g.strided() ? nullptr : take_widened<T>(ws, dk_count)),
        dv(g.strided() ? nullptr : take_widened<T>(ws, dv_count)), dbias(ws.take<C>(dbias_count)) {}
};

// The geometry for sizing: the bias only adds strides, never scratch, so it is left out.
AttentionGeometry geometry_of(std::span<const TensorType> in, size_t first, const Shape& out, const Attrs& attrs) {
  return AttentionGeometry(in[first].shape, in[first + 1].shape, in[first + 2].shape, nullptr, out, attrs);
}

// Batch entries run in parallel, one slot of scratch per thread. The slot count depends only on
// shapes, never on --threads, so a plan's workspace (and peak) is the same at any thread count:
// at most kMaxKernelSlots (backends/cpu/parallel.h), and only as many as keep the extra slots'
// scratch within a quarter of the bytes the kernel writes anyway, so that small models (whose
// per-slot scratch rivals their activations) stay on one slot.
template <typename Slot>
int64_t entry_slots(const AttentionGeometry& g, int64_t output_bytes, bool dropout_possible) {
  Workspace counter;
  const Slot one(counter, g, dropout_possible);
  (void)one;
  const int64_t per_slot = std::max<int64_t>(counter.used_bytes(), 1);
  return std::max<int64_t>(1, std::min({numel(g.batch), kMaxKernelSlots, 1 + output_bytes / 4 / per_slot}));
}

// One thread's forward scratch: a batch entry's operands widened (16-bit only) and one query
// block's scratch.
template <typename T, typename C>
struct ForwardSlot {
  WidenedOperands<T, C> operands;
  QueryBlockScratch<C> scratch;
  ForwardSlot(Workspace& ws, const AttentionGeometry& g, bool dropout_possible) : operands(ws, g), scratch(ws, g, dropout_possible) {}
};

template <typename T>
int64_t forward_slots(const AttentionGeometry& g, bool dropout_possible, int64_t output_bytes) {
  return entry_slots<ForwardSlot<T, typename Compute<T>::type>>(g, output_bytes, dropout_possible);
}

// Backward slots: entries run in parallel only when their gradients are disjoint matrices and
// no dbias is summed across them; otherwise one slot, in entry order.
template <typename T>
int64_t backward_slots(const AttentionGeometry& g, bool dropout_possible, bool dbias_wanted, int64_t output_bytes) {
  if (!g.entries_disjoint() || dbias_wanted) return 1;
  return entry_slots<BackwardSlot<T, typename Compute<T>::type>>(g, output_bytes, dropout_possible);
}

// ---- short sequences: groups of entries, one strided-batched product each -------------------
// When a whole entry fits one block (Tq ≤ kQueryBlock, Tk ≤ kKeyBlock) and entries are
// disjoint, G entries at a time share each product: one oneDNN call for G heads instead of G
// calls, whose fixed cost (≈8 µs) exceeds a short head's arithmetic (vit_small32, T = 50: 22 % of
// its step was attention). Groups are fixed, [0, G), [G, 2G), …, whatever the thread count, so
// the products' batch sizes (G and the remainder) and the workspace do not depend on --threads.
// G keeps a group's scores within one block's (kQueryBlock·kKeyBlock), and a group's scratch
// within a quarter of the bytes the kernel writes, as entry_slots does for slots; with G = 1
// the entries run one by one instead.

bool groupable(const AttentionGeometry& g, bool dbias_wanted) {
  return g.tq <= kQueryBlock && g.tk <= kKeyBlock && g.entries_disjoint() && !dbias_wanted && numel(g.batch) > 1;
}

// The products of a group of `n` entries, all strided-batched over contiguous entries.
struct GroupGemms {
  GemmShape scores, out, grad_v, grad_p, grad_q, grad_k;
  GroupGemms(const AttentionGeometry& g, int64_t n) {
    const int64_t tq = g.tq, tk = g.tk, d = g.d, dv = g.dv;
    scores = {.m = tq, .n = tk, .k = d, .trans_b = true, .batch = n, .batch_stride_a = tq * d, .batch_stride_b = tk * d};
    out = {.m = tq, .n = dv, .k = tk, .batch = n, .batch_stride_a = tq * tk, .batch_stride_b = tk * dv};
    grad_v = {.m = tk, .n = dv, .k = tq, .trans_a = true, .accumulate = true, .batch = n, .batch_stride_a = tq * tk, .batch_stride_b = tq * dv};
    grad_p = {.m = tq, .n = tk, .k = dv, .trans_b = true, .batch = n, .batch_stride_a = tq * dv, .batch_stride_b = tk * dv};
    grad_q = {.m = tq, .n = d, .k = tk, .accumulate = true, .batch = n, .batch_stride_a = tq * tk, .batch_stride_b = tk * d};
    grad_k = {.m = tk, .n = d, .k = tq, .trans_a = true, .accumulate = true, .batch = n, .batch_stride_a = tq * tk, .batch_stride_b = tq * d};
  }
};

// Gemm scratch of every group product, for both batch sizes a group of `size` can have.
template <typename C>
int64_t group_gemm_scratch_floats(const AttentionGeometry& g, int64_t size) {
  int64_t most = 0;
  const int64_t rest = numel(g.batch) % size;
  for (int64_t n : {size, rest}) {
    if (n == 0) continue;
    const GroupGemms p(g, n);
    for (const GemmShape& s : {p.scores, p.out, p.grad_v, p.grad_p, p.grad_q, p.grad_k}) most = std::max(most, gemm_scratch_floats<C>(s));
  }
  return most;
}

// One thread's scratch for a group of G entries: operands widened (16-bit only), probabilities
// and dropout factors (when dropout is possible); the forward adds the outputs, the backward dy
// widened and dP.
template <typename T, typename C>
struct GroupScratch {
  C *q, *k, *v, *dy;            // [G, Tq, D], [G, Tk, D], [G, Tk, Dv], [G, Tq, Dv] or null (T is C)
  C *scores, *factor, *out;     // [G, Tq, Tk], [G, Tq, Tk] or null, [G, Tq, Dv] (forward only)
  C* dprob;                     // [G, Tq, Tk] (backward only)
  C *dq, *dk, *dv;              // the group's gradients outside the default layout (backward only), else null
  float* gemm_scratch;
  GroupScratch(Workspace& ws, const AttentionGeometry& g, bool dropout_possible, bool backward, int64_t n) {
    q = take_operand<T>(ws, n * g.tq * g.d, g);
    k = take_operand<T>(ws, n * g.tk * g.d, g);
    v = take_operand<T>(ws, n * g.tk * g.dv, g);
    dy = backward ? take_operand<T>(ws, n * g.tq * g.dv, g) : nullptr;
    scores = ws.take<C>(n * g.tq * g.tk);
    factor = ws.take<C>(dropout_possible ? n * g.tq * g.tk : 0);
    out = backward ? nullptr : ws.take<C>(n * g.tq * g.dv);
    dprob = backward ? ws.take<C>(n * g.tq * g.tk) : nullptr;
    const bool own_grads = backward && g.strided();
    dq = own_grads ? ws.take<C>(n * g.tq * g.d) : nullptr;
    dk = own_grads ? ws.take<C>(n * g.tk * g.d) : nullptr;
    dv = own_grads ? ws.take<C>(n * g.tk * g.dv) : nullptr;
    gemm_scratch = ws.take<float>(group_gemm_scratch_floats<C>(g, n));
  }
};

// Entries per group (1: do not group), from the shapes alone.
template <typename T>
int64_t group_size(const AttentionGeometry& g, bool dropout_possible, bool backward, bool dbias_wanted, int64_t output_bytes) {
  if (!groupable(g, dbias_wanted)) return 1;
  Workspace counter;
  const GroupScratch<T, typename Compute<T>::type> one(counter, g, dropout_possible, backward, 1);
  (void)one;
  const int64_t per_entry = std::max<int64_t>(counter.used_bytes(), 1);
  const int64_t by_scores = kQueryBlock * kKeyBlock / std::max<int64_t>(g.tq * g.tk, 1);
  return std::clamp<int64_t>(std::min(by_scores, output_bytes / 4 / per_entry), 1, numel(g.batch));
}

// Slots for the grouped path: as entry_slots, over groups rather than entries.
template <typename T>
int64_t group_slots(const AttentionGeometry& g, bool dropout_possible, bool backward, int64_t size, int64_t output_bytes) {
  Workspace counter;
  const GroupScratch<T, typename Compute<T>::type> one(counter, g, dropout_possible, backward, size);
  (void)one;
  const int64_t groups = (numel(g.batch) + size - 1) / size;
  const int64_t per_slot = std::max<int64_t>(counter.used_bytes(), 1);
  return std::max<int64_t>(1, std::min({groups, kMaxKernelSlots, 1 + output_bytes / 4 / per_slot}));
}

// Scores of entries [i0, i0 + n) → softmax probabilities P in w.scores (a row whose every key
// is masked gets P = 0, not NaN), and the dropout factors in w.factor when dropout is on.
template <typename T, typename C>
void group_probabilities(GroupScratch<T, C>& w, const C* q, const C* k, const Tensor* bias, int64_t i0, int64_t n,
                         const AttentionGeometry& g, const AttentionDropout& dropout, const GroupGemms& p) {
  gemm(w.scores, q, k, p.scores, w.gemm_scratch);
  const int64_t per = g.tq * g.tk;
  for (int64_t i = 0; i < n * per; ++i) w.scores[i] *= static_cast<C>(g.scale);
  for (int64_t e = 0; bias && e < n; ++e) {
    add_bias_block(w.scores + e * per, *bias, g.bias_offset(i0 + e), g.bias_row(), g.bias_col(), g.tq, g.tk);
  }
  softmax_rows(w.scores, w.scores, n * g.tq, g.tk);
  for (int64_t e = 0; dropout.active && e < n; ++e) dropout.factors(w.factor + e * per, i0 + e, 0, 0, g.tq, g.tk, g.tq, g.tk);
}

// P̃ = P∘factor into `out` (P itself when dropout is off: no copy).
template <typename T, typename C>
const C* dropped_probabilities(const GroupScratch<T, C>& w, C* out, int64_t count, const AttentionDropout& dropout) {
  if (!dropout.active) return w.scores;
  for (int64_t i = 0; i < count; ++i) out[i] = w.scores[i] * w.factor[i];
  return out;
}

// y for entries [i0, i0 + n): y = P̃·v.
template <typename T, typename C>
void attention_group(T* y, GroupScratch<T, C>& w, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* bias,
                     int64_t i0, int64_t n, const AttentionGeometry& g, const AttentionDropout& dropout) {
  const GroupGemms p(g, n);
  const C* qc = load_entries(q.data<T>(), i0 * g.tq * g.d, i0, n, g.tq, g.d, g, w.q);
  const C* kc = load_entries(k.data<T>(), i0 * g.tk * g.d, i0, n, g.tk, g.d, g, w.k);
  const C* vc = load_entries(v.data<T>(), i0 * g.tk * g.dv, i0, n, g.tk, g.dv, g, w.v);
  group_probabilities(w, qc, kc, bias, i0, n, g, dropout, p);
  const C* dropped = dropped_probabilities(w, w.scores, n * g.tq * g.tk, dropout);  // in place: P is not needed again
  gemm(w.out, dropped, vc, p.out, w.gemm_scratch);
  if (g.strided()) {
    store_entries(y, w.out, i0, n, g.tq, g.dv, g);
    return;
  }
  T* yg = y + i0 * g.tq * g.dv;
  for (int64_t i = 0; i < n * g.tq * g.dv; ++i) yg[i] = store<T>(w.out[i]);
}

// Gradients for entries [i0, i0 + n) with P = softmax(s), P̃ = P∘factor, o = P̃·v:
// D = rowsum(dy∘o), dv += P̃ᵀ·dy, dP = (dy·vᵀ)∘factor, dS = P∘(dP - D),
// dq += scale·dS·k, dk += scale·dSᵀ·q. dq, dk, dv point at entry i0's matrices.
template <typename T, typename C>
void attention_grad_group(GroupScratch<T, C>& w, const Tensor& dy, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor* bias, C* dq, C* dk, C* dv, int64_t i0, int64_t n, const AttentionGeometry& g,
                          const AttentionDropout& dropout) {
  const GroupGemms p(g, n);
  const C* qc = load_entries(q.data<T>(), i0 * g.tq * g.d, i0, n, g.tq, g.d, g, w.q);
  const C* kc = load_entries(k.data<T>(), i0 * g.tk * g.d, i0, n, g.tk, g.d, g, w.k);
  const C* vc = load_entries(v.data<T>(), i0 * g.tk * g.dv, i0, n, g.tk, g.dv, g, w.v);
  const C* dyc = load_entries(dy.data<T>(), i0 * g.tq * g.dv, i0, n, g.tq, g.dv, g, w.dy);
  group_probabilities(w, qc, kc, bias, i0, n, g, dropout, p);  // w.scores = P
  const int64_t count = n * g.tq * g.tk;
  const C* dropped = dropped_probabilities(w, w.dprob, count, dropout);  // P̃ (w.dprob is free until dP)
  gemm(dv, dropped, dyc, p.grad_v, w.gemm_scratch);  // dv += P̃ᵀ·dy
  gemm(w.dprob, dyc, vc, p.grad_p, w.gemm_scratch);  // dy·vᵀ (P̃ is no longer needed)
  if (dropout.active) {
    for (int64_t i = 0; i < count; ++i) w.dprob[i] *= w.factor[i];
  }
  softmax_grad_rows(w.dprob, w.scores, n * g.tq, g.tk);  // the rows are whole: D from P and dP
  const C scale = static_cast<C>(g.scale);
  for (int64_t i = 0; i < count; ++i) w.dprob[i] *= scale;
  gemm(dq, w.dprob, kc, p.grad_q, w.gemm_scratch);  // dq += scale·dS·k
  gemm(dk, w.dprob, qc, p.grad_k, w.gemm_scratch);  // dk += scale·dSᵀ·q
}

}  // namespace

// Workspace: per slot, q, k, v widened per batch entry (16-bit only), then one query block's scratch.
Status attention_kernel(KernelContext& ctx) {
  const Tensor &q = *ctx.inputs[0], &k = *ctx.inputs[1], &v = *ctx.inputs[2];
  const Tensor* bias = ctx.inputs.size() >= 4 ? ctx.inputs[3] : nullptr;
  Tensor& y = *ctx.outputs[0];
  const AttentionGeometry g(q.shape(), k.shape(), v.shape(), bias ? &bias->shape() : nullptr, y.shape(), ctx.node.attrs);
  const AttentionDropout dropout(ctx);
  Workspace ws(ctx);
  return dispatch_dtype(q.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsFloatStorage<T>) {
      return unsupported_dtype(ctx, q.dtype());
    } else {
      using C = typename Compute<T>::type;
      const bool dropout_possible = AttentionDropout::possible(ctx.node);
      const int64_t size = group_size<T>(g, dropout_possible, false, false, static_cast<int64_t>(y.nbytes()));
      if (size > 1) {
        std::vector<GroupScratch<T, C>> groups;
        for (int64_t s = 0, n = group_slots<T>(g, dropout_possible, false, size, static_cast<int64_t>(y.nbytes())); s < n; ++s) {
          groups.emplace_back(ws, g, dropout_possible, false, size);
        }
        const int64_t batches = numel(g.batch);
        parallel_ranges((batches + size - 1) / size, 1, static_cast<int64_t>(groups.size()), [&](int64_t s, int64_t begin, int64_t end) {
          for (int64_t gi = begin; gi < end; ++gi) {
            attention_group(y.data<T>(), groups[s], q, k, v, bias, gi * size, std::min(size, batches - gi * size), g, dropout);
          }
        });
        return Status::Ok();
      }
      const int64_t slot_count = forward_slots<T>(g, dropout_possible, static_cast<int64_t>(y.nbytes()));
      std::vector<ForwardSlot<T, C>> slots;
      for (int64_t s = 0; s < slot_count; ++s) slots.emplace_back(ws, g, dropout_possible);
      parallel_ranges(numel(g.batch), 1, slot_count, [&](int64_t s, int64_t begin, int64_t end) {
        const OperandLoader<T, C> load_operands{q, k, v, bias, g, slots[s].operands};
        for (int64_t i = begin; i < end; ++i) {
          attention_matrix<T, C>(y.data<T>() + g.at(i, g.tq, g.dv), load_operands(i), slots[s].scratch, g, dropout);
        }
      });
      return Status::Ok();
    }
  });
}

// (q, k, v, [bias]) → y
int64_t attention_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const AttentionGeometry g = geometry_of(in, 0, out[0].shape, node.attrs);
  return layout_bytes(in[0].dtype, [&]<typename T>(Workspace& ws) {
    if constexpr (kIsFloatStorage<T>) {
      using C = typename Compute<T>::type;
      const int64_t y_bytes = numel(out[0].shape) * static_cast<int64_t>(dtype_size(out[0].dtype));
      const bool dropout_possible = AttentionDropout::possible(node);
      if (const int64_t size = group_size<T>(g, dropout_possible, false, false, y_bytes); size > 1) {
        for (int64_t s = 0, n = group_slots<T>(g, dropout_possible, false, size, y_bytes); s < n; ++s) {
          const GroupScratch<T, C> scratch(ws, g, dropout_possible, false, size);
          (void)scratch;
        }
        return;
      }
      for (int64_t s = 0, slot_count = forward_slots<T>(g, dropout_possible, y_bytes); s < slot_count; ++s) {
        const ForwardSlot<T, C> slot(ws, g, dropout_possible);
        (void)slot;
      }
    }
  });
}

// (dy, q, k, v, [bias]) → (dq, dk, dv, [dbias]); see the backward section above.
// Workspace: the forward's operands and block scratch, BackwardScratch's extra blocks, GradBuffers.
Status attention_grad_kernel(KernelContext& ctx) {
  const Tensor &dy = *ctx.inputs[0], &q = *ctx.inputs[1], &k = *ctx.inputs[2], &v = *ctx.inputs[3];
  const Tensor* bias = ctx.inputs.size() >= 5 ? ctx.inputs[4] : nullptr;
  Tensor* dbias_out = ctx.outputs.size() >= 4 ? ctx.outputs[3] : nullptr;
  const AttentionGeometry g(q.shape(), k.shape(), v.shape(), bias ? &bias->shape() : nullptr, dy.shape(), ctx.node.attrs);
  const AttentionDropout dropout(ctx);
  Workspace ws(ctx);
  return dispatch_dtype(q.dtype(), [&]<typename T>() -> Status {
    if constexpr (!kIsFloatStorage<T>) {
      return unsupported_dtype(ctx, q.dtype());
    } else {
      using C = typename Compute<T>::type;
      const int64_t grad_bytes = static_cast<int64_t>(ctx.outputs[0]->nbytes() + ctx.outputs[1]->nbytes() + ctx.outputs[2]->nbytes());
      const bool dropout_possible = AttentionDropout::possible(ctx.node);
      const int64_t size = group_size<T>(g, dropout_possible, true, dbias_out != nullptr, grad_bytes);
      if (size > 1) {
        std::vector<GroupScratch<T, C>> groups;
        for (int64_t s = 0, n = group_slots<T>(g, dropout_possible, true, size, grad_bytes); s < n; ++s) {
          groups.emplace_back(ws, g, dropout_possible, true, size);
        }
        const int64_t batches = numel(g.batch);
        if (g.strided()) {  // each group's gradients in its own scratch, then stored
          parallel_ranges((batches + size - 1) / size, 1, static_cast<int64_t>(groups.size()), [&](int64_t s, int64_t begin, int64_t end) {
            GroupScratch<T, C>& w = groups[s];
            for (int64_t gi = begin; gi < end; ++gi) {
              const int64_t i0 = gi * size, n = std::min(size, batches - i0);
              std::fill(w.dq, w.dq + n * g.tq * g.d, C(0));
              std::fill(w.dk, w.dk + n * g.tk * g.d, C(0));
              std::fill(w.dv, w.dv + n * g.tk * g.dv, C(0));
              attention_grad_group(w, dy, q, k, v, bias, w.dq, w.dk, w.dv, i0, n, g, dropout);
              store_grads<T>(ctx, w.dq, w.dk, w.dv, i0, n, g);
            }
          });
          return Status::Ok();
        }
        const GradBuffers<T, C> buffers(ws, g, ctx.outputs[0]->numel(), ctx.outputs[1]->numel(), ctx.outputs[2]->numel(), 0);
        GradAccumulator<T, C> dq(*ctx.outputs[0], buffers.dq), dk(*ctx.outputs[1], buffers.dk), dv(*ctx.outputs[2], buffers.dv);
        parallel_ranges((batches + size - 1) / size, 1, static_cast<int64_t>(groups.size()), [&](int64_t s, int64_t begin, int64_t end) {
          for (int64_t gi = begin; gi < end; ++gi) {
            const int64_t i0 = gi * size;
            attention_grad_group(groups[s], dy, q, k, v, bias, dq.data() + g.q_offset(i0), dk.data() + g.k_offset(i0),
                                 dv.data() + g.v_offset(i0), i0, std::min(size, batches - i0), g, dropout);
          }
        });
        dq.finish();
        dk.finish();
        dv.finish();
        return Status::Ok();
      }
      const int64_t slot_count = backward_slots<T>(g, dropout_possible, dbias_out != nullptr, grad_bytes);
      std::vector<BackwardSlot<T, C>> slots;
      for (int64_t s = 0; s < slot_count; ++s) slots.emplace_back(ws, g, dropout_possible);
      const GradBuffers<T, C> buffers(ws, g, ctx.outputs[0]->numel(), ctx.outputs[1]->numel(), ctx.outputs[2]->numel(),
                                      dbias_out ? dbias_out->numel() : 0);
      std::optional<GradAccumulator<T, C>> dq, dk, dv;  // the default layout's
      if (!g.strided()) dq.emplace(*ctx.outputs[0], buffers.dq), dk.emplace(*ctx.outputs[1], buffers.dk), dv.emplace(*ctx.outputs[2], buffers.dv);
      if (dbias_out) std::fill(buffers.dbias, buffers.dbias + dbias_out->numel(), C(0));  // bias layout
      parallel_ranges(numel(g.batch), 1, slot_count, [&](int64_t s, int64_t begin, int64_t end) {
        BackwardSlot<T, C>& slot = slots[s];
        const OperandLoader<T, C> load_operands{q, k, v, bias, g, slot.operands};
        for (int64_t i = begin; i < end; ++i) {
          const C* dy_c = load_entries(dy.data<T>(), i * g.tq * g.dv, i, 1, g.tq, g.dv, g, slot.dy);
          if (g.strided()) {  // the entry's own gradients, stored once it is done
            std::fill(slot.dq, slot.dq + g.tq * g.d, C(0));
            std::fill(slot.dk, slot.dk + g.tk * g.d, C(0));
            std::fill(slot.dv, slot.dv + g.tk * g.dv, C(0));
            attention_grad_matrix(dy_c, load_operands(i), AttentionGrads<C>{slot.dq, slot.dk, slot.dv, buffers.dbias}, slot.scratch, g, dropout);
            store_grads<T>(ctx, slot.dq, slot.dk, slot.dv, i, 1, g);
            continue;
          }
          const AttentionGrads<C> d{dq->data() + g.q_offset(i), dk->data() + g.k_offset(i), dv->data() + g.v_offset(i), buffers.dbias};
          attention_grad_matrix(dy_c, load_operands(i), d, slot.scratch, g, dropout);
        }
      });
      if (dq) dq->finish(), dk->finish(), dv->finish();
      for (int64_t i = 0; dbias_out && i < dbias_out->numel(); ++i) dbias_out->set_from_double(i, static_cast<double>(buffers.dbias[i]));
      return Status::Ok();
    }
  });
}

// (dy, q, k, v, [bias]) → (dq, dk, dv, [dbias])
int64_t attention_grad_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const AttentionGeometry g = geometry_of(in, 1, in[0].shape, node.attrs);
  return layout_bytes(in[1].dtype, [&]<typename T>(Workspace& ws) {
    if constexpr (kIsFloatStorage<T>) {
      using C = typename Compute<T>::type;
      int64_t grad_bytes = 0;
      for (size_t i = 0; i < 3; ++i) grad_bytes += numel(out[i].shape) * static_cast<int64_t>(dtype_size(out[i].dtype));
      const bool dropout_possible = AttentionDropout::possible(node);
      if (const int64_t size = group_size<T>(g, dropout_possible, true, out.size() >= 4, grad_bytes); size > 1) {
        for (int64_t s = 0, n = group_slots<T>(g, dropout_possible, true, size, grad_bytes); s < n; ++s) {
          const GroupScratch<T, C> scratch(ws, g, dropout_possible, true, size);
          (void)scratch;
        }
        const GradBuffers<T, C> buffers(ws, g, out[0].numel(), out[1].numel(), out[2].numel(), 0);
        (void)buffers;
        return;
      }
      for (int64_t s = 0, slot_count = backward_slots<T>(g, dropout_possible, out.size() >= 4, grad_bytes); s < slot_count; ++s) {
        const BackwardSlot<T, C> slot(ws, g, dropout_possible);
        (void)slot;
      }
      const GradBuffers<T, C> buffers(ws, g, out[0].numel(), out[1].numel(), out[2].numel(), out.size() >= 4 ? out[3].numel() : 0);
      (void)buffers;
    }
  });
}

}  // namespace memc::cpu
