// `memc calibrate`: measures this machine for the cost model's "cpu" profile — f32 and 16-bit
// GEMM rates (large and small, for the small-op efficiency), memory bandwidth, an elementwise
// op's throughput and the executor's per-node overhead — and writes a profile file that
// `memc compile --target FILE` (or MEMC_CPU_PROFILE=FILE with --target cpu) reads.
#pragma once
#include "planner/cost_model.h"

namespace memc {

// `seconds_per_probe` bounds each measurement (repeats until it is spent).
Expected<DeviceProfile> calibrate_cpu(double seconds_per_probe = 0.3);

}  // namespace memc
