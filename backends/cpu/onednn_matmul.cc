#include "backends/cpu/onednn_matmul.h"

#include <omp.h>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <unordered_map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "support/status.h"

namespace memc::cpu {
namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A row-major [batch, rows, cols] operand stored transposed ([cols, rows]) when `trans`;
// batch_stride 0 means one matrix shared by every batch (dims batch 1: oneDNN broadcasts).
memory::desc operand_desc(memory::data_type dt, int64_t batch, int64_t rows, int64_t cols, bool trans, int64_t batch_stride) {
  const memory::dims row_strides = trans ? memory::dims{1, rows} : memory::dims{cols, 1};
  if (batch == 1) return memory::desc({rows, cols}, dt, row_strides);
  const int64_t b = batch_stride == 0 ? 1 : batch;
  return memory::desc({b, rows, cols}, dt, {batch_stride == 0 ? rows * cols : batch_stride, row_strides[0], row_strides[1]});
}

// The operands' type (c is f32 for kBf16ToF32).
memory::data_type onednn_type(GemmType t) { return t == GemmType::kF32 ? memory::data_type::f32 : memory::data_type::bf16; }

// A primitive with its memory objects, whose data handles are reset per call (creating memory
// objects costs as much as a small product). For a single f32 product the weights (b) are first
// reordered into the layout the kernel prefers (format_tag::any), in the user scratchpad after
// the primitive's own: reading a plain row-major b directly ran at 35–80 GFLOP/s on an
// AVX-512 Xeon when its rows are a multiple of 4 KiB apart (n = 1536, 3072), against 107–147
// with the reorder counted (bench/journal/2026.md §23). The reorder reads b once per call, O(k·n)
// next to the product's O(m·k·n). bf16 products (AMX there) read b as it is: 400–550 GFLOP/s,
// and the reorder would cost more than it saves.
struct CachedMatmul {
  dnnl::matmul::primitive_desc desc;
  dnnl::matmul primitive;
  memory a, b, c, scratchpad;
  std::unordered_map<int, memory> args;
  std::optional<dnnl::reorder> pack_b;  // user b → packed b, when the layouts differ
  memory packed_b;
  size_t primitive_scratch_bytes = 0;  // the matmul's scratchpad; packed b follows, 64-byte aligned
  size_t scratch_bytes = 0;            // all of it
  bool scratchpad_only = false;        // the kernel allocates nothing beyond the scratchpad (brgemm)
};

// oneDNN 2.6 runs a matmul either as brgemm ("brg:avx512_core"...), which takes all its memory
// from the scratchpad, or through its gemm driver ("gemm:jit"), which mallocs packing buffers on
// every call in every thread (8 KiB and up; AVX2-only CPUs and ONEDNN_MAX_CPU_ISA=AVX2 take this
// path for every shape). Only the first keeps a step inside its plan.
bool allocates_only_scratchpad(const dnnl::matmul::primitive_desc& desc) {
  const std::string impl = desc.impl_info_str();
  return impl.rfind("brg", 0) == 0;
}

CachedMatmul create(const GemmShape& s, GemmType type) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (s.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // dst = product + dst
    attr.set_post_ops(ops);
  }
  const memory::data_type dt = onednn_type(type);  // bf16 operands accumulate in f32 and round once on store
  const memory::data_type c_dt = type == GemmType::kBf16ToF32 ? memory::data_type::f32 : dt;
  const memory::desc a = operand_desc(dt, s.batch, s.m, s.k, s.trans_a, s.batch_stride_a);
  const memory::desc b = operand_desc(dt, s.batch, s.k, s.n, s.trans_b, s.batch_stride_b);
  const memory::desc c = operand_desc(c_dt, s.batch, s.m, s.n, false, s.m * s.n);
  const bool pack = s.batch == 1 && type == GemmType::kF32;
  const memory::desc b_any = pack ? memory::desc({s.k, s.n}, dt, memory::format_tag::any) : b;
  dnnl::matmul::primitive_desc desc(dnnl::matmul::desc(a, b_any, c), attr, cpu_engine());
  CachedMatmul mm{desc, dnnl::matmul(desc), memory(a, cpu_engine(), nullptr), memory(b, cpu_engine(), nullptr),
                  memory(c, cpu_engine(), nullptr), memory(), {}, std::nullopt, memory(), 0, 0};
  mm.scratchpad_only = allocates_only_scratchpad(desc);
  mm.primitive_scratch_bytes = (desc.scratchpad_desc().get_size() + 63) / 64 * 64;
  mm.scratch_bytes = mm.primitive_scratch_bytes;
  memory weights = mm.b;
  if (desc.weights_desc() != b) {
    mm.packed_b = memory(desc.weights_desc(), cpu_engine(), nullptr);
    mm.pack_b = dnnl::reorder(mm.b, mm.packed_b);
    mm.scratch_bytes += desc.weights_desc().get_size();
    weights = mm.packed_b;
  }
  mm.args = {{DNNL_ARG_SRC, mm.a}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, mm.c}};
  if (desc.scratchpad_desc().get_size()) {
    mm.scratchpad = memory(desc.scratchpad_desc(), cpu_engine(), nullptr);
    mm.args.emplace(DNNL_ARG_SCRATCHPAD, mm.scratchpad);
  }
  return mm;
}

// Primitives by shape and thread count, one cache per thread (a cached entry's memory objects
// are per call state). Creating one costs tens of microseconds; a training step reuses a few
// dozen shapes. oneDNN fixes a primitive's threads when it is created, so one created before
// set_compute_threads changed the count would keep running on the old count.
CachedMatmul& cached(const GemmShape& s, GemmType type) {
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, int64_t, int64_t, int64_t, GemmType, int>;
  thread_local std::map<Key, CachedMatmul> cache;
  const Key key{s.m, s.n, s.k, s.trans_a, s.trans_b, s.accumulate, s.batch, s.batch_stride_a, s.batch_stride_b, type, omp_get_max_threads()};
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, create(s, type)).first;
  return it->second;
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

}  // namespace

void onednn_gemm(GemmType type, void* c, const void* a, const void* b, const GemmShape& s, void* scratchpad) {
  CachedMatmul& mm = cached(s, type);
  MEMC_CHECK(mm.scratch_bytes == 0 || scratchpad, "oneDNN matmul ", s.m, "x", s.n, "x", s.k, " needs ", mm.scratch_bytes,
             " bytes of planned scratchpad and got none");
  thread_local dnnl::stream stream(cpu_engine());
  mm.a.set_data_handle(const_cast<void*>(a));
  mm.b.set_data_handle(const_cast<void*>(b));
  mm.c.set_data_handle(c);
  if (mm.desc.scratchpad_desc().get_size()) mm.scratchpad.set_data_handle(scratchpad);
  if (mm.pack_b) {
    mm.packed_b.set_data_handle(static_cast<char*>(scratchpad) + mm.primitive_scratch_bytes);
    mm.pack_b->execute(stream, mm.b, mm.packed_b);
  }
  mm.primitive.execute(stream, mm.args);
  stream.wait();
}

int64_t onednn_scratchpad_bytes(const GemmShape& s, GemmType type) {
  if (s.m == 0 || s.n == 0 || s.k == 0) return 0;
  return static_cast<int64_t>(cached(s, type).scratch_bytes);
}

bool onednn_runs_in_scratchpad(GemmShape s, GemmType type) {
  if (s.m == 0 || s.n == 0 || s.k == 0) return false;
  // Both ways: a kernel may decide to accumulate after its workspace was sized (blas.h).
  s.accumulate = false;
  if (!cached(s, type).scratchpad_only) return false;
  s.accumulate = true;
  return cached(s, type).scratchpad_only;
}

const char* onednn_isa() { return isa_name(dnnl::get_effective_cpu_isa()); }

bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
  return has;
}

bool onednn_bf16_gemm_supported() {
  static const bool on = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    const bool library_ready = isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
    return cpu_has_bf16_dot() && library_ready;
  }();
  return on;
}

namespace {

// Best of `reps` timed calls of fn (after one untimed), in GFLOP/s for `flop` operations, timed
// by this thread's CPU clock: time the thread spends preempted (another process on a busy
// machine) does not count.
template <typename Fn>
double best_gflops(double flop, int reps, Fn&& fn) {
  fn();
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    timespec t0{}, t1{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    fn();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    const double s = static_cast<double>(t1.tv_sec - t0.tv_sec) + 1e-9 * static_cast<double>(t1.tv_nsec - t0.tv_nsec);
    best = std::max(best, flop / std::max(s, 1e-9) / 1e9);
  }
  return best;
}

// The process's bf16 GEMM path: unset until pinned (a plan's record) or first asked for.
struct Bf16GemmState {
  std::optional<bool> native;
  bool pinned = false;
  std::optional<Bf16GemmProbe> probe;
};
Bf16GemmState& bf16_state() {
  static Bf16GemmState state;
  return state;
}

}  // namespace

Bf16GemmProbe bf16_gemm_probe() {
  std::optional<Bf16GemmProbe>& probe = bf16_state().probe;
  if (probe) return *probe;
  Bf16GemmProbe p;
  if (onednn_bf16_gemm_supported()) {
    // One product of a transformer linear layer's size, f32 (b packed, as gemm<float> runs it)
    // and native bf16, on this thread alone (its CPU clock times it all; the primitives cached
    // for it are keyed to one thread, so a model's GEMMs at other thread counts get their own).
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const GemmShape s{.m = kBf16ProbeSize, .n = kBf16ProbeSize, .k = kBf16ProbeSize};
    const size_t n = static_cast<size_t>(kBf16ProbeSize) * kBf16ProbeSize;
    std::vector<float> a(n, 0.5f), b(n, 0.25f), c(n);
    std::vector<uint16_t> a16(n, 0x3f00), b16(n, 0x3e80), c16(n);  // 0.5 and 0.25 in bf16
    auto scratch = [&](GemmType t) { return std::vector<char>(static_cast<size_t>(onednn_scratchpad_bytes(s, t)) + 64); };
    std::vector<char> s32 = scratch(GemmType::kF32), s16 = scratch(GemmType::kBf16);
    const double flop = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    // Rounds of one f32 and one bf16 call, back to back, so a busy moment tends to hit both of
    // a round; the decision takes the median of the rounds' ratios, the report the best rates.
    std::vector<double> ratios;
    for (int round = 0; round < kBf16ProbeRounds; ++round) {
      const double f32 = best_gflops(flop, 1, [&] { onednn_gemm(GemmType::kF32, c.data(), a.data(), b.data(), s, s32.data()); });
      const double bf16 = best_gflops(flop, 1, [&] { onednn_gemm(GemmType::kBf16, c16.data(), a16.data(), b16.data(), s, s16.data()); });
      p.f32_gflops = std::max(p.f32_gflops, f32);
      p.bf16_gflops = std::max(p.bf16_gflops, bf16);
      ratios.push_back(bf16 / std::max(f32, 1e-9));
    }
    std::sort(ratios.begin(), ratios.end());
    p.ratio = ratios[ratios.size() / 2];
    omp_set_num_threads(threads);
  }
  probe = p;
  return p;
}

bool onednn_bf16_gemm() {
  std::optional<bool>& native = bf16_state().native;
  if (!native) {
    const char* env = std::getenv("MEMC_BF16_GEMM");
    const std::string forced = env ? env : "";
    if (!onednn_bf16_gemm_supported() || forced == "0") {
      native = false;
    } else if (forced == "1") {
      native = true;
    } else {  // the CPU says it can; whether the library is faster for it is measured
      const Bf16GemmProbe p = bf16_gemm_probe();
      native = p.ratio >= kBf16NativeMinRatio;
    }
  }
  return *native;
}

bool pin_onednn_bf16_gemm(bool native) {
  Bf16GemmState& state = bf16_state();
  state.native = native && onednn_bf16_gemm_supported();
  state.pinned = true;
  return *state.native == native;
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  const Bf16GemmState& state = bf16_state();
  std::string bf16 = onednn_bf16_gemm() ? "native" : "widened to f32";
  char measured[96];
  if (!onednn_bf16_gemm_supported()) {
    bf16 += cpu_has_bf16_dot() ? " (oneDNN has no bf16 kernels for this CPU)" : " (no avx512_bf16/amx_bf16)";
  } else if (state.pinned) {
    bf16 += " (as the plan records)";
  } else if (state.probe) {
    std::snprintf(measured, sizeof measured, " (measured: bf16 %.0f, f32 %.0f GFLOP/s)", state.probe->bf16_gflops, state.probe->f32_gflops);
    bf16 += measured;
  } else {
    bf16 += " (MEMC_BF16_GEMM)";
  }
  // A transformer layer's shape tells which way f32 products go here (blas.h: gemm).
  const GemmShape layer{.m = 256, .n = 768, .k = 768};
  const std::string f32 = onednn_runs_in_scratchpad(layer, GemmType::kF32)
                              ? "f32 GEMMs oneDNN brgemm"
                              : "f32 GEMMs OpenBLAS (oneDNN's gemm driver here allocates per call)";
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + ", ISA " +
         onednn_isa() + ", " + f32 + ", bf16 GEMMs " + bf16;
}

void set_onednn_threads(int threads) { omp_set_num_threads(threads); }
int onednn_threads() { return omp_get_max_threads(); }

}  // namespace memc::cpu
