// The CUDA backend's first layer (issue 7 in progress): device probe, one-allocation device
// arenas, and elementwise kernels with f32 compute over f32/bf16/f16 storage. Plain C++
// interface; the .cu files hold everything CUDA. Built when CMake finds nvcc (MEMC_HAVE_CUDA);
// without a GPU or driver every entry point reports it as a Status, never aborts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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

enum class Storage { kF32, kBF16, kF16 };
enum class Elementwise { kAdd, kMul, kTanh, kGelu };

// out[i] = op(a[i], b[i]) (b ignored by unary ops) for `n` elements at arena offsets, in f32
// arithmetic; 16-bit storage rounds to nearest even, as the CPU backend.
Status elementwise(Elementwise op, Storage storage, const Arena& arena, int64_t a, int64_t b, int64_t out, int64_t n);
Status synchronize();

}  // namespace memc::cuda
