#include "backends/cpu/cpu_backend.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "backends/cpu/kernels.h"

namespace memc::cpu {

const Kernel* CpuBackend::find_kernel(std::string_view op) const { return cpu::find_kernel(op); }

int64_t CpuBackend::workspace_bytes(const Module& module, const Node& node) const { return cpu_workspace_bytes(module, node); }

Expected<void*> CpuBackend::allocate(MemoryKind kind, int64_t bytes) {
  if (bytes < 0) return Status::Internal(str_cat("negative ", memory_kind_name(kind), " allocation"));
  constexpr size_t kAlign = 256;  // what cudaMalloc gives, so layouts agree across backends
  const size_t padded = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, padded);
  if (!p) return Status::BadInput(str_cat("out of ", memory_kind_name(kind), " memory allocating ", bytes, " bytes"));
  return p;
}

// A large block is its own anonymous mapping: the kernel hands out zero pages and backs each only
// when it is first written, so an arena costs resident memory as the step reaches it (not all at
// once when it is zeroed), and its pages go back to the system when it is freed (glibc may keep a
// freed heap block).
Expected<void*> CpuBackend::allocate_zeroed(MemoryKind kind, int64_t bytes) {
  if (bytes < kMappedBytes) return Backend::allocate_zeroed(kind, bytes);
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::BadInput(str_cat("out of ", memory_kind_name(kind), " memory allocating ", bytes, " bytes"));
  std::lock_guard<std::mutex> lock(mapped_mutex_);
  mapped_[p] = bytes;
  return p;
}

void CpuBackend::deallocate(MemoryKind, void* p) {
  {
    std::lock_guard<std::mutex> lock(mapped_mutex_);
    if (auto it = mapped_.find(p); it != mapped_.end()) {
      ::munmap(p, static_cast<size_t>(it->second));
      mapped_.erase(it);
      return;
    }
  }
  std::free(p);
}

Status CpuBackend::fill(void* p, uint8_t byte, int64_t bytes) {
  if (bytes > 0) std::memset(p, byte, static_cast<size_t>(bytes));
  return Status::Ok();
}

Status CpuBackend::copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(bytes));
  return Status::Ok();
}

Status CpuBackend::copy_async(void* dst, const void* src, int64_t bytes, Stream) { return copy(dst, src, bytes); }

}  // namespace memc::cpu
