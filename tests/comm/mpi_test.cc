// The MPI communicator against the arithmetic, as 1, 2 or 4 ranks (ctest runs each under
// tests/comm/mpirun.sh): rank-ordered blocks for every collective in f32, bf16, f16, f64, i32,
// i64 (and u8 for the data movers), odd block sizes, the padded flat-buffer round trip of
// ZeRO, sum and max, bf16/f16 rounding (one rounding per pairwise addition; every rank gets the
// same bits), overlapped async collectives, refused arguments and the data-file check.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "ir/tensor.h"
#include "tests/comm/mpi_test_util.h"

namespace memc::comm::testing {
namespace {

const DType kReducible[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32, DType::kI64};
const DType kMovable[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32, DType::kI64, DType::kU8};
const int64_t kCounts[] = {1, 7, 1001};

Communicator& comm() { return *g_comm; }
int rank() { return g_comm->rank(); }
int ranks() { return g_comm->size(); }

// Small integers, exact in every dtype and in sums over 4 ranks (≤ 4·(4·13) < 256, bf16's
// exact-integer range).
double code(int r, int64_t i) { return (r + 1) * (i % 13 + 1); }

Tensor filled(DType dtype, int64_t n, const std::function<double(int64_t)>& f) {
  Tensor t = Tensor::zeros(dtype, {n});
  for (int64_t i = 0; i < n; ++i) t.set_from_double(i, f(i));
  return t;
}

std::string label(DType dtype, int64_t count) { return str_cat(dtype_name(dtype), " count ", count); }

TEST(MpiComm, RanksAreNumberedFromZero) {
  EXPECT_GE(rank(), 0);
  EXPECT_LT(rank(), ranks());
  EXPECT_EQ(comm().transport(), "mpi");
  std::vector<int32_t> all(ranks());
  const int32_t mine = rank();
  ASSERT_TRUE(comm().all_gather(&mine, all.data(), 1, DType::kI32).ok());
  for (int r = 0; r < ranks(); ++r) EXPECT_EQ(all[r], r);
  EXPECT_TRUE(comm().barrier().ok());
}

TEST(MpiComm, AllGatherStacksBlocksInRankOrder) {
  for (DType dtype : kMovable) {
    for (int64_t count : kCounts) {
      Tensor send = filled(dtype, count, [](int64_t i) { return code(rank(), i); });
      Tensor recv = Tensor::zeros(dtype, {count * ranks()});
      ASSERT_TRUE(comm().all_gather(send.raw(), recv.raw(), count, dtype).ok()) << label(dtype, count);
      for (int r = 0; r < ranks(); ++r) {
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(recv.get_as_double(r * count + i), code(r, i)) << label(dtype, count) << " block " << r << " [" << i << "]";
        }
      }
    }
  }
}

TEST(MpiComm, ReduceScatterSumsBlockRIntoRankR) {
  for (DType dtype : kReducible) {
    for (int64_t count : kCounts) {
      // Block b of rank r's buffer holds code(r, b·count + i).
      Tensor send = filled(dtype, count * ranks(), [](int64_t i) { return code(rank(), i); });
      Tensor recv = Tensor::zeros(dtype, {count});
      ASSERT_TRUE(comm().reduce_scatter(send.raw(), recv.raw(), count, dtype, ReduceOp::kSum).ok()) << label(dtype, count);
      Tensor maxima = Tensor::zeros(dtype, {count});
      ASSERT_TRUE(comm().reduce_scatter(send.raw(), maxima.raw(), count, dtype, ReduceOp::kMax).ok()) << label(dtype, count);
      for (int64_t i = 0; i < count; ++i) {
        double sum = 0;
        for (int r = 0; r < ranks(); ++r) sum += code(r, rank() * count + i);
        ASSERT_EQ(recv.get_as_double(i), sum) << label(dtype, count) << " [" << i << "]";
        ASSERT_EQ(maxima.get_as_double(i), code(ranks() - 1, rank() * count + i)) << label(dtype, count) << " [" << i << "]";
      }
    }
  }
}

TEST(MpiComm, AllReduceSumAndMaxInPlaceOrNot) {
  for (DType dtype : kReducible) {
    for (int64_t count : kCounts) {
      Tensor send = filled(dtype, count, [](int64_t i) { return code(rank(), i) * (i % 2 ? 1 : -1); });
      Tensor sum = Tensor::zeros(dtype, {count});
      ASSERT_TRUE(comm().all_reduce(send.raw(), sum.raw(), count, dtype, ReduceOp::kSum).ok()) << label(dtype, count);
      Tensor in_place = send.clone();
      ASSERT_TRUE(comm().all_reduce(in_place.raw(), in_place.raw(), count, dtype, ReduceOp::kMax).ok()) << label(dtype, count);
      for (int64_t i = 0; i < count; ++i) {
        double expected = 0;
        for (int r = 0; r < ranks(); ++r) expected += code(r, i) * (i % 2 ? 1 : -1);
        ASSERT_EQ(sum.get_as_double(i), expected) << label(dtype, count) << " [" << i << "]";
        // Odd elements grow with the rank, even ones shrink: the max is rank R−1's or rank 0's.
        ASSERT_EQ(in_place.get_as_double(i), i % 2 ? code(ranks() - 1, i) : -code(0, i)) << label(dtype, count);
      }
    }
  }
}

TEST(MpiComm, MaxCarriesAnOverflowFlag) {
  // found_inf: one rank saw an inf gradient; every rank must learn it (and NaN must survive).
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (double bad : {INFINITY, NAN}) {
      Tensor flag = filled(dtype, 3, [&](int64_t i) { return rank() == ranks() - 1 && i == 1 ? bad : 0.0; });
      ASSERT_TRUE(comm().all_reduce(flag.raw(), flag.raw(), 3, dtype, ReduceOp::kMax).ok());
      EXPECT_EQ(flag.get_as_double(0), 0.0) << dtype_name(dtype);
      if (std::isnan(bad)) {
        EXPECT_TRUE(std::isnan(flag.get_as_double(1))) << dtype_name(dtype);
      } else {
        EXPECT_EQ(flag.get_as_double(1), INFINITY) << dtype_name(dtype);
      }
    }
  }
}

TEST(MpiComm, BroadcastFromEveryRoot) {
  for (int root = 0; root < ranks(); ++root) {
    for (DType dtype : kMovable) {
      Tensor buffer = filled(dtype, 7, [&](int64_t i) { return code(rank(), i); });
      ASSERT_TRUE(comm().broadcast(buffer.raw(), 7, dtype, root).ok());
      for (int64_t i = 0; i < 7; ++i) ASSERT_EQ(buffer.get_as_double(i), code(root, i)) << dtype_name(dtype) << " root " << root;
    }
  }
}

// 16-bit sums: each pairwise addition is done in f32 and rounded to nearest even. With two
// ranks that is exactly round(a + b); with more, within R−1 roundings of the exact sum; and
// every rank receives the same bits (the reduction order does not depend on the receiver).
TEST(MpiComm, SixteenBitSumsRoundPerAdditionAndAgreeAcrossRanks) {
  const int64_t count = 4099;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    std::mt19937 rng(100 + rank());
    std::uniform_real_distribution<float> dist(-4.f, 4.f);
    Tensor send = filled(dtype, count, [&](int64_t) { return dist(rng); });
    Tensor all = Tensor::zeros(dtype, {count * ranks()});
    ASSERT_TRUE(comm().all_gather(send.raw(), all.raw(), count, dtype).ok());
    Tensor sum = Tensor::zeros(dtype, {count});
    ASSERT_TRUE(comm().all_reduce(send.raw(), sum.raw(), count, dtype, ReduceOp::kSum).ok());
    const double unit = dtype == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);  // half an ulp, relative
    int inexact = 0;
    for (int64_t i = 0; i < count; ++i) {
      double exact = 0, magnitude = 0;
      for (int r = 0; r < ranks(); ++r) {
        exact += all.get_as_double(r * count + i);
        magnitude += std::abs(all.get_as_double(r * count + i));
      }
      const double got = sum.get_as_double(i);
      if (ranks() == 2) {
        Tensor rounded = filled(DType::kF32, 1, [&](int64_t) { return exact; }).cast(dtype);  // a + b is exact in f32
        ASSERT_EQ(got, rounded.get_as_double(0)) << dtype_name(dtype) << " [" << i << "]";
      } else {
        ASSERT_LE(std::abs(got - exact), (ranks() - 1) * unit * magnitude + 1e-30) << dtype_name(dtype) << " [" << i << "]";
      }
      inexact += got != exact;
    }
    if (ranks() > 1) {
      EXPECT_GT(inexact, 0) << "the test values should exercise rounding";
    }
    // Every rank holds the same bits: gather the sums as bytes and compare with rank 0's.
    std::vector<uint8_t> sums(sum.nbytes() * ranks());
    ASSERT_TRUE(comm().all_gather(sum.raw(), sums.data(), static_cast<int64_t>(sum.nbytes()), DType::kU8).ok());
    for (int r = 1; r < ranks(); ++r) {
      EXPECT_TRUE(std::equal(sums.begin(), sums.begin() + sum.nbytes(), sums.begin() + r * sum.nbytes()))
          << dtype_name(dtype) << ": rank " << r << "'s sum differs from rank 0's";
    }
  }
}

// ZeRO's flat buffer: 10 gradient elements padded to block·ranks; reduce-scatter gives each rank
// its summed shard, all-gather rebuilds the full sum, and the padding stays zero.
TEST(MpiComm, PaddedFlatBufferRoundTrip) {
  const int64_t elements = 10, block = shard_block(elements, ranks());
  EXPECT_EQ(block * ranks() >= elements && (block - 1) * ranks() < elements, true);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Tensor grads = filled(dtype, block * ranks(), [&](int64_t i) { return i < elements ? code(rank(), i) : 0.0; });
    Tensor shard = Tensor::zeros(dtype, {block});
    ASSERT_TRUE(comm().reduce_scatter(grads.raw(), shard.raw(), block, dtype).ok());
    Tensor full = Tensor::zeros(dtype, {block * ranks()});
    ASSERT_TRUE(comm().all_gather(shard.raw(), full.raw(), block, dtype).ok());
    for (int64_t i = 0; i < block * ranks(); ++i) {
      double expected = 0;
      for (int r = 0; r < ranks() && i < elements; ++r) expected += code(r, i);
      EXPECT_EQ(full.get_as_double(i), expected) << dtype_name(dtype) << " [" << i << "]";
    }
  }
}

TEST(MpiComm, AsyncCollectivesOverlapAndCompleteInAnyOrder) {
  const int64_t count = 5000;
  Tensor a = filled(DType::kF32, count, [](int64_t i) { return code(rank(), i); });
  Tensor gathered = Tensor::zeros(DType::kF32, {count * ranks()});
  Tensor b = filled(DType::kBF16, count, [](int64_t i) { return code(rank(), i); });
  Tensor reduced = Tensor::zeros(DType::kBF16, {count});
  auto first = comm().start_all_gather(a.raw(), gathered.raw(), count, DType::kF32);
  auto second = comm().start_all_reduce(b.raw(), reduced.raw(), count, DType::kBF16, ReduceOp::kSum);
  ASSERT_TRUE(first.ok() && second.ok());
  // "Compute" between start and done, then complete them in reverse order.
  volatile double busy = 0;
  for (int i = 0; i < 100000; ++i) busy = busy + std::sqrt(static_cast<double>(i));
  ASSERT_TRUE(comm().wait(*second).ok());
  ASSERT_TRUE(comm().wait(*first).ok());
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int r = 0; r < ranks(); ++r) sum += code(r, i);
    ASSERT_EQ(reduced.get_as_double(i), sum);
    ASSERT_EQ(gathered.get_as_double((ranks() - 1) * count + i), code(ranks() - 1, i));
  }
  auto again = comm().wait(*first);
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("unknown request"), std::string::npos) << again.message();
}

TEST(MpiComm, RefusedArgumentsNameTheProblem) {
  // Checked before any message is sent, identically on every rank, so no rank is left waiting.
  uint8_t bytes[4] = {};
  Status st = comm().all_reduce(bytes, bytes, 4, DType::kU8, ReduceOp::kSum);
  EXPECT_EQ(st.kind(), ErrorKind::kBadInput);
  EXPECT_NE(st.message().find("cannot reduce ui8"), std::string::npos) << st.message();
  st = comm().broadcast(bytes, 4, DType::kU8, ranks());
  EXPECT_NE(st.message().find(str_cat("root ", ranks(), " is not a rank")), std::string::npos) << st.message();
  st = comm().all_gather(bytes, bytes, int64_t{1} << 32, DType::kU8);
  EXPECT_NE(st.message().find("count 4294967296 outside"), std::string::npos) << st.message();
}

// The data-file check: the same bytes pass; a rank whose file differs, or cannot read it, fails
// every rank with a line naming it.
TEST(MpiComm, DataFileThatDiffersAcrossRanksIsCaught) {
  int32_t tag = static_cast<int32_t>(getpid());
  ASSERT_TRUE(comm().broadcast(&tag, 1, DType::kI32, 0).ok());
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / str_cat("memc_comm_test_", tag, "_", rank());
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  };
  const std::string same = write("same.npz", std::string(100000, 'x') + "tail");
  EXPECT_TRUE(check_same_file_on_all_ranks(comm(), same).ok());

  const std::string odd = write("odd.npz", ranks() > 1 && rank() == ranks() - 1 ? "other bytes" : "bytes");
  Status st = check_same_file_on_all_ranks(comm(), odd);
  if (ranks() > 1) {
    EXPECT_EQ(st.kind(), ErrorKind::kBadInput);
    EXPECT_NE(st.message().find(str_cat("differs across ranks (rank ", ranks() - 1, " differs from rank 0)")), std::string::npos)
        << st.message();
    EXPECT_TRUE(st.reached_by_every_rank());  // rank 0 alone reports it (tools/train.cc fail_job)
  } else {
    EXPECT_TRUE(st.ok());
  }
  const std::string missing = rank() == 0 ? (dir / "absent.npz").string() : same;
  st = check_same_file_on_all_ranks(comm(), missing);
  EXPECT_NE(st.message().find("cannot be read on rank 0"), std::string::npos) << st.message();
  EXPECT_TRUE(st.reached_by_every_rank());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace memc::comm::testing
