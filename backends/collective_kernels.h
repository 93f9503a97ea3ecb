// The collective ops' kernels (ir/ops/collective.cc), one implementation for every backend:
// each is one call of the rank's Communicator (backends/comm/communicator.h) on the node's
// arena buffers: host memory with MPI on CPU ranks, device memory with NCCL on GPU ranks. The
// backend supplies only its copy (`Copy`: memcpy on the CPU, an async copy on the node's stream
// on a GPU), for what needs no communication: a group of one (no communicator: the identity),
// shard_block, and a done's result where it is not in place.
// Ordering: a start first orders the communicator after the work queued on the node's stream
// (Communicator::follow: a no-op for MPI, whose CPU kernels have all finished; NCCL's own stream
// waits for the compute stream), so it reads its input once computed. A done orders what follows
// it on the node's stream after the collective (Communicator::wait_on: MPI waits on the host;
// NCCL makes the compute stream wait, and the executor's settle() at the step's end checks the
// deadline), and each blocking collective waits on the host, so nothing reads a result early and
// a dead peer fails the step instead of hanging.
#pragma once
#include <string>
#include <string_view>

#include "backends/backend.h"
#include "backends/comm/communicator.h"
#include "ir/ops/ops.h"

namespace memc::collective {

inline Expected<comm::ReduceOp> reduce_op(const Node& node) {
  const std::string reduce = node.attrs.get_string("reduce", "sum");
  if (reduce == "sum") return comm::ReduceOp::kSum;
  if (reduce == "max") return comm::ReduceOp::kMax;
  return Status::BadInput(str_cat("reduce '", reduce, "' is not sum or max"));
}

// The node's group must be this job's ranks: a plan compiled for N devices runs on N ranks.
inline Status check_group(const KernelContext& ctx) {
  const int64_t ranks = ctx.node.attrs.get_int("ranks", 1);
  const int64_t size = ctx.comm ? ctx.comm->size() : 1;
  if (ranks == size) return Status::Ok();
  return Status::BadInput(str_cat(ctx.node.op, " over ", ranks, " ranks runs in a job of ", size,
                                  ctx.comm ? "" : " (no communicator: start the run with mpirun)"));
}

template <class Copy>
Status copy_through(KernelContext& ctx, Copy& copy) {
  const Tensor& x = *ctx.inputs[0];
  if (ctx.outputs[0]->raw() == x.raw()) return Status::Ok();
  return copy(ctx.outputs[0]->raw(), x.raw(), static_cast<int64_t>(x.nbytes()));
}

// OP_start(x[, after]) → pending, and the blocking OP(x) as start + wait. `base` is the op
// without _start. One rank without a communicator: the identity, at once.
template <class Copy>
Expected<comm::RequestId> start(KernelContext& ctx, Copy& copy, std::string_view base) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  if (!ctx.comm) {
    MEMC_RETURN_IF_ERROR(copy_through(ctx, copy));
    return comm::RequestId{0};
  }
  MEMC_RETURN_IF_ERROR(ctx.comm->follow(ctx.stream));
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  if (base == "all_gather") return ctx.comm->start_all_gather(x.raw(), y.raw(), x.numel(), x.dtype());
  MEMC_ASSIGN_OR_RETURN(const comm::ReduceOp op, reduce_op(ctx.node));
  if (base == "reduce_scatter") return ctx.comm->start_reduce_scatter(x.raw(), y.raw(), y.numel(), y.dtype(), op);
  if (base == "all_reduce") return ctx.comm->start_all_reduce(x.raw(), y.raw(), x.numel(), x.dtype(), op);
  return Status::Internal(str_cat("no collective named ", base));
}

template <class Copy>
Status blocking(KernelContext& ctx, Copy& copy, std::string_view base) {
  MEMC_ASSIGN_OR_RETURN(const comm::RequestId request, start(ctx, copy, base));
  return ctx.comm ? ctx.comm->wait(request) : Status::Ok();
}

template <class Copy>
Status start_kernel(KernelContext& ctx, Copy& copy, std::string_view base) {
  MEMC_ASSIGN_OR_RETURN(const comm::RequestId request, start(ctx, copy, base));
  if (ctx.comm) ctx.comm->hold(ctx.outputs[0]->raw(), request);
  return Status::Ok();
}

// OP_done(pending, x) → the result over pending: waits for it.
template <class Copy>
Status done_kernel(KernelContext& ctx, Copy& copy) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  const Tensor& pending = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  if (ctx.comm) {
    MEMC_ASSIGN_OR_RETURN(const comm::RequestId request, ctx.comm->take(pending.raw()));
    MEMC_RETURN_IF_ERROR(ctx.comm->wait_on(request, ctx.stream));
  }
  if (y.raw() == pending.raw()) return Status::Ok();  // in place in a planned arena
  return copy(y.raw(), pending.raw(), static_cast<int64_t>(y.nbytes()));
}

template <class Copy>
Status broadcast_kernel(KernelContext& ctx, Copy& copy) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  MEMC_RETURN_IF_ERROR(copy_through(ctx, copy));
  if (!ctx.comm) return Status::Ok();
  MEMC_RETURN_IF_ERROR(ctx.comm->follow(ctx.stream));
  Tensor& y = *ctx.outputs[0];
  return ctx.comm->broadcast(y.raw(), y.numel(), y.dtype(), static_cast<int>(ctx.node.attrs.get_int("root", 0)));
}

// y = block `rank` of x along dim 0 (x [ranks·n, …] → [n, …]): local, no communication.
template <class Copy>
Status shard_block_kernel(KernelContext& ctx, Copy& copy) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  const int rank = ctx.comm ? ctx.comm->rank() : 0;
  return copy(y.raw(), static_cast<const char*>(x.raw()) + rank * y.nbytes(), static_cast<int64_t>(y.nbytes()));
}

// Calls add(op, kernel) for every collective op but split_flat (a copy each backend has in its
// own op table), over the backend's Copy, which is constructed from the KernelContext.
template <class Copy, class Add>
void register_kernels(Add&& add) {
  add("all_gather", [](KernelContext& ctx) { Copy copy(ctx); return blocking(ctx, copy, "all_gather"); });
  add("reduce_scatter", [](KernelContext& ctx) { Copy copy(ctx); return blocking(ctx, copy, "reduce_scatter"); });
  add("all_reduce", [](KernelContext& ctx) { Copy copy(ctx); return blocking(ctx, copy, "all_reduce"); });
  add("all_gather_start", [](KernelContext& ctx) { Copy copy(ctx); return start_kernel(ctx, copy, "all_gather"); });
  add("reduce_scatter_start", [](KernelContext& ctx) { Copy copy(ctx); return start_kernel(ctx, copy, "reduce_scatter"); });
  add("all_reduce_start", [](KernelContext& ctx) { Copy copy(ctx); return start_kernel(ctx, copy, "all_reduce"); });
  const Kernel done = [](KernelContext& ctx) { Copy copy(ctx); return done_kernel(ctx, copy); };
  for (const char* op : {"all_gather_done", "reduce_scatter_done", "all_reduce_done"}) add(op, done);
  add("broadcast", [](KernelContext& ctx) { Copy copy(ctx); return broadcast_kernel(ctx, copy); });
  add("shard_block", [](KernelContext& ctx) { Copy copy(ctx); return shard_block_kernel(ctx, copy); });
}

}  // namespace memc::collective
