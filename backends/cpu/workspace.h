// Kernel scratch ("workspace"). The executor hands each kernel one 64-byte-aligned block of
// exactly the size its workspace function declared; the kernel carves sub-buffers from it
// instead of allocating. A kernel's layout is written once, as code that calls take(), and
// run twice: in counting mode (no base) by the workspace function to get the size, and over
// ctx.workspace by the kernel, so the declared size and the kernel's use cannot drift apart.
#pragma once
#include <cstdint>

#include "backends/cpu/kernels.h"

namespace memc::cpu {

class Workspace {
 public:
  static constexpr int64_t kAlignment = 64;  // every sub-buffer starts on a cache line

  Workspace() = default;  // counting mode: take() returns nullptr and only adds up bytes
  Workspace(void* base, int64_t capacity_bytes) : base_(static_cast<char*>(base)), capacity_(capacity_bytes), counting_(false) {
    MEMC_CHECK(reinterpret_cast<uintptr_t>(base) % kAlignment == 0 || capacity_bytes == 0, "kernel workspace is not 64-byte aligned");
  }
  explicit Workspace(const KernelContext& ctx) : Workspace(ctx.workspace, ctx.workspace_bytes) {}

  // `count` elements of T, rounded up to whole cache lines; count 0 takes nothing.
  template <typename T>
  T* take(int64_t count) {
    const int64_t bytes = (count * static_cast<int64_t>(sizeof(T)) + kAlignment - 1) / kAlignment * kAlignment;
    T* p = counting_ || bytes == 0 ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += bytes;
    MEMC_CHECK(counting_ || used_ <= capacity_, "kernel workspace overrun: needs ", used_, " bytes, declared ", capacity_);
    return p;
  }
  int64_t used_bytes() const { return used_; }

 private:
  char* base_ = nullptr;
  int64_t capacity_ = 0;
  int64_t used_ = 0;
  bool counting_ = true;
};

// The body of a workspace function: runs `layout`, a lambda <typename T>(Workspace&) that
// carves what the kernel carves for element type T = dtype, in counting mode.
template <typename Layout>
int64_t layout_bytes(DType dtype, Layout&& layout) {
  return dispatch_dtype(dtype, [&]<typename T>() {
    Workspace counter;
    layout.template operator()<T>(counter);
    return counter.used_bytes();
  });
}

}  // namespace memc::cpu
