// Collectives between CPU ranks over MPI (Debian's OpenMPI): MPI_Iallgather,
// MPI_Ireduce_scatter_block, MPI_Iallreduce and MPI_Ibcast on MPI_COMM_WORLD, whose block layout
// is communicator.h's. bf16/f16 sums and maxima are MPI user ops that add in f32 and round to
// nearest even after each addition (as NCCL does), so no f32 staging buffer is needed. Float
// maxima are user ops too: MPI_MAX may drop a NaN, and a found-inf flag must survive.
//
// Failures never hang a job:
//  - errors come back as statuses (MPI_ERRORS_RETURN), never MPI's own abort;
//  - wait() polls with a deadline (Options::timeout_s, or MEMC_COMM_TIMEOUT_S): a collective
//    that a peer never joins fails after it, naming the op and any peer process known gone;
//  - a killed rank makes mpirun terminate the others with SIGTERM (within about a second);
//    the handler installed here prints one line per survivor naming the dead rank (peers on
//    this host are checked by pid: "memc: rank 0 of 4: stopped by the launcher during
//    all_reduce: rank 1 (pid 4505) is gone") and exits 1. abort() removes the handler, so a
//    rank that reported its own failure is not reported twice.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/comm/communicator.h"

namespace memc::comm {

class MpiCommunicator final : public Communicator {
 public:
  struct Options {
    double timeout_s = 0;                 // 0: MEMC_COMM_TIMEOUT_S, else 600 s
    bool report_peer_failure = true;      // SIGTERM handler naming the dead rank (process-wide)
  };
  // Initializes MPI (once per process; MPI cannot be initialized again after finalize) and
  // gathers every rank's host name and pid. A process not started by mpirun is rank 0 of 1.
  static Expected<std::unique_ptr<MpiCommunicator>> create(Options options);
  static Expected<std::unique_ptr<MpiCommunicator>> create() { return create(Options{}); }
  ~MpiCommunicator() override;  // MPI_Finalize when create() initialized MPI

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view transport() const override { return "mpi"; }
  BufferSpace buffers() const override { return BufferSpace::kHost; }
  double timeout_s() const { return timeout_s_; }

  Expected<RequestId> start_all_gather(const void* send, void* recv, int64_t count, DType dtype) override;
  Expected<RequestId> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override;
  Expected<RequestId> start_all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override;
  Expected<RequestId> start_broadcast(void* buffer, int64_t count, DType dtype, int root) override;
  Status wait(RequestId request) override;
  Status barrier() override;
  [[noreturn]] void abort(int exit_code) override;

  // Peers on this host whose process is gone, as "rank 1 (pid 4242)"; empty if none is known.
  std::string dead_peers() const;

 private:
  MpiCommunicator() = default;
  struct Pending;
  Expected<RequestId> track(const char* op, int rc, void* request);
  Status failure(const char* op, const std::string& why) const;

  int rank_ = 0, size_ = 1;
  bool finalize_ = false;
  double timeout_s_ = 600;
  std::vector<int> pids_;          // per rank
  std::vector<bool> same_host_;    // per rank: shares this rank's host name
  std::map<RequestId, std::unique_ptr<Pending>> pending_;
  RequestId next_request_ = 1;
  void* user_ops_[4][2] = {};      // [bf16, f16, f32, f64][sum, max] as MPI_Op
};

}  // namespace memc::comm
