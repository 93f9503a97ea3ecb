#include "backends/cpu/onednn_matmul.h"

#include <omp.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <unordered_map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

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

memory::data_type onednn_type(GemmType t) { return t == GemmType::kBf16 ? memory::data_type::bf16 : memory::data_type::f32; }

// A primitive with its memory objects, whose data handles are reset per call (creating memory
// objects costs as much as a small product). For a single f32 product the weights (b) are first
// reordered into the layout the kernel prefers (format_tag::any), in the user scratchpad after
// the primitive's own: reading a plain row-major b directly ran at 35–80 GFLOP/s on an
// AVX-512 Xeon when its rows are a multiple of 4 KiB apart (n = 1536, 3072), against 107–147
// with the reorder counted (bench/RESULTS.md §23). The reorder reads b once per call, O(k·n)
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
};

CachedMatmul create(const GemmShape& s, GemmType type) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (s.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // dst = product + dst
    attr.set_post_ops(ops);
  }
  const memory::data_type dt = onednn_type(type);  // bf16 operands accumulate in f32 and round once on store
  const memory::desc a = operand_desc(dt, s.batch, s.m, s.k, s.trans_a, s.batch_stride_a);
  const memory::desc b = operand_desc(dt, s.batch, s.k, s.n, s.trans_b, s.batch_stride_b);
  const memory::desc c = operand_desc(dt, s.batch, s.m, s.n, false, s.m * s.n);
  const bool pack = s.batch == 1 && type == GemmType::kF32;
  const memory::desc b_any = pack ? memory::desc({s.k, s.n}, dt, memory::format_tag::any) : b;
  dnnl::matmul::primitive_desc desc(dnnl::matmul::desc(a, b_any, c), attr, cpu_engine());
  CachedMatmul mm{desc, dnnl::matmul(desc), memory(a, cpu_engine(), nullptr), memory(b, cpu_engine(), nullptr),
                  memory(c, cpu_engine(), nullptr), memory(), {}, std::nullopt, memory(), 0, 0};
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

// Primitives by shape, one cache per thread (a cached entry's memory objects are per call state).
// Creating one costs tens of microseconds; a training step reuses a few dozen shapes.
CachedMatmul& cached(const GemmShape& s, GemmType type) {
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, int64_t, int64_t, int64_t, GemmType>;
  thread_local std::map<Key, CachedMatmul> cache;
  const Key key{s.m, s.n, s.k, s.trans_a, s.trans_b, s.accumulate, s.batch, s.batch_stride_a, s.batch_stride_b, type};
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

bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
  return has;
}

bool onednn_bf16_gemm() {
  static const bool on = [] {
    const char* env = std::getenv("MEMC_BF16_GEMM");
    if (env && std::string(env) == "0") return false;
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    const bool library_ready = isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
    return cpu_has_bf16_dot() && library_ready;
  }();
  return on;
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + ", ISA " +
         isa_name(dnnl::get_effective_cpu_isa()) + ", bf16 GEMMs " +
         (onednn_bf16_gemm() ? "native" : cpu_has_bf16_dot() ? "widened to f32 (MEMC_BF16_GEMM=0)" : "widened to f32 (no avx512_bf16/amx_bf16)");
}

void set_onednn_threads(int threads) { omp_set_num_threads(threads); }
int onednn_threads() { return omp_get_max_threads(); }

}  // namespace memc::cpu
