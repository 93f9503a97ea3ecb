#include "backends/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <cstdlib>

namespace memc::comm {
namespace {

ncclComm_t as_comm(void* p) { return static_cast<ncclComm_t>(p); }
cudaStream_t as_stream(void* p) { return static_cast<cudaStream_t>(p); }

Expected<ncclDataType_t> nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI64: return ncclInt64;
    case DType::kI32: return ncclInt32;
    case DType::kBool:
    case DType::kU8: return ncclUint8;
  }
  return Status::BadInput("unknown dtype");
}

Expected<ncclDataType_t> reducible_type(DType dtype) {
  if (dtype == DType::kBool || dtype == DType::kU8) {
    return Status::BadInput(str_cat("cannot reduce ", dtype_name(dtype), " (float, i32 or i64 only)"));
  }
  return nccl_type(dtype);
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

}  // namespace

int cuda_device_count(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    return 0;
  }
  if (count == 0 && why) *why = "no CUDA device";
  return count;
}

Expected<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(Communicator& bootstrap, int device, double timeout_s) {
  if (bootstrap.buffers() != BufferSpace::kHost) return Status::Internal("NCCL must be bootstrapped by a host communicator (MPI)");
  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator());
  comm->bootstrap_ = &bootstrap;
  comm->rank_ = bootstrap.rank();
  comm->size_ = bootstrap.size();
  comm->timeout_s_ = timeout_s > 0 ? timeout_s : 600;
  // Every rank joins the id broadcast even when it has no GPU, so none waits for it; the
  // device check comes after (a rank without a device then fails here, naming itself).
  std::string why;
  const int devices = cuda_device_count(&why);
  ncclUniqueId id = {};
  if (comm->rank_ == 0 && devices > 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) why = str_cat("ncclGetUniqueId: ", ncclGetErrorString(r));
  }
  MEMC_RETURN_IF_ERROR(bootstrap.broadcast(&id, sizeof(id), DType::kU8, 0));
  if (devices == 0) return Status::Internal(str_cat("rank ", comm->rank_, ": no GPU for NCCL (", why, ")"));
  comm->device_ = device >= 0 ? device : comm->rank_ % devices;
  if (cudaSetDevice(comm->device_) != cudaSuccess) {
    return Status::Internal(str_cat("rank ", comm->rank_, ": cannot use CUDA device ", comm->device_));
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return Status::Internal(str_cat("rank ", comm->rank_, ": cannot create a CUDA stream"));
  }
  comm->stream_ = stream;
  cudaEvent_t follow = nullptr;
  if (cudaEventCreateWithFlags(&follow, cudaEventDisableTiming) != cudaSuccess) {
    return Status::Internal(str_cat("rank ", comm->rank_, ": cannot create a CUDA event"));
  }
  comm->follow_event_ = follow;
  ncclComm_t nccl = nullptr;
  const ncclResult_t r = ncclCommInitRank(&nccl, comm->size_, id, comm->rank_);
  if (r != ncclSuccess) {
    // Ranks that share a GPU: NCCL refuses them ("Duplicate GPU detected") unless it is 2.30 or
    // later and asked to allow them.
    int version = 0;
    ncclGetVersion(&version);
    const std::string nccl_version = str_cat(version / 10000, ".", version / 100 % 100, ".", version % 100);
    const char* multi = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    const bool shared = comm->size_ > devices;
    std::string hint;
    if (shared && version < 23000) {
      hint = str_cat("; ", comm->size_, " ranks share ", devices, " GPU(s), which needs NCCL 2.30 or later with NCCL_MULTI_RANK_GPU_ENABLE=1");
    } else if (shared && !(multi && std::string(multi) == "1")) {
      hint = str_cat("; ", comm->size_, " ranks share ", devices, " GPU(s): set NCCL_MULTI_RANK_GPU_ENABLE=1 (and a small NCCL_MAX_CTAS)");
    }
    return Status::Internal(str_cat("rank ", comm->rank_, ": ncclCommInitRank: ", ncclGetErrorString(r), " (NCCL ", nccl_version, ")", hint));
  }
  comm->comm_ = nccl;
  return comm;
}

NcclCommunicator::~NcclCommunicator() {
  for (auto& [id, entry] : pending_) deferred_.push_back(entry);
  for (const Pending& entry : deferred_) {
    cudaEventDestroy(static_cast<cudaEvent_t>(entry.begin));
    cudaEventDestroy(static_cast<cudaEvent_t>(entry.end));
  }
  if (comm_) ncclCommDestroy(as_comm(comm_));
  if (follow_event_) cudaEventDestroy(static_cast<cudaEvent_t>(follow_event_));
  if (stream_) cudaStreamDestroy(as_stream(stream_));
}

Status NcclCommunicator::follow(void* stream) {
  cudaEvent_t event = static_cast<cudaEvent_t>(follow_event_);
  if (cudaEventRecord(event, static_cast<cudaStream_t>(stream)) != cudaSuccess ||
      cudaStreamWaitEvent(as_stream(stream_), event, 0) != cudaSuccess) {
    return failure("follow", "cannot order the collective after the compute stream");
  }
  return Status::Ok();
}

Status NcclCommunicator::failure(const char* op, const std::string& why) const {
  return Status::Internal(str_cat("rank ", rank_, " of ", size_, ": nccl ", op, " ", why));
}

Status NcclCommunicator::usable(const char* op) const {
  return comm_ ? Status::Ok() : failure(op, "after an earlier failure aborted the communicator");
}

Expected<void*> NcclCommunicator::begin(const char* op) {
  cudaEvent_t event = nullptr;
  if (cudaEventCreate(&event) != cudaSuccess || cudaEventRecord(event, as_stream(stream_)) != cudaSuccess) {
    if (event) cudaEventDestroy(event);
    return failure(op, "cannot record a CUDA event");
  }
  return static_cast<void*>(event);
}

Expected<RequestId> NcclCommunicator::track(const char* op, void* begin, int nccl_result) {
  if (nccl_result != ncclSuccess) {
    cudaEventDestroy(static_cast<cudaEvent_t>(begin));
    return failure(op, str_cat("failed to start: ", ncclGetErrorString(static_cast<ncclResult_t>(nccl_result))));
  }
  cudaEvent_t event = nullptr;
  if (cudaEventCreate(&event) != cudaSuccess || cudaEventRecord(event, as_stream(stream_)) != cudaSuccess) {
    if (event) cudaEventDestroy(event);
    cudaEventDestroy(static_cast<cudaEvent_t>(begin));
    return failure(op, "cannot record a CUDA event");
  }
  const RequestId id = next_request_++;
  pending_[id] = {op, begin, event, transfer_ms_.size()};
  transfer_ms_.push_back(std::numeric_limits<double>::quiet_NaN());
  return id;
}

std::vector<double> NcclCommunicator::take_transfer_ms() {
  std::vector<double> taken;
  taken.swap(transfer_ms_);
  for (auto& [id, entry] : pending_) entry.slot = SIZE_MAX;  // started before: no longer reported
  for (Pending& entry : deferred_) entry.slot = SIZE_MAX;
  return taken;
}

Expected<RequestId> NcclCommunicator::start_all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  MEMC_RETURN_IF_ERROR(usable("all_gather"));
  auto type = nccl_type(dtype);
  if (!type.ok()) return type.status();
  MEMC_ASSIGN_OR_RETURN(void* start, begin("all_gather"));
  return track("all_gather", start, ncclAllGather(send, recv, static_cast<size_t>(count), *type, as_comm(comm_), as_stream(stream_)));
}

Expected<RequestId> NcclCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  MEMC_RETURN_IF_ERROR(usable("reduce_scatter"));
  auto type = reducible_type(dtype);
  if (!type.ok()) return type.status().with_context("reduce_scatter: ");
  MEMC_ASSIGN_OR_RETURN(void* start, begin("reduce_scatter"));
  return track("reduce_scatter", start,
               ncclReduceScatter(send, recv, static_cast<size_t>(count), *type, nccl_op(op), as_comm(comm_), as_stream(stream_)));
}

Expected<RequestId> NcclCommunicator::start_all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  MEMC_RETURN_IF_ERROR(usable("all_reduce"));
  auto type = reducible_type(dtype);
  if (!type.ok()) return type.status().with_context("all_reduce: ");
  MEMC_ASSIGN_OR_RETURN(void* start, begin("all_reduce"));
  return track("all_reduce", start,
               ncclAllReduce(send, recv, static_cast<size_t>(count), *type, nccl_op(op), as_comm(comm_), as_stream(stream_)));
}

Expected<RequestId> NcclCommunicator::start_broadcast(void* buffer, int64_t count, DType dtype, int root) {
  MEMC_RETURN_IF_ERROR(usable("broadcast"));
  if (root < 0 || root >= size_) return Status::BadInput(str_cat("broadcast: root ", root, " is not a rank of ", size_));
  auto type = nccl_type(dtype);
  if (!type.ok()) return type.status();
  MEMC_ASSIGN_OR_RETURN(void* start, begin("broadcast"));
  return track("broadcast", start, ncclBroadcast(buffer, buffer, static_cast<size_t>(count), *type, root, as_comm(comm_), as_stream(stream_)));
}

Expected<NcclCommunicator::Pending> NcclCommunicator::take_pending(RequestId id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return Status::Internal(str_cat("rank ", rank_, ": wait for unknown request ", id));
  const Pending entry = it->second;
  pending_.erase(it);
  return entry;
}

Status NcclCommunicator::complete(const Pending& entry, std::chrono::steady_clock::time_point deadline) {
  const char* op = entry.op;
  cudaEvent_t event = static_cast<cudaEvent_t>(entry.end);
  Status result = Status::Ok();
  while (comm_) {  // after an abort the event is only freed
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaSuccess) break;
    if (state != cudaErrorNotReady) {
      result = failure(op, str_cat("failed: ", cudaGetErrorString(state)));
      break;
    }
    ncclResult_t async_error = ncclSuccess;
    ncclCommGetAsyncError(as_comm(comm_), &async_error);
    if (async_error != ncclSuccess && async_error != ncclInProgress) {
      result = failure(op, str_cat("failed: ", ncclGetErrorString(async_error)));
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      result = failure(op, str_cat("did not complete within ", timeout_s_, " s"));
      break;
    }
    sched_yield();
  }
  if (!result.ok()) {
    // A collective that cannot finish holds the stream: abort the communicator so it is freed.
    ncclCommAbort(as_comm(comm_));
    comm_ = nullptr;
  } else if (comm_ && entry.slot < transfer_ms_.size()) {  // both events have completed: the collective's device time
    float ms = 0;
    if (cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(entry.begin), event) == cudaSuccess) transfer_ms_[entry.slot] = ms;
  }
  cudaEventDestroy(static_cast<cudaEvent_t>(entry.begin));
  cudaEventDestroy(event);
  return result;
}

static std::chrono::steady_clock::time_point deadline_after(double seconds) {
  return std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

Status NcclCommunicator::wait(RequestId id) {
  MEMC_ASSIGN_OR_RETURN(const Pending entry, take_pending(id));
  return complete(entry, deadline_after(timeout_s_));
}

Status NcclCommunicator::wait_on(RequestId id, void* stream) {
  MEMC_ASSIGN_OR_RETURN(const Pending entry, take_pending(id));
  if (cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(entry.end), 0) != cudaSuccess) {
    return complete(entry, deadline_after(timeout_s_));  // the host waits instead
  }
  deferred_.push_back(entry);
  return Status::Ok();
}

Status NcclCommunicator::settle() {
  const auto deadline = deadline_after(timeout_s_);
  Status result = Status::Ok();
  for (const Pending& entry : deferred_) {
    Status st = complete(entry, deadline);
    if (result.ok() && !st.ok()) result = std::move(st);
  }
  deferred_.clear();
  return result;
}

Status NcclCommunicator::barrier() {
  // Work queued on the stream first, then the ranks meet over the bootstrap (no device buffer).
  MEMC_RETURN_IF_ERROR(settle());
  MEMC_RETURN_IF_ERROR(usable("barrier"));
  const cudaError_t err = cudaStreamSynchronize(as_stream(stream_));
  if (err != cudaSuccess) return failure("barrier", cudaGetErrorString(err));
  return bootstrap_->barrier();
}

void NcclCommunicator::abort(int exit_code) {
  if (comm_) ncclCommAbort(as_comm(comm_));
  comm_ = nullptr;
  bootstrap_->abort(exit_code);
  std::_Exit(exit_code);  // not reached: the bootstrap's abort ends the process
}

}  // namespace memc::comm
