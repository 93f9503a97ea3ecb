// A CUDA target without a device: what planning for a GPU needs, in plain C++ that libmemc
// holds on every build. A plan for --target h200 counts the CUDA kernels' workspaces here, on a
// machine without nvcc, a GPU or the CUDA module. The device half (memory, copies, streams,
// kernels) is backends/cuda/cuda_backend.h, in the CUDA module that backends/cuda_module.h loads:
// every such call on a target alone is an internal error naming it, never a crash.
#pragma once
#include <cstdint>
#include <string>

#include "backends/backend.h"

namespace memc::cuda {

// cuBLASLt's workspace per GEMM call: NVIDIA's recommendation (cublasSetWorkspace) is 32 MiB on
// Hopper (sm_90) and 4 MiB before it. One region of this size serves every GEMM of a step.
int64_t cublaslt_workspace_bytes(int sm_major);

class CudaTarget : public Backend {
 public:
  explicit CudaTarget(int sm_major) : sm_major_(sm_major) {}

  std::string_view name() const override { return "cuda"; }
  int sm_major() const { return sm_major_; }
  // Planning: the op table's scratch per node (backends/cuda/op_table.h) and the run state.
  int64_t workspace_bytes(const Module& module, const Node& node) const override;
  int64_t run_state_bytes() const override;

  // Kernels and the device: only an opened backend (the module's CudaBackend) has them.
  const Kernel* find_kernel(std::string_view op) const override { return nullptr; }
  Expected<void*> allocate(MemoryKind kind, int64_t bytes) override { return no_device("allocate"); }
  void deallocate(MemoryKind kind, void* p) override {}
  Status fill(void* p, uint8_t byte, int64_t bytes) override { return no_device("fill"); }
  Status copy(void* dst, const void* src, int64_t bytes) override { return no_device("copy"); }
  Status copy_async(void* dst, const void* src, int64_t bytes, Stream stream) override { return no_device("copy_async"); }
  Stream compute_stream() override { return {}; }
  Stream copy_stream() override { return {}; }
  Expected<Event> record(Stream stream) override { return no_device("record"); }
  Status wait(Stream stream, Event event) override { return no_device("wait"); }
  using Backend::destroy;  // destroy(Graph) keeps the seam's default
  void destroy(Event event) override {}
  Status synchronize(Stream stream) override { return no_device("synchronize"); }

 protected:
  static Status no_device(const char* what);

 private:
  int sm_major_;
};

}  // namespace memc::cuda
