// A rank of tests/comm/fault.sh: writes its pid to DIR/RANK.pid, then all-reduces in a loop for
// up to 60 s. Mode "stuck": rank 1 sleeps instead of joining, so the others' wait times out
// (MEMC_COMM_TIMEOUT_S). Any failure prints one line and ends the job through MPI_Abort.
// Usage: comm_fault_rank dead|stuck DIR
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "backends/comm/mpi_communicator.h"

int main(int argc, char** argv) {
  using namespace memc;
  if (argc != 3) {
    std::fprintf(stderr, "usage: comm_fault_rank dead|stuck DIR\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  auto comm = comm::MpiCommunicator::create();
  if (!comm.ok()) {
    std::fprintf(stderr, "memc: %s\n", comm.status().message().c_str());
    return 1;
  }
  comm::Communicator& c = **comm;
  std::ofstream(dir + "/" + std::to_string(c.rank()) + ".pid.tmp") << getpid() << "\n";
  std::rename((dir + "/" + std::to_string(c.rank()) + ".pid.tmp").c_str(), (dir + "/" + std::to_string(c.rank()) + ".pid").c_str());
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> values(1024, 1.f);
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    if (mode == "stuck" && c.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
    Status st = c.all_reduce(values.data(), values.data(), static_cast<int64_t>(values.size()), DType::kF32, comm::ReduceOp::kMax);
    if (!st.ok()) {
      std::fprintf(stderr, "memc: %s\n", st.message().c_str());
      c.abort(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::fprintf(stderr, "memc: rank %d: no failure within 60 s\n", c.rank());
  return 0;
}
