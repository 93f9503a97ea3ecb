// Collectives across the ranks of one SPMD program (DESIGN.md, "Backends and devices"). Each
// rank runs the same graph; a collective's shape is the per-rank shape. Blocks are rank-ordered
// along dim 0, as MPI_Allgather / MPI_Reduce_scatter_block and NCCL lay them out:
//   all_gather(x [n, …]) → [ranks·n, …]  block r of the result is rank r's x
//   reduce_scatter(x [ranks·n, …]) → [n, …]  rank r gets Σ over ranks of block r
//   all_reduce(x) → x's shape, Σ (or max) over ranks;  broadcast(x) → the root's x
//   shard_block(x [ranks·n, …]) → [n, …]  block r of x on rank r (local: no communication)
//   split_flat(x [n]) → [s_0], …, [s_k−1]  pieces of a unit's flat buffer {sizes}, consecutive
//                       or at ascending, non-overlapping {offsets}; what no piece covers is
//                       padding; gradient: the pieces at their offsets, zeros elsewhere
// Attributes: ranks (group size), group (a name; "world" when absent), reduce = "sum" | "max"
// on the reducing ops, root on broadcast. kernels call backends/comm's Communicator.
//
// Async pairs let a schedule overlap communication with compute: OP_start(x[, after]) returns
// the pending result buffer (its contents undefined until done), OP_done(pending, x) completes
// it in place. `done` reads x so that liveness keeps the source alive while the transfer runs.
// The optional `after` is any value the start must follow (zero3's prefetch: the first split
// piece of the unit before); the schedule pass may issue such a start as soon as it exists. A
// done's optional `after` is what it waits for (a gradient's reduction completes once the next
// unit's gradient exists, so the transfer overlaps that unit's backward).
#include "ir/grad.h"
#include "ir/ops/ops.h"

namespace memc {
namespace {

Status check_group(const Node& node) {
  const int64_t ranks = node.attrs.get_int("ranks", 0);
  if (ranks < 1 || ranks > (int64_t{1} << 20)) return Status::BadInput(str_cat("attribute 'ranks' ", ranks, " outside [1, 2^20]"));
  const Attr* group = node.attrs.find("group");
  if (group && !std::holds_alternative<std::string>(*group)) return Status::BadInput("attribute 'group' must be a string");
  return Status::Ok();
}

Status check_reduce(const Node& node, DType dtype) {
  const std::string reduce = node.attrs.get_string("reduce", "sum");
  if (reduce != "sum" && reduce != "max") return Status::BadInput(str_cat("attribute 'reduce' is '", reduce, "', not sum or max"));
  if (!is_float(dtype) && dtype != DType::kI32 && dtype != DType::kI64) {
    return Status::BadInput(str_cat("cannot reduce ", dtype_name(dtype), " (float, i32 or i64 only)"));
  }
  return Status::Ok();
}

// The synchronous op's result type for input type `x`; shared by OP, OP_start and OP_done.
using ResultFn = Status (*)(const Node&, const TensorType& x, TensorType& out);

Status all_gather_result(const Node& node, const TensorType& x, TensorType& out) {
  MEMC_RETURN_IF_ERROR(check_group(node));
  if (x.shape.empty()) return Status::BadInput("all_gather needs an input of rank >= 1 (blocks stack along dim 0)");
  out = x;
  out.shape[0] *= node.attrs.get_int("ranks", 1);
  return check_shape(out.shape, "all_gather result");
}

Status reduce_scatter_result(const Node& node, const TensorType& x, TensorType& out) {
  MEMC_RETURN_IF_ERROR(check_group(node));
  MEMC_RETURN_IF_ERROR(check_reduce(node, x.dtype));
  const int64_t ranks = node.attrs.get_int("ranks", 1);
  if (x.shape.empty() || x.shape[0] % ranks != 0) {
    return Status::BadInput(str_cat("reduce_scatter input [", shape_str(x.shape), "] dim 0 is not a multiple of ", ranks,
                                    " ranks (pad the flat buffer)"));
  }
  out = x;
  out.shape[0] /= ranks;
  return Status::Ok();
}

Status shard_block_result(const Node& node, const TensorType& x, TensorType& out) {
  MEMC_RETURN_IF_ERROR(check_group(node));
  const int64_t ranks = node.attrs.get_int("ranks", 1);
  if (x.shape.empty() || x.shape[0] % ranks != 0) {
    return Status::BadInput(str_cat("shard_block input [", shape_str(x.shape), "] dim 0 is not a multiple of ", ranks, " ranks"));
  }
  out = x;
  out.shape[0] /= ranks;
  return Status::Ok();
}

Status split_flat_shape(const ShapeContext& c, std::vector<TensorType>& out) {
  const TensorType& x = c.inputs[0];
  const std::vector<int64_t> sizes = c.node.attrs.get_ints("sizes");
  if (x.shape.size() != 1) return Status::BadInput(str_cat("split_flat input is [", shape_str(x.shape), "], not a flat buffer"));
  if (sizes.empty()) return Status::BadInput("split_flat needs 'sizes'");
  const std::vector<int64_t> offsets = split_flat_offsets(c.node.attrs);
  if (offsets.size() != sizes.size()) return Status::BadInput(str_cat("split_flat has ", sizes.size(), " sizes and ", offsets.size(), " offsets"));
  int64_t end = 0;
  out.clear();
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1) return Status::BadInput(str_cat("split_flat size ", sizes[i], " is not positive"));
    if (offsets[i] < end) return Status::BadInput(str_cat("split_flat piece ", i, " at ", offsets[i], " overlaps the one before (ends at ", end, ")"));
    end = offsets[i] + sizes[i];
    out.push_back({x.dtype, {sizes[i]}});
  }
  if (end > x.shape[0]) return Status::BadInput(str_cat("split_flat pieces end at ", end, ", beyond the buffer's ", x.shape[0]));
  return Status::Ok();
}

// d x = the pieces' gradients at their offsets, zeros between and after them; a piece nobody
// read contributes zeros.
Status split_flat_grad(GradBuilder& g) {
  if (!g.needs_GI(0)) return Status::Ok();
  const std::vector<int64_t> sizes = g.attrs().get_ints("sizes"), offsets = split_flat_offsets(g.attrs());
  const DType dtype = g.dtype(g.I(0));
  auto zeros = [&](int64_t n) { return g.emit("constant", {}, make_attrs({{"value", Tensor::zeros(dtype, {n})}})); };
  std::vector<ValueId> parts;
  int64_t end = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (offsets[i] > end) parts.push_back(zeros(offsets[i] - end));
    const ValueId go = g.GO(static_cast<int>(i));
    parts.push_back(go != kNoValue ? go : zeros(sizes[i]));
    end = offsets[i] + sizes[i];
  }
  const int64_t padding = g.shape(g.I(0))[0] - end;
  if (padding > 0) parts.push_back(zeros(padding));
  g.set_GI(0, parts.size() == 1 ? parts[0] : g.emit("concat", parts, make_attrs({{"axis", int64_t{0}}})));
  return Status::Ok();
}

Status all_reduce_result(const Node& node, const TensorType& x, TensorType& out) {
  MEMC_RETURN_IF_ERROR(check_group(node));
  MEMC_RETURN_IF_ERROR(check_reduce(node, x.dtype));
  out = x;
  return Status::Ok();
}

Status broadcast_result(const Node& node, const TensorType& x, TensorType& out) {
  MEMC_RETURN_IF_ERROR(check_group(node));
  const int64_t root = node.attrs.get_int("root", 0);
  if (root < 0 || root >= node.attrs.get_int("ranks", 1)) return Status::BadInput(str_cat("root ", root, " is not a rank"));
  out = x;
  return Status::Ok();
}

ShapeFn sync_shape(ResultFn result) {
  return [result](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
    TensorType t;
    MEMC_RETURN_IF_ERROR(result(c.node, c.inputs[0], t));
    out = {t};
    return Status::Ok();
  };
}

// done(pending, x): pending must be what start(x) returned.
ShapeFn done_shape(ResultFn result) {
  return [result](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
    TensorType t;
    MEMC_RETURN_IF_ERROR(result(c.node, c.inputs[1], t));
    if (!(c.inputs[0] == t)) {
      return Status::BadInput(str_cat("pending buffer is ", type_str(c.inputs[0]), ", the collective of ", type_str(c.inputs[1]),
                                      " gives ", type_str(t)));
    }
    out = {t};
    return Status::Ok();
  };
}

// Additions a reduction performs: (ranks − 1) per element of the reduced result.
int64_t reduce_flops(const Node& node, int64_t reduced_elements) {
  return (node.attrs.get_int("ranks", 1) - 1) * reduced_elements;
}

Attrs group_attrs(const Attrs& from, bool with_reduce) {
  Attrs a;
  a.set("ranks", from.get_int("ranks", 1));
  if (from.has("group")) a.set("group", from.get_string("group", "world"));
  if (with_reduce) a.set("reduce", std::string("sum"));
  return a;
}

// SPMD gradients of the summed loss over ranks. all_gather: y = [x_0; …; x_{R−1}] on every rank,
// so dx_r = Σ_r' dy_r'[block r] = reduce_scatter(dy).
Status all_gather_grad(GradBuilder& g) {
  if (g.needs_GI(0)) g.set_GI(0, g.emit("reduce_scatter", {g.GO(0)}, group_attrs(g.attrs(), true)));
  return Status::Ok();
}
// all_gather_done(pending, x) is all_gather(x) completed: dx = reduce_scatter(dy), itself an
// async pair (zero3's gradient leaves while the backward goes on); the pending buffer (its
// start's result, contents undefined) has no gradient.
Status all_gather_done_grad(GradBuilder& g) {
  if (!g.needs_GI(1)) return Status::Ok();
  const Attrs attrs = group_attrs(g.attrs(), true);
  const ValueId pending = g.emit("reduce_scatter_start", {g.GO(0)}, attrs);
  g.set_GI(1, g.emit("reduce_scatter_done", {pending, g.GO(0)}, attrs));
  return Status::Ok();
}
// reduce_scatter (sum): y_r = Σ_r' x_r'[block r], so dx_r'[block r] = dy_r: dx = all_gather(dy).
Status reduce_scatter_grad(GradBuilder& g) {
  if (g.attrs().get_string("reduce", "sum") != "sum") return Status::BadInput("memc.reduce_scatter with reduce = max has no gradient rule");
  if (g.needs_GI(0)) g.set_GI(0, g.emit("all_gather", {g.GO(0)}, group_attrs(g.attrs(), false)));
  return Status::Ok();
}
// all_reduce (sum): y = Σ_r x_r on every rank, so dx_r = Σ_r' dy_r' = all_reduce(dy).
Status all_reduce_grad(GradBuilder& g) {
  if (g.attrs().get_string("reduce", "sum") != "sum") return Status::BadInput("memc.all_reduce with reduce = max has no gradient rule");
  if (g.needs_GI(0)) g.set_GI(0, g.emit("all_reduce", {g.GO(0)}, group_attrs(g.attrs(), true)));
  return Status::Ok();
}
// broadcast: dx_root = Σ_r dy_r and zero elsewhere — a reduce-to-root memc has no op for yet.
Status broadcast_grad(GradBuilder& g) {
  return Status::BadInput("memc.broadcast has no gradient rule (broadcast parameters before differentiating)");
}

struct Collective {
  const char* name;
  ResultFn result;
  GradFn grad;
  const char* doc;
  bool reduces;
};

}  // namespace

std::vector<int64_t> flat_offsets(const std::vector<int64_t>& numels, int64_t align) {
  std::vector<int64_t> offsets;
  int64_t end = 0;
  for (int64_t n : numels) {
    offsets.push_back((end + align - 1) / align * align);
    end = offsets.back() + n;
  }
  return offsets;
}

std::vector<int64_t> split_flat_offsets(const Attrs& attrs) {
  std::vector<int64_t> offsets = attrs.get_ints("offsets");
  return offsets.empty() ? flat_offsets(attrs.get_ints("sizes"), 1) : offsets;
}


void register_collective_ops(OpRegistry& r) {
  const Collective collectives[] = {
      {"all_gather", all_gather_result, all_gather_grad, "x [n, …] → [ranks·n, …], block r from rank r {ranks, group}", false},
      {"reduce_scatter", reduce_scatter_result, reduce_scatter_grad,
       "x [ranks·n, …] → [n, …], rank r gets the sum (or max) of block r {ranks, group, reduce}", true},
      {"all_reduce", all_reduce_result, all_reduce_grad, "x → the sum (or max) of x over ranks {ranks, group, reduce}", true},
      {"broadcast", broadcast_result, broadcast_grad, "x → the root's x on every rank {ranks, group, root}", false},
  };
  // Local, but rank-dependent: a rank's shard of a flat buffer every rank holds whole.
  r.add({.name = "shard_block", .min_inputs = 1, .max_inputs = 1, .flags = kOpNoGradient, .shape = sync_shape(shard_block_result),
         .flops = [](const Node&, auto, auto) -> int64_t { return 0; }, .doc = "x [ranks·n, …] → [n, …], block r of x on rank r {ranks}"});
  r.add({.name = "split_flat", .min_inputs = 1, .max_inputs = 1, .num_outputs = -1, .shape = split_flat_shape,
         .flops = [](const Node&, auto, auto) -> int64_t { return 0; },
         .doc = "x [n] → [s_0], …, [s_k−1]: consecutive pieces of a flat buffer {sizes}", .grad = split_flat_grad});
  for (const Collective& c : collectives) {
    const bool reduces = c.reduces;
    // Flops: a reduction adds ranks − 1 values into each element of its result; gathers and
    // broadcasts compute nothing.
    FlopsFn flops = [reduces](const Node& n, std::span<const TensorType>, std::span<const TensorType> out) -> int64_t {
      return reduces ? reduce_flops(n, out[0].numel()) : 0;
    };
    r.add({.name = c.name, .min_inputs = 1, .max_inputs = 1, .flags = kOpCollective, .shape = sync_shape(c.result),
           .flops = flops, .doc = c.doc, .grad = c.grad});
    r.add({.name = str_cat(c.name, "_start"), .min_inputs = 1, .max_inputs = 2, .flags = kOpCollective | kOpNoGradient,
           .shape = sync_shape(c.result), .flops = [](const Node&, auto, auto) -> int64_t { return 0; },
           .doc = str_cat("(x[, after]) → the pending result of ", c.name, " (undefined until ", c.name,
                          "_done); `after`, read for order only, is the prefetch point")});
    // all_gather_done differentiates (zero3's prefetched gathers); the other pairs are emitted
    // after autodiff only.
    const bool gather = std::string_view(c.name) == "all_gather";
    r.add({.name = str_cat(c.name, "_done"), .min_inputs = 2, .max_inputs = 3,
           .flags = kOpCollective | kOpInplaceOk | (gather ? 0u : kOpNoGradient), .shape = done_shape(c.result), .flops = flops,
           .doc = str_cat("(pending, x[, after]) → the completed ", c.name, " of x, in place over pending; `after`, read ",
                          "for order only, is what the completion waits for"),
           .grad = gather ? GradFn(all_gather_done_grad) : GradFn()});
  }
}

int64_t collective_wire_bytes(const Module& m, const Node& node) {
  const OpDef* def = node.def;
  if (!def || !(def->flags & kOpCollective) || node.outputs.empty()) return 0;
  if (node.op.ends_with("_done")) return 0;  // counted once, at the start
  const std::string base = node.op.ends_with("_start") ? node.op.substr(0, node.op.size() - 6) : node.op;
  const int64_t ranks = node.attrs.get_int("ranks", 1);
  const int64_t out_bytes = m.value(node.outputs[0]).type.bytes();
  const int64_t in_bytes = m.value(node.inputs[0]).type.bytes();
  // Ring algorithms: each rank sends (ranks − 1) blocks of the larger buffer's 1/ranks.
  if (base == "all_gather") return out_bytes * (ranks - 1) / ranks;
  if (base == "reduce_scatter") return in_bytes * (ranks - 1) / ranks;
  if (base == "all_reduce") return 2 * in_bytes * (ranks - 1) / ranks;
  if (base == "broadcast") return ranks > 1 ? in_bytes : 0;
  return 0;
}

}  // namespace memc
