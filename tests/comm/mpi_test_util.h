// Shared by the tests that run as MPI ranks: the process's communicator (mpi_test_main.cc).
#pragma once
#include "backends/comm/mpi_communicator.h"

namespace memc::comm::testing {
extern MpiCommunicator* g_comm;
}  // namespace memc::comm::testing
