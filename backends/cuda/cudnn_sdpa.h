// cuDNN's fused attention (SDPA, FlashAttention-2 style) for memc.attention and attention_grad,
// through the cuDNN frontend's graph API (backends/cuda/cudnn_sdpa.cc, library memc_cudnn_sdpa,
// built when CMake finds cuDNN and the frontend's headers: cmake/cudnn_frontend.cmake).
//
// Legend: B batch, H heads, Tq query rows, Tk key rows, D q/k head dim, Dv v head dim.
// q, k, v, o and their gradients are stored in the node's layout (ir/attention_layout.h: packed
// BHSD by default, or bthd / tbhd, which cuDNN reads through strides), the rest packed:
//   q [B,H,Tq,D] · k [B,H,Tk,D] · v [B,H,Tk,Dv] · o, do [B,H,Tq,Dv] · dq [B,H,Tq,D] · dk [B,H,Tk,D]
//   dv [B,H,Tk,Dv] · bias [B, 1|H, 1|Tq, Tk] (added after the scale, as memc does)
//   stats [B,H,Tq,1] f32: each row's log-sum-exp (natural log) of scale·q·kᵀ + bias, which the
//   forward writes and the backward reads. Dropout draws from seed and offset, one i64 each in
//   device memory ([1,1,1,1]); the backward must get the forward's values to redraw its mask
//   (cuDNN's Philox stream, not memc's CPU counter_random: the masks differ from the CPU's).
#pragma once
#include <cstdint>

#include "ir/attention_layout.h"
#include "ir/dtype.h"
#include "support/status.h"

struct cudnnContext;  // cudnnHandle_t is cudnnContext* (cudnn_graph.h)

namespace memc::cuda {

struct SdpaShape {
  int64_t batch = 0, heads = 0, tq = 0, tk = 0, d = 0, dv = 0;
  DType dtype = DType::kBF16;  // q, k, v, o, bias and their gradients; cuDNN takes bf16 and f16
  bool has_bias = false;
  bool bias_broadcast_heads = false;  // bias [B,1,·,Tk]
  bool bias_broadcast_rows = false;   // bias [B,·,1,Tk]
  float scale = 1.f;                  // scores = scale·q·kᵀ + bias
  float dropout = 0.f;                // probability of dropping an attention weight
  bool causal = false;                // row i sees keys 0..i (top-left aligned)
  AttentionLayout layout = AttentionLayout::kBHTD;  // of q, k, v, o and their gradients
};

// The graphs' tensor UIDs: the keys of the variant pack the kernels will execute with.
enum SdpaUid : int64_t {
  kSdpaQ = 1, kSdpaK = 2, kSdpaV = 3, kSdpaO = 4, kSdpaStats = 5, kSdpaBias = 6, kSdpaSeed = 7, kSdpaOffset = 8,
  kSdpaDO = 101, kSdpaDQ = 102, kSdpaDK = 103, kSdpaDV = 104,
};

// Builds the forward graph (o and stats from q, k, v[, bias]) or the backward graph (dq, dk, dv
// from q, k, v, o, do, stats[, bias]) and runs the frontend's validation, which needs no GPU
// when sm_version is given (90: H100/H200, 80: A100; 0: the current device's, which fails as
// Internal without one). Ok: the frontend's support rules accept the graph; engines are only
// chosen on a device, so a kernel may still find none (and the backward's rules check head dims
// per architecture but no SM floor). BadInput, message "not supported by cuDNN SDPA: <why>":
// f32 storage (memc's rule, from cuDNN's support matrix) or a frontend refusal (head dims, SM,
// ...); the executor then runs memc's own kernel. Internal: a malformed graph, a bug.
Status validate_sdpa(const SdpaShape& shape, int sm_version, bool backward);

// The workspace cuDNN's chosen plan for this graph needs, in bytes. Needs a GPU: engines and
// their workspaces exist only once cuDNN has the device, through this handle (cudnnCreate on
// the device the graph will run on). Without a GPU the frontend could plan from serialized
// device properties (DeviceProperties, cuDNN ≥ 9.8), but those come from a real device too.
Expected<int64_t> sdpa_workspace_bytes(const SdpaShape& shape, bool backward, cudnnContext* handle);

// Device pointers of one execution; those a graph does not use stay null.
struct SdpaPointers {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *bias = nullptr;
  void* o = nullptr;      // forward: written; backward: read
  float* stats = nullptr;  // forward: written; backward: read
  const void* d_o = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

// Runs the forward graph (o and stats) or the backward graph (dq, dk, dv) for `shape` on the
// current device's `stream` (a cudaStream_t), with `workspace_bytes` of scratch at `workspace`.
// Each shape's graph is built once (cuDNN picks its engine on the device) and kept, and so is a
// refusal: BadInput "not supported by cuDNN SDPA: …" when cuDNN has no engine for it or wants
// more workspace than the plan gave; the caller then runs memc's own kernel. No dropout: memc's
// masks come from its counter RNG, cuDNN's from Philox, and a step must be one or the other.
Status run_sdpa(const SdpaShape& shape, bool backward, const SdpaPointers& pointers, void* workspace, int64_t workspace_bytes,
                void* stream);

}  // namespace memc::cuda
