// Collectives across the ranks of one training job (DESIGN.md, "Backends and devices"): one
// interface, two transports — MPI for CPU ranks (mpi_communicator.h), NCCL for GPU ranks
// (nccl_communicator.h, bootstrapped through MPI). Both lay blocks out in rank order along
// the buffer, so a sharded flat buffer is laid out once for either:
//   all_gather      send [count]        → recv [size·count], block r = rank r's send
//   reduce_scatter  send [size·count]   → recv [count], rank r gets the reduction of block r
//   all_reduce      send [count]        → recv [count] on every rank (send may equal recv)
//   broadcast       buffer [count] of `root` → every rank's buffer
// Buffers are host memory for MPI and device memory for NCCL (`buffers()` says which).
// Reductions: sum, and max (for found-inf / overflow flags). 16-bit floats are reduced pairwise
// in f32 and rounded to nearest even after each addition (MPI: a user op; NCCL: natively), so
// a sum over R ranks may round R−1 times; every rank receives the same bits.
// A collective that fails or does not complete within the timeout returns an Internal status
// naming this rank, the op and, when it can tell, the peer rank that is gone.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ir/dtype.h"
#include "support/status.h"

namespace memc::comm {

enum class ReduceOp : uint8_t { kSum, kMax };
enum class BufferSpace : uint8_t { kHost, kDevice };
std::string_view reduce_op_name(ReduceOp op);

// A collective started and not yet waited for.
using RequestId = int64_t;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view transport() const = 0;  // "mpi", "nccl"
  virtual BufferSpace buffers() const = 0;

  // Async forms: the buffers must stay untouched until wait() returns. `count` is elements
  // per rank block (see the table above).
  virtual Expected<RequestId> start_all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  virtual Expected<RequestId> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual Expected<RequestId> start_all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual Expected<RequestId> start_broadcast(void* buffer, int64_t count, DType dtype, int root) = 0;
  // Completes a started collective, or fails naming what went wrong (timeout, a dead peer).
  virtual Status wait(RequestId request) = 0;
  // Completes a started collective for the work queued on `stream` (a backend's compute stream)
  // from now on. A device transport does it without blocking the host: the stream waits for the
  // collective, and the check that it finished in time and without error moves to settle().
  // Default: wait() on the host.
  virtual Status wait_on(RequestId request, void* stream) { return wait(request); }
  // Blocks until every collective that wait_on() left to the device has completed, each within
  // the deadline, or fails naming the first that did not. Call it before the host reads what
  // the step computed, and before waiting for the compute stream (which may wait on them).
  virtual Status settle() { return Status::Ok(); }
  // Orders the collectives started from now on after the work queued so far on `stream` (a
  // backend's compute stream, cudaStream_t). MPI's buffers are host memory written by kernels
  // that have returned: nothing to do.
  virtual Status follow(void* stream) { return Status::Ok(); }
  virtual Status barrier() = 0;
  // The device time of each collective waited for since the last call, in the order they were
  // started (ms on the transport's stream, from CUDA events; NaN for one not waited for yet),
  // and forgets them. Empty where the transport cannot time its collectives (MPI).
  virtual std::vector<double> take_transfer_ms() { return {}; }
  // Ends the whole job (every rank) with `exit_code` after a failure this rank cannot recover
  // from; never returns.
  [[noreturn]] virtual void abort(int exit_code) = 0;

  // A started collective handed from the kernel that starts it to the one that completes it
  // (the IR's OP_start / OP_done pair), keyed by its result buffer. `take` fails when no
  // collective into `result` is pending.
  void hold(const void* result, RequestId request) { pending_[result] = request; }
  Expected<RequestId> take(const void* result);

  // Blocking forms: start, then wait.
  Status all_gather(const void* send, void* recv, int64_t count, DType dtype);
  Status reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op = ReduceOp::kSum);
  Status all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op = ReduceOp::kSum);
  Status broadcast(void* buffer, int64_t count, DType dtype, int root);

 private:
  std::unordered_map<const void*, RequestId> pending_;
};

// Elements per rank block when `elements` are sharded over `ranks`: ⌈elements / ranks⌉; the
// flat buffer is padded to block·ranks so every collective is one call.
int64_t shard_block(int64_t elements, int ranks);

// "A data file that differs across ranks is caught before the first step": every rank hashes
// the file (FNV-1a over its bytes) and the hashes are all-gathered; an unreadable file or a
// differing hash fails on every rank, naming the ranks that differ from rank 0. Collective:
// every rank must call it. Needs a communicator on host buffers (MPI).
Status check_same_file_on_all_ranks(Communicator& comm, const std::string& path);
// FNV-1a 64 of a file's bytes; of a folder (.npy shards), of its files' names, sizes and first
// and last 64 KiB. Exposed for tests.
Expected<uint64_t> file_hash(const std::string& path);

}  // namespace memc::comm
