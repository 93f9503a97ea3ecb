#include "passes/optimizers.h"

#include "passes/training_step.h"

namespace memc {

ValueId UpdateContext::state(const std::string& prefix, TensorType type) const {
  return module.add_argument(prefix + "." + target, std::move(type), Role::kOptimizerState);
}

namespace {

// Every update takes weight_decay first; the remaining attributes follow in the kernel's order.
Attrs decay_attrs(const UpdateContext& c) {
  Attrs a;
  a.set("weight_decay", c.options.weight_decay);
  return a;
}

// `inputs` then loss scaling's skip flag, when there is one.
std::vector<ValueId> with_skip(const UpdateContext& c, std::vector<ValueId> inputs) {
  if (c.skip != kNoValue) inputs.push_back(c.skip);
  return inputs;
}

UpdateNode build_sgd(const UpdateContext& c) {
  return {"sgd_update", with_skip(c, {c.weight, c.grad, c.lr}), decay_attrs(c), {c.weight}};
}

UpdateNode build_momentum(const UpdateContext& c) {
  Attrs a = decay_attrs(c);
  a.set("momentum", c.options.momentum);
  a.set("dampening", c.options.dampening);
  a.set("nesterov", int64_t{c.options.nesterov});
  const ValueId buf = c.state("momentum_buffer", c.weight_type());
  return {"momentum_update", with_skip(c, {c.weight, c.grad, buf, c.lr, c.step}), a, {c.weight, buf}};
}

// Adam's moments in f32 like the weight; `decoupled`: AdamW's weight decay.
UpdateNode build_adam_moments(const UpdateContext& c, bool decoupled) {
  Attrs a = decay_attrs(c);
  a.set("beta1", c.options.beta1);
  a.set("beta2", c.options.beta2);
  a.set("eps", c.options.eps);
  a.set("decoupled", int64_t{decoupled});
  const ValueId m = c.state("exp_avg", c.weight_type()), v = c.state("exp_avg_sq", c.weight_type());
  return {"adam_update", with_skip(c, {c.weight, c.grad, m, v, c.lr, c.step}), a, {c.weight, m, v}};
}
UpdateNode build_adam(const UpdateContext& c) { return build_adam_moments(c, false); }
UpdateNode build_adamw(const UpdateContext& c) { return build_adam_moments(c, true); }

// adam8bit's quantization block: a flat unit aligns each parameter and rank share to it.
constexpr int64_t kBlock = 2048;

// AdamW with block-wise 8-bit moments: u8 codes shaped like the parameter, an f32 absmax per block.
UpdateNode build_adam8bit(const UpdateContext& c) {
  const TensorType t = c.weight_type();
  const int64_t blocks = (t.numel() + kBlock - 1) / kBlock;
  Attrs a = decay_attrs(c);
  a.set("beta1", c.options.beta1);
  a.set("beta2", c.options.beta2);
  a.set("eps", c.options.eps);
  a.set("decoupled", int64_t{1});
  a.set("block", kBlock);
  const TensorType codes{DType::kU8, t.shape}, maxima{DType::kF32, {blocks}};
  const ValueId mq = c.state("exp_avg.q8", codes), mm = c.state("exp_avg.absmax", maxima);
  const ValueId vq = c.state("exp_avg_sq.q8", codes), vm = c.state("exp_avg_sq.absmax", maxima);
  return {"adam8bit_update", with_skip(c, {c.weight, c.grad, mq, mm, vq, vm, c.lr, c.step}), a, {c.weight, mq, mm, vq, vm}};
}

// Factored second moment over the last two dims for rank ≥ 2 (row and column means); no first
// moment. Inputs: weight, grad, states, lr, step[, skip].
UpdateNode build_adafactor(const UpdateContext& c) {
  const TensorType t = c.weight_type();
  Attrs a = decay_attrs(c);
  a.set("decay_rate", -0.8);
  a.set("eps1", 1e-30);
  a.set("clip_threshold", 1.0);
  const bool factored = t.shape.size() >= 2;
  a.set("factored", int64_t{factored});
  UpdateNode u{"adafactor_update", {c.weight, c.grad}, a, {c.weight}, factored ? 3 : 2};
  if (factored) {
    Shape rows(t.shape.begin(), t.shape.end() - 1), cols(t.shape.begin(), t.shape.end() - 2);
    cols.push_back(t.shape.back());
    const ValueId r = c.state("exp_avg_sq_row", {DType::kF32, rows}), col = c.state("exp_avg_sq_col", {DType::kF32, cols});
    u.updated.insert(u.updated.end(), {r, col});
    u.inputs.insert(u.inputs.end(), {r, col});
  } else {
    const ValueId v = c.state("exp_avg_sq", {DType::kF32, t.shape});
    u.updated.push_back(v);
    u.inputs.push_back(v);
  }
  u.inputs.insert(u.inputs.end(), {c.lr, c.step});
  u.inputs = with_skip(c, std::move(u.inputs));
  return u;
}

}  // namespace

const std::vector<OptimizerDef>& optimizers() {
  static const std::vector<OptimizerDef> kOptimizers = {
      {"sgd", "sgd", 0.0, 1, &build_sgd},
      {"momentum", "momentum", 0.0, 1, &build_momentum},
      {"adam", "adam", 0.0, 1, &build_adam},
      {"adamw", "adamw (default)", 0.01, 1, &build_adamw},
      {"adam8bit", "adam8bit (AdamW, 8-bit block-wise moments)", 0.01, kBlock, &build_adam8bit},
      {"adafactor", "adafactor (factored second moment)", 0.0, 0, &build_adafactor},
  };
  return kOptimizers;
}

const OptimizerDef* find_optimizer(std::string_view name) {
  for (const OptimizerDef& o : optimizers()) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

std::string optimizer_names(bool flat_only, std::string_view last_separator) {
  std::vector<std::string_view> names;
  for (const OptimizerDef& o : optimizers()) {
    if (!flat_only || o.flat_align > 0) names.push_back(o.name);
  }
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += i + 1 == names.size() ? last_separator : std::string_view(", ");
    s += names[i];
  }
  return s;
}

}  // namespace memc
