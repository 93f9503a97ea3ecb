// The CUDA backend: device probe, one-allocation device arenas, and the Backend seam (memory,
// copies, streams, events, graphs; the op kernels are backends/cuda/op_table.h's). Plain C++
// interface; the .cu files hold everything CUDA. Built when CMake finds nvcc (MEMC_HAVE_CUDA);
// without a GPU or driver every entry point reports it as a Status, never aborts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "support/status.h"

namespace memc::cuda {

struct DeviceInfo {
  int count = 0;             // devices visible to the runtime
  std::string name;          // device 0
  int64_t total_bytes = 0;   // device 0 memory
  int sm_major = 0, sm_minor = 0;
  std::string error;         // why count is 0 (no driver, no device)
};
DeviceInfo probe();

// One cudaMalloc for a whole plan's arena: nothing is allocated per tensor while training.
class Arena {
 public:
  static Expected<Arena> create(int64_t bytes);
  Arena() = default;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Status upload(int64_t offset, const void* host, int64_t bytes);
  Status download(int64_t offset, void* host, int64_t bytes) const;

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// cuBLASLt's workspace per GEMM call: NVIDIA's recommendation (cublasSetWorkspace) is 32 MiB on
// Hopper (sm_90) and 4 MiB before it. One region of this size serves every GEMM of a step.
int64_t cublaslt_workspace_bytes(int sm_major);

// The CUDA backend behind the seam. Constructed for planning it touches no device: a plan for
// --target h200 asks it for workspace bytes on a machine without a GPU. open() binds device K
// and creates its compute and copy streams; the memory, copy and stream methods need that.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int sm_major) : sm_major_(sm_major) {}
  ~CudaBackend() override;
  // Device K; bad input naming why when there is no driver, no such device, or no CUDA build.
  static Expected<std::unique_ptr<CudaBackend>> open(int device);

  std::string_view name() const override { return name_; }
  const Kernel* find_kernel(std::string_view op) const override;
  GroupKernel find_group_kernel(std::string_view op) const override;
  int64_t workspace_bytes(const Module& module, const Node& node) const override;
  Expected<void*> allocate(MemoryKind kind, int64_t bytes) override;
  void deallocate(MemoryKind kind, void* p) override;
  Status fill(void* p, uint8_t byte, int64_t bytes) override;
  Status copy(void* dst, const void* src, int64_t bytes) override;
  Status copy_async(void* dst, const void* src, int64_t bytes, Stream stream) override;
  Stream compute_stream() override { return {compute_}; }
  Stream copy_stream() override { return {copy_}; }
  Expected<Event> record(Stream stream) override;
  Status wait(Stream stream, Event event) override;
  void destroy(Event event) override;
  Status synchronize(Stream stream) override;
  int64_t device_bytes_in_use() const override;  // cudaMemGetInfo: total - free
  int64_t run_state_bytes() const override;  // ops::kRunStateBytes
  bool can_capture() const override { return device_ >= 0; }
  Status begin_capture(Stream stream) override;
  Expected<Graph> end_capture(Stream stream) override;
  Status launch(Graph graph, Stream stream) override;
  void destroy(Graph graph) override;

 private:
  int sm_major_;
  int device_ = -1;  // -1: a planning instance, not opened
  std::string name_ = "cuda";
  void* compute_ = nullptr;  // cudaStream_t
  void* copy_ = nullptr;
  Status require_open(const char* what) const;
};

}  // namespace memc::cuda
