// ViTs of any shape as ONNX, without PyTorch: the graph a torchvision ViT export has (patch
// convolution, class token, position embedding, pre-norm blocks with multi-head attention and an
// erf-GELU MLP, final norm, the class token's head), with torchvision's parameter names and
// seeded random weights. For tests that need shapes no committed model has (odd widths, 3 or 5
// layers, other patch grids).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "tests/frontend_onnx_builder.h"

namespace memc::testing {

struct VitShape {
  int64_t image = 8, patch = 4, channels = 1;
  int64_t hidden = 16, heads = 2, layers = 2, mlp = 32, classes = 10;
  std::string name() const {
    return str_cat("vit_i", image, "p", patch, "c", channels, "_h", hidden, "x", heads, "_l", layers, "_m", mlp, "_k", classes);
  }
};

// Weights uniform in ±scale from a 64-bit LCG seeded by the tensor's position in the model.
inline Tensor vit_random(Shape shape, double scale, uint64_t seed) {
  Tensor t = Tensor::zeros(DType::kF32, shape);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.set_from_double(i, scale * (static_cast<double>(s >> 11) / 9007199254740992.0 * 2 - 1));
  }
  return t;
}

// The model, serialized. Input "x" [batch (dynamic), channels, image, image]; output "logits".
inline std::string build_vit_onnx(const VitShape& v) {
  OnnxBuilder b(17);
  uint64_t seed = 1;
  const int64_t grid = v.image / v.patch, tokens = grid * grid + 1, head_dim = v.hidden / v.heads;
  auto param = [&](const std::string& name, Shape shape, double scale) { b.init(name, vit_random(shape, scale, seed++)); };
  auto ones = [&](const std::string& name, int64_t n) { b.init(name, make_tensor(DType::kF32, {n}, {1.0})); };
  auto zeros = [&](const std::string& name, int64_t n) { b.init(name, make_tensor(DType::kF32, {n}, {0.0})); };
  b.input("x", {-1, v.channels, v.image, v.image}).output("logits");
  // Patches: conv [hidden, C, p, p] stride p, then [B, hidden, P] -> [B, P, hidden].
  param("conv_proj.weight", {v.hidden, v.channels, v.patch, v.patch}, 0.2);
  param("conv_proj.bias", {v.hidden}, 0.05);
  auto& conv = b.node("Conv", {"x", "conv_proj.weight", "conv_proj.bias"}, {"patches"});
  attr_ints(conv, "kernel_shape", {v.patch, v.patch});
  attr_ints(conv, "strides", {v.patch, v.patch});
  b.ints("flat_shape", {0, v.hidden, -1});
  b.node("Reshape", {"patches", "flat_shape"}, {"patches_flat"});
  attr_ints(b.node("Transpose", {"patches_flat"}, {"tokens0"}), "perm", {0, 2, 1});
  // The class token, expanded over the batch: [B, 1, hidden] from x's batch dim.
  param("class_token", {1, 1, v.hidden}, 0.02);
  b.node("Shape", {"x"}, {"x_shape"});
  b.ints("zero", {0});
  attr_i(b.node("Gather", {"x_shape", "zero"}, {"batch"}), "axis", 0);
  b.ints("one_hidden", {1, v.hidden});
  attr_i(b.node("Concat", {"batch", "one_hidden"}, {"cls_shape"}), "axis", 0);
  b.node("Expand", {"class_token", "cls_shape"}, {"cls"});
  attr_i(b.node("Concat", {"cls", "tokens0"}, {"tokens1"}), "axis", 1);
  param("encoder.pos_embedding", {1, tokens, v.hidden}, 0.02);
  b.node("Add", {"tokens1", "encoder.pos_embedding"}, {"h0"});
  b.ints("heads_shape", {0, 0, v.heads, head_dim});
  b.ints("merge_shape", {0, 0, v.hidden});
  b.scalar("attn_scale", 1.0 / std::sqrt(static_cast<double>(head_dim)));
  b.scalar("sqrt2", std::sqrt(2.0));
  b.scalar("half", 0.5);
  b.scalar("onef", 1.0);
  std::string h = "h0";
  auto linear = [&](const std::string& in, const std::string& w, const std::string& bias, const std::string& out) {
    attr_ints(b.node("Transpose", {w}, {w + "_t"}), "perm", {1, 0});
    b.node("MatMul", {in, w + "_t"}, {out + "_mm"});
    b.node("Add", {out + "_mm", bias}, {out});
  };
  auto layernorm = [&](const std::string& in, const std::string& prefix, const std::string& out) {
    ones(prefix + ".weight", v.hidden);
    zeros(prefix + ".bias", v.hidden);
    auto& ln = b.node("LayerNormalization", {in, prefix + ".weight", prefix + ".bias"}, {out});
    attr_i(ln, "axis", -1);
    attr_f(ln, "epsilon", 1e-6f);
  };
  for (int64_t l = 0; l < v.layers; ++l) {
    const std::string p = str_cat("encoder.layers.encoder_layer_", l, ".");
    const std::string t = str_cat("l", l, "_");
    layernorm(h, p + "ln_1", t + "ln1");
    for (const char* m : {"q", "k", "v"}) {
      param(p + "self_attention." + m + "_proj.weight", {v.hidden, v.hidden}, 0.2);
      zeros(p + "self_attention." + m + "_proj.bias", v.hidden);
      linear(t + "ln1", p + "self_attention." + m + "_proj.weight", p + "self_attention." + m + "_proj.bias", t + m);
      b.node("Reshape", {t + m, "heads_shape"}, {t + m + "_h"});
      attr_ints(b.node("Transpose", {t + m + "_h"}, {t + m + "_bh"}), "perm", {0, 2, 1, 3});
    }
    attr_ints(b.node("Transpose", {t + "k_bh"}, {t + "kt"}), "perm", {0, 1, 3, 2});
    b.node("MatMul", {t + "q_bh", t + "kt"}, {t + "scores0"});
    b.node("Mul", {t + "scores0", "attn_scale"}, {t + "scores"});
    attr_i(b.node("Softmax", {t + "scores"}, {t + "probs"}), "axis", -1);
    b.node("MatMul", {t + "probs", t + "v_bh"}, {t + "ctx_bh"});
    attr_ints(b.node("Transpose", {t + "ctx_bh"}, {t + "ctx_h"}), "perm", {0, 2, 1, 3});
    b.node("Reshape", {t + "ctx_h", "merge_shape"}, {t + "ctx"});
    param(p + "self_attention.out_proj.weight", {v.hidden, v.hidden}, 0.2);
    zeros(p + "self_attention.out_proj.bias", v.hidden);
    linear(t + "ctx", p + "self_attention.out_proj.weight", p + "self_attention.out_proj.bias", t + "attn");
    b.node("Add", {h, t + "attn"}, {t + "res1"});
    layernorm(t + "res1", p + "ln_2", t + "ln2");
    param(p + "mlp.0.weight", {v.mlp, v.hidden}, 0.2);
    param(p + "mlp.0.bias", {v.mlp}, 0.05);
    linear(t + "ln2", p + "mlp.0.weight", p + "mlp.0.bias", t + "fc1");
    b.node("Div", {t + "fc1", "sqrt2"}, {t + "g0"});  // erf-GELU as torch exports it
    b.node("Erf", {t + "g0"}, {t + "g1"});
    b.node("Add", {t + "g1", "onef"}, {t + "g2"});
    b.node("Mul", {t + "fc1", t + "g2"}, {t + "g3"});
    b.node("Mul", {t + "g3", "half"}, {t + "gelu"});
    param(p + "mlp.3.weight", {v.hidden, v.mlp}, 0.2);
    param(p + "mlp.3.bias", {v.hidden}, 0.05);
    linear(t + "gelu", p + "mlp.3.weight", p + "mlp.3.bias", t + "fc2");
    b.node("Add", {t + "res1", t + "fc2"}, {t + "out"});
    h = t + "out";
  }
  layernorm(h, "encoder.ln", "final");
  attr_i(b.node("Gather", {"final", "zero_scalar"}, {"cls_out"}), "axis", 1);
  b.init("zero_scalar", make_tensor(DType::kI64, {}, {0.0}));
  param("heads.head.weight", {v.classes, v.hidden}, 0.2);
  zeros("heads.head.bias", v.classes);
  auto& gemm = b.node("Gemm", {"cls_out", "heads.head.weight", "heads.head.bias"}, {"logits"});
  attr_i(gemm, "transB", 1);
  return b.bytes();
}

}  // namespace memc::testing
