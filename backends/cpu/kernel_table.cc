#include <algorithm>

#include "backends/cpu/kernels.h"
#include "backends/kernel_attrs.h"

namespace memc::cpu {

void KernelTable::add(const std::string& op, Kernel k, WorkspaceFn workspace_bytes) {
  for (const auto& e : entries) MEMC_CHECK(e.op != op, "CPU kernel registered twice: ", op);
  entries.push_back({op, k, workspace_bytes});
}

static const KernelTable& table() {
  static const KernelTable* t = [] {
    auto* table = new KernelTable();
    register_elementwise_kernels(*table);
    register_linalg_kernels(*table);
    register_reduce_kernels(*table);
    register_shape_kernels(*table);
    register_misc_kernels(*table);
    register_training_kernels(*table);
    register_optimizer_kernels(*table);
    register_collective_kernels(*table);
    return table;
  }();
  return *t;
}

static const KernelTable::Entry* find_entry(std::string_view op) {
  for (const auto& e : table().entries) {
    if (e.op == op) return &e;
  }
  return nullptr;
}

const Kernel* find_kernel(std::string_view op) {
  const KernelTable::Entry* e = find_entry(op);
  return e ? &e->kernel : nullptr;
}

int64_t cpu_workspace_bytes(const Module& module, const Node& node) {
  const KernelTable::Entry* e = find_entry(node.op);
  if (!e || !e->workspace_bytes) return 0;
  const NodeTypes types(module, node);
  return e->workspace_bytes(node, types.in, types.out);
}

std::vector<std::string> kernel_ops() {
  std::vector<std::string> out;
  for (const auto& e : table().entries) out.push_back(e.op);
  std::sort(out.begin(), out.end());
  return out;
}


}  // namespace memc::cpu
