// The CUDA backend's workspace model: plain C++, so a plan for a GPU target counts the CUDA
// kernels' scratch on a machine without nvcc or a GPU. Once a device is open, the executor checks
// what the libraries actually ask for against these figures.
#include <algorithm>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/op_table.h"

namespace memc::cuda {

int64_t cublaslt_workspace_bytes(int sm_major) { return sm_major >= 9 ? int64_t{32} << 20 : int64_t{4} << 20; }

namespace {

constexpr int64_t kAlignment = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// attention_grad(dy, q, k, v, [bias]) through cuDNN's SDPA backward. memc's attention forward
// keeps no softmax statistics (the backward recomputes them, as the CPU kernel does), so the
// backward first reruns the forward into scratch: the output O [.., Tq, Dv] in the data dtype and
// the row statistics [.., Tq] in f32. cuDNN's own workspace (its dQ accumulator, f32 [.., Tq, D],
// at least) is only known on a device: it gets the larger of that accumulator and cuBLASLt's
// figure, which the step's GEMMs already plan, so the cuDNN path rarely raises the peak; where
// its engine wants more, the kernel runs memc's own attention instead (run_sdpa refuses).
int64_t attention_grad_bytes(const Module& module, const Node& node, int64_t gemm_bytes) {
  const TensorType& q = module.value(node.inputs[1]).type;
  const TensorType& v = module.value(node.inputs[3]).type;
  if (q.dtype != DType::kBF16 && q.dtype != DType::kF16) return 0;  // cuDNN takes 16-bit attention only
  const int64_t head_dim = q.shape.back(), value_dim = v.shape.back();
  const int64_t rows = q.numel() / std::max<int64_t>(head_dim, 1);  // batch × heads × Tq
  const int64_t output = rows * value_dim * static_cast<int64_t>(dtype_size(q.dtype));
  const int64_t stats = rows * 4;
  const int64_t dq_accumulator = rows * head_dim * 4;
  return aligned(output) + aligned(stats) + std::max(aligned(dq_accumulator), gemm_bytes);
}

}  // namespace

int64_t CudaBackend::run_state_bytes() const { return ops::kRunStateBytes; }

int64_t CudaBackend::workspace_bytes(const Module& module, const Node& node) const {
  std::vector<TensorType> in, out;  // O(arity)
  for (ValueId v : node.inputs) in.push_back(v == kNoValue ? TensorType{} : module.value(v).type);
  for (ValueId v : node.outputs) out.push_back(module.value(v).type);
  int64_t kernel = ops::workspace_bytes(node, in, out, cublaslt_workspace_bytes(sm_major_));
  // The attention backward plans for cuDNN's SDPA too, so either path fits.
  if (node.op == "attention_grad") kernel = std::max(kernel, attention_grad_bytes(module, node, cublaslt_workspace_bytes(sm_major_)));
  return ops::kRunStateBytes + kernel;
}

}  // namespace memc::cuda
