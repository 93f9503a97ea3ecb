#include "runtime/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/blas.h"
#include "ir/grad.h"  // make_attrs
#include "ir/op_registry.h"
#include "runtime/host_memory.h"
#include "runtime/planned_executor.h"

namespace memc {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `body` repeatedly for about `budget` seconds; returns seconds per call (best of runs).
template <typename F>
double time_per_call(double budget, F&& body) {
  body();  // warm up
  double best = 1e30, spent = 0;
  while (spent < budget) {
    const auto start = Clock::now();
    body();
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, t);
    spent += t;
  }
  return best;
}

// Seconds per step of `m` on `backend` through the planned executor (best of the replays).
Status time_planned(Backend& backend, double budget, const Module& m, double& seconds) {
  DeviceMemory memory(backend);
  MEMC_ASSIGN_OR_RETURN(PlannedExecutor ex, PlannedExecutor::create(m, memory));
  Status status = Status::Ok();
  seconds = time_per_call(budget, [&] {
    if (status.ok()) status = ex.run({});
  });
  return status;
}

// One node of `op` on inputs of `types` (attributes `attrs`), as a module.
Expected<Module> one_node(const std::string& op, const std::vector<TensorType>& types, Attrs attrs = {}) {
  Module m;
  std::vector<ValueId> inputs;
  for (size_t i = 0; i < types.size(); ++i) inputs.push_back(m.add_argument(str_cat("x", i), types[i], Role::kInput));
  MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> y, m.add_node(op, inputs, std::move(attrs)));
  m.set_outputs(y);
  return m;
}

// FLOP/s of an [n, n] · [n, n] matmul in `dtype`: a chain of `chain` of them, each one's time
// less `overhead`.
Expected<double> device_gemm_rate(Backend& backend, double budget, DType dtype, int64_t n, int chain = 1, double overhead = 0) {
  Module m;
  const TensorType type{dtype, {n, n}};
  ValueId y = m.add_argument("a", type, Role::kInput);
  const ValueId b = m.add_argument("b", type, Role::kInput);
  for (int i = 0; i < chain; ++i) {
    MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> out, m.add_node("matmul", {y, b}));
    y = out[0];
  }
  m.set_outputs({y});
  double t = 0;
  MEMC_RETURN_IF_ERROR(time_planned(backend, budget, m, t));
  return 2.0 * static_cast<double>(n * n * n) / std::max(t / chain - overhead, 1e-12);
}

template <typename T>
double gemm_rate(int64_t n, double budget) {
  std::vector<T> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = static_cast<T>(static_cast<float>(i % 7) * 0.1f);
  std::vector<float> scratch(static_cast<size_t>(cpu::gemm_scratch_floats<T>({n, n, n})));
  const double t = time_per_call(budget, [&] { cpu::gemm<T>(c.data(), a.data(), b.data(), {n, n, n}, scratch.data()); });
  return 2.0 * static_cast<double>(n * n * n) / t;
}

// The cache tier: 32 chained (add, transpose) pairs over an [r, r] f32 matrix whose add's 12r²
// bytes are three quarters of the L2: a small model's streaming ops are both kinds (elementwise
// at the cache's full rate, copies and reductions with strided reads). After the node overhead.
template <typename RunPlanned>
Status calibrate_cache(DeviceProfile& p, RunPlanned&& run_planned) {
  p.cache_bytes = cpu_cache_bytes();
  const auto r = static_cast<int64_t>(std::sqrt(static_cast<double>(std::max<int64_t>(p.cache_bytes / 16, 1024))));
  Module m;
  const ValueId x = m.add_argument("x", TensorType{DType::kF32, {r, r}}, Role::kInput);
  ValueId v = x;
  for (int i = 0; i < 32; ++i) {
    MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> sum, m.add_node("add", {v, x}));
    MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> t, m.add_node("transpose", {sum[0]}, make_attrs({{"perm", std::vector<int64_t>{1, 0}}})));
    v = t[0];
  }
  m.set_outputs({v});
  double t = 0;
  MEMC_RETURN_IF_ERROR(run_planned(m, t));
  p.cache_bandwidth = 20.0 * static_cast<double>(r * r) / std::max(t / 32 - 2 * p.node_overhead_s, 1e-9);
  return Status::Ok();
}

// Attention: a long head (T = 197, ViT-B/16's) and many short ones (T = 16). Each takes
// (FLOPs + half_flops + entries · entry_flops) / (f32 rate · efficiency): two equations for the
// efficiency and the per-entry cost. `run_planned(module, seconds)` times a module's step; a
// GPU's probes chain `repeats` nodes (each one's output the next one's q) and count each node's
// time less `overhead` (the cost model charges that per node apart).
template <typename RunPlanned>
Status calibrate_attention(DeviceProfile& p, RunPlanned&& run_planned, int repeats = 1, double overhead = 0) {
  struct Probe {
    int64_t entries, t, d;
    double seconds = 0, flops = 0;
  };
  Probe probes[] = {{16, 197, 64}, {256, 16, 16}};
  for (Probe& probe : probes) {
    Module m;
    const TensorType type{DType::kF32, {probe.entries, probe.t, probe.d}};
    const ValueId q = m.add_argument("q", type, Role::kInput), k = m.add_argument("k", type, Role::kInput),
                  v = m.add_argument("v", type, Role::kInput);
    ValueId y = q;
    for (int i = 0; i < repeats; ++i) {
      MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> out, m.add_node("attention", {y, k, v}));
      y = out[0];
    }
    m.set_outputs({y});
    MEMC_RETURN_IF_ERROR(run_planned(m, probe.seconds));
    probe.seconds = std::max(probe.seconds / repeats - overhead, 1e-12);
    probe.flops = static_cast<double>(node_flops(m, m.node(m.schedule()[0])));
  }
  // a_i · e − n_i · c = f_i + h, with a_i = t_i · rate
  const double a0 = probes[0].seconds * p.f32_flops, a1 = probes[1].seconds * p.f32_flops;
  const double n0 = static_cast<double>(probes[0].entries), n1 = static_cast<double>(probes[1].entries);
  const double r0 = probes[0].flops + p.half_flops, r1 = probes[1].flops + p.half_flops;
  const double det = -a0 * n1 + a1 * n0;
  if (det != 0) {
    p.attention_efficiency = std::clamp((-r0 * n1 + r1 * n0) / det, 0.01, 1.0);
    p.attention_entry_flops = std::max(0.0, (a0 * p.attention_efficiency - r0) / n0);
  }
  return Status::Ok();
}

// The elementwise rate (tanh over `n` elements in f32 and bf16, FLOPs as the registry counts
// them) relative to the f32 GEMM rate; returns tanh's f32 seconds.
template <typename RunPlanned>
Expected<double> calibrate_elementwise(DeviceProfile& p, RunPlanned&& run_planned, int64_t n) {
  MEMC_ASSIGN_OR_RETURN(const Module tanh_f32, one_node("tanh", {TensorType{DType::kF32, {n}}}));
  MEMC_ASSIGN_OR_RETURN(const Module tanh_low, one_node("tanh", {TensorType{DType::kBF16, {n}}}));
  double t_tanh = 0, t_low = 0;
  MEMC_RETURN_IF_ERROR(run_planned(tanh_f32, t_tanh));
  MEMC_RETURN_IF_ERROR(run_planned(tanh_low, t_low));
  const double flops = static_cast<double>(node_flops(tanh_f32, tanh_f32.node(tanh_f32.schedule()[0])));
  p.other_efficiency = std::clamp(flops / std::max(t_tanh, 1e-12) / p.f32_flops, 1e-4, 1.0);
  p.low_other_factor = std::max(1.0, t_low / std::max(t_tanh, 1e-12));
  return t_tanh;
}

// The per-node overhead: 512 chained one-element adds.
template <typename RunPlanned>
Status calibrate_node_overhead(DeviceProfile& p, RunPlanned&& run_planned) {
  Module m;
  ValueId v = m.add_argument("x", TensorType{DType::kF32, {1}}, Role::kInput);
  for (int i = 0; i < 512; ++i) {
    MEMC_ASSIGN_OR_RETURN(const std::vector<ValueId> sum, m.add_node("add", {v, v}));
    v = sum[0];
  }
  m.set_outputs({v});
  double t = 0;
  MEMC_RETURN_IF_ERROR(run_planned(m, t));
  p.node_overhead_s = t / 512;
  return Status::Ok();
}

}  // namespace

Expected<DeviceProfile> calibrate_cpu(double budget) {
  Expected<DeviceProfile> base = device_profile("cpu");
  if (!base.ok()) return base.status();
  DeviceProfile p = *base;
  p.name = "cpu";
  // Every rate at one thread; then the GEMM and the tanh again at the compute threads memc runs
  // with, for the profile's thread gains (planner/cost_model.h).
  const int64_t threads = std::max<int64_t>(host_memory().threads, 1);
  set_compute_threads(1);
  // GEMM: the rate of a large product, and a small one for the half-efficiency point
  // (efficiency(f) = f/(f + half) relative to the large rate).
  const double big = gemm_rate<float>(1024, budget);
  const double small = gemm_rate<float>(48, budget);
  p.f32_flops = big;
  p.heavy_efficiency = 1.0;
  const double f_small = 2.0 * 48 * 48 * 48;
  p.half_flops = small < big ? f_small * (big / small - 1.0) : 1.0;
  p.low_flops = gemm_rate<bf16_t>(512, budget);
  // Memory bandwidth: a copy of 256 MB (read + write).
  const size_t bytes = size_t{256} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double t_copy = time_per_call(budget, [&] { std::memcpy(dst.data(), src.data(), bytes); });
  p.mem_bandwidth = p.host_bandwidth = 2.0 * static_cast<double>(bytes) / t_copy;
  p.bandwidth_efficiency = 1.0;
  // Elementwise compute, attention and per-node overhead through the planned executor that
  // training uses.
  auto run_planned = [&](const Module& m, double& seconds) { return time_planned(cpu_backend(), budget, m, seconds); };
  MEMC_ASSIGN_OR_RETURN(const double t_tanh, calibrate_elementwise(p, run_planned, int64_t{1} << 22));
  MEMC_RETURN_IF_ERROR(calibrate_attention(p, run_planned));
  MEMC_RETURN_IF_ERROR(calibrate_node_overhead(p, run_planned));
  MEMC_RETURN_IF_ERROR(calibrate_cache(p, run_planned));
  set_compute_threads(threads);
  p.heavy_thread_gain = p.other_thread_gain = 0;
  if (threads > 1) {
    const double extra = static_cast<double>(threads - 1);
    double t_tanh_threads = 0;
    MEMC_ASSIGN_OR_RETURN(const Module tanh_f32, one_node("tanh", {TensorType{DType::kF32, {int64_t{1} << 22}}}));
    MEMC_RETURN_IF_ERROR(run_planned(tanh_f32, t_tanh_threads));
    p.heavy_thread_gain = std::clamp((gemm_rate<float>(1024, budget) / big - 1.0) / extra, 0.0, 1.0);
    p.other_thread_gain = std::clamp((t_tanh / std::max(t_tanh_threads, 1e-9) - 1.0) / extra, 0.0, 1.0);
  }
  p.link_bandwidth = 0;
  return p;
}

Expected<DeviceProfile> calibrate_device(Backend& backend, DeviceProfile p, double budget, const DeviceProbeSizes& sizes) {
  auto run_planned = [&](const Module& m, double& seconds) { return time_planned(backend, budget, m, seconds); };
  // A step's fixed cost (the step number's copy, the graph launch, the sync) would dominate a
  // small probe: the per-node overhead first, then small probes as chains of 32 nodes, each
  // node's time less that overhead.
  constexpr int kChain = 32;
  MEMC_RETURN_IF_ERROR(calibrate_node_overhead(p, run_planned));
  // GEMMs: a large product's rate in f32 (TF32 off, the default) and bf16, and a small f32 one
  // for the half-efficiency point, as calibrate_cpu.
  MEMC_ASSIGN_OR_RETURN(p.f32_flops, device_gemm_rate(backend, budget, DType::kF32, sizes.gemm));
  MEMC_ASSIGN_OR_RETURN(p.low_flops, device_gemm_rate(backend, budget, DType::kBF16, sizes.low_gemm));
  MEMC_ASSIGN_OR_RETURN(const double small, device_gemm_rate(backend, budget, DType::kF32, sizes.small_gemm, kChain, p.node_overhead_s));
  p.heavy_efficiency = 1.0;
  const double f_small = 2.0 * std::pow(static_cast<double>(sizes.small_gemm), 3);
  p.half_flops = small < p.f32_flops ? f_small * (p.f32_flops / small - 1.0) : 1.0;
  // Memory: an add of two f32 vectors (256 MiB each by default), read and written per call.
  const int64_t n = sizes.stream;
  MEMC_ASSIGN_OR_RETURN(const Module add, one_node("add", {TensorType{DType::kF32, {n}}, TensorType{DType::kF32, {n}}}));
  double t_add = 0;
  MEMC_RETURN_IF_ERROR(run_planned(add, t_add));
  p.mem_bandwidth = 12.0 * static_cast<double>(n) / std::max(t_add, 1e-12);
  p.bandwidth_efficiency = 1.0;
  MEMC_RETURN_IF_ERROR(calibrate_elementwise(p, run_planned, n).status());
  MEMC_RETURN_IF_ERROR(calibrate_attention(p, run_planned, kChain, p.node_overhead_s));
  p.cache_bytes = 0, p.cache_bandwidth = 0;  // no cache tier on a GPU
  p.heavy_thread_gain = p.other_thread_gain = 0;
  return p;
}

Status calibrate_comm(comm::Communicator& comm, DeviceProfile& p) {
  const int ranks = comm.size();
  // Fastest of `reps` calls, each started together (a barrier before each).
  auto fastest = [&](int reps, auto&& body) -> Expected<double> {
    double best = 1e30;
    for (int i = 0; i <= reps; ++i) {  // the first call warms up
      MEMC_RETURN_IF_ERROR(comm.barrier());
      const auto start = Clock::now();
      MEMC_RETURN_IF_ERROR(body());
      const double t = std::chrono::duration<double>(Clock::now() - start).count();
      if (i > 0) best = std::min(best, t);
    }
    // Every rank takes the slowest rank's figure: a collective ends when the last rank is done.
    double slowest = 0;
    MEMC_RETURN_IF_ERROR(comm.all_reduce(&best, &slowest, 1, DType::kF64, comm::ReduceOp::kMax));
    return slowest;
  };
  float one = 1, sum = 0;
  MEMC_ASSIGN_OR_RETURN(const double latency, fastest(200, [&] { return comm.all_reduce(&one, &sum, 1, DType::kF32); }));
  const int64_t block = int64_t{16} << 20;  // floats per rank: 64 MiB
  std::vector<float> send(static_cast<size_t>(block), 1.0f), recv(static_cast<size_t>(block * ranks));
  MEMC_ASSIGN_OR_RETURN(const double gather, fastest(5, [&] { return comm.all_gather(send.data(), recv.data(), block, DType::kF32); }));
  const double wire = static_cast<double>((ranks - 1) * block * 4);  // ring: each rank sends the others' share once
  p.comm_latency_s = latency;
  p.comm_bandwidth = wire / std::max(gather - latency, 1e-9);
  return Status::Ok();
}

}  // namespace memc
