// CPU kernels of the optimizer updates, matching torch.optim's arithmetic order so losses
// track PyTorch's step for step. State and math in the compute type (f32 for 16-bit storage).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/kernel_attrs.h"
#include "backends/cpu/loops.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/vector_math.h"  // kVectorChunk

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

// w ← w - lr·(g + λw)
Status sgd_kernel(KernelContext& ctx) {
  const double wd = ctx.node.attrs.get_float("weight_decay", 0.0);
  if (skipped(ctx, 3)) return Status::Ok();
  const double lr = scalar(ctx, 2);
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* w = ctx.inputs[0]->data<T>();
    const T* g = ctx.inputs[1]->data<T>();
    T* out = ctx.outputs[0]->data<T>();
    parallel_elementwise(ctx.outputs[0]->numel(), [&](int64_t begin, int64_t end) {  // elements are independent
      for (int64_t i = begin; i < end; ++i) {
        const C wi = load(w[i]);
        const C gi = load(g[i]) + static_cast<C>(wd) * wi;
        out[i] = store<T, C>(wi - static_cast<C>(lr) * gi);
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
    const T* g = ctx.inputs[1]->data<T>();
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
          for (int64_t j = 0; j < len; ++j) gc[j] = load(g[i0 + j]);
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
    const T* g = ctx.inputs[1]->data<T>();
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
          for (int64_t j = 0; j < len; ++j) gc[j] = load(g[i0 + j]);
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

// AdamW (or Adam) on moments stored as 8-bit codes per block of `block` elements: each block
// is decoded (code value × block absmax), updated in f32 exactly as adam_kernel, and encoded
// again against its new absmax.
Status adam8bit_kernel(KernelContext& ctx) {
  const int64_t block = ctx.node.attrs.get_int("block", 2048);
  if (skipped(ctx, 8)) return Status::Ok();
  const AdamStep adam = adam_step(ctx, true, 6);
  const QuantMap &ms = signed_map(), &vs = unsigned_map();
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
    // block exactly as on one: the result does not depend on --threads. An element costs tens
    // of nanoseconds (the code searches), so even one block of a few hundred is worth a thread.
    auto update = [&]<bool kDecoupled>() {
      parallel_ranges(blocks, 1, INT64_MAX, [&](int64_t, int64_t first, int64_t last) {
        const AdamStep::Factors<float> f = factors;  // a local copy: registers (AdamStep::factors)
        std::vector<float> m(static_cast<size_t>(std::min(block, n))), v(m.size());
        for (int64_t bi = first; bi < last; ++bi) {
          const int64_t b0 = bi * block, len = std::min(block, n - b0);
          float new_m_max = 0, new_v_max = 0;
          for (int64_t j = 0; j < len; ++j) {
            const int64_t i = b0 + j;
            float wi = static_cast<float>(load(w[i]));
            float mi = ms.value[mq[i]] * m_max[bi], vi = vs.value[vq[i]] * v_max[bi];
            AdamStep::update<kDecoupled>(f, wi, static_cast<float>(load(g[i])), mi, vi);
            w_out[i] = store<T, float>(wi);
            m[static_cast<size_t>(j)] = mi, v[static_cast<size_t>(j)] = vi;
            new_m_max = std::max(new_m_max, std::abs(mi)), new_v_max = std::max(new_v_max, vi);
          }
          // Normalized by the new maxima in place, then encoded (a zero block stays code 0).
          if (new_m_max > 0) {
            for (int64_t j = 0; j < len; ++j) m[static_cast<size_t>(j)] /= new_m_max;
            ms.encode_many(m.data(), mq_out + b0, len);
          } else {
            for (int64_t j = 0; j < len; ++j) mq_out[b0 + j] = 0;
          }
          if (new_v_max > 0) {
            for (int64_t j = 0; j < len; ++j) v[static_cast<size_t>(j)] /= new_v_max;
            vs.encode_many(v.data(), vq_out + b0, len);
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
Status adafactor_kernel(KernelContext& ctx) {
  const bool factored = ctx.node.attrs.get_int("factored", 0);
  const double decay = ctx.node.attrs.get_float("decay_rate", -0.8), eps1 = ctx.node.attrs.get_float("eps1", 1e-30),
               clip = ctx.node.attrs.get_float("clip_threshold", 1.0), wd = ctx.node.attrs.get_float("weight_decay", 0.0);
  const size_t first_scalar = factored ? 4 : 3;
  if (skipped(ctx, first_scalar + 2)) return Status::Ok();
  const double lr = scalar(ctx, static_cast<int>(first_scalar)), t = scalar(ctx, static_cast<int>(first_scalar + 1));
  const auto beta = static_cast<float>(1.0 - std::pow(t, decay));
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    const T* w = ctx.inputs[0]->data<T>();
    const T* g = ctx.inputs[1]->data<T>();
    T* w_out = ctx.outputs[0]->data<T>();
    const int64_t n = ctx.outputs[0]->numel();
    std::vector<float> u(static_cast<size_t>(n));
    if (factored) {
      const Shape& s = ctx.inputs[0]->shape();
      const int64_t cols = s.back(), rows = s[s.size() - 2], mats = n / (rows * cols);
      const float* r = ctx.inputs[2]->data<float>();
      const float* c = ctx.inputs[3]->data<float>();
      float* r_out = ctx.outputs[1]->data<float>();
      float* c_out = ctx.outputs[2]->data<float>();
      std::vector<double> row_mean(static_cast<size_t>(rows)), col_mean(static_cast<size_t>(cols));
      for (int64_t b = 0; b < mats; ++b) {
        std::fill(row_mean.begin(), row_mean.end(), 0.0);
        std::fill(col_mean.begin(), col_mean.end(), 0.0);
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            const double gi = static_cast<double>(load(g[(b * rows + i) * cols + j]));
            const double sq = gi * gi + eps1;
            row_mean[static_cast<size_t>(i)] += sq / static_cast<double>(cols);
            col_mean[static_cast<size_t>(j)] += sq / static_cast<double>(rows);
          }
        }
        double r_sum = 0;
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t k = b * rows + i;
          r_out[k] = beta * r[k] + (1.0f - beta) * static_cast<float>(row_mean[static_cast<size_t>(i)]);
          r_sum += r_out[k];
        }
        const double r_avg = r_sum / static_cast<double>(rows);
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t k = b * cols + j;
          c_out[k] = beta * c[k] + (1.0f - beta) * static_cast<float>(col_mean[static_cast<size_t>(j)]);
        }
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            const int64_t k = (b * rows + i) * cols + j;
            const double v_hat = static_cast<double>(r_out[b * rows + i]) / r_avg * static_cast<double>(c_out[b * cols + j]);
            u[static_cast<size_t>(k)] = static_cast<float>(static_cast<double>(load(g[k])) / std::sqrt(v_hat));
          }
        }
      }
    } else {
      const float* v = ctx.inputs[2]->data<float>();
      float* v_out = ctx.outputs[1]->data<float>();
      for (int64_t i = 0; i < n; ++i) {
        const float gi = static_cast<float>(load(g[i]));
        v_out[i] = beta * v[i] + (1.0f - beta) * (gi * gi + static_cast<float>(eps1));
        u[static_cast<size_t>(i)] = gi / std::sqrt(v_out[i]);
      }
    }
    double sq = 0;
    for (float x : u) sq += static_cast<double>(x) * x;
    const double rms = std::sqrt(sq / static_cast<double>(std::max<int64_t>(n, 1)));
    const auto scale = static_cast<float>(1.0 / std::max(1.0, rms / clip));
    for (int64_t i = 0; i < n; ++i) {
      const float wi = static_cast<float>(load(w[i]));
      w_out[i] = store<T, float>(wi - static_cast<float>(lr * wd) * wi - static_cast<float>(lr) * scale * u[static_cast<size_t>(i)]);
    }
  });
}

}  // namespace

void register_optimizer_kernels(KernelTable& t) {
  t.add("sgd_update", sgd_kernel);
  t.add("momentum_update", momentum_kernel);
  t.add("adam_update", adam_kernel);
  t.add("adam8bit_update", adam8bit_kernel);
  t.add("adafactor_update", adafactor_kernel);
}

}  // namespace memc::cpu
