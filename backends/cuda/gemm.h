// GEMMs on CUDA through cuBLASLt: the kernels of memc.linear and memc.matmul behind the seam
// (backends/cuda/gemm.cu). Plain C++ interface; built with the CUDA backend.
#pragma once
#include <cstdint>

#include "backends/backend.h"

namespace memc::cuda {

// y[batch][M×N] = op(a)[M×K] · op(b)[K×N] (+ bias[N] on every row), all row-major, device pointers.
// op transposes the last two dims of the stored operand; a stride of 0 broadcasts an operand.
struct GemmCall {
  DType dtype = DType::kF32;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1, stride_a = 0, stride_b = 0;  // elements between consecutive matrices
  const void* a = nullptr;
  const void* b = nullptr;
  const void* bias = nullptr;  // optional, dtype of y
  void* y = nullptr;
};
Status gemm(const GemmCall& call, void* workspace, int64_t workspace_bytes, void* stream);

// TF32 for f32 GEMMs: off by default so fp32 matches the CPU backend (`memc run --tf32`).
void set_tf32(bool allowed);

Status linear_kernel(KernelContext& ctx);
Status matmul_kernel(KernelContext& ctx);

}  // namespace memc::cuda
