#include "backends/cpu/kernels.h"

namespace memc::cpu {

void register_elementwise_kernels(KernelTable& t) {}

}  // namespace memc::cpu
