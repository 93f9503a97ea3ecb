// cuDNN attention graphs (backends/cuda/cudnn_sdpa.h) for the committed models' attention shapes,
// validated without a GPU for sm_90 (H100/H200) and sm_80 (A100): forward (with the stats the
// backward reads) and backward, in bf16 and f16, with each model's bias pattern and attention
// dropout, and in the strided layouts GPU plans use. f32, odd head dims and pre-Ampere targets are refused with the reason. The workspace
// query needs a GPU and skips without one.
#include <gtest/gtest.h>

#include <cudnn.h>

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cuda/cudnn_sdpa.h"

namespace memc::cuda {
namespace {

constexpr int kHopper = 90, kAmpere = 80, kTuring = 75;

struct ModelAttention {
  const char* name;
  SdpaShape shape;  // dtype is set per case
};

// From the memc.attention nodes of `memc compile MODEL --print-ir` (f32 plans; the shapes are the
// same at every precision). Bias patterns: text_encoder's key-padding mask [B,H,1,Tk], bigbird's
// [B,1,1,Tk] (bigbird_full) and [B,1,Tq,Tk] (bigbird_full_t215); the bigbirds keep attention
// dropout 0.1. bert_t215 (also roberta_t215 and distilbert_t215: same shapes) is fused since the
// fusion peels torch's where(isnan(P), 0, P) guard: q·kᵀ + mask [4,1,32,32], softmax, ·v.
const std::vector<ModelAttention>& model_attentions() {
  static const std::vector<ModelAttention> cases = {
      // compile models/vit_tiny.onnx --batch 32
      {"vit_tiny", {.batch = 32, .heads = 2, .tq = 17, .tk = 17, .d = 16, .dv = 16, .scale = 0.25f}},
      // compile models/vit_small32.onnx --batch 32
      {"vit_small32", {.batch = 32, .heads = 4, .tq = 65, .tk = 65, .d = 32, .dv = 32, .scale = 0.17677670f}},
      // compile models/text_encoder.onnx --batch 32 --seq 32
      {"text_encoder",
       {.batch = 32, .heads = 2, .tq = 32, .tk = 32, .d = 16, .dv = 16, .has_bias = true, .bias_broadcast_rows = true,
        .scale = 0.25f}},
      // compile models/bigbird_full.onnx --batch 32 --seq 32
      {"bigbird_full",
       {.batch = 32, .heads = 2, .tq = 32, .tk = 32, .d = 16, .dv = 16, .has_bias = true, .bias_broadcast_heads = true,
        .bias_broadcast_rows = true, .scale = 0.25f, .dropout = 0.1f}},
      // compile models/bigbird_full_t215.onnx --batch 4 --seq 32
      {"bigbird_full_t215",
       {.batch = 4, .heads = 2, .tq = 32, .tk = 32, .d = 16, .dv = 16, .has_bias = true, .bias_broadcast_heads = true,
        .scale = 0.25f, .dropout = 0.1f}},
      // compile models/bert_t215.onnx --batch 4 --seq 32 (unfused, see above)
      {"bert_t215",
       {.batch = 4, .heads = 2, .tq = 32, .tk = 32, .d = 16, .dv = 16, .has_bias = true, .bias_broadcast_heads = true,
        .scale = 0.25f}},
      // compile models/vit_b_16_skeleton.onnx --batch 16 (ViT-B/16)
      {"vit_b_16", {.batch = 16, .heads = 12, .tq = 197, .tk = 197, .d = 64, .dv = 64, .scale = 0.125f}},
      // compile models/vit_l_16_skeleton.onnx --batch 16 (ViT-L/16)
      {"vit_l_16", {.batch = 16, .heads = 16, .tq = 197, .tk = 197, .d = 64, .dv = 64, .scale = 0.125f}},
  };
  return cases;
}

struct Case {
  ModelAttention model;
  int sm_version;
  DType dtype;
  bool backward;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const ModelAttention& model : model_attentions()) {
    for (int sm_version : {kHopper, kAmpere}) {
      for (DType dtype : {DType::kBF16, DType::kF16}) {
        for (bool backward : {false, true}) cases.push_back({model, sm_version, dtype, backward});
      }
    }
  }
  return cases;
}

std::string case_name(const Case& c) {
  return std::string(c.model.name) + "_sm" + std::to_string(c.sm_version) + (c.dtype == DType::kBF16 ? "_bf16" : "_f16") +
         (c.backward ? "_backward" : "_forward");
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }  // readable ctest names

class SdpaModelTest : public testing::TestWithParam<Case> {};

TEST_P(SdpaModelTest, Validates) {
  SdpaShape shape = GetParam().model.shape;
  shape.dtype = GetParam().dtype;
  const Status status = validate_sdpa(shape, GetParam().sm_version, GetParam().backward);
  EXPECT_TRUE(status.ok()) << status.message();
}

INSTANTIATE_TEST_SUITE_P(Models, SdpaModelTest, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<Case>& info) { return case_name(info.param); });

SdpaShape model_shape(std::string_view name, DType dtype) {
  for (const ModelAttention& model : model_attentions()) {
    if (model.name != name) continue;
    SdpaShape shape = model.shape;
    shape.dtype = dtype;
    return shape;
  }
  ADD_FAILURE() << "no model " << name;
  return {};
}
SdpaShape vit_b_16(DType dtype) { return model_shape("vit_b_16", dtype); }

TEST(CudnnSdpa, F32IsRefusedWithTheReason) {
  for (bool backward : {false, true}) {
    const Status status = validate_sdpa(vit_b_16(DType::kF32), kHopper, backward);
    EXPECT_EQ(status.kind(), ErrorKind::kBadInput);
    EXPECT_EQ(status.message(), "not supported by cuDNN SDPA: f32 (cuDNN attention takes bf16, f16 or fp8)");
  }
}

// cuDNN's own rule, passed on: head dims must be multiples of 8.
TEST(CudnnSdpa, HeadDimNotAMultipleOf8IsRefusedByCudnn) {
  SdpaShape shape = vit_b_16(DType::kBF16);
  shape.d = shape.dv = 12;
  for (bool backward : {false, true}) {
    const Status status = validate_sdpa(shape, kHopper, backward);
    EXPECT_EQ(status.kind(), ErrorKind::kBadInput);
    EXPECT_EQ(status.message().rfind("not supported by cuDNN SDPA: ", 0), 0u) << status.message();
    EXPECT_NE(status.message().find("multiple of 8"), std::string::npos) << status.message();
  }
}

// The target is the one asked for, not this machine's: cuDNN's forward needs sm_80 or newer.
TEST(CudnnSdpa, TuringIsRefusedByCudnn) {
  const Status status = validate_sdpa(vit_b_16(DType::kBF16), kTuring, /*backward=*/false);
  EXPECT_EQ(status.kind(), ErrorKind::kBadInput);
  EXPECT_EQ(status.message(), "not supported by cuDNN SDPA: SDPA FP16/BF16 requires SM80 (Ampere) or newer architecture");
}

TEST(CudnnSdpa, CausalMaskWithBiasAndDropoutValidates) {
  SdpaShape shape = model_shape("bigbird_full", DType::kBF16);  // bias [B,1,1,Tk], dropout 0.1
  shape.causal = true;
  for (bool backward : {false, true}) {
    const Status status = validate_sdpa(shape, kHopper, backward);
    EXPECT_TRUE(status.ok()) << status.message();
  }
}

// GPU plans lay attention out where the projections wrote q, k and v (ir/attention_layout.h):
// cuDNN reads [B, T, H, D] and [T, B, H, D] through strides, every model's shapes both ways, for
// Hopper and Ampere.
TEST(CudnnSdpa, StridedLayoutsValidate) {
  for (const ModelAttention& model : model_attentions()) {
    for (const AttentionLayout layout : {AttentionLayout::kBTHD, AttentionLayout::kTBHD}) {
      for (int sm_version : {kHopper, kAmpere}) {
        for (bool backward : {false, true}) {
          SdpaShape shape = model.shape;
          shape.dtype = DType::kBF16, shape.layout = layout;
          const Status status = validate_sdpa(shape, sm_version, backward);
          EXPECT_TRUE(status.ok()) << model.name << " " << attention_layout_name(layout) << " sm" << sm_version
                                   << (backward ? " backward: " : " forward: ") << status.message();
        }
      }
    }
  }
}

// Plans, and so workspaces, exist only on a device.
TEST(CudnnSdpa, WorkspaceOnTheDevice) {
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t created = cudnnCreate(&handle);
  if (created != CUDNN_STATUS_SUCCESS) GTEST_SKIP() << "no cuDNN handle without a GPU: " << cudnnGetErrorString(created);
  for (bool backward : {false, true}) {
    Expected<int64_t> bytes = sdpa_workspace_bytes(vit_b_16(DType::kBF16), backward, handle);
    EXPECT_TRUE(bytes.ok()) << bytes.status().message();
    if (bytes.ok()) std::printf("[cudnn] ViT-B/16 bf16 %s workspace: %lld bytes\n", backward ? "backward" : "forward", static_cast<long long>(*bytes));
  }
  cudnnDestroy(handle);
}

}  // namespace
}  // namespace memc::cuda
