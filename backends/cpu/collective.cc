// Collective kernels (ir/ops/collective.cc) on CPU ranks: backends/collective_kernels.h over
// host copies (arena buffers are host memory on the CPU backend; MPI's blocks land in them).
// split_flat needs no communication: it copies the pieces of a flat buffer.
#include <cstring>
#include <string>

#include "backends/collective_kernels.h"
#include "backends/cpu/kernels.h"
#include "ir/ops/ops.h"

namespace memc::cpu {
namespace {

struct HostCopy {
  explicit HostCopy(const KernelContext&) {}
  Status operator()(void* dst, const void* src, int64_t bytes) const {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return Status::Ok();
  }
};

// Pieces of a flat buffer at their offsets (a unit's gathered parameters).
Status split_flat_kernel(KernelContext& ctx) {
  const char* x = static_cast<const char*>(ctx.inputs[0]->raw());
  const std::vector<int64_t> offsets = split_flat_offsets(ctx.node.attrs);
  const size_t elem = dtype_size(ctx.inputs[0]->dtype());
  for (size_t i = 0; i < ctx.outputs.size(); ++i) std::memcpy(ctx.outputs[i]->raw(), x + offsets[i] * elem, ctx.outputs[i]->nbytes());
  return Status::Ok();
}

}  // namespace

void register_collective_kernels(KernelTable& t) {
  collective::register_kernels<HostCopy>([&](const char* op, Kernel kernel) { t.add(op, kernel); });
  t.add("split_flat", split_flat_kernel);
}

}  // namespace memc::cpu
