#include "runtime/device_memory.h"

#include <cstdlib>
#include <cstring>

namespace memc {

Expected<DeviceMemory::Block> DeviceMemory::allocate(int64_t bytes, const std::string& what) {
  if (bytes < 0) return Status::Internal("negative allocation for " + what);
  const size_t padded = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, padded);
  if (!p) return Status::BadInput(str_cat("out of device memory allocating ", bytes, " bytes for ", what));
  std::memset(p, 0, padded);
  *current_ += bytes;
  *peak_ = std::max(*peak_, *current_);
  auto current = current_;
  return Block(p, [current, bytes](void* q) {
    std::free(q);
    *current -= bytes;
  });
}

}  // namespace memc
