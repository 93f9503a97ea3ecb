#include "backends/cpu/onednn_matmul.h"

#include <omp.h>

#include <map>
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
memory::desc operand_desc(int64_t batch, int64_t rows, int64_t cols, bool trans, int64_t batch_stride) {
  const memory::dims row_strides = trans ? memory::dims{1, rows} : memory::dims{cols, 1};
  if (batch == 1) return memory::desc({rows, cols}, memory::data_type::f32, row_strides);
  const int64_t b = batch_stride == 0 ? 1 : batch;
  return memory::desc({b, rows, cols}, memory::data_type::f32, {batch_stride == 0 ? rows * cols : batch_stride, row_strides[0], row_strides[1]});
}

// A primitive with its memory objects, whose data handles are reset per call (creating memory
// objects costs as much as a small product).
struct CachedMatmul {
  dnnl::matmul::primitive_desc desc;
  dnnl::matmul primitive;
  memory a, b, c, scratchpad;
  std::unordered_map<int, memory> args;
};

CachedMatmul create(const GemmShape& s) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (s.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // dst = product + dst
    attr.set_post_ops(ops);
  }
  const memory::desc a = operand_desc(s.batch, s.m, s.k, s.trans_a, s.batch_stride_a);
  const memory::desc b = operand_desc(s.batch, s.k, s.n, s.trans_b, s.batch_stride_b);
  const memory::desc c = operand_desc(s.batch, s.m, s.n, false, s.m * s.n);
  dnnl::matmul::primitive_desc desc(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  CachedMatmul mm{desc, dnnl::matmul(desc), memory(a, cpu_engine(), nullptr), memory(b, cpu_engine(), nullptr),
                  memory(c, cpu_engine(), nullptr), memory(), {}};
  mm.args = {{DNNL_ARG_SRC, mm.a}, {DNNL_ARG_WEIGHTS, mm.b}, {DNNL_ARG_DST, mm.c}};
  if (desc.scratchpad_desc().get_size()) {
    mm.scratchpad = memory(desc.scratchpad_desc(), cpu_engine(), nullptr);
    mm.args.emplace(DNNL_ARG_SCRATCHPAD, mm.scratchpad);
  }
  return mm;
}

// Primitives by shape, one cache per thread (a cached entry's memory objects are per call state).
// Creating one costs tens of microseconds; a training step reuses a few dozen shapes.
CachedMatmul& cached(const GemmShape& s) {
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, int64_t, int64_t, int64_t>;
  thread_local std::map<Key, CachedMatmul> cache;
  const Key key{s.m, s.n, s.k, s.trans_a, s.trans_b, s.accumulate, s.batch, s.batch_stride_a, s.batch_stride_b};
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, create(s)).first;
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

void onednn_sgemm(float* c, const float* a, const float* b, const GemmShape& s, void* scratchpad) {
  CachedMatmul& mm = cached(s);
  const size_t scratch_bytes = mm.desc.scratchpad_desc().get_size();
  MEMC_CHECK(scratch_bytes == 0 || scratchpad, "oneDNN matmul ", s.m, "x", s.n, "x", s.k, " needs ", scratch_bytes,
             " bytes of planned scratchpad and got none");
  thread_local dnnl::stream stream(cpu_engine());
  mm.a.set_data_handle(const_cast<float*>(a));
  mm.b.set_data_handle(const_cast<float*>(b));
  mm.c.set_data_handle(c);
  if (scratch_bytes) mm.scratchpad.set_data_handle(scratchpad);
  mm.primitive.execute(stream, mm.args);
  stream.wait();
}

int64_t onednn_scratchpad_bytes(const GemmShape& s) {
  if (s.m == 0 || s.n == 0 || s.k == 0) return 0;
  return static_cast<int64_t>(cached(s).desc.scratchpad_desc().get_size());
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + ", ISA " +
         isa_name(dnnl::get_effective_cpu_isa());
}

void set_onednn_threads(int threads) { omp_set_num_threads(threads); }
int onednn_threads() { return omp_get_max_threads(); }

}  // namespace memc::cpu
