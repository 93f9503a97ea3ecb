// The CUDA backend's workspace model: plain C++, so a plan for a GPU target counts the CUDA
// kernels' scratch on a machine without nvcc or a GPU. Once a device is open, the executor checks
// what the libraries actually ask for against these figures.
#include <algorithm>

#include "backends/cuda/cuda_backend.h"

namespace memc::cuda {

int64_t cublaslt_workspace_bytes(int sm_major) { return sm_major >= 9 ? int64_t{32} << 20 : int64_t{4} << 20; }

namespace {

constexpr int64_t kAlignment = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// attention_grad(dy, q, k, v, [bias]) through cuDNN's SDPA backward. memc's attention forward
// keeps no softmax statistics (the backward recomputes them, as the CPU kernel does), so the
// backward first reruns the forward into scratch: the output O [.., Tq, Dv] in the data dtype and
// the row statistics [.., Tq] in f32; cuDNN then accumulates dQ in f32 [.., Tq, D].
int64_t attention_grad_bytes(const Module& module, const Node& node) {
  const TensorType& q = module.value(node.inputs[1]).type;
  const TensorType& v = module.value(node.inputs[3]).type;
  const int64_t head_dim = q.shape.back(), value_dim = v.shape.back();
  const int64_t rows = q.numel() / std::max<int64_t>(head_dim, 1);  // batch × heads × Tq
  const int64_t output = rows * value_dim * static_cast<int64_t>(dtype_size(q.dtype));
  const int64_t stats = rows * 4;
  const int64_t dq_accumulator = rows * head_dim * 4;
  return aligned(output) + aligned(stats) + aligned(dq_accumulator);
}

}  // namespace

int64_t CudaBackend::workspace_bytes(const Module& module, const Node& node) const {
  const std::string& op = node.op;
  if (op == "matmul" || op == "linear" || op == "conv" || op == "conv_grad_input" || op == "conv_grad_weight") {
    return cublaslt_workspace_bytes(sm_major_);
  }
  if (op == "attention_grad") return attention_grad_bytes(module, node);
  // Every other op runs on memc's own kernels, which are written to take no scratch; one that
  // needs some declares it here, so plans for GPU targets count it.
  return 0;
}

}  // namespace memc::cuda
