// The CUDA backend against the host: device probe, arena round trips, the op table's
// elementwise kernels in f32 and bf16 storage against host arithmetic (f32 ≤ 1e-6 relative,
// 16-bit storage within one rounding), and the Backend seam (memory kinds, copies, streams and
// events). Without a GPU every case is skipped, naming why.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "ir/dtype.h"

namespace memc {
namespace {

#define REQUIRE_GPU()                                                                         \
  do {                                                                                        \
    const cuda::DeviceInfo info = cuda::probe();                                              \
    if (info.count == 0) GTEST_SKIP() << "no CUDA device here (" << info.error << ")";       \
  } while (0)

TEST(CudaBackend, ProbeNeverFails) {
  const cuda::DeviceInfo info = cuda::probe();
  if (info.count == 0) {
    EXPECT_FALSE(info.error.empty());
    GTEST_SKIP() << "no CUDA device here (" << info.error << "); probe reported it without failing";
  }
  EXPECT_GT(info.total_bytes, 0);
  std::printf("[cuda] %d device(s); device 0: %s, sm_%d%d, %lld bytes\n", info.count, info.name.c_str(), info.sm_major, info.sm_minor,
              static_cast<long long>(info.total_bytes));
}

TEST(CudaBackend, ArenaRoundTrip) {
  REQUIRE_GPU();
  auto arena = cuda::Arena::create(1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status().message();
  std::vector<float> host(1000), back(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  ASSERT_TRUE(arena->upload(4096, host.data(), 4000).ok());
  ASSERT_TRUE(arena->download(4096, back.data(), 4000).ok());
  EXPECT_EQ(host, back);
  EXPECT_FALSE(arena->upload((1 << 20) - 8, host.data(), 4000).ok());  // outside: refused
}

float reference(const std::string& op, float a, float b) {
  if (op == "add") return a + b;
  if (op == "mul") return a * b;
  if (op == "tanh") return std::tanh(a);
  return 0.5f * a * (1.f + std::erf(a * 0.70710678118654752f));  // gelu
}

// The op table's elementwise kernels (backends/cuda/op_table.h) on the device, in f32 and bf16
// storage: f32 arithmetic, the output rounded to nearest even.
TEST(CudaBackend, ElementwiseMatchesHostInEveryStorage) {
  REQUIRE_GPU();
  auto opened = cuda::CudaBackend::open(0);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  cuda::CudaBackend& backend = **opened;
  const int64_t n = 100'003;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-3.f, 3.f);
  Tensor a = Tensor::zeros(DType::kF32, {n}), b = Tensor::zeros(DType::kF32, {n});
  for (int64_t i = 0; i < n; ++i) a.data<float>()[i] = dist(rng), b.data<float>()[i] = dist(rng);
  for (const std::string op : {"add", "mul", "tanh", "gelu"}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const Tensor ha = a.cast(t), hb = b.cast(t);
      const int64_t bytes = static_cast<int64_t>(ha.nbytes());
      void* p = *backend.allocate(MemoryKind::kDevice, 3 * bytes);
      char* base = static_cast<char*>(p);
      ASSERT_TRUE(backend.copy(base, ha.raw(), bytes).ok() && backend.copy(base + bytes, hb.raw(), bytes).ok());
      Tensor da = Tensor::borrow(t, {n}, base), db = Tensor::borrow(t, {n}, base + bytes), dy = Tensor::borrow(t, {n}, base + 2 * bytes);
      Node node;
      node.op = op;
      KernelContext ctx{node, {&da}, {&dy}};
      if (op == "add" || op == "mul") ctx.inputs.push_back(&db);
      ctx.stream = backend.compute_stream().handle;
      const Kernel* kernel = backend.find_kernel(op);
      ASSERT_NE(kernel, nullptr) << op;
      ASSERT_TRUE((*kernel)(ctx).ok()) << op;
      ASSERT_TRUE(backend.synchronize(backend.compute_stream()).ok());
      Tensor y = Tensor::zeros(t, {n});
      ASSERT_TRUE(backend.copy(y.raw(), dy.raw(), bytes).ok());
      backend.deallocate(MemoryKind::kDevice, p);
      const double bound = t == DType::kF32 ? 1e-6 : 1e-2;
      for (int64_t i = 0; i < n; i += 97) {
        Tensor want = Tensor::zeros(t, {});  // the reference rounded to t
        want.set_from_double(0, reference(op, static_cast<float>(ha.get_as_double(i)), static_cast<float>(hb.get_as_double(i))));
        const double w = want.get_as_double(0);
        EXPECT_NEAR(y.get_as_double(i), w, bound * std::max(1.0, std::abs(w))) << op << " " << dtype_name(t) << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace memc

namespace memc {
namespace {

// The Backend seam on CUDA: device and pinned memory, fills, synchronous and async copies on the
// copy stream ordered before the compute stream by an event.
TEST(CudaBackend, SeamMemoryCopiesAndStreams) {
  REQUIRE_GPU();
  auto opened = cuda::CudaBackend::open(0);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  cuda::CudaBackend& backend = **opened;
  constexpr int64_t kBytes = 1 << 20;
  auto device = backend.allocate(MemoryKind::kDevice, kBytes);
  auto pinned = backend.allocate(MemoryKind::kPinnedHost, kBytes);
  ASSERT_TRUE(device.ok() && pinned.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*device) % 256, 0u);
  ASSERT_TRUE(backend.fill(*device, 0x5A, kBytes).ok());
  auto* staging = static_cast<uint8_t*>(*pinned);
  ASSERT_TRUE(backend.copy(staging, *device, kBytes).ok());
  EXPECT_EQ(staging[0], 0x5A);
  EXPECT_EQ(staging[kBytes - 1], 0x5A);
  for (int64_t i = 0; i < kBytes; ++i) staging[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(backend.copy_async(*device, staging, kBytes, backend.copy_stream()).ok());
  auto event = backend.record(backend.copy_stream());
  ASSERT_TRUE(event.ok());
  ASSERT_TRUE(backend.wait(backend.compute_stream(), *event).ok());
  std::vector<uint8_t> back(kBytes);
  ASSERT_TRUE(backend.copy(back.data(), *device, kBytes).ok());  // on the compute stream, after the event
  for (int64_t i = 0; i < kBytes; i += 4099) EXPECT_EQ(back[i], static_cast<uint8_t>(i * 7)) << i;
  backend.destroy(*event);
  backend.deallocate(MemoryKind::kDevice, *device);
  backend.deallocate(MemoryKind::kPinnedHost, *pinned);
}

}  // namespace
}  // namespace memc

#include "backends/cuda/gemm.h"

namespace memc {
namespace {

// cuBLASLt GEMMs behind the seam against a double-precision host reference: linear with bias in
// f32 (TF32 off: ≤ 1e-5 relative) and bf16 (inputs rounded to bf16 first; ≤ 1e-2), and a
// batched matmul with transpose_b and a broadcast (unbatched) right operand.
struct GemmCase {
  const char* op;
  DType dtype;
  Shape a, b;      // x and w (linear) or a and b (matmul)
  bool bias;       // linear only
  int64_t transpose_attr;  // transpose_w (linear) or transpose_b (matmul)
};

double gemm_error(cuda::CudaBackend& backend, const GemmCase& c) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  auto host = [&](const Shape& s) {
    Tensor t = Tensor::zeros(DType::kF32, s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    return c.dtype == DType::kF32 ? t : t.cast(c.dtype).cast(DType::kF32);  // the values the GPU sees
  };
  Node node;
  node.op = c.op;
  const bool linear = std::string(c.op) == "linear";
  node.attrs.set(linear ? "transpose_w" : "transpose_b", c.transpose_attr);
  const Tensor a = host(c.a), b = host(c.b);
  const int64_t k = c.a.back();
  const int64_t n = linear ? (c.transpose_attr ? c.b[0] : c.b[1]) : (c.transpose_attr ? c.b[c.b.size() - 2] : c.b.back());
  const int64_t m = c.a[c.a.size() - 2];
  const int64_t batch = linear ? 1 : a.numel() / (m * k);
  const Tensor bias = host({n});
  Shape out_shape = c.a;
  out_shape.back() = n;
  // Host reference in double.
  std::vector<double> ref(static_cast<size_t>(a.numel() / k * n));
  const int64_t b_batch = linear ? 1 : b.numel() / (k * n);
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < (linear ? a.numel() / k : m); ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = c.bias ? bias.data<float>()[j] : 0.0;
        for (int64_t q = 0; q < k; ++q) {
          const float* bp = b.data<float>() + (b_batch > 1 ? p * k * n : 0);
          const double w = c.transpose_attr ? bp[j * k + q] : bp[q * n + j];
          sum += static_cast<double>(a.data<float>()[(p * m + i) * k + q]) * w;
        }
        ref[static_cast<size_t>((p * m + i) * n + j)] = sum;
      }
  auto upload = [&](const Tensor& t) {
    const Tensor stored = t.cast(c.dtype);
    void* p = *backend.allocate(MemoryKind::kDevice, static_cast<int64_t>(stored.nbytes()));
    EXPECT_TRUE(backend.copy(p, stored.raw(), static_cast<int64_t>(stored.nbytes())).ok());
    return Tensor::borrow(c.dtype, t.shape(), p);
  };
  Tensor da = upload(a), db = upload(b), dbias = upload(bias);
  Tensor dy = Tensor::borrow(c.dtype, out_shape, *backend.allocate(MemoryKind::kDevice, numel(out_shape) * dtype_size(c.dtype)));
  const int64_t workspace_bytes = cuda::cublaslt_workspace_bytes(9);
  void* workspace = *backend.allocate(MemoryKind::kDevice, workspace_bytes);
  KernelContext ctx{node, {&da, &db}, {&dy}};
  if (linear && c.bias) ctx.inputs.push_back(&dbias);
  ctx.workspace = workspace;
  ctx.workspace_bytes = workspace_bytes;
  ctx.stream = backend.compute_stream().handle;
  const Kernel* kernel = backend.find_kernel(c.op);
  EXPECT_NE(kernel, nullptr) << c.op;
  const Status st = (*kernel)(ctx);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(backend.synchronize(backend.compute_stream()).ok());
  Tensor y = Tensor::zeros(c.dtype, out_shape);
  EXPECT_TRUE(backend.copy(y.raw(), dy.raw(), static_cast<int64_t>(y.nbytes())).ok());
  double max_err = 0, max_ref = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    max_err = std::max(max_err, std::abs(y.get_as_double(i) - ref[static_cast<size_t>(i)]));
    max_ref = std::max(max_ref, std::abs(ref[static_cast<size_t>(i)]));
  }
  for (void* p : {da.raw(), db.raw(), dbias.raw(), dy.raw(), workspace}) backend.deallocate(MemoryKind::kDevice, p);
  return max_err / std::max(max_ref, 1e-30);
}

TEST(CudaBackend, CublasLtGemmsMatchTheHost) {
  REQUIRE_GPU();
  auto opened = cuda::CudaBackend::open(0);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  const GemmCase cases[] = {
      {"linear", DType::kF32, {4, 197, 96}, {384, 96}, true, 1},
      {"linear", DType::kF32, {33, 50}, {50, 70}, false, 0},
      {"linear", DType::kBF16, {8, 64, 128}, {256, 128}, true, 1},
      {"matmul", DType::kF32, {6, 40, 32}, {6, 48, 32}, false, 1},  // q·kᵀ per head
      {"matmul", DType::kF32, {5, 17, 24}, {24, 9}, false, 0},       // unbatched right operand
      {"matmul", DType::kF16, {3, 64, 64}, {3, 64, 32}, false, 0},
  };
  for (const GemmCase& c : cases) {
    const double err = gemm_error(**opened, c);
    const double bound = c.dtype == DType::kF32 ? 1e-5 : 1e-2;
    EXPECT_LE(err, bound) << c.op << " " << dtype_name(c.dtype) << " [" << shape_str(c.a) << "]·[" << shape_str(c.b) << "]";
    std::printf("[cuda] %s %s [%s]x[%s]: rel error %.2e\n", c.op, std::string(dtype_name(c.dtype)).c_str(), shape_str(c.a).c_str(),
                shape_str(c.b).c_str(), err);
  }
}

}  // namespace
}  // namespace memc
