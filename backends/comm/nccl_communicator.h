// Collectives between GPU ranks over NCCL, one GPU per rank. Bootstrapped through MPI: rank 0
// makes the ncclUniqueId and the bootstrap communicator broadcasts it. Buffers are device
// memory; collectives run on this communicator's own CUDA stream. A done node's wait_on() makes
// the compute stream wait for the collective's end event (cudaStreamWaitEvent), so the host goes
// on launching compute; settle() at the step's end, and wait() for a blocking collective, poll
// the events with the bootstrap's deadline, checking ncclCommGetAsyncError, so a dead peer fails
// the step (the communicator is then aborted with ncclCommAbort, which frees both streams)
// instead of hanging. bf16/f16 use NCCL's
// own reductions (f32 arithmetic, rounded per step), the same contract as the MPI user ops.
// Built whenever CUDA and NCCL are found; create() fails, saying why, where there is no GPU.
#pragma once
#include <chrono>
#include <map>
#include <vector>
#include <memory>

#include "backends/comm/communicator.h"

namespace memc::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the bootstrap's ranks. `device` is this rank's CUDA device; -1 picks
  // rank mod device count.
  static Expected<std::unique_ptr<NcclCommunicator>> create(Communicator& bootstrap, int device, double timeout_s);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view transport() const override { return "nccl"; }
  BufferSpace buffers() const override { return BufferSpace::kDevice; }
  int device() const { return device_; }
  void* stream() const { return stream_; }  // cudaStream_t the collectives run on

  Expected<RequestId> start_all_gather(const void* send, void* recv, int64_t count, DType dtype) override;
  Expected<RequestId> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override;
  Expected<RequestId> start_all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override;
  Expected<RequestId> start_broadcast(void* buffer, int64_t count, DType dtype, int root) override;
  Status wait(RequestId request) override;
  Status wait_on(RequestId request, void* stream) override;
  Status settle() override;
  Status follow(void* stream) override;  // this communicator's stream waits for `stream`'s work
  Status barrier() override;
  [[noreturn]] void abort(int exit_code) override;
  std::vector<double> take_transfer_ms() override;

 private:
  NcclCommunicator() = default;
  // A timing event recorded on the stream before a collective is queued (its start).
  Expected<void*> begin(const char* op);
  Expected<RequestId> track(const char* op, void* begin, int nccl_result);
  Status failure(const char* op, const std::string& why) const;
  Status usable(const char* op) const;
  struct Pending;
  // Polls the collective's end event until `deadline`; records its device time; frees its events.
  Status complete(const Pending& entry, std::chrono::steady_clock::time_point deadline);
  Expected<Pending> take_pending(RequestId request);

  Communicator* bootstrap_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  double timeout_s_ = 600;
  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t
  void* follow_event_ = nullptr;  // cudaEvent_t recorded on the stream followed
  struct Pending {
    const char* op;
    void* begin;   // cudaEvent_t before the collective
    void* end;     // cudaEvent_t after it
    size_t slot;   // its place in transfer_ms_
  };
  std::map<RequestId, Pending> pending_;
  std::vector<Pending> deferred_;  // wait_on()'s, in the order waited: settle() checks them
  RequestId next_request_ = 1;
  std::vector<double> transfer_ms_;  // per collective started, in order (take_transfer_ms)
};

// The number of CUDA devices, or 0 with the reason in `why` (no driver, no device).
int cuda_device_count(std::string* why);

}  // namespace memc::comm
