// The CUDA backend's workspace model: plain C++, so a plan for a GPU target counts the CUDA
// kernels' scratch on a machine without nvcc or a GPU. Once a device is open, the executor checks
// what the libraries actually ask for against these figures.
#include "backends/cuda/target.h"

#include "backends/cuda/op_table.h"

namespace memc::cuda {

int64_t cublaslt_workspace_bytes(int sm_major) { return sm_major >= 9 ? int64_t{32} << 20 : int64_t{4} << 20; }

int64_t CudaTarget::run_state_bytes() const { return ops::kRunStateBytes; }

int64_t CudaTarget::workspace_bytes(const Module& module, const Node& node) const {
  const NodeTypes types(module, node);
  return ops::workspace_bytes(node, types.in, types.out, cublaslt_workspace_bytes(sm_major_));
}

Status CudaTarget::no_device(const char* what) {
  return Status::Internal(str_cat(what, " on a CUDA target built for planning (no device opened)"));
}

}  // namespace memc::cuda
