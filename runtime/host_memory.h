// Host memory outside the planned arena: the GEMM library's buffers. OpenBLAS maps a 128 MiB
// buffer for each thread that runs a GEMM, on first use, and retries a failed mmap forever
// (a run under `ulimit -v` spun at 100% CPU). prepare_host_memory() runs before any GEMM: under
// a finite address-space limit (RLIMIT_AS) it lowers the GEMM thread count to what the limit
// holds, checks that their buffers can be mapped, and maps them with one tiny GEMM, so no later
// GEMM allocates. Without a limit it changes nothing.
#pragma once
#include <cstdint>

#include "support/status.h"

namespace memc {

// OpenBLAS's per-thread buffer (BUFFER_SIZE of Debian's x86_64 build, measured with strace:
// 134,217,728 bytes, tried again up to 135,266,304 with its alignment slack).
inline constexpr int64_t kGemmBufferBytes = int64_t{129} << 20;

struct HostMemory {
  int64_t address_limit_bytes = -1;  // RLIMIT_AS; -1: unlimited
  int64_t gemm_threads = 0;          // threads OpenBLAS may use
  int64_t gemm_buffer_bytes = 0;     // their buffers, outside the arena: threads × kGemmBufferBytes (mapped up
                                     // front under a limit, lazily by OpenBLAS without one)
};

// Exit 1 with one line when even one GEMM buffer does not fit under the limit.
Expected<HostMemory> prepare_host_memory();
// What prepare_host_memory() settled (for reports).
const HostMemory& host_memory();

}  // namespace memc
