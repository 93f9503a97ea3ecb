// GEMMs on CUDA through cuBLASLt (backends/cuda/gemm.cu); the ops that use them are in
// backends/cuda/ops.h. Plain C++ interface, so host code (and host tests) can describe a call.
#pragma once
#include <cstdint>

#include "backends/backend.h"

namespace memc::cuda {

// y[batch][M×N] = op(a)[M×K] · op(b)[K×N] (+ bias[N] on every row), all row-major, device pointers.
// op transposes the last two dims of the stored operand; a stride of 0 broadcasts an operand.
// A stored matrix's rows may lie further apart than its row length (an attention head's rows
// inside [T, B, H, E], say): lda, ldb and ldy give the step, 0 meaning packed.
struct GemmCall {
  DType dtype = DType::kF32;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1, stride_a = 0, stride_b = 0;  // elements between consecutive matrices
  int64_t stride_y = 0;                           // likewise for y; 0: packed (m·n)
  int64_t lda = 0, ldb = 0, ldy = 0;              // elements between a stored matrix's rows; 0: packed
  const void* a = nullptr;
  const void* b = nullptr;
  const void* bias = nullptr;  // optional, dtype of y
  void* y = nullptr;
  // Optional, one matrix only (matmul_bgrad): the epilogue also writes the sums over k of op(a)'s
  // rows (m values, bias_grad_of 0) or of op(b)'s columns (n values, 1), dtype of y. Where
  // cuBLASLt offers no algorithm for that epilogue, gemm() is bad input and writes nothing.
  void* bias_grad = nullptr;
  int bias_grad_of = 0;
  // matmul_acc: y += product (beta = 1) instead of y = product, and y (with the bias) f32 over
  // 16-bit a and b where y_f32.
  bool accumulate = false;
  bool y_f32 = false;
  DType y_dtype() const { return y_f32 ? DType::kF32 : dtype; }
};
Status gemm(const GemmCall& call, void* workspace, int64_t workspace_bytes, void* stream);

// TF32 for f32 GEMMs: off by default so fp32 matches the CPU backend (`memc run --tf32`).
void set_tf32(bool allowed);


}  // namespace memc::cuda
