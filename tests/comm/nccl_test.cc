// The NCCL communicator, bootstrapped through MPI (run as MPI ranks, one GPU each). Checks the
// same rank-ordered layout as the MPI tests on device buffers, in f32 and bf16. Without a GPU
// every case is skipped, naming why; the build and link are what this machine checks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/comm/nccl_communicator.h"
#include "tests/comm/mpi_test_util.h"

namespace memc::comm::testing {
namespace {

// Every rank must agree on skipping, or the ranks with a GPU would wait for the others.
bool all_have_gpus(std::string* why) {
  const int32_t lacking = cuda_device_count(why) > 0 ? 0 : 1;
  int32_t any_lacking = 1;
  if (!g_comm->all_reduce(&lacking, &any_lacking, 1, DType::kI32, ReduceOp::kMax).ok()) return false;
  return any_lacking == 0;
}

#define REQUIRE_GPUS()                                                          \
  do {                                                                          \
    std::string why;                                                            \
    if (!all_have_gpus(&why)) GTEST_SKIP() << "no CUDA device on some rank (" << (why.empty() ? "another rank" : why) << ")"; \
  } while (0)

TEST(NcclComm, WithoutAGpuCreationFailsSayingWhy) {
  std::string why;
  if (cuda_device_count(&why) > 0) return;  // covered by the cases below
  auto nccl = NcclCommunicator::create(*g_comm, -1, 10);
  ASSERT_FALSE(nccl.ok());
  EXPECT_NE(nccl.status().message().find("no GPU for NCCL"), std::string::npos) << nccl.status().message();
}

TEST(NcclComm, CollectivesUseTheRankOrderedLayout) {
  REQUIRE_GPUS();
  auto created = NcclCommunicator::create(*g_comm, -1, 60);
  ASSERT_TRUE(created.ok()) << created.status().message();
  NcclCommunicator& nccl = **created;
  const int R = nccl.size(), r = nccl.rank();
  const int64_t count = 1001;
  std::vector<float> send(count * R), back(count * R);
  for (int64_t i = 0; i < count * R; ++i) send[i] = static_cast<float>((r + 1) * (i % 13 + 1));
  float *d_send = nullptr, *d_recv = nullptr;
  ASSERT_EQ(cudaMalloc(&d_send, send.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_recv, send.size() * sizeof(float)), cudaSuccess);
  cudaMemcpy(d_send, send.data(), send.size() * sizeof(float), cudaMemcpyHostToDevice);

  ASSERT_TRUE(nccl.all_gather(d_send, d_recv, count, DType::kF32).ok());
  cudaMemcpy(back.data(), d_recv, back.size() * sizeof(float), cudaMemcpyDeviceToHost);
  for (int b = 0; b < R; ++b) {
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(back[b * count + i], static_cast<float>((b + 1) * (i % 13 + 1)));
  }
  ASSERT_TRUE(nccl.reduce_scatter(d_send, d_recv, count, DType::kF32, ReduceOp::kSum).ok());
  cudaMemcpy(back.data(), d_recv, count * sizeof(float), cudaMemcpyDeviceToHost);
  for (int64_t i = 0; i < count; ++i) {
    float sum = 0;
    for (int q = 0; q < R; ++q) sum += static_cast<float>((q + 1) * ((r * count + i) % 13 + 1));
    ASSERT_EQ(back[i], sum) << i;
  }
  ASSERT_TRUE(nccl.all_reduce(d_send, d_send, count, DType::kF32, ReduceOp::kMax).ok());
  cudaMemcpy(back.data(), d_send, count * sizeof(float), cudaMemcpyDeviceToHost);
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(back[i], static_cast<float>(R * (i % 13 + 1)));
  EXPECT_TRUE(nccl.barrier().ok());
  cudaFree(d_send);
  cudaFree(d_recv);
}

// A done on the compute stream: the stream waits for the collective (the host does not), a copy
// queued behind the wait reads the gathered blocks, and settle() checks and times the collective.
TEST(NcclComm, WaitOnTheComputeStreamOrdersWhatFollowsAndSettleChecksIt) {
  REQUIRE_GPUS();
  auto created = NcclCommunicator::create(*g_comm, -1, 60);
  ASSERT_TRUE(created.ok()) << created.status().message();
  NcclCommunicator& nccl = **created;
  const int R = nccl.size(), r = nccl.rank();
  const int64_t count = 1 << 20;
  std::vector<float> send(count, static_cast<float>(r + 1)), back(count * R);
  float *d_send = nullptr, *d_recv = nullptr, *d_copy = nullptr;
  ASSERT_EQ(cudaMalloc(&d_send, count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_recv, count * R * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_copy, count * R * sizeof(float)), cudaSuccess);
  cudaMemcpy(d_send, send.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  nccl.take_transfer_ms();
  ASSERT_TRUE(nccl.follow(compute).ok());
  auto request = nccl.start_all_gather(d_send, d_recv, count, DType::kF32);
  ASSERT_TRUE(request.ok()) << request.status().message();
  ASSERT_TRUE(nccl.wait_on(*request, compute).ok());
  cudaMemcpyAsync(d_copy, d_recv, count * R * sizeof(float), cudaMemcpyDeviceToDevice, compute);
  ASSERT_TRUE(nccl.settle().ok());
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  cudaMemcpy(back.data(), d_copy, back.size() * sizeof(float), cudaMemcpyDeviceToHost);
  for (int b = 0; b < R; ++b) ASSERT_EQ(back[b * count + count - 1], static_cast<float>(b + 1)) << b;
  const std::vector<double> ms = nccl.take_transfer_ms();
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_GT(ms[0], 0.0);
  EXPECT_TRUE(nccl.settle().ok());  // nothing left to settle
  cudaStreamDestroy(compute);
  cudaFree(d_send);
  cudaFree(d_recv);
  cudaFree(d_copy);
}

TEST(NcclComm, Bf16SumsRoundOncePerAddition) {
  REQUIRE_GPUS();
  auto created = NcclCommunicator::create(*g_comm, -1, 60);
  ASSERT_TRUE(created.ok()) << created.status().message();
  NcclCommunicator& nccl = **created;
  const int64_t count = 4096;
  std::vector<uint16_t> send(count), sum(count);
  for (int64_t i = 0; i < count; ++i) send[i] = f32_to_bf16(1.f + static_cast<float>(i) / 1024.f + nccl.rank() * 0.001f);
  uint16_t* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, count * 2), cudaSuccess);
  cudaMemcpy(d, send.data(), count * 2, cudaMemcpyHostToDevice);
  ASSERT_TRUE(nccl.all_reduce(d, d, count, DType::kBF16, ReduceOp::kSum).ok());
  cudaMemcpy(sum.data(), d, count * 2, cudaMemcpyDeviceToHost);
  cudaFree(d);
  std::vector<uint16_t> all(count * nccl.size());
  ASSERT_TRUE(g_comm->all_gather(send.data(), all.data(), count, DType::kBF16).ok());
  for (int64_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int q = 0; q < nccl.size(); ++q) exact += bf16_to_f32(all[q * count + i]);
    EXPECT_NEAR(bf16_to_f32(sum[i]), exact, std::max(1, nccl.size() - 1) * std::ldexp(std::abs(exact), -8)) << i;
  }
}

}  // namespace
}  // namespace memc::comm::testing
