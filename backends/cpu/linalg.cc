#include "backends/cpu/kernels.h"

namespace memc::cpu {

void register_linalg_kernels(KernelTable& t) {}

}  // namespace memc::cpu
