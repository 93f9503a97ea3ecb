// gtest main for tests run as MPI ranks (tests/comm/mpirun.sh NP TEST): every rank runs every
// case in the same order, so the collectives inside them meet. Rank 0 prints gtest's usual
// output; other ranks print only their failures, prefixed with the rank. The exit status is
// the same on every rank: non-zero when any rank failed.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/comm/mpi_test_util.h"

namespace memc::comm::testing {

MpiCommunicator* g_comm = nullptr;

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace memc::comm::testing

int main(int argc, char** argv) {
  using namespace memc::comm;
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = MpiCommunicator::create({.timeout_s = 60});
  if (!comm.ok()) {
    std::fprintf(stderr, "memc: %s\n", comm.status().message().c_str());
    return 1;
  }
  memc::comm::testing::g_comm = comm->get();
  if ((*comm)->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new memc::comm::testing::RankFailurePrinter((*comm)->rank()));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = failed;
  memc::Status st = (*comm)->all_reduce(&failed, &any_failed, 1, memc::DType::kI32, ReduceOp::kMax);
  if (!st.ok()) std::fprintf(stderr, "memc: %s\n", st.message().c_str());
  comm->reset();  // MPI_Finalize
  return any_failed || !st.ok();
}
