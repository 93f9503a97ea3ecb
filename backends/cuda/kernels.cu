// The CUDA backend's op kernels: backends/cuda/op_table.h's ops with a runner that launches each
// body as a grid-stride kernel on the node's stream, copies with cudaMemcpyAsync, and GEMMs
// through cuBLASLt (backends/cuda/gemm.cu). Launches are asynchronous; the executor synchronizes
// at the end of the step.
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/op_table.h"

namespace memc::cuda {
namespace {

template <class Body>
__global__ void run_body(Body body, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) body(i);
}

// A reduction with one block per output (grid-stride over outputs): the block's threads take
// every blockDim-th element, then merge their partials pairwise in shared memory. One thread per
// output (run_body) left a bias gradient's 768 outputs each summing 3,152 rows alone: 1.5 ms a
// call on ViT-B/16 b16 (bench/journal/2026.md §36).
constexpr int kReduceThreads = 256;
__global__ void reduce_blocks(Reduce body, int64_t outputs) {
  __shared__ double partial[kReduceThreads];
  for (int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    const int64_t base = body.kept.offset(o);
    double acc = body.start();
    for (int64_t r = threadIdx.x; r < body.count; r += blockDim.x) acc = body.take(acc, base, r);
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) partial[threadIdx.x] = body.merge(partial[threadIdx.x], partial[threadIdx.x + half]);
      __syncthreads();
    }
    if (threadIdx.x == 0) body.finish(o, partial[0]);
    __syncthreads();
  }
}

// A warp per row of a score matrix (attention through GEMMs, backends/cuda/attention_bodies.h):
// the lanes stride over the row's columns, then reduce by shuffles, in a fixed order.
constexpr int kWarp = 32, kRowThreads = 256;
__device__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__global__ void score_softmax_rows(ScoreSoftmax body, int64_t rows) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp), cols = body.cols();
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp; row < rows; row += warps) {
    float m = -INFINITY;
    for (int64_t c = lane; c < cols; c += kWarp) m = fmaxf(m, body.logit(row, c));
    m = warp_max(m);
    if (m == -INFINITY) m = 0;
    float sum = 0.f;
    for (int64_t c = lane; c < cols; c += kWarp) sum += expf(body.logit(row, c) - m);
    const float inv_sum = 1.f / warp_sum(sum);
    for (int64_t c = lane; c < cols; c += kWarp) body.store(row, c, m, inv_sum);
  }
}
__global__ void score_grad_rows(ScoreGrad body, int64_t rows) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp), cols = body.cols();
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp; row < rows; row += warps) {
    float d = 0.f;
    for (int64_t c = lane; c < cols; c += kWarp) d += body.term(row, c);
    d = warp_sum(d);
    for (int64_t c = lane; c < cols; c += kWarp) body.store(row, c, d);
  }
}
__device__ double warp_sum(double v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
// layernorm's rows, a warp each: the body's pieces in the body's order (its operator() is the
// one-thread form), the sums reduced across the warp.
template <typename T>
__global__ void layernorm_rows(LayernormRow<T> body, int64_t rows) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp), n = body.cols();
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp; r < rows; r += warps) {
    double sum = 0;
    for (int64_t i = lane; i < n; i += kWarp) sum += body.first(r, i);
    const double mean = n ? warp_sum(sum) / static_cast<double>(n) : 0.0;
    double square = 0;
    for (int64_t i = lane; i < n; i += kWarp) {
      const double c = body.value(r, i) - mean;
      square += c * c;
    }
    const float mean_f = static_cast<float>(mean), inv_f = static_cast<float>(body.inv_std(warp_sum(square)));
    for (int64_t i = lane; i < n; i += kWarp) body.store(r, i, mean_f, inv_f);
    if (lane == 0) body.stats(r, mean_f, inv_f);
  }
}
template <typename T>
__global__ void layernorm_grad_rows(LayernormGradRow<T> body, int64_t rows) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp), h = body.cols();
  const float count = static_cast<float>(h);
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp; r < rows; r += warps) {
    float sum = 0;
    for (int64_t j = lane; j < h; j += kWarp) sum += body.xv(r, j);
    const float mean = warp_sum(sum) / count;
    float square = 0;
    for (int64_t j = lane; j < h; j += kWarp) square += (body.xv(r, j) - mean) * (body.xv(r, j) - mean);
    const float inv = body.inv_std(warp_sum(square));
    float sum_g = 0, sum_gx = 0;
    for (int64_t j = lane; j < h; j += kWarp) {
      const float g = body.gv(r, j);
      sum_g += g, sum_gx += g * (body.xv(r, j) - mean) * inv;
    }
    const float mean_g = warp_sum(sum_g) / count, mean_gx = warp_sum(sum_gx) / count;
    for (int64_t j = lane; j < h; j += kWarp) body.store(r, j, mean, inv, mean_g, mean_gx);
    if (lane == 0) body.stats[2 * r] = mean, body.stats[2 * r + 1] = inv;
  }
}
// A language model's cross-entropy rows, a warp each (50,257 classes in GPT-2's): the body's
// pieces in the body's order, the max and sums reduced across the warp.
template <typename T>
__global__ void cross_entropy_rows(CrossEntropyRow<T> body, int64_t rows) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp), cols = body.cols();
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp; r < rows; r += warps) {
    bool settled = false;
    if (lane == 0) settled = body.settled(r);
    if (__shfl_sync(0xffffffffu, settled, 0)) continue;
    float m = -INFINITY;
    for (int64_t c = lane; c < cols; c += kWarp) m = fmaxf(m, body.logit(r, c));
    m = warp_max(m);
    double sum = 0;
    for (int64_t c = lane; c < cols; c += kWarp) sum += expf(body.logit(r, c) - m);
    sum = warp_sum(sum);
    if (lane == 0) body.finish(r, m, sum);
  }
}
template <typename T>
__global__ void cross_entropy_grad_rows(CrossEntropyGradRow<T> body, int64_t rows) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp), cols = body.cols();
  const float scale = body.scale();
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp; r < rows; r += warps) {
    if (body.ignored(r)) {
      for (int64_t c = lane; c < cols; c += kWarp) body.store_zero(r, c);
      continue;
    }
    float m = -INFINITY;
    for (int64_t c = lane; c < cols; c += kWarp) m = fmaxf(m, body.logit(r, c));
    m = warp_max(m);
    float sum = 0.f;
    for (int64_t c = lane; c < cols; c += kWarp) sum += expf(body.logit(r, c) - m);
    sum = warp_sum(sum);
    for (int64_t c = lane; c < cols; c += kWarp) body.store(r, c, m, sum, scale);
  }
}
unsigned row_blocks(int64_t rows) {
  const int64_t per_block = kRowThreads / kWarp;
  return static_cast<unsigned>(std::min<int64_t>((rows + per_block - 1) / per_block, int64_t{1} << 20));
}

Status check_launch(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Internal(str_cat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

// The pinned copy of `bytes` at `host`, made on first use and refreshed if the bytes changed.
// Keyed by address and size: a constant's value lives as long as its plan.
Expected<const void*> pinned_copy(const void* host, int64_t bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int64_t>, void*> staged;
  std::lock_guard<std::mutex> lock(mutex);
  void*& pinned = staged[{host, bytes}];
  if (!pinned) {
    MEMC_RETURN_IF_ERROR(check_launch(cudaMallocHost(&pinned, static_cast<size_t>(bytes)), "cudaMallocHost (staging)"));
    std::memcpy(pinned, host, static_cast<size_t>(bytes));
  } else if (std::memcmp(pinned, host, static_cast<size_t>(bytes)) != 0) {
    std::memcpy(pinned, host, static_cast<size_t>(bytes));
  }
  return static_cast<const void*>(pinned);
}

// A transfer in flight on the copy stream, keyed by its pending buffer: `fork` orders the copy
// after the compute stream's work so far, `joined` the compute stream's later work after the
// copy. Made once per buffer and reused every step (and inside a captured graph, where the
// record/wait pairs become the graph's edges between the two streams).
struct CopyEvents {
  cudaEvent_t fork = nullptr, joined = nullptr;
};
Expected<CopyEvents> copy_events(const void* pending) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, CopyEvents> events;  // by (device, buffer)
  int device = 0;
  MEMC_RETURN_IF_ERROR(check_launch(cudaGetDevice(&device), "cudaGetDevice (copy)"));
  std::lock_guard<std::mutex> lock(mutex);
  CopyEvents& e = events[{device, pending}];
  if (!e.fork) {
    MEMC_RETURN_IF_ERROR(check_launch(cudaEventCreateWithFlags(&e.fork, cudaEventDisableTiming), "cudaEventCreate (copy)"));
    MEMC_RETURN_IF_ERROR(check_launch(cudaEventCreateWithFlags(&e.joined, cudaEventDisableTiming), "cudaEventCreate (copy)"));
  }
  return e;
}

struct DeviceRunner {
  cudaStream_t stream, copy_stream;
  explicit DeviceRunner(const KernelContext& ctx)
      : stream(static_cast<cudaStream_t>(ctx.stream)), copy_stream(static_cast<cudaStream_t>(ctx.copy_stream)) {}

  template <class Body>
  Status operator()(const Body& body, int64_t n) {
    if (n <= 0) return Status::Ok();
    constexpr int kThreads = 256;
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 20);
    run_body<Body><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(body, n);
    return check_launch(cudaGetLastError(), "kernel launch");
  }
  // Reductions of 64 elements or more per output take a block each.
  Status operator()(const Reduce& body, int64_t n) {
    if (body.count < 64) return operator()<Reduce>(body, n);
    if (n <= 0) return Status::Ok();
    const int64_t blocks = std::min<int64_t>(n, int64_t{1} << 16);
    reduce_blocks<<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(body, n);
    return check_launch(cudaGetLastError(), "kernel launch (reduction)");
  }
  // layernorm rows and score rows take a warp each.
  template <typename T>
  Status operator()(const LayernormRow<T>& body, int64_t rows) {
    if (rows <= 0) return Status::Ok();
    layernorm_rows<T><<<row_blocks(rows), kRowThreads, 0, stream>>>(body, rows);
    return check_launch(cudaGetLastError(), "kernel launch (layernorm)");
  }
  template <typename T>
  Status operator()(const LayernormGradRow<T>& body, int64_t rows) {
    if (rows <= 0) return Status::Ok();
    layernorm_grad_rows<T><<<row_blocks(rows), kRowThreads, 0, stream>>>(body, rows);
    return check_launch(cudaGetLastError(), "kernel launch (layernorm gradient)");
  }
  template <typename T>
  Status operator()(const CrossEntropyRow<T>& body, int64_t rows) {
    if (rows <= 0) return Status::Ok();
    cross_entropy_rows<T><<<row_blocks(rows), kRowThreads, 0, stream>>>(body, rows);
    return check_launch(cudaGetLastError(), "kernel launch (cross-entropy)");
  }
  template <typename T>
  Status operator()(const CrossEntropyGradRow<T>& body, int64_t rows) {
    if (rows <= 0) return Status::Ok();
    cross_entropy_grad_rows<T><<<row_blocks(rows), kRowThreads, 0, stream>>>(body, rows);
    return check_launch(cudaGetLastError(), "kernel launch (cross-entropy gradient)");
  }
  Status operator()(const ScoreSoftmax& body, int64_t rows) {
    if (rows <= 0) return Status::Ok();
    score_softmax_rows<<<row_blocks(rows), kRowThreads, 0, stream>>>(body, rows);
    return check_launch(cudaGetLastError(), "kernel launch (score softmax)");
  }
  Status operator()(const ScoreGrad& body, int64_t rows) {
    if (rows <= 0) return Status::Ok();
    score_grad_rows<<<row_blocks(rows), kRowThreads, 0, stream>>>(body, rows);
    return check_launch(cudaGetLastError(), "kernel launch (score gradient)");
  }
  Status copy(void* dst, const void* src, int64_t bytes) {
    if (bytes <= 0) return Status::Ok();
    return check_launch(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, stream), "copy");
  }
  // Without a copy stream (a caller that has none) the copy is ordered on the compute stream.
  Status copy_start(void* dst, const void* src, int64_t bytes) {
    if (!copy_stream) return copy(dst, src, bytes);
    MEMC_ASSIGN_OR_RETURN(const CopyEvents e, copy_events(dst));
    MEMC_RETURN_IF_ERROR(check_launch(cudaEventRecord(e.fork, stream), "cudaEventRecord (copy start)"));
    MEMC_RETURN_IF_ERROR(check_launch(cudaStreamWaitEvent(copy_stream, e.fork, 0), "cudaStreamWaitEvent (copy start)"));
    if (bytes > 0) {
      MEMC_RETURN_IF_ERROR(check_launch(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, copy_stream), "copy (copy stream)"));
    }
    return check_launch(cudaEventRecord(e.joined, copy_stream), "cudaEventRecord (copy)");
  }
  Status copy_done(const void* pending) {
    if (!copy_stream) return Status::Ok();
    MEMC_ASSIGN_OR_RETURN(const CopyEvents e, copy_events(pending));
    return check_launch(cudaStreamWaitEvent(stream, e.joined, 0), "cudaStreamWaitEvent (copy done)");
  }
  // Host data a kernel sends every step (a constant's value, the quantization maps) is staged
  // once in pinned memory, so the copy is asynchronous and a captured graph can hold it.
  Status upload(void* dst, const void* host, int64_t bytes) {
    if (bytes <= 0) return Status::Ok();
    MEMC_ASSIGN_OR_RETURN(const void* pinned, pinned_copy(host, bytes));
    return copy(dst, pinned, bytes);
  }
  Status gemm(const GemmCall& call, void* workspace, int64_t bytes) { return cuda::gemm(call, workspace, bytes, stream); }
  Status sdpa(const SdpaShape& shape, bool backward, const SdpaPointers& p, void* workspace, int64_t bytes) {
#ifdef MEMC_HAVE_CUDNN_SDPA
    return run_sdpa(shape, backward, p, workspace, bytes, stream);
#else
    return Status::BadInput("not supported by cuDNN SDPA: memc was built without the cuDNN frontend");
#endif
  }
};

}  // namespace

const Kernel* CudaBackend::find_kernel(std::string_view op) const { return ops::find_kernel<DeviceRunner>(op); }
GroupKernel CudaBackend::find_group_kernel(std::string_view op) const { return ops::find_group_kernel<DeviceRunner>(op); }

}  // namespace memc::cuda
