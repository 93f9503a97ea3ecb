// The CUDA backend's runtime half where memc is built without nvcc: planning for GPU targets
// still works (backends/cuda/workspace.cc); opening a device says why it cannot.
#ifndef MEMC_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemm.h"

namespace memc::cuda {

namespace {
Status not_built() { return Status::BadInput("memc was built without CUDA (no nvcc was found at build time)"); }
}  // namespace

DeviceInfo probe() { return DeviceInfo{.error = "memc was built without CUDA"}; }
Expected<std::unique_ptr<CudaBackend>> CudaBackend::open(int device) {
  return not_built().with_context(str_cat("--device cuda:", device, ": "));
}
CudaBackend::~CudaBackend() = default;
Status CudaBackend::require_open(const char*) const { return not_built(); }
const Kernel* CudaBackend::find_kernel(std::string_view) const { return nullptr; }
GroupKernel CudaBackend::find_group_kernel(std::string_view) const { return nullptr; }
Expected<void*> CudaBackend::allocate(MemoryKind, int64_t) { return not_built(); }
void CudaBackend::deallocate(MemoryKind, void*) {}
Status CudaBackend::fill(void*, uint8_t, int64_t) { return not_built(); }
Status CudaBackend::copy(void*, const void*, int64_t) { return not_built(); }
Status CudaBackend::copy_async(void*, const void*, int64_t, Stream) { return not_built(); }
Expected<Event> CudaBackend::record(Stream) { return not_built(); }
Status CudaBackend::wait(Stream, Event) { return not_built(); }
void CudaBackend::destroy(Event) {}
Status CudaBackend::synchronize(Stream) { return not_built(); }
int64_t CudaBackend::device_bytes_in_use() const { return -1; }
Status CudaBackend::begin_capture(Stream) { return not_built(); }
Expected<Graph> CudaBackend::end_capture(Stream) { return not_built(); }
Status CudaBackend::launch(Graph, Stream) { return not_built(); }
void CudaBackend::destroy(Graph) {}
void set_tf32(bool) {}

}  // namespace memc::cuda
#endif  // MEMC_HAVE_CUDA
