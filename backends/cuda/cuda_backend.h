// The CUDA backend: device probe, one-allocation device arenas, and the Backend seam (memory,
// copies, streams, events, graphs; the op kernels are backends/cuda/op_table.h's). Plain C++
// interface; the .cu files hold everything CUDA. It lives in the CUDA module (libmemc_cuda.so,
// built when CMake finds nvcc), which memc loads on the first GPU run (backends/cuda_module.h);
// without a GPU or driver every entry point reports it as a Status, never aborts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/target.h"
#include "backends/cuda_module.h"
#include "support/status.h"

namespace memc::cuda {

DeviceInfo probe();  // backends/cuda_module.h

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

// The CUDA backend behind the seam: the planning target's workspace model (backends/cuda/target.h)
// plus the device. open() binds device K and creates its compute and copy streams; the memory,
// copy and stream methods need that.
class CudaBackend final : public CudaTarget {
 public:
  explicit CudaBackend(int sm_major) : CudaTarget(sm_major) {}
  ~CudaBackend() override;
  // Device K; bad input naming why when there is no driver, no such device, or no CUDA build.
  static Expected<std::unique_ptr<CudaBackend>> open(int device);

  std::string_view name() const override { return name_; }
  const Kernel* find_kernel(std::string_view op) const override;
  GroupKernel find_group_kernel(std::string_view op) const override;
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
  bool can_capture() const override { return device_ >= 0; }
  Status begin_capture(Stream stream) override;
  Expected<Graph> end_capture(Stream stream) override;
  Status launch(Graph graph, Stream stream) override;
  void destroy(Graph graph) override;

 private:
  int device_ = -1;  // -1: a planning instance, not opened
  std::string name_ = "cuda";
  void* compute_ = nullptr;  // cudaStream_t
  void* copy_ = nullptr;
  Status require_open(const char* what) const;
};

}  // namespace memc::cuda
