// The device-memory accountant: every byte memc allocates on a device goes through it (arenas,
// kernel workspace, communication buffers), so the measured peak is the high-water mark of
// real allocations — not the planned number read back. On the CPU backend "device" memory is
// this allocator's heap, kept apart from host memory so budgets are exercised without a GPU.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "support/status.h"

namespace memc {

class DeviceMemory {
 public:
  // One allocation; freed (and accounted) when the last owner drops it.
  using Block = std::shared_ptr<void>;
  // 64-byte aligned, zero-filled; `what` names it in the out-of-memory error.
  Expected<Block> allocate(int64_t bytes, const std::string& what);
  int64_t current_bytes() const { return *current_; }
  int64_t peak_bytes() const { return *peak_; }
  void reset_peak() { *peak_ = *current_; }

 private:
  // Shared with the blocks' deleters, which may outlive a moved-from accountant.
  std::shared_ptr<int64_t> current_ = std::make_shared<int64_t>(0);
  std::shared_ptr<int64_t> peak_ = std::make_shared<int64_t>(0);
};

}  // namespace memc
