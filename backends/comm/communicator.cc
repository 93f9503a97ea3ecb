#include "backends/comm/communicator.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
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

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull, kFnvPrime = 0x100000001b3ull;

uint64_t fnv(uint64_t hash, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * kFnvPrime;
  return hash;
}

// Hashes `limit` bytes from `offset` of the file (all of it from there: limit < 0).
Expected<uint64_t> hash_range(uint64_t hash, const std::string& path, int64_t offset, int64_t limit) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) return Status::BadInput(str_cat(path, ": cannot open"));
  if (offset > 0 && std::fseek(file.get(), offset, SEEK_SET) != 0) return Status::BadInput(str_cat(path, ": cannot seek"));
  std::vector<unsigned char> chunk(1 << 16);
  size_t got;
  while (limit != 0 && (got = std::fread(chunk.data(), 1, limit < 0 ? chunk.size() : std::min<size_t>(chunk.size(), limit), file.get())) > 0) {
    hash = fnv(hash, chunk.data(), got);
    if (limit > 0) limit -= static_cast<int64_t>(got);
  }
  if (std::ferror(file.get())) return Status::BadInput(str_cat(path, ": read error"));
  return hash;
}

}  // namespace

Expected<uint64_t> file_hash(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return hash_range(kFnvOffset, path, 0, -1);
  // A folder of .npy shards (runtime/npy_stream.h), possibly far larger than memory: its files'
  // names and sizes, and each one's first and last 64 KiB (the header and the tail of the data).
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    if (entry.is_regular_file(ec)) files.push_back(entry.path());
  }
  if (ec) return Status::BadInput(str_cat(path, ": cannot list: ", ec.message()));
  std::sort(files.begin(), files.end());
  uint64_t hash = kFnvOffset;
  constexpr int64_t kEdge = 1 << 16;
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    const auto size = static_cast<int64_t>(std::filesystem::file_size(f, ec));
    if (ec) return Status::BadInput(str_cat(f.string(), ": cannot stat"));
    hash = fnv(fnv(hash, name.data(), name.size()), &size, sizeof size);
    MEMC_ASSIGN_OR_RETURN(hash, hash_range(hash, f.string(), 0, kEdge));
    if (size > kEdge) {
      MEMC_ASSIGN_OR_RETURN(hash, hash_range(hash, f.string(), std::max(kEdge, size - kEdge), -1));
    }
  }
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
  // Every rank gathered the same slots, so every rank reaches the same verdict (rank 0 says it).
  if (!unreadable.empty()) return Status::BadInput(str_cat(path, ": cannot be read on rank ", unreadable)).on_every_rank();
  if (!differing.empty()) return Status::BadInput(str_cat(path, ": differs across ranks (rank ", differing, " differs from rank 0)")).on_every_rank();
  return Status::Ok();
}

}  // namespace memc::comm
