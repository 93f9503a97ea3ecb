#include "runtime/device_memory.h"

namespace memc {

Expected<DeviceMemory::Block> DeviceMemory::allocate(int64_t bytes, const std::string& what) {
  return allocate_kind(MemoryKind::kDevice, bytes, what, device_);
}

Expected<DeviceMemory::Block> DeviceMemory::allocate_host(int64_t bytes, const std::string& what) {
  return allocate_kind(MemoryKind::kPinnedHost, bytes, what, host_);
}

Expected<DeviceMemory::Block> DeviceMemory::allocate_kind(MemoryKind kind, int64_t bytes, const std::string& what,
                                                          std::shared_ptr<Counter> counter) {
  if (bytes < 0) return Status::Internal("negative allocation for " + what);
  // Zeroed once: optimizer states start at zero; nothing is cleared per step afterwards.
  Expected<void*> p = backend_->allocate_zeroed(kind, bytes);
  if (!p.ok()) return p.status().with_context(what + ": ");
  Backend* backend = backend_;
  Block block(*p, [backend, kind, counter, bytes](void* q) {
    backend->deallocate(kind, q);
    counter->current -= bytes;
  });
  counter->current += bytes;
  counter->peak = std::max(counter->peak, counter->current);
  return block;
}

}  // namespace memc
