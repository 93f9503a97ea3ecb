// The CUDA backend against the host: device probe, arena round trips, and elementwise kernels
// in f32, bf16 and f16 storage against the CPU backend's arithmetic (f32 ≤ 1e-6 relative,
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

float reference(cuda::Elementwise op, float a, float b) {
  switch (op) {
    case cuda::Elementwise::kAdd: return a + b;
    case cuda::Elementwise::kMul: return a * b;
    case cuda::Elementwise::kTanh: return std::tanh(a);
    case cuda::Elementwise::kGelu: return 0.5f * a * (1.f + std::erf(a * 0.70710678118654752f));
  }
  return 0;
}

TEST(CudaBackend, ElementwiseMatchesHostInEveryStorage) {
  REQUIRE_GPU();
  const int64_t n = 100'003;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-3.f, 3.f);
  std::vector<float> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) a[i] = dist(rng), b[i] = dist(rng);
  for (auto op : {cuda::Elementwise::kAdd, cuda::Elementwise::kMul, cuda::Elementwise::kTanh, cuda::Elementwise::kGelu}) {
    // f32
    auto arena = cuda::Arena::create(3 * n * 4);
    ASSERT_TRUE(arena.ok());
    ASSERT_TRUE(arena->upload(0, a.data(), n * 4).ok());
    ASSERT_TRUE(arena->upload(n * 4, b.data(), n * 4).ok());
    ASSERT_TRUE(cuda::elementwise(op, cuda::Storage::kF32, *arena, 0, n * 4, 2 * n * 4, n).ok());
    std::vector<float> out(n);
    ASSERT_TRUE(arena->download(2 * n * 4, out.data(), n * 4).ok());
    for (int64_t i = 0; i < n; i += 97) {
      const float want = reference(op, a[i], b[i]);
      EXPECT_NEAR(out[i], want, 1e-6f * std::max(1.f, std::abs(want))) << i;
    }
    // bf16 storage: inputs rounded, f32 arithmetic, output rounded to nearest even.
    std::vector<bf16_t> a16(n), b16(n), o16(n);
    for (int64_t i = 0; i < n; ++i) a16[i] = store<bf16_t, float>(a[i]), b16[i] = store<bf16_t, float>(b[i]);
    ASSERT_TRUE(arena->upload(0, a16.data(), n * 2).ok());
    ASSERT_TRUE(arena->upload(n * 2, b16.data(), n * 2).ok());
    ASSERT_TRUE(cuda::elementwise(op, cuda::Storage::kBF16, *arena, 0, n * 2, 2 * n * 2, n).ok());
    ASSERT_TRUE(arena->download(2 * n * 2, o16.data(), n * 2).ok());
    for (int64_t i = 0; i < n; i += 97) {
      const float want = load(store<bf16_t, float>(reference(op, load(a16[i]), load(b16[i]))));
      EXPECT_NEAR(load(o16[i]), want, 1e-2f * std::max(1.f, std::abs(want))) << i;
    }
  }
  EXPECT_TRUE(cuda::synchronize().ok());
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
