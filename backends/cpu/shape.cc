#include "backends/cpu/kernels.h"

namespace memc::cpu {

void register_shape_kernels(KernelTable& t) {}

}  // namespace memc::cpu
