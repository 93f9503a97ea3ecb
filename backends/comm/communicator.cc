#include "backends/comm/communicator.h"

#include <cstdio>
#include <memory>
#include <vector>

namespace memc::comm {

std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

Expected<RequestId> Communicator::take(const void* result) {
  auto it = pending_.find(result);
  if (it == pending_.end()) return Status::Internal("no collective started into this buffer (an OP_done without its OP_start)");
  const RequestId request = it->second;
  pending_.erase(it);
  return request;
}

Status Communicator::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  auto request = start_all_gather(send, recv, count, dtype);
  return request.ok() ? wait(*request) : request.status();
}

Status Communicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  auto request = start_reduce_scatter(send, recv, count, dtype, op);
  return request.ok() ? wait(*request) : request.status();
}

Status Communicator::all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  auto request = start_all_reduce(send, recv, count, dtype, op);
  return request.ok() ? wait(*request) : request.status();
}

Status Communicator::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  auto request = start_broadcast(buffer, count, dtype, root);
  return request.ok() ? wait(*request) : request.status();
}

int64_t shard_block(int64_t elements, int ranks) {
  MEMC_CHECK(ranks >= 1 && elements >= 0, "shard_block(", elements, ", ", ranks, ")");
  return (elements + ranks - 1) / ranks;
}

Expected<uint64_t> file_hash(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) return Status::BadInput(str_cat(path, ": cannot open"));
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64
  std::vector<unsigned char> chunk(1 << 16);
  size_t got;
  while ((got = std::fread(chunk.data(), 1, chunk.size(), file.get())) > 0) {
    for (size_t i = 0; i < got; ++i) hash = (hash ^ chunk[i]) * 0x100000001b3ull;
  }
  if (std::ferror(file.get())) return Status::BadInput(str_cat(path, ": read error"));
  return hash;
}

Status check_same_file_on_all_ranks(Communicator& comm, const std::string& path) {
  if (comm.buffers() != BufferSpace::kHost) {
    return Status::Internal(str_cat("check_same_file_on_all_ranks needs a host-buffer communicator, not ", comm.transport()));
  }
  // Every rank joins the gather, readable file or not, so none is left waiting. Slot 0 says
  // whether the file was read, slot 1 holds its hash.
  auto hash = file_hash(path);
  const int64_t mine[2] = {hash.ok() ? 1 : 0, hash.ok() ? static_cast<int64_t>(*hash) : 0};
  std::vector<int64_t> all(2 * static_cast<size_t>(comm.size()));
  MEMC_RETURN_IF_ERROR(comm.all_gather(mine, all.data(), 2, DType::kI64));
  std::string unreadable, differing;
  for (int r = 0; r < comm.size(); ++r) {
    if (!all[2 * r]) unreadable += str_cat(unreadable.empty() ? "" : ", ", r);
    else if (all[0] && all[2 * r + 1] != all[1]) differing += str_cat(differing.empty() ? "" : ", ", r);
  }
  if (!unreadable.empty()) return Status::BadInput(str_cat(path, ": cannot be read on rank ", unreadable));
  if (!differing.empty()) return Status::BadInput(str_cat(path, ": differs across ranks (rank ", differing, " differs from rank 0)"));
  return Status::Ok();
}

}  // namespace memc::comm
