#include <algorithm>

#include "backends/cpu/kernels.h"

namespace memc::cpu {

void KernelTable::add(const std::string& op, Kernel k) {
  for (const auto& e : entries) MEMC_CHECK(e.first != op, "CPU kernel registered twice: ", op);
  entries.emplace_back(op, k);
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
    return table;
  }();
  return *t;
}

const Kernel* find_kernel(const std::string& op) {
  for (const auto& e : table().entries) {
    if (e.first == op) return &e.second;
  }
  return nullptr;
}

std::vector<std::string> kernel_ops() {
  std::vector<std::string> out;
  for (const auto& e : table().entries) out.push_back(e.first);
  std::sort(out.begin(), out.end());
  return out;
}

uint32_t counter_random(uint64_t seed, uint64_t stream, uint64_t index) {
  // SplitMix64 over a combined counter: statistically sound, stateless and cheap.
  uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (stream + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ index;
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 16);
}

}  // namespace memc::cpu
