// The CUDA backend's kernels on the host, for tests without a GPU: HostRunner runs each kernel
// body (backends/cuda/bodies.h) as a plain loop and GEMMs in double precision; HostCudaBackend
// is the CPU backend in every respect but its kernels (the CUDA op table on HostRunner) and its
// workspace model (the CUDA one, without cuBLASLt's share, which the host GEMMs do not use).
#pragma once
#include <cstring>
#include <set>

#include "backends/backend.h"
#include "backends/kernel_attrs.h"
#include "backends/cuda/op_table.h"

namespace memc::testing {

// Runs bodies as loops on the host; GEMMs accumulate in double.
struct HostRunner {
  explicit HostRunner(const KernelContext&) {}
  template <class Body>
  Status operator()(const Body& body, int64_t n) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return Status::Ok();
  }
  Status copy(void* dst, const void* src, int64_t bytes) {
    if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
    return Status::Ok();
  }
  Status upload(void* dst, const void* host, int64_t bytes) { return copy(dst, host, bytes); }
  // A transfer's pair: the copy at once; the done checks that a start into `pending` preceded it.
  static std::set<const void*>& started() {
    static thread_local std::set<const void*> s;
    return s;
  }
  Status copy_start(void* dst, const void* src, int64_t bytes) {
    started().insert(dst);
    return copy(dst, src, bytes);
  }
  Status copy_done(const void* pending) {
    if (started().erase(pending) == 0) return Status::Internal("a copy's done without its start");
    return Status::Ok();
  }
  // No cuDNN on the host: attention runs memc's own kernel, as on a GPU where cuDNN refuses.
  Status sdpa(const cuda::SdpaShape&, bool, const cuda::SdpaPointers&, void*, int64_t) {
    return Status::BadInput("not supported by cuDNN SDPA: no GPU");
  }
  Status gemm(const cuda::GemmCall& c, void*, int64_t) {
    // As cuBLASLt where its heuristic offers no algorithm for the bias-gradient epilogue.
    if (c.bias_grad && refuse_bias_grad()) return Status::BadInput("host GEMM: no bias-gradient epilogue");
    return ops_gemm(c);
  }
  // Tests set it to run matmul_bgrad's fallback (the plain GEMM and a reduction).
  static bool& refuse_bias_grad() {
    static thread_local bool refuse = false;
    return refuse;
  }

  static Status ops_gemm(const cuda::GemmCall& c) {
    switch (c.dtype) {
      case DType::kF32: return typed_gemm<float, float>(c);
      case DType::kBF16: return c.y_f32 ? typed_gemm<bf16_t, float>(c) : typed_gemm<bf16_t, bf16_t>(c);
      case DType::kF16: return c.y_f32 ? typed_gemm<f16_t, float>(c) : typed_gemm<f16_t, f16_t>(c);
      default: return Status::BadInput("host GEMM: dtype");
    }
  }
  template <typename T, typename Y>
  static Status typed_gemm(const cuda::GemmCall& c) {
    const T* a = static_cast<const T*>(c.a);
    const T* b = static_cast<const T*>(c.b);
    const Y* bias = static_cast<const Y*>(c.bias);
    Y* y = static_cast<Y*>(c.y);
    // Row steps of the stored operands (cuBLASLt's ld): packed unless the call gives one.
    const int64_t lda = c.lda ? c.lda : (c.trans_a ? c.m : c.k), ldb = c.ldb ? c.ldb : (c.trans_b ? c.k : c.n);
    const int64_t ldy = c.ldy ? c.ldy : c.n, stride_y = c.stride_y ? c.stride_y : c.m * c.n;
    for (int64_t p = 0; p < c.batch; ++p) {
      const T* ap = a + p * c.stride_a;
      const T* bp = b + p * c.stride_b;
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) {
          double s = bias ? cuda::ld(bias, j) : 0.0;
          const double before = c.accumulate ? cuda::ld(y, p * stride_y + i * ldy + j) : 0.0;
          for (int64_t k = 0; k < c.k; ++k) {
            const double x = cuda::ld(ap, c.trans_a ? k * lda + i : i * lda + k);
            const double w = cuda::ld(bp, c.trans_b ? j * ldb + k : k * ldb + j);
            s += x * w;
          }
          // As cuBLASLt: the product summed in f32, then beta·C added (alpha = beta = 1).
          cuda::st(y, p * stride_y + i * ldy + j, c.accumulate ? static_cast<float>(static_cast<float>(s) + before) : static_cast<float>(s));
        }
      }
    }
    if (c.bias_grad) {  // the sums over k of op(a)'s rows or op(b)'s columns
      Y* g = static_cast<Y*>(c.bias_grad);
      const int64_t count = c.bias_grad_of ? c.n : c.m;
      for (int64_t i = 0; i < count; ++i) {
        double s = 0;
        for (int64_t k = 0; k < c.k; ++k) {
          s += c.bias_grad_of ? cuda::ld(b, c.trans_b ? i * c.k + k : k * c.n + i) : cuda::ld(a, c.trans_a ? k * c.m + i : i * c.k + k);
        }
        cuda::st(g, i, static_cast<float>(s));
      }
    }
    return Status::Ok();
  }
};

// The CPU backend with the CUDA kernels (on the host runner) and their workspace model.
class HostCudaBackend final : public Backend {
 public:
  // `fuse` false: no group kernels, every update node runs alone.
  explicit HostCudaBackend(bool fuse = true) : fuse_(fuse) {}
  std::string_view name() const override { return "cuda-on-host"; }
  const Kernel* find_kernel(std::string_view op) const override { return cuda::ops::find_kernel<HostRunner>(op); }
  // The fused updates, as on a GPU.
  GroupKernel find_group_kernel(std::string_view op) const override { return fuse_ ? cuda::ops::find_group_kernel<HostRunner>(op) : nullptr; }
  int64_t workspace_bytes(const Module& module, const Node& node) const override {
    const NodeTypes types(module, node);
    return cuda::ops::workspace_bytes(node, types.in, types.out, 0);
  }
  int64_t run_state_bytes() const override { return cuda::ops::kRunStateBytes; }
  Expected<void*> allocate(MemoryKind kind, int64_t bytes) override { return cpu_backend().allocate(kind, bytes); }
  void deallocate(MemoryKind kind, void* p) override { cpu_backend().deallocate(kind, p); }
  Status fill(void* p, uint8_t byte, int64_t bytes) override { return cpu_backend().fill(p, byte, bytes); }
  Status copy(void* dst, const void* src, int64_t bytes) override { return cpu_backend().copy(dst, src, bytes); }
  Status copy_async(void* dst, const void* src, int64_t bytes, Stream s) override { return cpu_backend().copy_async(dst, src, bytes, s); }
  Stream compute_stream() override { return {}; }
  Stream copy_stream() override { return {}; }
  Expected<Event> record(Stream) override { return Event{}; }
  Status wait(Stream, Event) override { return Status::Ok(); }
  void destroy(Event) override {}
  Status synchronize(Stream) override { return Status::Ok(); }

 private:
  bool fuse_;
};

}  // namespace memc::testing
