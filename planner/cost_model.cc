#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <fstream>
#include <optional>
#include <unistd.h>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "backends/cpu/blas.h"
#include "ir/attention_layout.h"
#include "ir/op_registry.h"
#include "passes/offload.h"
#include "support/atomic_file.h"

namespace memc {

int64_t cpu_cache_bytes() {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2 > 0 ? static_cast<int64_t>(l2) : int64_t{1} << 20;
}

namespace {

using json = nlohmann::json;

DeviceProfile cpu_default() {
  // The 2-core Intel Xeon VM (AVX-512, AMX) with oneDNN, measured at one thread with
  // `memc run --profile` on vit_tiny b32 (1 and 8 micro-batches) and vit_small32 b32 (fp32 and
  // bf16-mixed), 2026-12-02 (bench/journal/2026.md §30).
  DeviceProfile p;
  p.name = "cpu";
  // GEMMs run at ≈120 GFLOP/s (vit_small32's, ViT-B/16's 114–156) after a fixed ≈3.5 µs per
  // call (vit_tiny's linear: 32 µs at 3.3 MFLOP, 7.2 µs at 0.41 MFLOP).
  p.f32_flops = 1.2e11;
  p.heavy_efficiency = 1.0;
  p.half_flops = 4e5;
  // 16-bit GEMMs: widened to f32 (conversions cost a little) unless the CPU has bf16 dot products
  // that oneDNN uses (backends/cpu/blas.h); then they run 2–4× the f32 rate (AMX on a Xeon:
  // 183–600 GFLOP/s against 93–149 f32 on one core, bench/journal/2026.md §23; vit_small32's GEMMs
  // 3.1× faster in bf16-mixed), counted as 3×.
  p.low_flops = cpu::onednn_bf16_gemm() ? 3.0 * p.f32_flops : 1.0e11;
  // Attention (backends/cpu/attention.cc) runs its block products at ≈45 % of the GEMM rate on
  // ViT-B/16 (T = 197), and a short head costs ≈5 µs (forward) to 11 µs (backward) whatever its
  // FLOPs (vit_tiny, T = 17).
  p.attention_efficiency = 0.45;
  p.attention_entry_flops = 2e5;
  // It widens bf16 operands and computes in f32 (vit_tiny b16 bf16-mixed: attention 0.85 ms
  // measured against 0.20 estimated at the bf16 GEMM rate).
  p.attention_widens = true;
  p.mem_bandwidth = 1.2e10;
  p.host_bandwidth = 1.2e10;
  p.link_bandwidth = 0;  // host and device are one memory
  p.other_efficiency = 0.1;
  // Streaming kernels reach ≈9 GB/s, three quarters of the nominal 12 (`memc calibrate`'s memcpy
  // measures 19–20 GB/s here; a kernel also computes and writes what it reads).
  p.bandwidth_efficiency = 0.75;
  // bf16 elementwise work moves half the bytes but widens and rounds: vit_small32's elementwise
  // and normalization took 0.85–1.0× their fp32 time.
  p.low_other_factor = 1.8;
  // The executor between two kernels: a step's wall time less its kernels' (vit_tiny b32:
  // 0.2 ms over 223 nodes; 8 micro-batches, 0.9 ms over ≈1,800).
  p.node_overhead_s = 1e-6;
  // Small nodes run from cache: vit_tiny b32's adds, transposes, reductions and gather_grads
  // (≤ 0.5 MB each) moved 13.3 MB in 0.41 ms, 32 GB/s (adds 85, the others 20–33), against the
  // 9 GB/s of streaming; `memc calibrate`'s (add, transpose) chain within L2 measured 22–34 GB/s.
  p.cache_bytes = cpu_cache_bytes();
  p.cache_bandwidth = 3.2e10;
  // Two threads against one on the 2-core Xeon VM (bench/journal/2026.md §29, `memc run --profile`):
  // GEMMs 1.54× (ViT-B/16 b8) and 1.59× (vit_small32 b32), the rest 1.32× and 1.35×.
  p.heavy_thread_gain = 0.55;
  p.other_thread_gain = 0.33;
  p.memory_bytes = 24LL << 30;
  // Ranks on one machine talk over MPI's shared-memory transport: `mpirun -np 2 memc calibrate`
  // measured 1.5 us and 2.1 GB/s sent per rank on a 2-core Xeon VM (bench/journal/2026.md §26).
  p.comm_bandwidth = 2e9;
  p.comm_latency_s = 2e-6;
  return p;
}

DeviceProfile gpu(const std::string& name, double f32, double low, double hbm, double link, double nvlink, double nic, int64_t memory) {
  DeviceProfile p;
  p.name = name;
  p.f32_flops = f32;
  p.low_flops = low;
  p.mem_bandwidth = hbm;
  p.host_bandwidth = 2e11;  // a dual-socket server's DRAM, shared by the host update's threads
  p.link_bandwidth = link;
  p.heavy_efficiency = 0.6;
  p.attention_efficiency = 0.6;  // cuDNN's fused attention: one kernel for every entry
  p.other_efficiency = 0.5;
  p.bandwidth_efficiency = 0.8;
  p.half_flops = 5e9;  // GPUs need big GEMMs to fill
  p.node_overhead_s = 6e-6;
  p.memory_bytes = memory;
  p.comm_bandwidth = nvlink;
  p.comm_latency_s = 2e-5;  // the flat model's (unused while the interconnect is set)
  p.interconnect = "nvlink";
  p.node_ranks = 8;
  p.nic_bandwidth = nic;
  return p;
}

}  // namespace

namespace {

// The data sheet of a GPU target, or nullopt.
std::optional<DeviceProfile> data_sheet(const std::string& target) {
  // Data sheets (SXM, dense): A100 19.5 TF f32, 312 TF bf16, 2.04 TB/s, PCIe 4 ×16;
  // H100 67 TF f32, 989 TF bf16, 3.35 TB/s, PCIe 5 ×16; H200 as H100 with 4.8 TB/s, 141 GB.
  // NVLink per GPU and direction: A100 300 GB/s (NVLink 3), H100/H200 450 GB/s (NVLink 4, NVSwitch),
  // at 80% as NCCL's bus bandwidth reaches on large messages. One InfiniBand NIC per GPU, as in
  // DGX/HGX nodes: A100 HDR 200 Gb/s, H100/H200 NDR 400 Gb/s.
  if (target == "a100") return gpu("a100", 19.5e12, 312e12, 2.039e12, 25e9, 2.4e11, 25e9, 80LL * 1000 * 1000 * 1000);
  if (target == "h100") return gpu("h100", 67e12, 989e12, 3.35e12, 50e9, 3.6e11, 50e9, 80LL * 1000 * 1000 * 1000);
  if (target == "h200") return gpu("h200", 67e12, 989e12, 4.8e12, 50e9, 3.6e11, 50e9, 141LL * 1000 * 1000 * 1000);
  return std::nullopt;
}

Expected<DeviceProfile> read_profile(const std::string& path, DeviceProfile p);

}  // namespace

Expected<DeviceProfile> gpu_data_sheet(const std::string& target) {
  if (std::optional<DeviceProfile> sheet = data_sheet(target)) return *sheet;
  return Status::BadInput(str_cat("--target ", target, ": not a100, h100 or h200"));
}

Expected<DeviceProfile> device_profile(const std::string& target) {
  if (std::optional<DeviceProfile> sheet = data_sheet(target)) {
    // A GPU target's measured profile (memc calibrate --device cuda), for the GPU it measured.
    const char* env = std::getenv("MEMC_GPU_PROFILE");
    if (env == nullptr || !*env) return *sheet;
    MEMC_ASSIGN_OR_RETURN(DeviceProfile p, read_profile(env, *sheet));
    if (p.name != target) return Status::BadInput(str_cat("MEMC_GPU_PROFILE=", env, " measured ", p.name, ", not the ", target, " of --target"));
    return p;
  }
  std::string path = target;
  if (target == "cpu") {
    const char* env = std::getenv("MEMC_CPU_PROFILE");
    if (env == nullptr || !*env) return cpu_default();
    path = env;
  }
  if (!std::ifstream(path)) return Status::BadInput("--target " + target + ": not cpu, a100, h100, h200 or a readable profile file");
  return read_profile(path, cpu_default());
}

namespace {

// A profile file's fields over `p`'s.
Expected<DeviceProfile> read_profile(const std::string& path, DeviceProfile p) {
  std::ifstream in(path);
  if (!in) return Status::BadInput(path + ": not a readable profile file");
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::BadInput(path + ": not a JSON device profile");
  try {
    p.name = j.value("name", p.name);
    p.f32_flops = j.value("f32_flops", p.f32_flops);
    p.low_flops = j.value("low_flops", p.low_flops);
    p.bf16 = j.value("bf16", p.bf16);
    p.fp16 = j.value("fp16", p.fp16);
    p.mem_bandwidth = j.value("mem_bandwidth", p.mem_bandwidth);
    p.host_bandwidth = j.value("host_bandwidth", p.host_bandwidth);
    p.link_bandwidth = j.value("link_bandwidth", p.link_bandwidth);
    p.comm_bandwidth = j.value("comm_bandwidth", p.comm_bandwidth);
    p.comm_latency_s = j.value("comm_latency_s", p.comm_latency_s);
    p.heavy_efficiency = j.value("heavy_efficiency", p.heavy_efficiency);
    p.other_efficiency = j.value("other_efficiency", p.other_efficiency);
    p.bandwidth_efficiency = j.value("bandwidth_efficiency", p.bandwidth_efficiency);
    p.half_flops = j.value("half_flops", p.half_flops);
    p.attention_efficiency = j.value("attention_efficiency", p.attention_efficiency);
    p.attention_entry_flops = j.value("attention_entry_flops", p.attention_entry_flops);
    p.attention_widens = j.value("attention_widens", p.attention_widens);
    p.low_other_factor = j.value("low_other_factor", p.low_other_factor);
    p.node_overhead_s = j.value("node_overhead_s", p.node_overhead_s);
    // A profile file without the tier was measured without one: none, not this machine's default.
    p.cache_bytes = j.value("cache_bytes", int64_t{0});
    p.cache_bandwidth = j.value("cache_bandwidth", 0.0);
    p.heavy_thread_gain = j.value("heavy_thread_gain", p.heavy_thread_gain);
    p.other_thread_gain = j.value("other_thread_gain", p.other_thread_gain);
    p.memory_bytes = j.value("memory_bytes", p.memory_bytes);
    p.interconnect = j.value("interconnect", p.interconnect);
    p.node_ranks = j.value("node_ranks", p.node_ranks);
    p.nic_bandwidth = j.value("nic_bandwidth", p.nic_bandwidth);
  } catch (const json::exception& e) {
    return Status::BadInput(path + ": " + e.what());
  }
  if (!(p.f32_flops > 0 && p.low_flops > 0 && p.mem_bandwidth > 0 && p.host_bandwidth > 0)) {
    return Status::BadInput(path + ": rates must be positive");
  }
  if (!p.interconnect.empty() && !(p.interconnect == "nvlink" || p.interconnect == "ib")) {
    return Status::BadInput(path + ": interconnect must be nvlink, ib or absent");
  }
  if (!p.interconnect.empty() && !(p.nic_bandwidth > 0 && p.node_ranks >= 1 && p.comm_bandwidth > 0)) {
    return Status::BadInput(path + ": an interconnect needs positive nic_bandwidth, comm_bandwidth and node_ranks");
  }
  if (!(p.heavy_thread_gain >= 0 && p.heavy_thread_gain <= 1 && p.other_thread_gain >= 0 && p.other_thread_gain <= 1)) {
    return Status::BadInput(path + ": thread gains must be between 0 and 1");
  }
  return p;
}

}  // namespace

Status write_profile(const std::string& path, const DeviceProfile& p) {
  json j = {{"name", p.name},
            {"f32_flops", p.f32_flops},
            {"low_flops", p.low_flops},
            {"bf16", p.bf16},
            {"fp16", p.fp16},
            {"mem_bandwidth", p.mem_bandwidth},
            {"host_bandwidth", p.host_bandwidth},
            {"link_bandwidth", p.link_bandwidth},
            {"comm_bandwidth", p.comm_bandwidth},
            {"comm_latency_s", p.comm_latency_s},
            {"heavy_efficiency", p.heavy_efficiency},
            {"other_efficiency", p.other_efficiency},
            {"bandwidth_efficiency", p.bandwidth_efficiency},
            {"half_flops", p.half_flops},
            {"attention_efficiency", p.attention_efficiency},
            {"attention_entry_flops", p.attention_entry_flops},
            {"attention_widens", p.attention_widens},
            {"low_other_factor", p.low_other_factor},
            {"node_overhead_s", p.node_overhead_s},
            {"cache_bytes", p.cache_bytes},
            {"cache_bandwidth", p.cache_bandwidth},
            {"heavy_thread_gain", p.heavy_thread_gain},
            {"other_thread_gain", p.other_thread_gain},
            {"memory_bytes", p.memory_bytes}};
  if (!p.interconnect.empty()) {
    j["interconnect"] = p.interconnect;
    j["node_ranks"] = p.node_ranks;
    j["nic_bandwidth"] = p.nic_bandwidth;
  }
  return write_file_atomic(path, j.dump(2) + "\n");
}

Status set_interconnect(DeviceProfile& p, const std::string& kind, int64_t gpus_per_node) {
  if (p.nic_bandwidth <= 0) {
    return Status::BadInput(str_cat("--interconnect ", kind, ": --target ", p.name, " is not a GPU (a100, h100 or h200)"));
  }
  if (gpus_per_node < 1) return Status::BadInput(str_cat("--gpus-per-node ", gpus_per_node, " must be at least 1"));
  if (kind == "nvlink") {
    p.node_ranks = gpus_per_node;
  } else if (kind == "ib") {
    p.node_ranks = 1;
  } else {
    return Status::BadInput("--interconnect " + kind + ": not nvlink or ib");
  }
  p.interconnect = kind;
  return Status::Ok();
}

std::string interconnect_name(const DeviceProfile& p) {
  if (p.interconnect == "nvlink") return str_cat("nvlink, ", p.node_ranks, " GPUs per node");
  return p.interconnect;
}

namespace {

// NCCL's tuning tables for the Simple and LL protocols (µs): the base latency of a ring and a
// tree call, and one hop's latency over NVLink and over the network, ring and tree.
struct NcclProtocol {
  double ring_base, tree_base, nvlink_ring, nvlink_tree, net_ring, net_tree;
  double ring_factor, tree_factor;  // the share of the bus bandwidth the protocol reaches
};
constexpr NcclProtocol kSimple{8.4, 8.4, 3.4, 28.0, 9.6, 50.0, 1.0, 0.9};
constexpr NcclProtocol kLowLatency{6.6, 6.8, 0.47, 0.52, 2.7, 5.0, 0.25, 0.9 / 3.8};

// A collective node's op without _start, and the whole buffer NCCL's model counts.
std::string_view collective_base(std::string_view op) { return op.ends_with("_start") ? op.substr(0, op.size() - 6) : op; }
int64_t collective_buffer_bytes(const Module& m, const Node& node) {
  return collective_base(node.op) == "all_gather" ? m.value(node.outputs[0]).type.bytes() : m.value(node.inputs[0]).type.bytes();
}

}  // namespace

double collective_seconds(const DeviceProfile& p, std::string_view op, int64_t bytes, int64_t ranks) {
  if (ranks <= 1) return 0;
  const auto size = static_cast<double>(bytes);
  const auto n = static_cast<double>(ranks);
  if (p.interconnect.empty()) {  // the flat model: each rank's wire bytes, as collective_wire_bytes
    const double wire = op == "all_reduce" ? 2 * size * (n - 1) / n : op == "broadcast" ? size : size * (n - 1) / n;
    return wire / p.comm_bandwidth + p.comm_latency_s;
  }
  const int64_t per_node = std::min(std::max<int64_t>(p.node_ranks, 1), ranks);
  const int64_t nodes = (ranks + per_node - 1) / per_node;
  const bool net = nodes > 1;
  const double bus = net ? std::min(p.comm_bandwidth, static_cast<double>(per_node) * p.nic_bandwidth * kNicEfficiency) : p.comm_bandwidth;
  const bool all_reduce = op == "all_reduce";
  const double steps = all_reduce ? 2 * (n - 1) : op == "broadcast" ? n : n - 1;
  const double inter_steps = (all_reduce ? 2.0 : 1.0) * static_cast<double>(nodes - 1);  // hops between nodes
  double best = std::numeric_limits<double>::infinity();
  for (const NcclProtocol& proto : {kSimple, kLowLatency}) {
    const double ring_us = proto.ring_base + (steps - inter_steps) * proto.nvlink_ring + inter_steps * proto.net_ring;
    best = std::min(best, ring_us * 1e-6 + size / (bus * proto.ring_factor * n / steps));
    if (all_reduce) {
      const double tree_us = proto.tree_base + 2 * (static_cast<double>(per_node - 1) * proto.nvlink_tree +
                                                    std::log2(static_cast<double>(nodes)) * proto.net_tree);
      best = std::min(best, tree_us * 1e-6 + size / (bus * proto.tree_factor * 0.5));
    }
  }
  return best;
}

StepEstimate estimate_step(const Module& train, const DeviceProfile& p, int64_t threads, std::map<std::string, double>* by_op) {
  const double extra = static_cast<double>(std::max<int64_t>(threads, 1) - 1);
  const double heavy_speedup = 1.0 + p.heavy_thread_gain * extra, other_speedup = 1.0 + p.other_thread_gain * extra;
  const OpRegistry& registry = OpRegistry::get();
  double seconds = 0, comm = 0;
  // An update on the host is charged at host bandwidth with its copies over the link; where
  // host and device are one memory (the CPU) it costs what it costs anywhere.
  const bool split = p.link_bandwidth > 0;
  const HostTraffic traffic = split ? host_traffic(train) : HostTraffic{};
  double comm_total = 0;
  std::unordered_map<ValueId, std::pair<double, double>> in_flight;  // pending value → (compute clock at start, its time)
  std::string_view previous_op;  // a GPU runs consecutive updates of one op, and casts, as one launch
  for (NodeId id : train.schedule()) {
    const Node& node = train.node(id);
    // (the elementwise updates: adam8bit and Adafactor launch per node)
    const bool fused = split && node.op == previous_op &&
                       (node.op == "sgd_update" || node.op == "momentum_update" || node.op == "adam_update" || node.op == "cast");
    previous_op = node.op;
    if (split && runs_on_host(train, node)) continue;
    const OpDef* def = registry.find(node.op);
    if (node.op == "constant" || (def && (def->flags & kOpView))) continue;
    if (split && def && (def->flags & kOpTransfer)) continue;  // charged as link time below
    if (def && (def->flags & kOpCollective)) {
      if (node.op.ends_with("_done")) {  // exposed: what the compute since its start did not hide
        auto it = in_flight.find(node.inputs[0]);
        if (it != in_flight.end()) comm += std::max(0.0, it->second.second - (seconds - it->second.first));
        continue;
      }
      const double t = collective_seconds(p, collective_base(node.op), collective_buffer_bytes(train, node), node.attrs.get_int("ranks", 1));
      comm_total += t;
      if (node.op.ends_with("_start")) {
        in_flight[node.outputs[0]] = {seconds, t};
      } else {
        comm += t;
      }
      continue;
    }
    const auto flops = static_cast<double>(node_flops(train, node));
    const auto bytes = static_cast<double>(node_bytes(train, node));
    bool low = false;
    for (ValueId v : node.inputs) {
      if (v == kNoValue) continue;
      const DType t = train.value(v).type.dtype;
      if (t == DType::kBF16 || t == DType::kF16) low = true;
    }
    const bool heavy = def && (def->flags & kOpComputeHeavy);
    const bool attention = node.op == "attention" || node.op == "attention_grad";
    const double rate = low ? p.low_flops : p.f32_flops;
    double compute = 0;
    if (heavy) {  // the FLOPs plus the call's fixed cost (and attention's per entry)
      const Shape& y = train.value(node.outputs[0]).type.shape;  // attention: [batch…, T, D] or as its layout says
      const double entries = attention ? static_cast<double>(numel(attention_operand_of(attention_layout_of(node.attrs), y).batch)) : 0.0;
      // A widening kernel's per-entry work (its operands converted to f32) runs at the f32 rate.
      const double entry_rate = p.attention_widens ? p.f32_flops : rate;
      const double efficiency = std::max(attention ? p.attention_efficiency : p.heavy_efficiency, 1e-6);
      compute = ((flops + p.half_flops) / rate + entries * p.attention_entry_flops / entry_rate) / efficiency / heavy_speedup;
    } else if (flops > 0) {
      compute = flops / (rate * std::max(p.other_efficiency, 1e-6)) / other_speedup;
    }
    const double streaming = p.mem_bandwidth * p.bandwidth_efficiency;
    const bool cached = p.cache_bytes > 0 && p.cache_bandwidth > streaming && bytes <= static_cast<double>(p.cache_bytes);
    const double memory = bytes / (cached ? p.cache_bandwidth : streaming) / other_speedup;
    const double node_seconds = std::max(compute, memory) * (low && !heavy ? p.low_other_factor : 1.0) + (fused ? 0.0 : p.node_overhead_s);
    seconds += node_seconds;
    if (by_op) (*by_op)[node.op] += node_seconds * 1e3;
  }
  StepEstimate e;
  e.compute_ms = seconds * 1e3;
  if (split) e.transfer_ms = static_cast<double>(traffic.link_bytes) / p.link_bandwidth * 1e3;
  e.host_ms = static_cast<double>(traffic.host_update_bytes) / (p.host_bandwidth * p.bandwidth_efficiency) * 1e3;
  e.comm_ms = comm * 1e3;
  e.comm_total_ms = comm_total * 1e3;
  e.step_ms = std::max(e.compute_ms, e.transfer_ms) + e.host_ms + e.comm_ms;
  return e;
}

}  // namespace memc
