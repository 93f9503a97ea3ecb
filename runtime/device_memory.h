// The device-memory accountant: every byte memc allocates on a device goes through it (arenas,
// kernel workspace, communication buffers), so the measured peak is the high-water mark of
// real allocations — not the planned number read back. It allocates through the Backend seam:
// on the CPU backend "device" memory is a heap kept apart from host memory, so budgets are
// exercised without a GPU; on CUDA it is cudaMalloc. Host arenas (offloaded values) are counted
// apart, as host bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "support/status.h"

namespace memc {

class DeviceMemory {
 public:
  explicit DeviceMemory(Backend& backend = cpu_backend()) : backend_(&backend) {}

  // One allocation; freed (and accounted) when the last owner drops it.
  using Block = std::shared_ptr<void>;
  // Device memory, zero-filled; `what` names it in the out-of-memory error.
  Expected<Block> allocate(int64_t bytes, const std::string& what);
  // Pinned host memory (the host arena of offloaded values), zero-filled; counted as host bytes.
  Expected<Block> allocate_host(int64_t bytes, const std::string& what);

  Backend& backend() const { return *backend_; }
  int64_t current_bytes() const { return device_->current; }
  int64_t peak_bytes() const { return device_->peak; }
  int64_t host_peak_bytes() const { return host_->peak; }
  void reset_peak() { device_->peak = device_->current; }

 private:
  struct Counter {
    int64_t current = 0, peak = 0;
  };
  Expected<Block> allocate_kind(MemoryKind kind, int64_t bytes, const std::string& what, std::shared_ptr<Counter> counter);
  Backend* backend_;
  // Shared with the blocks' deleters, which may outlive a moved-from accountant.
  std::shared_ptr<Counter> device_ = std::make_shared<Counter>();
  std::shared_ptr<Counter> host_ = std::make_shared<Counter>();
};

}  // namespace memc
