// CPU kernels of the optimizer updates, matching torch.optim's arithmetic order so losses
// track PyTorch's step for step. State and math in the compute type (f32 for 16-bit storage).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels.h"
#include "backends/kernel_attrs.h"
#include "backends/cpu/loops.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/vector_math.h"  // kVectorChunk
#include "backends/cpu/workspace.h"

namespace memc::cpu {
namespace {


double scalar(const KernelContext& ctx, int i) { return ctx.inputs[i]->get_as_double(0); }

// The optional `skip` input at `index` (loss scaling's found_inf) is set: every output keeps
// its input (output k updates input 0 for k = 0, else input 1 + k), bit for bit.
bool skipped(KernelContext& ctx, size_t index) {
  if (ctx.inputs.size() <= index || ctx.inputs[index] == nullptr || scalar(ctx, static_cast<int>(index)) < 0.5) return false;
  for (size_t k = 0; k < ctx.outputs.size(); ++k) {
    const Tensor* in = ctx.inputs[k == 0 ? 0 : 1 + k];
    if (ctx.outputs[k]->raw() != in->raw()) std::memcpy(ctx.outputs[k]->raw(), in->raw(), in->nbytes());
  }
  return true;
}

// The gradient an update reads, in its own float storage: an f32 parameter's update may read a
// bf16 or f16 gradient, widened as a cast widens it (passes/update_grad_casts.h).
template <typename C>
class GradientIn {
 public:
  explicit GradientIn(const Tensor& g) : data_(g.raw()), dtype_(g.dtype()) {}
  // Elements [i0, i0 + n) into out, as C.
  void load_chunk(C* out, int64_t i0, int64_t n) const {
    dispatch_dtype(dtype_, [&]<typename G>() {
      if constexpr (kIsFloatStorage<G>) {
        const G* g = static_cast<const G*>(data_) + i0;
        for (int64_t j = 0; j < n; ++j) out[j] = static_cast<C>(load(g[j]));
      } else {  // update_shape admits float gradients only; NaN shows a plan that bypassed it
        std::fill(out, out + n, std::numeric_limits<C>::quiet_NaN());
      }
    });
  }

 private:
  const void* data_;
  DType dtype_;
};

// w ← w - lr·(g + λw)
Status sgd_kernel(KernelContext& ctx) {
  const double wd = ctx.node.attrs.get_float("weight_decay", 0.0);
  if (skipped(ctx, 3)) return Status::Ok();
  const double lr = scalar(ctx, 2);
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* w = ctx.inputs[0]->data<T>();
    const GradientIn<C> g(*ctx.inputs[1]);
    T* out = ctx.outputs[0]->data<T>();
    parallel_elementwise(ctx.outputs[0]->numel(), [&](int64_t begin, int64_t end) {  // elements are independent
      C gc[kVectorChunk];
      for (int64_t i0 = begin; i0 < end; i0 += kVectorChunk) {
        const int64_t len = std::min(kVectorChunk, end - i0);
        g.load_chunk(gc, i0, len);
        for (int64_t j = 0; j < len; ++j) {
          const C wi = load(w[i0 + j]);
          const C gi = gc[j] + static_cast<C>(wd) * wi;
          out[i0 + j] = store<T, C>(wi - static_cast<C>(lr) * gi);
        }
      }
    });
  });
}

// torch.optim.SGD: g ← g + λw; buf ← g on the first step, else μ·buf + (1-τ)·g;
// g ← g + μ·buf (Nesterov) or buf; w ← w - lr·g
Status momentum_kernel(KernelContext& ctx) {
  const double wd = ctx.node.attrs.get_float("weight_decay", 0.0), mu = ctx.node.attrs.get_float("momentum", 0.9),
               damp = ctx.node.attrs.get_float("dampening", 0.0);
  const bool nesterov = ctx.node.attrs.get_int("nesterov", 0);
  if (skipped(ctx, 5)) return Status::Ok();
  const double lr = scalar(ctx, 3);
  const bool first = scalar(ctx, 4) <= 1.0;
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* w = ctx.inputs[0]->data<T>();
    const GradientIn<C> g(*ctx.inputs[1]);
    const T* buf = ctx.inputs[2]->data<T>();
    T* w_out = ctx.outputs[0]->data<T>();
    T* buf_out = ctx.outputs[1]->data<T>();
    // Vectorized as adam_kernel's loop (chunks through local arrays, factors in registers), with
    // the first-step and Nesterov choices made once per call.
    auto update = [&]<bool kFirst, bool kNesterov>() {
      parallel_elementwise(ctx.outputs[0]->numel(), [&](int64_t begin, int64_t end) {  // elements are independent
        const C wd_c = static_cast<C>(wd), mu_c = static_cast<C>(mu), rest = static_cast<C>(1.0 - damp), lr_c = static_cast<C>(lr);
        C wc[kVectorChunk], gc[kVectorChunk], bc[kVectorChunk];
        for (int64_t i0 = begin; i0 < end; i0 += kVectorChunk) {
          const int64_t len = std::min(kVectorChunk, end - i0);
          for (int64_t j = 0; j < len; ++j) wc[j] = load(w[i0 + j]);
          g.load_chunk(gc, i0, len);
          if constexpr (!kFirst) {
            for (int64_t j = 0; j < len; ++j) bc[j] = load(buf[i0 + j]);
          }
          for (int64_t j = 0; j < len; ++j) {
            const C gi = gc[j] + wd_c * wc[j];
            C b = gi;
            if constexpr (!kFirst) b = mu_c * bc[j] + rest * gi;
            C step_dir = b;
            if constexpr (kNesterov) step_dir = gi + mu_c * b;
            bc[j] = b;
            wc[j] = wc[j] - lr_c * step_dir;
          }
          for (int64_t j = 0; j < len; ++j) buf_out[i0 + j] = store<T, C>(bc[j]);
          for (int64_t j = 0; j < len; ++j) w_out[i0 + j] = store<T, C>(wc[j]);
        }
      });
    };
    if (first) nesterov ? update.template operator()<true, true>() : update.template operator()<true, false>();
    else nesterov ? update.template operator()<false, true>() : update.template operator()<false, false>();
  });
}

// torch.optim.Adam or AdamW, one element at a time by AdamStep (backends/kernel_math.h, the
// arithmetic the CUDA kernel shares).
// lr and step are the scalar inputs at lr_input and lr_input + 1.
AdamStep adam_step(const KernelContext& ctx, bool decoupled_default, int lr_input) {
  AdamStep a = adam_settings(ctx.node.attrs, decoupled_default);
  a.lr = scalar(ctx, lr_input);
  a.set_step(scalar(ctx, lr_input + 1));
  return a;
}

Status adam_kernel(KernelContext& ctx) {
  if (skipped(ctx, 6)) return Status::Ok();
  const AdamStep adam = adam_step(ctx, false, 4);
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* w = ctx.inputs[0]->data<T>();
    const GradientIn<C> g(*ctx.inputs[1]);
    const T* m = ctx.inputs[2]->data<T>();
    const T* v = ctx.inputs[3]->data<T>();
    T* w_out = ctx.outputs[0]->data<T>();
    T* m_out = ctx.outputs[1]->data<T>();
    T* v_out = ctx.outputs[2]->data<T>();
    const AdamStep::Factors<C> factors = adam.factors<C>();
    // In chunks through local arrays: GCC then vectorizes each loop with no runtime test that
    // the outputs do not overlap the inputs. A direct loop over 4 inputs and 3 outputs needs
    // more such tests than GCC emits (10), and it stayed scalar code.
    auto update = [&]<bool kDecoupled>() {
      parallel_elementwise(ctx.outputs[0]->numel(), [&](int64_t begin, int64_t end) {  // elements are independent
        const AdamStep::Factors<C> f = factors;  // a local copy: registers (AdamStep::factors)
        C wc[kVectorChunk], gc[kVectorChunk], mc[kVectorChunk], vc[kVectorChunk];
        for (int64_t i0 = begin; i0 < end; i0 += kVectorChunk) {
          const int64_t len = std::min(kVectorChunk, end - i0);
          for (int64_t j = 0; j < len; ++j) wc[j] = load(w[i0 + j]);
          g.load_chunk(gc, i0, len);
          for (int64_t j = 0; j < len; ++j) mc[j] = load(m[i0 + j]);
          for (int64_t j = 0; j < len; ++j) vc[j] = load(v[i0 + j]);
          for (int64_t j = 0; j < len; ++j) AdamStep::update<kDecoupled>(f, wc[j], gc[j], mc[j], vc[j]);
          for (int64_t j = 0; j < len; ++j) m_out[i0 + j] = store<T, C>(mc[j]);
          for (int64_t j = 0; j < len; ++j) v_out[i0 + j] = store<T, C>(vc[j]);
          for (int64_t j = 0; j < len; ++j) w_out[i0 + j] = store<T, C>(wc[j]);
        }
      });
    };
    if (adam.decoupled) update.template operator()<true>();
    else update.template operator()<false>();
  });
}

const QuantMap& signed_map() {
  static const QuantMap map = QuantMap::dynamic(true);
  return map;
}
const QuantMap& unsigned_map() {
  static const QuantMap map = QuantMap::dynamic(false);
  return map;
}
const QuantIndex& signed_index() {
  static const QuantIndex index(signed_map());
  return index;
}
const QuantIndex& unsigned_index() {
  static const QuantIndex index(unsigned_map());
  return index;
}

// adam8bit's scratch: each thread slot's decoded moments of one block, before they are encoded
// against the block's new absmax.
struct Adam8bitScratch {
  int64_t slot_len;
  float *m, *v;  // [kMaxKernelSlots, slot_len] each
  Adam8bitScratch(Workspace& ws, int64_t block, int64_t n)
      : slot_len(std::min(block, n)), m(ws.take<float>(kMaxKernelSlots * slot_len)), v(ws.take<float>(kMaxKernelSlots * slot_len)) {}
};

int64_t adam8bit_workspace(const Node& node, std::span<const TensorType>, std::span<const TensorType> out) {
  Workspace counter;
  Adam8bitScratch scratch(counter, node.attrs.get_int("block", 2048), numel(out[0].shape));
  return counter.used_bytes();
}

// AdamW (or Adam) on moments stored as 8-bit codes per block of `block` elements: each block
// is decoded (code value × block absmax), updated in f32 exactly as adam_kernel, and encoded
// again against its new absmax.
Status adam8bit_kernel(KernelContext& ctx) {
  const int64_t block = ctx.node.attrs.get_int("block", 2048);
  if (skipped(ctx, 8)) return Status::Ok();
  const AdamStep adam = adam_step(ctx, true, 6);
  const QuantMap &ms = signed_map(), &vs = unsigned_map();
  const QuantIndex &m_codes = signed_index(), &v_codes = unsigned_index();
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    const T* w = ctx.inputs[0]->data<T>();
    const T* g = ctx.inputs[1]->data<T>();
    const uint8_t* mq = ctx.inputs[2]->data<uint8_t>();
    const float* m_max = ctx.inputs[3]->data<float>();
    const uint8_t* vq = ctx.inputs[4]->data<uint8_t>();
    const float* v_max = ctx.inputs[5]->data<float>();
    T* w_out = ctx.outputs[0]->data<T>();
    uint8_t* mq_out = ctx.outputs[1]->data<uint8_t>();
    float* m_max_out = ctx.outputs[2]->data<float>();
    uint8_t* vq_out = ctx.outputs[3]->data<uint8_t>();
    float* v_max_out = ctx.outputs[4]->data<float>();
    const int64_t n = ctx.outputs[0]->numel(), blocks = (n + block - 1) / block;
    const AdamStep::Factors<float> factors = adam.factors<float>();
    // Blocks are independent (each has its own absmax), so they run on parallel threads, each
    // block exactly as on one: the result does not depend on --threads. Even one block of a few
    // hundred elements is worth a thread.
    Workspace ws(ctx);
    const Adam8bitScratch scratch(ws, block, n);
    auto update = [&]<bool kDecoupled>() {
      parallel_ranges(blocks, 1, kMaxKernelSlots, [&](int64_t slot, int64_t first, int64_t last) {
        const AdamStep::Factors<float> f = factors;  // a local copy: registers (AdamStep::factors)
        float* m = scratch.m + slot * scratch.slot_len;
        float* v = scratch.v + slot * scratch.slot_len;
        for (int64_t bi = first; bi < last; ++bi) {
          const int64_t b0 = bi * block, len = std::min(block, n - b0);
          float new_m_max = 0, new_v_max = 0;
          for (int64_t j = 0; j < len; ++j) {
            const int64_t i = b0 + j;
            float wi = static_cast<float>(load(w[i]));
            float mi = ms.value[mq[i]] * m_max[bi], vi = vs.value[vq[i]] * v_max[bi];
            AdamStep::update<kDecoupled>(f, wi, static_cast<float>(load(g[i])), mi, vi);
            w_out[i] = store<T, float>(wi);
            m[j] = mi, v[j] = vi;
            new_m_max = std::max(new_m_max, std::abs(mi)), new_v_max = std::max(new_v_max, vi);
          }
          // Normalized by the new maxima in place, then encoded (a zero block stays code 0).
          if (new_m_max > 0) {
            for (int64_t j = 0; j < len; ++j) m[j] /= new_m_max;
            m_codes.encode_many(m, mq_out + b0, len);
          } else {
            for (int64_t j = 0; j < len; ++j) mq_out[b0 + j] = 0;
          }
          if (new_v_max > 0) {
            for (int64_t j = 0; j < len; ++j) v[j] /= new_v_max;
            v_codes.encode_many(v, vq_out + b0, len);
          } else {
            for (int64_t j = 0; j < len; ++j) vq_out[b0 + j] = 0;
          }
          m_max_out[bi] = new_m_max, v_max_out[bi] = new_v_max;
        }
      });
    };
    if (adam.decoupled) update.template operator()<true>();
    else update.template operator()<false>();
  });
}

// Adafactor (Shazeer & Stern 2018) without a first moment, with an explicit learning rate:
// β2ₜ = 1 - t^decay_rate; G = g² + ε₁; factored (rank ≥ 2, over the last two dims):
// r ← β2ₜ r + (1-β2ₜ) mean_cols G, c ← β2ₜ c + (1-β2ₜ) mean_rows G, v̂ = (r / mean r) ⊗ c;
// else v ← β2ₜ v + (1-β2ₜ) G, v̂ = v. u = g/√v̂, u ← u / max(1, RMS(u)/d);
// w ← w - lr·λ·w - lr·u.
// The arithmetic and its order are the CUDA kernel's (backends/cuda/bodies.h: means summed
// per element in f64, Σu² in chunks of kSumChunk), and every sum keeps its order on any
// number of threads, so the result does not depend on --threads. u is never stored: it is computed once for its RMS and
// again for the step, so the scratch is the column means, the row-factor means and the Σu²
// partials, never a copy of the parameter.
constexpr int64_t kAdafactorSumChunk = 4096;

struct AdafactorGeometry {
  int64_t n = 0, rows = 1, cols = 1, mats = 0, parts = 0;  // unfactored: one row of n
  AdafactorGeometry(const Shape& w, bool factored) : n(numel(w)) {
    if (factored) rows = w[w.size() - 2], cols = w.back(), mats = n / std::max<int64_t>(rows * cols, 1);
    else cols = std::max<int64_t>(n, 1);
    parts = (n + kAdafactorSumChunk - 1) / kAdafactorSumChunk;
  }
};

struct AdafactorScratch {
  double *col_mean, *r_avg, *partial;  // [mats·cols], [mats], [parts]
  AdafactorScratch(Workspace& ws, const AdafactorGeometry& geo)
      : col_mean(ws.take<double>(geo.mats * geo.cols)), r_avg(ws.take<double>(geo.mats)), partial(ws.take<double>(geo.parts)) {}
};

int64_t adafactor_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType>) {
  const AdafactorGeometry geo(in[0].shape, node.attrs.get_int("factored", 0));
  Workspace counter;
  AdafactorScratch scratch(counter, geo);
  return counter.used_bytes();
}

Status adafactor_kernel(KernelContext& ctx) {
  const bool factored = ctx.node.attrs.get_int("factored", 0);
  const double decay = ctx.node.attrs.get_float("decay_rate", -0.8), eps1 = ctx.node.attrs.get_float("eps1", 1e-30),
               clip = ctx.node.attrs.get_float("clip_threshold", 1.0), wd = ctx.node.attrs.get_float("weight_decay", 0.0);
  const size_t first_scalar = factored ? 4 : 3;
  if (skipped(ctx, first_scalar + 2)) return Status::Ok();
  const double lr = scalar(ctx, static_cast<int>(first_scalar)), t = scalar(ctx, static_cast<int>(first_scalar + 1));
  const auto beta = static_cast<float>(1.0 - std::pow(t, decay));
  const AdafactorGeometry geo(ctx.inputs[0]->shape(), factored);
  const int64_t n = geo.n, rows = geo.rows, cols = geo.cols, mats = geo.mats;
  Workspace ws(ctx);
  const AdafactorScratch scratch(ws, geo);
  // Rows of work per thread range: enough elements to be worth a thread.
  const int64_t row_grain = std::max<int64_t>(1, kElementwiseGrain / cols);
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    const T* w = ctx.inputs[0]->data<T>();
    const T* g = ctx.inputs[1]->data<T>();
    T* w_out = ctx.outputs[0]->data<T>();
    const float* r_out = nullptr;
    const float* c_out = nullptr;
    const float* v_out = nullptr;
    if (factored) {
      const float* r = ctx.inputs[2]->data<float>();
      const float* c = ctx.inputs[3]->data<float>();
      float* r_new = ctx.outputs[1]->data<float>();
      float* c_new = ctx.outputs[2]->data<float>();
      const auto sq = [&](int64_t e) {
        const double gi = static_cast<double>(load(g[e]));
        return gi * gi + eps1;
      };
      // Row factors: each row's mean on one thread.
      parallel_ranges(mats * rows, row_grain, INT64_MAX, [&](int64_t, int64_t first, int64_t last) {
        for (int64_t k = first; k < last; ++k) {
          double mean = 0;
          for (int64_t j = 0; j < cols; ++j) mean += sq(k * cols + j) / static_cast<double>(cols);
          r_new[k] = beta * r[k] + (1.0f - beta) * static_cast<float>(mean);
        }
      });
      // Column factors: a range of (matrix, column) pairs per thread, each column summed down
      // its rows in order, reading row segments.
      parallel_ranges(mats * cols, std::max<int64_t>(1, kElementwiseGrain / rows), INT64_MAX, [&](int64_t, int64_t first, int64_t last) {
        for (int64_t b = first / cols; b * cols < last; ++b) {
          const int64_t j0 = std::max(first - b * cols, int64_t{0}), j1 = std::min(last - b * cols, cols);
          double* mean = scratch.col_mean + b * cols;
          std::fill(mean + j0, mean + j1, 0.0);
          for (int64_t i = 0; i < rows; ++i) {
            for (int64_t j = j0; j < j1; ++j) mean[j] += sq((b * rows + i) * cols + j) / static_cast<double>(rows);
          }
          for (int64_t j = j0; j < j1; ++j) c_new[b * cols + j] = beta * c[b * cols + j] + (1.0f - beta) * static_cast<float>(mean[j]);
        }
      });
      for (int64_t b = 0; b < mats; ++b) {
        double sum = 0;
        for (int64_t i = 0; i < rows; ++i) sum += r_new[b * rows + i];
        scratch.r_avg[b] = sum / static_cast<double>(rows);
      }
      r_out = r_new, c_out = c_new;
    } else {
      const float* v = ctx.inputs[2]->data<float>();
      float* v_new = ctx.outputs[1]->data<float>();
      parallel_elementwise(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const float gi = static_cast<float>(load(g[i]));
          v_new[i] = beta * v[i] + (1.0f - beta) * (gi * gi + static_cast<float>(eps1));
        }
      });
      v_out = v_new;
    }
    // u for the elements [begin, end) into u[0, end - begin), row segment by row segment; the
    // inner loops vectorize.
    const auto directions = [&](int64_t begin, int64_t end, float* u) {
      if (!factored) {
        for (int64_t i = begin; i < end; ++i) u[i - begin] = static_cast<float>(load(g[i])) / std::sqrt(v_out[i]);
        return;
      }
      for (int64_t row = begin / cols; row * cols < end; ++row) {
        const int64_t b = row / rows, j0 = std::max(begin - row * cols, int64_t{0}), j1 = std::min(end - row * cols, cols);
        const double r_scaled = static_cast<double>(r_out[row]) / scratch.r_avg[b];
        const float* c_row = c_out + b * cols;
        const T* g_row = g + row * cols;
        float* u_row = u + (row * cols - begin);
        for (int64_t j = j0; j < j1; ++j) {
          const double v_hat = r_scaled * static_cast<double>(c_row[j]);
          u_row[j] = static_cast<float>(static_cast<double>(load(g_row[j])) / std::sqrt(v_hat));
        }
      }
    };
    // In chunks of kVectorChunk through a local array: body(first element, count, u).
    const auto for_each_chunk = [&](int64_t begin, int64_t end, auto&& body) {
      float u[kVectorChunk];
      for (int64_t i0 = begin; i0 < end; i0 += kVectorChunk) {
        const int64_t len = std::min(kVectorChunk, end - i0);
        directions(i0, i0 + len, u);
        body(i0, len, u);
      }
    };
    const int64_t parts = geo.parts;
    parallel_ranges(parts, std::max<int64_t>(1, kElementwiseGrain / kAdafactorSumChunk), INT64_MAX, [&](int64_t, int64_t first, int64_t last) {
      for (int64_t p = first; p < last; ++p) {
        double sum = 0;
        for_each_chunk(p * kAdafactorSumChunk, std::min(n, (p + 1) * kAdafactorSumChunk), [&](int64_t, int64_t len, const float* u) {
          for (int64_t j = 0; j < len; ++j) sum += static_cast<double>(u[j]) * u[j];
        });
        scratch.partial[p] = sum;
      }
    });
    double sq = 0;
    for (int64_t p = 0; p < parts; ++p) sq += scratch.partial[p];
    const double rms = std::sqrt(sq / static_cast<double>(std::max<int64_t>(n, 1)));
    const auto scale = static_cast<float>(1.0 / std::max(1.0, rms / clip));
    const auto lr_wd = static_cast<float>(lr * wd), lr_f = static_cast<float>(lr);
    parallel_elementwise(n, [&](int64_t begin, int64_t end) {
      for_each_chunk(begin, end, [&](int64_t i0, int64_t len, const float* u) {
        for (int64_t j = 0; j < len; ++j) {
          const float wi = static_cast<float>(load(w[i0 + j]));
          w_out[i0 + j] = store<T, float>(wi - lr_wd * wi - lr_f * scale * u[j]);
        }
      });
    });
  });
}

}  // namespace

void register_optimizer_kernels(KernelTable& t) {
  t.add("sgd_update", sgd_kernel);
  t.add("momentum_update", momentum_kernel);
  t.add("adam_update", adam_kernel);
  t.add("adam8bit_update", adam8bit_kernel, adam8bit_workspace);
  t.add("adafactor_update", adafactor_kernel, adafactor_workspace);
}

}  // namespace memc::cpu
