#include "runtime/op_profile.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "ir/op_registry.h"

namespace memc {
namespace {

struct Profile {
  bool enabled = false;
  std::mutex mutex;  // ranks are processes, but kernels may record from a helper thread later
  std::map<std::string, OpTime> by_op;
};

Profile& profile() {
  static Profile p;
  return p;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

void enable_op_profile() { profile().enabled = true; }
bool op_profile_enabled() { return profile().enabled; }

void record_op_time(const std::string& op, double ms) {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  OpTime& t = p.by_op[op];
  if (t.op.empty()) t.op = op, t.category = op_category(op);
  t.ms += ms;
  ++t.calls;
}

std::vector<OpTime> op_profile() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  std::vector<OpTime> out;
  for (const auto& [op, t] : p.by_op) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

std::string op_category(const std::string& op) {
  static const std::map<std::string, std::string> exact = {
      {"matmul", "gemm"}, {"linear", "gemm"}, {"conv", "gemm"},
      {"attention", "attention"}, {"attention_grad", "attention"},
      {"sgd_update", "optimizer"}, {"momentum_update", "optimizer"}, {"adam_update", "optimizer"},
      {"adam8bit_update", "optimizer"}, {"adafactor_update", "optimizer"},
      {"layernorm", "normalization"}, {"layernorm_grad", "normalization"}, {"softmax", "normalization"},
      {"log_softmax", "normalization"}, {"softmax_grad", "normalization"}, {"log_softmax_grad", "normalization"},
      {"copy", "copies"}, {"cast", "copies"}, {"transpose", "copies"}, {"concat", "copies"}, {"slice", "copies"},
      {"slice_grad", "copies"}, {"gather", "copies"}, {"gather_grad", "copies"}, {"pad", "copies"}, {"expand", "copies"}, {"gather_elements", "copies"}, {"gather_elements_grad", "copies"},
      {"tile", "copies"}, {"reshape", "copies"}, {"copy_to_host", "copies"}, {"copy_to_device", "copies"},
      {"copy_to_host_start", "copies"}, {"copy_to_host_done", "copies"}, {"copy_to_device_start", "copies"}, {"copy_to_device_done", "copies"},
      {"split_flat", "copies"}, {"shard_block", "copies"},
      {"softmax_cross_entropy", "loss"}, {"softmax_cross_entropy_grad", "loss"},
  };
  if (auto it = exact.find(op); it != exact.end()) return it->second;
  // Collectives and their async pairs (all_gather_start, reduce_scatter_done, …).
  if (const OpDef* def = OpRegistry::get().find(op); def && (def->flags & kOpCollective)) return "collective";
  if (starts_with(op, "conv_")) return "gemm";
  if (starts_with(op, "reduce_") || op == "argmax" || op == "argmin" || op == "cumsum") return "reduction";
  return "elementwise";
}

}  // namespace memc
