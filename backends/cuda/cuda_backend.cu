#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemm.h"

#include <cuda_runtime.h>

namespace memc::cuda {
namespace {

Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

DeviceInfo probe() {
  DeviceInfo info;
  const cudaError_t e = cudaGetDeviceCount(&info.count);
  if (e != cudaSuccess) {
    info.count = 0;
    info.error = cudaGetErrorString(e);
    return info;
  }
  if (info.count == 0) {
    info.error = "no CUDA device";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    info.name = prop.name;
    info.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    info.sm_major = prop.major;
    info.sm_minor = prop.minor;
  }
  return info;
}

Expected<Arena> Arena::create(int64_t bytes) {
  Arena arena;
  if (bytes > 0) {
    MEMC_RETURN_IF_ERROR(check(cudaMalloc(&arena.data_, static_cast<size_t>(bytes)), "cudaMalloc of the arena"));
    arena.bytes_ = bytes;
    MEMC_RETURN_IF_ERROR(check(cudaMemset(arena.data_, 0, static_cast<size_t>(bytes)), "cudaMemset of the arena"));
  }
  return std::move(arena);  // nvcc needs the move (Expected<Arena> from an lvalue); g++ calls it redundant
}

Arena::Arena(Arena&& other) noexcept : data_(other.data_), bytes_(other.bytes_) { other.data_ = nullptr, other.bytes_ = 0; }

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = other.data_, bytes_ = other.bytes_;
    other.data_ = nullptr, other.bytes_ = 0;
  }
  return *this;
}

Arena::~Arena() {
  if (data_) cudaFree(data_);
}

Status Arena::upload(int64_t offset, const void* host, int64_t bytes) {
  if (offset < 0 || offset + bytes > bytes_) return Status::Internal("upload outside the arena");
  return check(cudaMemcpy(static_cast<char*>(data_) + offset, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice), "upload");
}

Status Arena::download(int64_t offset, void* host, int64_t bytes) const {
  if (offset < 0 || offset + bytes > bytes_) return Status::Internal("download outside the arena");
  return check(cudaMemcpy(host, static_cast<const char*>(data_) + offset, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost), "download");
}


}  // namespace memc::cuda

// ---- The Backend seam (backends/backend.h) ----
namespace memc::cuda {

namespace {
cudaStream_t as_stream(Stream s) { return static_cast<cudaStream_t>(s.handle); }
}  // namespace

Expected<std::unique_ptr<CudaBackend>> CudaBackend::open(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return Status::BadInput(str_cat("--device cuda:", device, ": no usable CUDA device (", cudaGetErrorString(e), ")"));
  if (device < 0 || device >= count) {
    return Status::BadInput(str_cat("--device cuda:", device, ": this machine has ", count, " CUDA device(s)"));
  }
  cudaDeviceProp prop{};
  MEMC_RETURN_IF_ERROR(check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  auto backend = std::make_unique<CudaBackend>(prop.major);
  backend->device_ = device;
  backend->name_ = str_cat("cuda:", device);
  MEMC_RETURN_IF_ERROR(check(cudaSetDevice(device), "cudaSetDevice"));
  // The attention row kernels keep up to 2 KiB of per-thread accumulators (ptxas: 2048-byte
  // stack frame for the backward's key rows); reserving it now keeps the driver from resizing
  // local memory at a launch, which a graph capture does not allow.
  MEMC_RETURN_IF_ERROR(check(cudaDeviceSetLimit(cudaLimitStackSize, 4096), "cudaDeviceSetLimit(stack)"));
  cudaStream_t compute = nullptr, copy = nullptr;
  MEMC_RETURN_IF_ERROR(check(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate"));
  backend->compute_ = compute;
  MEMC_RETURN_IF_ERROR(check(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking), "cudaStreamCreate"));
  backend->copy_ = copy;
  return Expected<std::unique_ptr<CudaBackend>>(std::move(backend));
}

CudaBackend::~CudaBackend() {
  if (compute_) cudaStreamDestroy(as_stream({compute_}));
  if (copy_) cudaStreamDestroy(as_stream({copy_}));
}

Status CudaBackend::require_open(const char* what) const {
  if (device_ < 0) return Status::Internal(str_cat(what, " on a CUDA backend built for planning (no device opened)"));
  return Status::Ok();
}

Expected<void*> CudaBackend::allocate(MemoryKind kind, int64_t bytes) {
  MEMC_RETURN_IF_ERROR(require_open("allocate"));
  void* p = nullptr;
  const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  const cudaError_t e = kind == MemoryKind::kDevice ? cudaMalloc(&p, n)
                        : kind == MemoryKind::kPinnedHost ? cudaMallocHost(&p, n)
                                                          : (p = std::malloc(n)) ? cudaSuccess : cudaErrorMemoryAllocation;
  if (e != cudaSuccess) {
    return Status::BadInput(str_cat("out of ", memory_kind_name(kind), " memory on ", name_, " allocating ", bytes, " bytes (",
                                    cudaGetErrorString(e), ")"));
  }
  return p;
}

void CudaBackend::deallocate(MemoryKind kind, void* p) {
  if (!p) return;
  if (kind == MemoryKind::kDevice) cudaFree(p);
  else if (kind == MemoryKind::kPinnedHost) cudaFreeHost(p);
  else std::free(p);
}

Status CudaBackend::fill(void* p, uint8_t byte, int64_t bytes) {
  MEMC_RETURN_IF_ERROR(require_open("fill"));
  if (bytes <= 0) return Status::Ok();
  MEMC_RETURN_IF_ERROR(check(cudaMemsetAsync(p, byte, static_cast<size_t>(bytes), as_stream({compute_})), "cudaMemset"));
  return check(cudaStreamSynchronize(as_stream({compute_})), "cudaStreamSynchronize");
}

Status CudaBackend::copy(void* dst, const void* src, int64_t bytes) {
  MEMC_RETURN_IF_ERROR(require_open("copy"));
  if (bytes <= 0) return Status::Ok();
  MEMC_RETURN_IF_ERROR(check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, as_stream({compute_})), "cudaMemcpy"));
  return check(cudaStreamSynchronize(as_stream({compute_})), "cudaStreamSynchronize");
}

Status CudaBackend::copy_async(void* dst, const void* src, int64_t bytes, Stream stream) {
  MEMC_RETURN_IF_ERROR(require_open("copy_async"));
  if (bytes <= 0) return Status::Ok();
  return check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, as_stream(stream)), "cudaMemcpyAsync");
}

Expected<Event> CudaBackend::record(Stream stream) {
  MEMC_RETURN_IF_ERROR(require_open("record"));
  cudaEvent_t event = nullptr;
  MEMC_RETURN_IF_ERROR(check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
  MEMC_RETURN_IF_ERROR(check(cudaEventRecord(event, as_stream(stream)), "cudaEventRecord"));
  return Event{event};
}

Status CudaBackend::wait(Stream stream, Event event) {
  return check(cudaStreamWaitEvent(as_stream(stream), static_cast<cudaEvent_t>(event.handle), 0), "cudaStreamWaitEvent");
}

void CudaBackend::destroy(Event event) {
  if (event.handle) cudaEventDestroy(static_cast<cudaEvent_t>(event.handle));
}

Status CudaBackend::synchronize(Stream stream) {
  MEMC_RETURN_IF_ERROR(require_open("synchronize"));
  return check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
}

int64_t CudaBackend::device_bytes_in_use() const {
  size_t free_bytes = 0, total_bytes = 0;
  if (device_ < 0 || cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return -1;
  return static_cast<int64_t>(total_bytes - free_bytes);
}

// Whole-step graphs. Thread-local capture: only this thread's work on `stream` is recorded, and a
// synchronizing call from it during the capture fails the capture instead of stalling.
Status CudaBackend::begin_capture(Stream stream) {
  MEMC_RETURN_IF_ERROR(require_open("begin_capture"));
  return check(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}

Expected<Graph> CudaBackend::end_capture(Stream stream) {
  cudaGraph_t graph = nullptr;
  MEMC_RETURN_IF_ERROR(check(cudaStreamEndCapture(as_stream(stream), &graph), "cudaStreamEndCapture"));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  MEMC_RETURN_IF_ERROR(check(e, "cudaGraphInstantiate"));
  return Graph{exec};
}

Status CudaBackend::launch(Graph graph, Stream stream) {
  return check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.handle), as_stream(stream)), "cudaGraphLaunch");
}

void CudaBackend::destroy(Graph graph) {
  if (graph.handle) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph.handle));
}

}  // namespace memc::cuda
