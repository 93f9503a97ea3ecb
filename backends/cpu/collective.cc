// Collective kernels (ir/ops/collective.cc) on CPU ranks: each is one call of the rank's
// Communicator (backends/comm/communicator.h) on arena buffers, which are host memory on the CPU
// backend. One rank without a communicator runs them as the identity a group of one computes.
// shard_block and split_flat need no communication: they copy parts of a flat buffer.
#include <cstring>
#include <string>

#include "backends/comm/communicator.h"
#include "backends/cpu/kernels.h"
#include "ir/ops/ops.h"

namespace memc::cpu {
namespace {

Expected<comm::ReduceOp> reduce_op(const Node& node) {
  const std::string reduce = node.attrs.get_string("reduce", "sum");
  if (reduce == "sum") return comm::ReduceOp::kSum;
  if (reduce == "max") return comm::ReduceOp::kMax;
  return Status::BadInput(str_cat("reduce '", reduce, "' is not sum or max"));
}

// The node's group must be this job's ranks: a plan compiled for N devices runs on N ranks.
Status check_group(const KernelContext& ctx) {
  const int64_t ranks = ctx.node.attrs.get_int("ranks", 1);
  const int64_t size = ctx.comm ? ctx.comm->size() : 1;
  if (ranks == size) return Status::Ok();
  return Status::BadInput(str_cat(ctx.node.op, " over ", ranks, " ranks runs in a job of ", size,
                                  ctx.comm ? "" : " (no communicator: start the run with mpirun)"));
}

Status copy_through(KernelContext& ctx) {
  const Tensor& x = *ctx.inputs[0];
  if (ctx.outputs[0]->raw() != x.raw()) std::memcpy(ctx.outputs[0]->raw(), x.raw(), x.nbytes());
  return Status::Ok();
}

Status all_gather_kernel(KernelContext& ctx) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  if (!ctx.comm) return copy_through(ctx);
  const Tensor& x = *ctx.inputs[0];
  return ctx.comm->all_gather(x.raw(), ctx.outputs[0]->raw(), x.numel(), x.dtype());
}

Status reduce_scatter_kernel(KernelContext& ctx) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  if (!ctx.comm) return copy_through(ctx);
  MEMC_ASSIGN_OR_RETURN(const comm::ReduceOp op, reduce_op(ctx.node));
  Tensor& y = *ctx.outputs[0];
  return ctx.comm->reduce_scatter(ctx.inputs[0]->raw(), y.raw(), y.numel(), y.dtype(), op);
}

Status all_reduce_kernel(KernelContext& ctx) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  if (!ctx.comm) return copy_through(ctx);
  MEMC_ASSIGN_OR_RETURN(const comm::ReduceOp op, reduce_op(ctx.node));
  const Tensor& x = *ctx.inputs[0];
  return ctx.comm->all_reduce(x.raw(), ctx.outputs[0]->raw(), x.numel(), x.dtype(), op);
}

// OP_start(x[, after]) → pending: starts the collective into the pending buffer and leaves it
// in flight (one rank: the identity, at once). OP_done(pending, x) → the result over pending:
// waits for it. `after` only orders the start (the schedule's prefetch point).
Status start_kernel(KernelContext& ctx, const std::string& base) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  if (!ctx.comm) return copy_through(ctx);
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  Expected<comm::RequestId> request = Status::Internal("unreachable");
  if (base == "all_gather") {
    request = ctx.comm->start_all_gather(x.raw(), y.raw(), x.numel(), x.dtype());
  } else {
    MEMC_ASSIGN_OR_RETURN(const comm::ReduceOp op, reduce_op(ctx.node));
    request = base == "reduce_scatter" ? ctx.comm->start_reduce_scatter(x.raw(), y.raw(), y.numel(), y.dtype(), op)
                                       : ctx.comm->start_all_reduce(x.raw(), y.raw(), x.numel(), x.dtype(), op);
  }
  if (!request.ok()) return request.status();
  ctx.comm->hold(y.raw(), *request);
  return Status::Ok();
}

Status done_kernel(KernelContext& ctx) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  const Tensor& pending = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  if (ctx.comm) {
    MEMC_ASSIGN_OR_RETURN(const comm::RequestId request, ctx.comm->take(pending.raw()));
    MEMC_RETURN_IF_ERROR(ctx.comm->wait(request));
  }
  if (y.raw() != pending.raw()) std::memcpy(y.raw(), pending.raw(), y.nbytes());  // in place in a planned arena
  return Status::Ok();
}

Status broadcast_kernel(KernelContext& ctx) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  MEMC_RETURN_IF_ERROR(copy_through(ctx));
  if (!ctx.comm) return Status::Ok();
  Tensor& y = *ctx.outputs[0];
  return ctx.comm->broadcast(y.raw(), y.numel(), y.dtype(), static_cast<int>(ctx.node.attrs.get_int("root", 0)));
}

// y = block `rank` of x along dim 0 (x [ranks·n, …] → [n, …]).
Status shard_block_kernel(KernelContext& ctx) {
  MEMC_RETURN_IF_ERROR(check_group(ctx));
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  const int rank = ctx.comm ? ctx.comm->rank() : 0;
  std::memcpy(y.raw(), static_cast<const char*>(x.raw()) + rank * y.nbytes(), y.nbytes());
  return Status::Ok();
}

// Pieces of a flat buffer at their offsets (a unit's gathered parameters).
Status split_flat_kernel(KernelContext& ctx) {
  const char* x = static_cast<const char*>(ctx.inputs[0]->raw());
  const std::vector<int64_t> offsets = split_flat_offsets(ctx.node.attrs);
  const size_t elem = dtype_size(ctx.inputs[0]->dtype());
  for (size_t i = 0; i < ctx.outputs.size(); ++i) std::memcpy(ctx.outputs[i]->raw(), x + offsets[i] * elem, ctx.outputs[i]->nbytes());
  return Status::Ok();
}

}  // namespace

void register_collective_kernels(KernelTable& t) {
  t.add("all_gather", all_gather_kernel);
  t.add("reduce_scatter", reduce_scatter_kernel);
  t.add("all_reduce", all_reduce_kernel);
  t.add("broadcast", broadcast_kernel);
  t.add("shard_block", shard_block_kernel);
  t.add("split_flat", split_flat_kernel);
  t.add("all_gather_start", [](KernelContext& ctx) { return start_kernel(ctx, "all_gather"); });
  t.add("reduce_scatter_start", [](KernelContext& ctx) { return start_kernel(ctx, "reduce_scatter"); });
  t.add("all_reduce_start", [](KernelContext& ctx) { return start_kernel(ctx, "all_reduce"); });
  for (const char* done : {"all_gather_done", "reduce_scatter_done", "all_reduce_done"}) t.add(done, done_kernel);
}

}  // namespace memc::cpu
