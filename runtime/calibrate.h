// `memc calibrate`: measures this machine for the cost model's "cpu" profile — f32 and 16-bit
// GEMM rates (large and small, for the small-op efficiency), memory bandwidth, an elementwise
// op's throughput and the executor's per-node overhead, all at one thread, then the GEMM and the
// elementwise op at memc's compute threads for the gain per extra thread — and writes a profile file that
// `memc compile --target FILE` (or MEMC_CPU_PROFILE=FILE with --target cpu) reads.
// Under mpirun (`mpirun -np N memc calibrate -o F`) it also measures the ranks' collectives over
// MPI (loopback between processes on one machine): their latency and bandwidth, which the cost
// model charges for a sharded plan's all_gather, reduce_scatter and all_reduce.
#pragma once
#include "backends/backend.h"
#include "backends/comm/communicator.h"
#include "planner/cost_model.h"

namespace memc {

// `seconds_per_probe` bounds each measurement (repeats until it is spent).
Expected<DeviceProfile> calibrate_cpu(double seconds_per_probe = 0.3);

// `memc calibrate --device cuda`: measures a GPU (`backend`) through memc's own kernels and the
// planned executor, as a training step runs them (a CUDA graph replayed from the third run on):
// the f32 and 16-bit GEMM rates (large, and small for the half-efficiency point), the memory
// bandwidth (a large add: its bytes read and written), an elementwise op's throughput, attention
// (as calibrate_cpu) and the per-node overhead of a replayed step. What it does not measure
// (host, link, NVLink and NIC bandwidths, memory size) stays `base`'s, the target's data sheet,
// whose name the profile keeps; MEMC_GPU_PROFILE=FILE applies it to that target
// (planner/cost_model.h).
// `sizes` scales the probes (tests run them small on the CPU and the CUDA host runner).
struct DeviceProbeSizes {
  int64_t gemm = 4096, low_gemm = 8192, small_gemm = 256;  // square matmuls: f32, bf16, the small f32 one
  int64_t stream = int64_t{1} << 26;                        // elements of the add and tanh probes
};
Expected<DeviceProfile> calibrate_device(Backend& backend, DeviceProfile base, double seconds_per_probe = 0.3,
                                         const DeviceProbeSizes& sizes = {});

// Collective: every rank of `comm` calls it. Fills `p.comm_latency_s` (a one-element all_reduce)
// and `p.comm_bandwidth` (the bytes one rank sends in a 64 MiB all_gather, ring-counted as
// collective_wire_bytes does, per second once the latency is taken off). Each probe runs the
// same fixed number of times on every rank and keeps the fastest.
Status calibrate_comm(comm::Communicator& comm, DeviceProfile& p);

}  // namespace memc
