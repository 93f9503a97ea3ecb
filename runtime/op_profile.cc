#include "runtime/op_profile.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <map>
#include <mutex>
#include <vector>

#include "ir/op_registry.h"

namespace memc {
namespace {

struct Span {
  int64_t node = -1, pair = -1;
  std::string op;
  double start_ms = 0, end_ms = 0;
};

struct Profile {
  bool enabled = false;
  std::mutex mutex;  // ranks are processes, but kernels may record from a helper thread later
  std::map<std::string, OpTime> by_op;
  std::chrono::steady_clock::time_point step_origin;
  std::vector<Span> spans;  // the current (last) profiled training step's
  std::vector<double> transfers;  // its collectives' device times, in start order
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

void begin_profiled_step() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.spans.clear();
  p.transfers.clear();
  p.step_origin = std::chrono::steady_clock::now();
}

double profiled_step_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - profile().step_origin).count();
}

void record_span(int64_t node, int64_t pair, const std::string& op, double start_ms, double end_ms) {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.spans.push_back({node, pair, op, start_ms, end_ms});
}

void record_collective_transfers(std::vector<double> ms) {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.transfers = std::move(ms);
}

StepTimeline last_step_timeline() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  StepTimeline t;
  if (p.spans.empty()) return t;
  t.step_ms = p.spans.back().end_ms - p.spans.front().start_ms;
  std::unordered_map<int64_t, size_t> started;  // a start node → its collective
  const OpRegistry& registry = OpRegistry::get();
  for (const Span& s : p.spans) {
    const OpDef* def = registry.find(s.op);
    if (!def || !(def->flags & kOpCollective)) {
      t.kernel_ms += s.end_ms - s.start_ms;
      continue;
    }
    const std::string_view op(s.op);
    if (op.ends_with("_start")) {
      started[s.node] = t.collectives.size();
      // the start kernel's own span counts as waiting: the step spent it on the collective
      t.collectives.push_back({std::string(op.substr(0, op.size() - 6)), s.start_ms, s.end_ms, s.end_ms - s.start_ms});
    } else if (op.ends_with("_done")) {
      if (auto it = started.find(s.pair); it != started.end()) {
        CollectiveSpan& c = t.collectives[it->second];
        c.wait_ms += s.end_ms - s.start_ms;
        c.end_ms = s.end_ms;
      }
    } else {
      t.collectives.push_back({s.op, s.start_ms, s.end_ms, s.end_ms - s.start_ms});
    }
  }
  for (size_t i = 0; i < t.collectives.size() && i < p.transfers.size(); ++i) {
    if (p.transfers[i] == p.transfers[i]) t.collectives[i].transfer_ms = p.transfers[i];  // NaN: unknown
  }
  return t;
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
      {"matmul", "gemm"}, {"matmul_bgrad", "gemm"}, {"matmul_acc", "gemm"}, {"linear", "gemm"}, {"conv", "gemm"},
      {"attention", "attention"}, {"attention_grad", "attention"},
      {"sgd_update", "optimizer"}, {"momentum_update", "optimizer"}, {"adam_update", "optimizer"},
      {"adam8bit_update", "optimizer"}, {"adafactor_update", "optimizer"},
      {"layernorm", "normalization"}, {"add_layernorm", "normalization"}, {"layernorm_grad", "normalization"}, {"softmax", "normalization"},
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
