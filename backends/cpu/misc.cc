// CPU kernels for the ops of ir/ops/misc.cc.
#include "backends/cpu/kernels.h"

namespace memc::cpu {

void register_misc_kernels(KernelTable& t) {}

}  // namespace memc::cpu
