// CPU kernels of the optimizer updates, matching torch.optim's arithmetic order so losses
// track PyTorch's step for step. State and math in the compute type (f32 for 16-bit storage).
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "backends/cpu/loops.h"

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
    for (int64_t i = 0, count = ctx.outputs[0]->numel(); i < count; ++i) {
      const C wi = load(w[i]);
      const C gi = load(g[i]) + static_cast<C>(wd) * wi;
      out[i] = store<T, C>(wi - static_cast<C>(lr) * gi);
    }
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
    for (int64_t i = 0, count = ctx.outputs[0]->numel(); i < count; ++i) {
      const C wi = load(w[i]);
      const C gi = load(g[i]) + static_cast<C>(wd) * wi;
      const C b = first ? gi : static_cast<C>(mu) * load(buf[i]) + static_cast<C>(1.0 - damp) * gi;
      const C step_dir = nesterov ? gi + static_cast<C>(mu) * b : b;
      buf_out[i] = store<T, C>(b);
      w_out[i] = store<T, C>(wi - static_cast<C>(lr) * step_dir);
    }
  });
}

// torch.optim.Adam (L2: g ← g + λw) or AdamW (decoupled: w ← w·(1 - lr·λ)), then
// m ← β1·m + (1-β1)·g; v ← β2·v + (1-β2)·g²;
// w ← w - (lr/(1-β1ᵗ))·m / (√v/√(1-β2ᵗ) + ε)
Status adam_kernel(KernelContext& ctx) {
  const double b1 = ctx.node.attrs.get_float("beta1", 0.9), b2 = ctx.node.attrs.get_float("beta2", 0.999),
               eps = ctx.node.attrs.get_float("eps", 1e-8), wd = ctx.node.attrs.get_float("weight_decay", 0.0);
  const bool decoupled = ctx.node.attrs.get_int("decoupled", 0);
  if (skipped(ctx, 6)) return Status::Ok();
  const double lr = scalar(ctx, 4), t = scalar(ctx, 5);
  const double bc1 = 1.0 - std::pow(b1, t), bc2_sqrt = std::sqrt(1.0 - std::pow(b2, t));
  const double step_size = lr / bc1;
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    using C = typename Compute<T>::type;
    const T* w = ctx.inputs[0]->data<T>();
    const T* g = ctx.inputs[1]->data<T>();
    const T* m = ctx.inputs[2]->data<T>();
    const T* v = ctx.inputs[3]->data<T>();
    T* w_out = ctx.outputs[0]->data<T>();
    T* m_out = ctx.outputs[1]->data<T>();
    T* v_out = ctx.outputs[2]->data<T>();
    for (int64_t i = 0, count = ctx.outputs[0]->numel(); i < count; ++i) {
      C wi = load(w[i]), gi = load(g[i]);
      if (decoupled) wi *= static_cast<C>(1.0 - lr * wd);
      else gi += static_cast<C>(wd) * wi;
      const C mi = static_cast<C>(b1) * load(m[i]) + static_cast<C>(1.0 - b1) * gi;
      const C vi = static_cast<C>(b2) * load(v[i]) + static_cast<C>(1.0 - b2) * gi * gi;
      const C denom = std::sqrt(vi) / static_cast<C>(bc2_sqrt) + static_cast<C>(eps);
      m_out[i] = store<T, C>(mi);
      v_out[i] = store<T, C>(vi);
      w_out[i] = store<T, C>(wi - static_cast<C>(step_size) * mi / denom);
    }
  });
}

}  // namespace

void register_optimizer_kernels(KernelTable& t) {
  t.add("sgd_update", sgd_kernel);
  t.add("momentum_update", momentum_kernel);
  t.add("adam_update", adam_kernel);
}

}  // namespace memc::cpu
