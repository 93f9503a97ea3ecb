// The fused attention kernels (backends/cpu/attention.cc), registered with the linalg family.
#pragma once
#include "backends/cpu/kernels.h"

namespace memc::cpu {

Status attention_kernel(KernelContext& ctx);
// (dy, q, k, v, [bias]) → (dq, dk, dv, [dbias]) {scale, dropout_ratio, seed}
Status attention_grad_kernel(KernelContext& ctx);
int64_t attention_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out);
int64_t attention_grad_workspace(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out);

}  // namespace memc::cpu
