// The CUDA backend's op kernels, written once over a runner R that executes bodies
// (backends/cuda/bodies.h) for n indices: a CUDA grid on the device (backends/cuda/kernels.cu),
// a plain loop on the host (tests/cuda/ops_host_test.cc). R provides
//   Status operator()(const Body& body, int64_t n)          run body(0..n-1), stream-ordered
//   Status copy(void* dst, const void* src, int64_t bytes)   within device memory
//   Status upload(void* dst, const void* host, int64_t bytes)  a constant from host memory
//   Status copy_start(void* dst, const void* src, int64_t bytes)  a transfer's start: the copy
//     queued on the copy stream after the compute stream's work so far, keyed by dst
//   Status copy_done(const void* pending)  the compute stream's later work waits for that copy
//   Status gemm(const GemmCall& call, void* workspace, int64_t bytes)
//   Status sdpa(const SdpaShape&, bool backward, const SdpaPointers&, void* workspace, int64_t bytes)
//     cuDNN's attention (backends/cuda/cudnn_sdpa.h); bad input where it cannot run the shape
// Everything here runs on the host side of a launch: reading attributes and shapes, carving the
// node's planned workspace, and choosing bodies. Device data is only touched by bodies.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "ir/ops/ops.h"
#include "backends/kernel_attrs.h"
#include "ir/fused_program.h"
#include "backends/cuda/attention_bodies.h"
#include "backends/cuda/bodies.h"
#include "backends/cuda/gemm.h"
#include "ir/graph.h"
#include "ir/tensor.h"
#include "support/status.h"

namespace memc::cuda::ops {

inline Status unsupported(const KernelContext& ctx, const std::string& what) {
  return Status::BadInput(str_cat("memc.", ctx.node.op, " on CUDA: ", what));
}

inline Expected<Strided> strided(const KernelContext& ctx, const Shape& dims, const std::vector<int64_t>& strides) {
  if (dims.size() > static_cast<size_t>(kMaxDims)) return unsupported(ctx, str_cat("rank ", dims.size(), " > ", kMaxDims));
  Strided s;
  s.rank = static_cast<int>(dims.size());
  int64_t count = 1, last = 0;  // elements, and the largest offset
  bool nonnegative = true;
  for (size_t d = 0; d < dims.size(); ++d) {
    s.dims[d] = dims[d], s.strides[d] = strides[d];
    count *= dims[d];
    nonnegative = nonnegative && strides[d] >= 0;
    last += (dims[d] > 0 ? dims[d] - 1 : 0) * strides[d];
  }
  constexpr int64_t kNarrow = int64_t{1} << 31;
  s.narrow = nonnegative && count < kNarrow && last < kNarrow;
  return s;
}
inline Expected<Strided> broadcast_map(const KernelContext& ctx, const Shape& in, const Shape& out) {
  return strided(ctx, out, broadcast_strides(in, out));
}

// The node's planned scratch, handed out in 256-byte aligned pieces; the sizes the workspace
// model (backends/cuda/workspace.cc) plans are these functions' sums.
constexpr int64_t kScratchAlignment = 256;
inline int64_t scratch_piece(int64_t bytes) { return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment; }
struct Scratch {
  char* next;
  int64_t left;
  explicit Scratch(const KernelContext& ctx) : next(static_cast<char*>(ctx.workspace)), left(ctx.workspace_bytes) {}
  template <typename T>
  Expected<T*> take(const KernelContext& ctx, int64_t count) {
    const int64_t bytes = scratch_piece(count * static_cast<int64_t>(sizeof(T)));
    if (bytes > left) return unsupported(ctx, str_cat("needs ", bytes, " bytes of workspace, ", left, " planned"));
    T* p = reinterpret_cast<T*>(next);
    next += bytes, left -= bytes;
    return p;
  }
};

// Calls fn.template operator()<T>() with T the storage type of a float dtype the bodies handle.
template <typename Fn>
Status dispatch_float(const KernelContext& ctx, DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: return fn.template operator()<float>();
    case DType::kBF16: return fn.template operator()<bf16_t>();
    case DType::kF16: return fn.template operator()<f16_t>();
    default: return unsupported(ctx, str_cat("dtype ", dtype_name(t), " (CUDA kernels take f32, bf16 or f16)"));
  }
}
// Calls fn.template operator()<E>() with E an unsigned integer of t's size (data movement).
template <typename Fn>
Status dispatch_bytes(DType t, Fn&& fn) {
  switch (dtype_size(t)) {
    case 1: return fn.template operator()<uint8_t>();
    case 2: return fn.template operator()<uint16_t>();
    case 4: return fn.template operator()<uint32_t>();
    default: return fn.template operator()<uint64_t>();
  }
}

template <typename T>
const T* in(const KernelContext& ctx, size_t i) {
  return ctx.inputs.size() > i && ctx.inputs[i] ? static_cast<const T*>(ctx.inputs[i]->raw()) : nullptr;
}
template <typename T>
T* out(const KernelContext& ctx, size_t i) {
  return ctx.outputs.size() > i && ctx.outputs[i] ? static_cast<T*>(ctx.outputs[i]->raw()) : nullptr;
}

// ---- data movement ----------------------------------------------------------------------------
template <class R>
Status copy_op(KernelContext& ctx, R& run) {
  return run.copy(ctx.outputs[0]->raw(), ctx.inputs[0]->raw(), static_cast<int64_t>(ctx.outputs[0]->nbytes()));
}

// A transfer's async pair (copy_to_host_start/_done, copy_to_device_start/_done): the start runs
// the copy on the copy stream, the done orders the compute stream after it (and copies only
// where the plan did not put its result in place over the pending buffer).
template <class R>
Status copy_start_op(KernelContext& ctx, R& run) {
  return run.copy_start(ctx.outputs[0]->raw(), ctx.inputs[0]->raw(), static_cast<int64_t>(ctx.outputs[0]->nbytes()));
}

template <class R>
Status copy_done_op(KernelContext& ctx, R& run) {
  const Tensor& pending = *ctx.inputs[0];
  MEMC_RETURN_IF_ERROR(run.copy_done(pending.raw()));
  if (ctx.outputs[0]->raw() == pending.raw()) return Status::Ok();
  return run.copy(ctx.outputs[0]->raw(), pending.raw(), static_cast<int64_t>(pending.nbytes()));
}

template <class R>
Status constant_op(KernelContext& ctx, R& run) {
  const Tensor* value = ctx.node.attrs.get_tensor("value");
  if (!value || value->nbytes() != ctx.outputs[0]->nbytes()) return unsupported(ctx, "value does not match the output type");
  return run.upload(ctx.outputs[0]->raw(), value->raw(), static_cast<int64_t>(value->nbytes()));
}

// out = in[base + Σ coord·stride] over the output's shape.
template <class R>
Status strided_copy(KernelContext& ctx, R& run, int64_t base, const std::vector<int64_t>& strides) {
  const Tensor& y = *ctx.outputs[0];
  MEMC_ASSIGN_OR_RETURN(Strided map, strided(ctx, y.shape(), strides));
  coalesce({&map});
  return dispatch_bytes(y.dtype(), [&]<typename E>() {
    return run(CopyStrided<E>{in<E>(ctx, 0), out<E>(ctx, 0), base, map}, y.numel());
  });
}

template <class R>
Status transpose_op(KernelContext& ctx, R& run) {
  const std::vector<int64_t> own = row_major_strides(ctx.inputs[0]->shape());
  std::vector<int64_t> strides;
  for (int64_t p : ctx.node.attrs.get_ints("perm")) strides.push_back(own[p]);
  return strided_copy(ctx, run, 0, strides);
}

template <class R>
Status slice_op(KernelContext& ctx, R& run) {
  const auto axes = ctx.node.attrs.get_ints("axes"), starts = ctx.node.attrs.get_ints("starts"), steps = ctx.node.attrs.get_ints("steps");
  std::vector<int64_t> strides = row_major_strides(ctx.inputs[0]->shape());
  int64_t base = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (ctx.outputs[0]->shape()[axes[i]] == 0) return Status::Ok();
    base += starts[i] * strides[axes[i]];
    strides[axes[i]] *= steps[i];
  }
  return strided_copy(ctx, run, base, strides);
}

template <class R>
Status expand_op(KernelContext& ctx, R& run) {
  return strided_copy(ctx, run, 0, broadcast_strides(ctx.inputs[0]->shape(), ctx.outputs[0]->shape()));
}

template <class R>
Status concat_op(KernelContext& ctx, R& run) {
  const Tensor& y = *ctx.outputs[0];
  int64_t outer = 1;
  for (int64_t d = 0; d < ctx.node.attrs.get_int("axis", 0); ++d) outer *= y.shape()[d];
  if (outer == 0) return Status::Ok();
  const int64_t out_chunk = y.numel() / outer;
  int64_t offset = 0;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const int64_t chunk = ctx.inputs[i]->numel() / outer;
    if (chunk) {
      MEMC_RETURN_IF_ERROR(dispatch_bytes(y.dtype(), [&]<typename E>() {
        return run(ConcatPart<E>{in<E>(ctx, i), out<E>(ctx, 0), chunk, out_chunk, offset}, outer * chunk);
      }));
    }
    offset += chunk;
  }
  return Status::Ok();
}

// y = x repeated `repeats` times along each dim: a strided copy over [r0, d0, r1, d1, ...] with
// stride 0 along each repeat.
template <class R>
Status tile_op(KernelContext& ctx, R& run) {
  const Tensor& x = *ctx.inputs[0];
  const auto repeats = ctx.node.attrs.get_ints("repeats");
  const std::vector<int64_t> own = row_major_strides(x.shape());
  Shape view;
  std::vector<int64_t> strides;
  for (size_t d = 0; d < repeats.size(); ++d) view.insert(view.end(), {repeats[d], x.shape()[d]}), strides.insert(strides.end(), {0, own[d]});
  MEMC_ASSIGN_OR_RETURN(Strided map, strided(ctx, view, strides));
  coalesce({&map});
  return dispatch_bytes(x.dtype(), [&]<typename E>() { return run(CopyStrided<E>{in<E>(ctx, 0), out<E>(ctx, 0), 0, map}, numel(view)); });
}

template <class R>
Status pad_op(KernelContext& ctx, R& run) {
  const Tensor& x = *ctx.inputs[0];
  Tensor& y = *ctx.outputs[0];
  const std::string mode = ctx.node.attrs.get_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge") return Status::BadInput(str_cat("unknown pad mode '", mode, "'"));
  if (x.rank() > kMaxDims) return unsupported(ctx, str_cat("rank ", x.rank(), " > ", kMaxDims));
  const auto pads = ctx.node.attrs.get_ints("pads");
  Tensor value = Tensor::zeros(x.dtype(), {});  // the pad value in x's storage
  value.set_from_double(0, ctx.node.attrs.get_float("value", 0.0));
  return dispatch_bytes(x.dtype(), [&]<typename E>() {
    Pad<E> body{in<E>(ctx, 0), out<E>(ctx, 0), *static_cast<const E*>(value.raw()),
                mode == "edge" ? PadMode::kEdge : mode == "reflect" ? PadMode::kReflect : PadMode::kConstant, static_cast<int>(x.rank())};
    for (int d = 0; d < body.rank; ++d) body.in_dims[d] = x.shape()[d], body.out_dims[d] = y.shape()[d], body.begin[d] = pads[d];
    return run(body, y.numel());
  });
}

// [outer, n, inner] split of `shape` at `axis`.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
  AxisSplit(const Shape& shape, int64_t axis) {
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) (d < axis ? outer : d > axis ? inner : n) *= shape[d];
  }
};

// Whether `indices` is i64 (else i32; other dtypes are refused).
inline Expected<bool> wide_indices(const KernelContext& ctx, const Tensor& indices) {
  if (indices.dtype() != DType::kI64 && indices.dtype() != DType::kI32) {
    return unsupported(ctx, str_cat("indices of dtype ", dtype_name(indices.dtype())));
  }
  return indices.dtype() == DType::kI64;
}

// gather's sources in data [.., n at axis, ..].
inline Expected<TakeMap> take_map(const KernelContext& ctx, const Tensor& indices, const Shape& data_shape) {
  const AxisSplit s(data_shape, ctx.node.attrs.get_int("axis", 0));
  MEMC_ASSIGN_OR_RETURN(const bool wide, wide_indices(ctx, indices));
  return TakeMap{indices.raw(), wide, s.n, indices.numel(), s.inner};
}

// out = data at map's sources (gather, gather_elements); E moves the bytes of any dtype.
template <class R, class Map>
Status gather_by(KernelContext& ctx, R& run, const Map& map) {
  return dispatch_bytes(ctx.inputs[0]->dtype(), [&]<typename E>() {
    return run(GatherBy<E, Map>{in<E>(ctx, 0), out<E>(ctx, 0), map}, ctx.outputs[0]->numel());
  });
}

template <class R>
Status gather_op(KernelContext& ctx, R& run) {
  MEMC_ASSIGN_OR_RETURN(const TakeMap map, take_map(ctx, *ctx.inputs[1], ctx.inputs[0]->shape()));
  return gather_by(ctx, run, map);
}

// dx = zeros, then dx[map.source(i)] += dy[i] over dy's elements, in f32: dx itself, or scratch
// for 16-bit dx (rounded once at the end), by atomic adds on the device.
template <class R, class Map>
Status scatter_add_by(KernelContext& ctx, R& run, const Map& map) {
  Tensor& dx = *ctx.outputs[0];
  Scratch scratch(ctx);
  return dispatch_float(ctx, dx.dtype(), [&]<typename T>() -> Status {
    float* acc = nullptr;
    if constexpr (std::is_same_v<T, float>) {
      acc = out<float>(ctx, 0);
    } else {
      MEMC_ASSIGN_OR_RETURN(acc, scratch.take<float>(ctx, dx.numel()));
    }
    MEMC_RETURN_IF_ERROR(run(Fill<float>{acc, 0.f}, dx.numel()));
    MEMC_RETURN_IF_ERROR(run(ScatterAddBy<T, Map>{in<T>(ctx, 0), acc, map}, ctx.inputs[0]->numel()));
    if constexpr (!std::is_same_v<T, float>) MEMC_RETURN_IF_ERROR(run(StoreF32<T>{acc, out<T>(ctx, 0)}, dx.numel()));
    return Status::Ok();
  });
}

// dx[.., idx[j], ..] += dy[.., j, ..]
template <class R>
Status gather_grad_op(KernelContext& ctx, R& run) {
  MEMC_ASSIGN_OR_RETURN(const TakeMap map, take_map(ctx, *ctx.inputs[1], ctx.outputs[0]->shape()));
  return scatter_add_by(ctx, run, map);
}

// dx = 0, then dx[slice] = dy.
template <class R>
Status slice_grad_op(KernelContext& ctx, R& run) {
  const Tensor& dy = *ctx.inputs[0];
  Tensor& dx = *ctx.outputs[0];
  const auto axes = ctx.node.attrs.get_ints("axes"), starts = ctx.node.attrs.get_ints("starts"), steps = ctx.node.attrs.get_ints("steps");
  std::vector<int64_t> strides = row_major_strides(dx.shape());
  int64_t base = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    base += starts[i] * strides[axes[i]];
    strides[axes[i]] *= steps[i];
  }
  MEMC_ASSIGN_OR_RETURN(const Strided map, strided(ctx, dy.shape(), strides));
  return dispatch_bytes(dx.dtype(), [&]<typename E>() -> Status {
    MEMC_RETURN_IF_ERROR(run(Zero<E>{out<E>(ctx, 0)}, dx.numel()));
    return run(ScatterStrided<E>{in<E>(ctx, 0), out<E>(ctx, 0), base, map}, dy.numel());
  });
}

// gather_elements' sources in data of `data_shape`.
inline Expected<ElementsMap> elements_map(const KernelContext& ctx, const Tensor& indices, const Shape& data_shape) {
  const Shape& index_shape = indices.shape();
  if (index_shape.size() > static_cast<size_t>(kMaxDims)) return unsupported(ctx, str_cat("rank ", index_shape.size(), " > ", kMaxDims));
  ElementsMap m;
  MEMC_ASSIGN_OR_RETURN(m.wide_indices, wide_indices(ctx, indices));
  m.indices = indices.raw();
  m.rank = static_cast<int>(index_shape.size());
  m.axis = static_cast<int>(ctx.node.attrs.get_int("axis", 0));
  m.axis_dim = data_shape[m.axis];
  const std::vector<int64_t> strides = row_major_strides(data_shape);
  for (int d = 0; d < m.rank; ++d) m.index_dims[d] = index_shape[d], m.data_strides[d] = strides[d];
  return m;
}

template <class R>
Status gather_elements_op(KernelContext& ctx, R& run) {
  MEMC_ASSIGN_OR_RETURN(const ElementsMap map, elements_map(ctx, *ctx.inputs[1], ctx.inputs[0]->shape()));
  return gather_by(ctx, run, map);
}

// dx[elements of idx] += dy
template <class R>
Status gather_elements_grad_op(KernelContext& ctx, R& run) {
  MEMC_ASSIGN_OR_RETURN(const ElementsMap map, elements_map(ctx, *ctx.inputs[1], ctx.outputs[0]->shape()));
  return scatter_add_by(ctx, run, map);
}

// ---- elementwise ------------------------------------------------------------------------------
inline bool is_float_storage(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

template <class R>
Status cast_op(KernelContext& ctx, R& run) {
  const Tensor &x = *ctx.inputs[0], &y = *ctx.outputs[0];
  if (is_float_storage(x.dtype()) && is_float_storage(y.dtype())) {
    return dispatch_float(ctx, x.dtype(), [&]<typename From>() {
      return dispatch_float(ctx, y.dtype(), [&]<typename To>() { return run(CastFloat<From, To>{in<From>(ctx, 0), out<To>(ctx, 0)}, x.numel()); });
    });
  }
  return run(Cast{x.raw(), x.dtype(), ctx.outputs[0]->raw(), y.dtype()}, x.numel());
}

template <class R>
Status unary_op(KernelContext& ctx, R& run, UnaryOp op) {
  if (op == UnaryOp::kGelu && ctx.node.attrs.get_string("approximate", "none") == "tanh") op = UnaryOp::kGeluTanh;
  const float alpha = static_cast<float>(ctx.node.attrs.get_float("alpha", 0.01));
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    return run(Unary<T>{in<T>(ctx, 0), out<T>(ctx, 0), op, alpha}, ctx.outputs[0]->numel());
  });
}

template <class R>
Status binary_op(KernelContext& ctx, R& run, BinaryOp op) {
  if (op == BinaryOp::kMod && ctx.node.attrs.get_int("fmod", 0)) op = BinaryOp::kFmod;
  const Shape& y = ctx.outputs[0]->shape();
  MEMC_ASSIGN_OR_RETURN(Strided sa, broadcast_map(ctx, ctx.inputs[0]->shape(), y));
  MEMC_ASSIGN_OR_RETURN(Strided sb, broadcast_map(ctx, ctx.inputs[1]->shape(), y));
  coalesce({&sa, &sb});
  const DType t = ctx.inputs[0]->dtype();
  if (is_integer(t) || t == DType::kF64) return run(BinaryAny{ctx.inputs[0]->raw(), ctx.inputs[1]->raw(), ctx.outputs[0]->raw(), t, op, sa, sb}, ctx.outputs[0]->numel());
  return dispatch_float(ctx, t, [&]<typename T>() {
    return run(Binary<T>{in<T>(ctx, 0), in<T>(ctx, 1), out<T>(ctx, 0), op, sa, sb}, ctx.outputs[0]->numel());
  });
}

template <class R>
Status compare_op(KernelContext& ctx, R& run, CompareOp op) {
  const Shape& y = ctx.outputs[0]->shape();
  MEMC_ASSIGN_OR_RETURN(Strided sa, broadcast_map(ctx, ctx.inputs[0]->shape(), y));
  MEMC_ASSIGN_OR_RETURN(Strided sb, broadcast_map(ctx, ctx.inputs[1]->shape(), y));
  coalesce({&sa, &sb});
  return run(Compare{ctx.inputs[0]->raw(), ctx.inputs[1]->raw(), ctx.inputs[0]->dtype(), out<uint8_t>(ctx, 0), op, sa, sb},
             ctx.outputs[0]->numel());
}

template <class R>
Status not_op(KernelContext& ctx, R& run) {
  return run(Not{in<uint8_t>(ctx, 0), out<uint8_t>(ctx, 0)}, ctx.outputs[0]->numel());
}

template <class R>
Status where_op(KernelContext& ctx, R& run) {
  const Shape& y = ctx.outputs[0]->shape();
  MEMC_ASSIGN_OR_RETURN(Strided sc, broadcast_map(ctx, ctx.inputs[0]->shape(), y));
  MEMC_ASSIGN_OR_RETURN(Strided sa, broadcast_map(ctx, ctx.inputs[1]->shape(), y));
  MEMC_ASSIGN_OR_RETURN(Strided sb, broadcast_map(ctx, ctx.inputs[2]->shape(), y));
  coalesce({&sc, &sa, &sb});
  return dispatch_bytes(ctx.outputs[0]->dtype(), [&]<typename E>() {
    return run(Where<E>{in<uint8_t>(ctx, 0), in<E>(ctx, 1), in<E>(ctx, 2), out<E>(ctx, 0), sc, sa, sb}, ctx.outputs[0]->numel());
  });
}

// fused_elementwise: the program (ir/fused_program.h) as FusedElementwise's codes, each step
// coded as its op's own kernel chooses (gelu's form, mod never fuses).
inline Expected<FusedCode> fused_code(const KernelContext& ctx, const FusedStep& step, DType dtype) {
  static const std::map<std::string, std::pair<FusedKind, uint8_t>> codes = [] {
    std::map<std::string, std::pair<FusedKind, uint8_t>> c;
    const std::pair<const char*, UnaryOp> unary[] = {
        {"neg", UnaryOp::kNeg}, {"abs", UnaryOp::kAbs}, {"exp", UnaryOp::kExp}, {"log", UnaryOp::kLog}, {"sqrt", UnaryOp::kSqrt},
        {"rsqrt", UnaryOp::kRsqrt}, {"reciprocal", UnaryOp::kReciprocal}, {"tanh", UnaryOp::kTanh}, {"sigmoid", UnaryOp::kSigmoid},
        {"relu", UnaryOp::kRelu}, {"erf", UnaryOp::kErf}, {"gelu", UnaryOp::kGelu}, {"floor", UnaryOp::kFloor},
        {"ceil", UnaryOp::kCeil}, {"round", UnaryOp::kRound}, {"sin", UnaryOp::kSin}, {"cos", UnaryOp::kCos},
        {"softplus", UnaryOp::kSoftplus}, {"sign", UnaryOp::kSign}, {"leaky_relu", UnaryOp::kLeakyRelu},
        {"asin", UnaryOp::kAsin}, {"acos", UnaryOp::kAcos}, {"atan", UnaryOp::kAtan}};
    for (const auto& [name, op] : unary) c[name] = {FusedKind::kUnary, static_cast<uint8_t>(op)};
    const std::pair<const char*, BinaryOp> binary[] = {{"add", BinaryOp::kAdd}, {"sub", BinaryOp::kSub}, {"mul", BinaryOp::kMul},
                                                       {"div", BinaryOp::kDiv}, {"pow", BinaryOp::kPow}, {"max", BinaryOp::kMax},
                                                       {"min", BinaryOp::kMin}};
    for (const auto& [name, op] : binary) c[name] = {FusedKind::kBinary, static_cast<uint8_t>(op)};
    const std::pair<const char*, CompareOp> compare[] = {
        {"equal", CompareOp::kEqual}, {"less", CompareOp::kLess}, {"less_equal", CompareOp::kLessEqual},
        {"greater", CompareOp::kGreater}, {"greater_equal", CompareOp::kGreaterEqual}, {"and", CompareOp::kAnd},
        {"or", CompareOp::kOr}, {"xor", CompareOp::kXor}};
    for (const auto& [name, op] : compare) c[name] = {FusedKind::kCompare, static_cast<uint8_t>(op)};
    c["not"] = {FusedKind::kNot, 0};
    c["where"] = {FusedKind::kWhere, 0};
    c["cast"] = {FusedKind::kCast, 0};
    c["gelu_grad"] = {FusedKind::kGeluGrad, 0};
    c["dropout"] = {FusedKind::kDropout, 0};
    return c;
  }();
  const auto it = codes.find(step.op);
  if (it == codes.end()) return unsupported(ctx, str_cat("no fused step for memc.", step.op));
  FusedCode code;
  code.kind = it->second.first, code.op = it->second.second, code.dtype = dtype;
  const bool tanh_form = step.attrs.get_string("approximate", "none") == "tanh";
  if (step.op == "gelu" && tanh_form) code.op = static_cast<uint8_t>(UnaryOp::kGeluTanh);
  if (step.op == "gelu_grad") code.op = tanh_form ? 1 : 0;
  code.alpha = static_cast<float>(step.attrs.get_float("alpha", 0.01));
  int8_t* operands[] = {&code.a, &code.b, &code.c};
  for (size_t k = 0; k < step.args.size(); ++k) *operands[k] = static_cast<int8_t>(step.args[k]);
  return code;
}

template <class R>
Status fused_elementwise_op(KernelContext& ctx, R& run) {
  static_assert(kFusedInputs == kFusedMaxInputs && kFusedSteps == kFusedMaxSteps && kFusedResults == kFusedMaxResults &&
                kFusedDropouts == kFusedMaxDropouts);
  const int inputs = static_cast<int>(ctx.inputs.size());
  MEMC_ASSIGN_OR_RETURN(const FusedProgram program, fused_program(ctx));  // backends/kernel_attrs.h
  const std::vector<TensorType>& types = program.types;
  const Shape& y = ctx.outputs[0]->shape();
  FusedElementwise body;
  body.inputs = inputs, body.steps = static_cast<int>(program.steps.size()), body.results = static_cast<int>(program.results.size());
  for (int k = 0; k < inputs; ++k) {
    body.in[k] = ctx.inputs[k]->raw(), body.in_type[k] = ctx.inputs[k]->dtype();
    MEMC_ASSIGN_OR_RETURN(body.map[k], broadcast_map(ctx, ctx.inputs[k]->shape(), y));
  }
  Strided* maps[kFusedInputs];
  for (int k = 0; k < inputs; ++k) maps[k] = &body.map[k];
  coalesce(maps, static_cast<size_t>(inputs));
  int dropouts = 0;
  for (int s = 0; s < body.steps; ++s) {
    const FusedStep& step = program.steps[s];
    MEMC_ASSIGN_OR_RETURN(body.step[s], fused_code(ctx, step, types[inputs + s].dtype));
    if (step.op != "dropout") continue;
    const double ratio = step.attrs.get_float("ratio", 0.5);
    const bool active = ctx.training && ratio != 0.0;  // as dropout_op
    const int64_t node_seed = step.attrs.get_int("seed", 0);
    FusedDropout& d = body.dropout[dropouts];
    d.seed = ctx.seed, d.stream = DrawStream{dropout_stream(node_seed, ctx.step), node_seed, ctx.device_step};
    d.threshold = active ? dropout_threshold(ratio) : uint64_t{1} << 32;
    d.offset = random_draw_offset(step.attrs, ctx.batch_row_offset);
    d.scale = active ? static_cast<float>(1.0 / (1.0 - ratio)) : 1.f;
    body.step[s].op = static_cast<uint8_t>(dropouts++);
  }
  for (int r = 0; r < body.results; ++r) body.out[r] = ctx.outputs[r]->raw(), body.result_slot[r] = static_cast<int8_t>(program.results[r]);
  return run(body, ctx.outputs[0]->numel());
}

inline DrawStream draw_stream(const KernelContext& ctx) {
  const int64_t node_seed = ctx.node.attrs.get_int("seed", 0);
  return DrawStream{dropout_stream(node_seed, ctx.step), node_seed, ctx.device_step};
}

template <class R>
Status dropout_op(KernelContext& ctx, R& run) {
  const double ratio = ctx.node.attrs.get_float("ratio", 0.5);
  const int64_t n = ctx.inputs[0]->numel();
  uint8_t* mask = out<uint8_t>(ctx, 1);
  const bool active = ctx.training && ratio != 0.0;
  const DrawStream stream = draw_stream(ctx);
  // Inference: every draw kept (threshold above any 32-bit draw) at scale 1.
  const uint64_t threshold = active ? dropout_threshold(ratio) : uint64_t{1} << 32;
  const float scale = active ? static_cast<float>(1.0 / (1.0 - ratio)) : 1.f;
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    return run(Dropout<T>{in<T>(ctx, 0), out<T>(ctx, 0), mask, ctx.seed, stream, threshold, random_draw_offset(ctx), scale}, n);
  });
}

template <class R>
Status gelu_grad_op(KernelContext& ctx, R& run) {
  const bool tanh_form = ctx.node.attrs.get_string("approximate", "none") == "tanh";
  return dispatch_float(ctx, ctx.inputs[1]->dtype(), [&]<typename T>() {
    return run(GeluGrad<T>{in<T>(ctx, 0), in<T>(ctx, 1), out<T>(ctx, 0), tanh_form}, ctx.outputs[0]->numel());
  });
}

template <class R>
Status full_op(KernelContext& ctx, R& run) {
  const double value = ctx.node.attrs.get_float("value", 0.0);
  Tensor& y = *ctx.outputs[0];
  if (is_float(y.dtype()) && y.dtype() != DType::kF64) {
    return dispatch_float(ctx, y.dtype(), [&]<typename T>() { return run(Fill<T>{out<T>(ctx, 0), static_cast<float>(value)}, y.numel()); });
  }
  return run(FillAny{y.raw(), y.dtype(), value}, y.numel());
}

// ---- reductions and normalization --------------------------------------------------------------
template <class R>
Status reduce_op(KernelContext& ctx, R& run, ReduceOp op) {
  const Shape& x = ctx.inputs[0]->shape();
  const auto axes = ctx.node.attrs.get_ints("axes");
  const std::vector<int64_t> own = row_major_strides(x);
  Shape kept_dims, reduced_dims;
  std::vector<int64_t> kept_strides, reduced_strides;
  for (size_t d = 0; d < x.size(); ++d) {
    const bool reduced = axes.empty() || std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    (reduced ? reduced_dims : kept_dims).push_back(x[d]);
    (reduced ? reduced_strides : kept_strides).push_back(own[d]);
  }
  MEMC_ASSIGN_OR_RETURN(Strided kept, strided(ctx, kept_dims, kept_strides));
  MEMC_ASSIGN_OR_RETURN(Strided reduced, strided(ctx, reduced_dims, reduced_strides));
  coalesce({&kept}), coalesce({&reduced});  // each its own iteration: outputs, and a run of inputs
  const DType t = ctx.inputs[0]->dtype();
  if (!is_float(t)) return unsupported(ctx, str_cat("dtype ", dtype_name(t)));
  return run(Reduce{ctx.inputs[0]->raw(), ctx.outputs[0]->raw(), t, op, kept, reduced, numel(reduced_dims)}, ctx.outputs[0]->numel());
}

// A parameter broadcast to the normalized dims (layernorm's scale and bias).
inline Expected<Strided> param_map(const KernelContext& ctx, size_t input, const Shape& normalized) {
  if (ctx.inputs.size() <= input || !ctx.inputs[input]) return Strided{};
  return broadcast_map(ctx, ctx.inputs[input]->shape(), normalized);
}

// layernorm(x, scale, [bias]), or add_layernorm(x, r, scale, [bias]) → (x + r, y) (`residual`).
template <class R>
Status layernorm_rows_op(KernelContext& ctx, R& run, bool residual) {
  const Tensor& x = *ctx.inputs[0];
  const size_t p = residual ? 2 : 1, y = residual ? 1 : 0;  // scale's input, y's output
  const int64_t axis = ctx.node.attrs.get_int("axis", x.rank() - 1);
  const Shape normalized(x.shape().begin() + axis, x.shape().end());
  const int64_t n = numel(normalized), rows = n ? x.numel() / n : 0;
  MEMC_ASSIGN_OR_RETURN(const Strided scale_map, param_map(ctx, p, normalized));
  MEMC_ASSIGN_OR_RETURN(const Strided bias_map, param_map(ctx, p + 1, normalized));
  const double eps = ctx.node.attrs.get_float("eps", 1e-5);
  return dispatch_float(ctx, x.dtype(), [&]<typename T>() {
    LayernormRow<T> body{in<T>(ctx, 0), in<T>(ctx, p), in<T>(ctx, p + 1), ctx.outputs[y]->raw(), ctx.outputs[y]->dtype(), out<float>(ctx, y + 1),
                         out<float>(ctx, y + 2), n, eps, scale_map, bias_map};
    if (residual) body.residual = ctx.inputs[1]->raw(), body.residual_type = ctx.inputs[1]->dtype(), body.sum = out<T>(ctx, 0);
    return run(body, rows);
  });
}
template <class R>
Status layernorm_op(KernelContext& ctx, R& run) { return layernorm_rows_op(ctx, run, false); }
template <class R>
Status add_layernorm_op(KernelContext& ctx, R& run) { return layernorm_rows_op(ctx, run, true); }

// Scratch of layernorm_grad: per-row statistics [rows, 2], the scale gradient's partial sums
// [row blocks, h], and a row of f32 sums when the scale covers fewer elements than the row.
// With the bias gradient, its partials [row blocks, h] too.
inline int64_t layernorm_grad_scratch(int64_t rows, int64_t h, int64_t scale_numel, bool bias = false) {
  return scratch_piece(rows * 2 * 4) + scratch_piece(layernorm_partials(rows) * h * 4) + (scale_numel != h ? scratch_piece(h * 4) : 0) +
         (bias ? scratch_piece(layernorm_partials(rows) * h * 4) : 0);
}

template <class R>
Status layernorm_grad_op(KernelContext& ctx, R& run) {
  const Tensor& x = *ctx.inputs[1];
  const int64_t axis = ctx.node.attrs.get_int("axis", x.rank() - 1);
  const Shape normalized(x.shape().begin() + axis, x.shape().end());
  const int64_t h = numel(normalized), rows = h ? x.numel() / h : 0;
  const int64_t ds_n = ctx.outputs[1]->numel();
  // dbias, and dx's 16-bit copy (the last output; passes/layernorm_grad_casts.h)
  const bool bias = ctx.node.attrs.get_int("bias_grad", 0) && ctx.outputs.size() > 2 && ctx.outputs[2];
  Tensor* copy = ctx.node.attrs.has("dx_copy") ? ctx.outputs.back() : nullptr;
  const DType dy_type = ctx.inputs[0]->dtype();
  if (dy_type != x.dtype() && !(x.dtype() == DType::kF32 && is_16bit_float(dy_type))) return unsupported(ctx, str_cat("dy of dtype ", dtype_name(dy_type)));
  if (copy && !(x.dtype() == DType::kF32 && is_16bit_float(copy->dtype()))) return unsupported(ctx, str_cat("a dx copy of dtype ", dtype_name(copy->dtype())));
  const GradientIn dy{ctx.inputs[0]->raw(), dy_type};
  if (bias && ds_n != h) return unsupported(ctx, "a bias gradient with scale broadcast from fewer elements");
  MEMC_ASSIGN_OR_RETURN(const Strided scale_map, param_map(ctx, 2, normalized));
  const double eps = ctx.node.attrs.get_float("eps", 1e-5);
  Scratch scratch(ctx);
  MEMC_ASSIGN_OR_RETURN(float* stats, scratch.take<float>(ctx, rows * 2));
  return dispatch_float(ctx, x.dtype(), [&]<typename T>() -> Status {
    MEMC_RETURN_IF_ERROR(
        run(LayernormGradRow<T>{dy, in<T>(ctx, 1), in<T>(ctx, 2), out<T>(ctx, 0), stats, h, eps, scale_map, in<T>(ctx, 3),
                                copy ? copy->raw() : nullptr, copy ? copy->dtype() : DType::kBF16},
            rows));
    const int64_t partials = layernorm_partials(rows);
    MEMC_ASSIGN_OR_RETURN(float* partial, scratch.take<float>(ctx, partials * h));
    float* partial_bias = nullptr;
    if (bias) {
      MEMC_ASSIGN_OR_RETURN(partial_bias, scratch.take<float>(ctx, partials * h));
    }
    MEMC_RETURN_IF_ERROR(run(LayernormGradScalePartial<T>{dy, in<T>(ctx, 1), stats, partial, rows, h, partial_bias}, partials * h));
    if (ds_n == h) return run(LayernormGradScale<T>{partial, out<T>(ctx, 1), nullptr, partials, h, partial_bias, out<T>(ctx, 2)}, h);
    MEMC_ASSIGN_OR_RETURN(float* acc, scratch.take<float>(ctx, h));
    MEMC_RETURN_IF_ERROR(run(LayernormGradScale<T>{partial, nullptr, acc, partials, h}, h));
    return run(SumInto<T>{acc, out<T>(ctx, 1), h, scale_map}, ds_n);
  });
}

// Lines along `axis` of `shape` ([outer, n, inner]) and how many there are.
inline std::pair<Lines, int64_t> lines_along(const Shape& shape, int64_t axis) {
  const AxisSplit s(shape, axis);
  return {Lines{s.n, s.inner}, s.outer * s.inner};
}

// softmax and log_softmax: y = Line(x) along {axis} (default the last).
template <template <typename> class Line, class R>
Status line_op(KernelContext& ctx, R& run) {
  const Tensor& x = *ctx.inputs[0];
  const auto [lines, count] = lines_along(x.shape(), ctx.node.attrs.get_int("axis", x.rank() - 1));
  return dispatch_float(ctx, x.dtype(), [&]<typename T>() { return run(Line<T>{in<T>(ctx, 0), out<T>(ctx, 0), lines}, count); });
}

// Their gradients: (dy, y) → dx along the forward's axis.
template <template <typename> class GradLine, class R>
Status line_grad_op(KernelContext& ctx, R& run) {
  const Tensor& y = *ctx.inputs[1];
  const auto [lines, count] = lines_along(y.shape(), ctx.node.attrs.get_int("axis", y.rank() - 1));
  return dispatch_float(ctx, y.dtype(), [&]<typename T>() {
    return run(GradLine<T>{in<T>(ctx, 0), in<T>(ctx, 1), out<T>(ctx, 0), lines}, count);
  });
}

template <class R>
Status arg_extreme_op(KernelContext& ctx, R& run, bool is_max) {
  const Tensor& x = *ctx.inputs[0];
  const auto [lines, count] = lines_along(x.shape(), ctx.node.attrs.get_int("axis", 0));
  if (lines.n == 0) return Status::BadInput("argmax/argmin over an empty axis");
  return run(ArgExtremeLine{x.raw(), x.dtype(), out<int64_t>(ctx, 0), lines, is_max, ctx.node.attrs.get_int("select_last_index", 0) != 0},
             count);
}

template <class R>
Status topk_op(KernelContext& ctx, R& run) {
  const Tensor& x = *ctx.inputs[0];
  const int64_t k = ctx.node.attrs.get_int("k", 1);
  const auto [lines, count] = lines_along(x.shape(), ctx.node.attrs.get_int("axis", 0));
  if (k < 1 || k > lines.n) return Status::BadInput(str_cat("topk: k = ", k, " outside [1, ", lines.n, "]"));
  return run(TopKLine{x.raw(), ctx.outputs[0]->raw(), out<int64_t>(ctx, 1), x.dtype(), static_cast<int>(dtype_size(x.dtype())), lines,
                      Lines{k, lines.inner}, ctx.node.attrs.get_int("largest", 1) != 0},
             count);
}

template <class R>
Status cumsum_op(KernelContext& ctx, R& run) {
  const Tensor& x = *ctx.inputs[0];
  const auto [lines, count] = lines_along(x.shape(), ctx.node.attrs.get_int("axis", 0));
  const bool exclusive = ctx.node.attrs.get_int("exclusive", 0), reverse = ctx.node.attrs.get_int("reverse", 0);
  return run(CumsumLine{x.raw(), ctx.outputs[0]->raw(), x.dtype(), lines, exclusive, reverse}, count);
}

// ---- loss (CrossEntropyRows: backends/kernel_attrs.h) --------------------------------------------------

template <class R>
Status cross_entropy_op(KernelContext& ctx, R& run) {
  const Tensor& logits = *ctx.inputs[0];
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  const CrossEntropyRows loss(ctx.node, rows);
  Scratch scratch(ctx);
  MEMC_ASSIGN_OR_RETURN(double* row_loss, scratch.take<double>(ctx, rows));
  return dispatch_float(ctx, logits.dtype(), [&]<typename T>() -> Status {
    MEMC_RETURN_IF_ERROR(run(CrossEntropyRow<T>{in<T>(ctx, 0), in<int64_t>(ctx, 1), row_loss, classes, loss.ignore.has_value(), loss.ignore.value_or(-1)}, rows));
    return run(CrossEntropySum{row_loss, ctx.outputs[0]->raw(), ctx.outputs[0]->dtype(), rows, loss.divisor}, 1);
  });
}

template <class R>
Status cross_entropy_grad_op(KernelContext& ctx, R& run) {
  const Tensor& logits = *ctx.inputs[1];
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  const CrossEntropyRows loss(ctx.node, rows);
  return dispatch_float(ctx, logits.dtype(), [&]<typename T>() {
    return run(CrossEntropyGradRow<T>{ctx.inputs[0]->raw(), ctx.inputs[0]->dtype(), in<T>(ctx, 1), in<int64_t>(ctx, 2), out<T>(ctx, 0), classes,
                                      loss.ignore.has_value(), loss.ignore.value_or(-1), loss.divisor},
               rows);
  });
}

// ---- optimizer --------------------------------------------------------------------------------
// An update node's per-step scalar inputs at these indices (-1, or an absent optional input: none).
inline StepScalars step_scalars(const KernelContext& ctx, int lr, int step, int skip) {
  StepScalars s;
  auto take = [&](int i, const void*& p, DType& t) {
    if (i < 0 || ctx.inputs.size() <= static_cast<size_t>(i) || !ctx.inputs[i]) return;
    p = ctx.inputs[i]->raw(), t = ctx.inputs[i]->dtype();
  };
  take(lr, s.lr, s.lr_dtype), take(step, s.step, s.step_dtype), take(skip, s.skip, s.skip_dtype);
  return s;
}

// An update's gradient (input 1), in whatever float storage it has.
inline GradientIn gradient_in(const KernelContext& ctx) { return {ctx.inputs[1]->raw(), ctx.inputs[1]->dtype()}; }

// The elementwise updates' bodies, one per node; the per-node kernels run one, the fused ones
// (below) many in one launch.
template <typename T>
AdamUpdate<T> adam_body(const KernelContext& ctx) {
  return {in<T>(ctx, 0), gradient_in(ctx), in<T>(ctx, 2), in<T>(ctx, 3), out<T>(ctx, 0), out<T>(ctx, 1), out<T>(ctx, 2),
          step_scalars(ctx, 4, 5, 6), adam_settings(ctx.node.attrs, false)};
}

template <typename T>
SgdUpdate<T> sgd_body(const KernelContext& ctx) {
  return {in<T>(ctx, 0), gradient_in(ctx), out<T>(ctx, 0), step_scalars(ctx, 2, -1, 3),
          static_cast<float>(ctx.node.attrs.get_float("weight_decay", 0.0))};
}

template <typename T>
MomentumUpdate<T> momentum_body(const KernelContext& ctx) {
  MomentumParams p;
  p.weight_decay = static_cast<float>(ctx.node.attrs.get_float("weight_decay", 0.0));
  p.momentum = static_cast<float>(ctx.node.attrs.get_float("momentum", 0.9));
  p.dampening = static_cast<float>(ctx.node.attrs.get_float("dampening", 0.0));
  p.nesterov = ctx.node.attrs.get_int("nesterov", 0);
  return {in<T>(ctx, 0), gradient_in(ctx), in<T>(ctx, 2), out<T>(ctx, 0), out<T>(ctx, 1), step_scalars(ctx, 3, 4, 5), p};
}

// The bodies of an update op as generic callables: make.template operator()<T>(ctx).
struct AdamBodies {
  template <typename T>
  AdamUpdate<T> operator()(const KernelContext& ctx) const { return adam_body<T>(ctx); }
};
struct SgdBodies {
  template <typename T>
  SgdUpdate<T> operator()(const KernelContext& ctx) const { return sgd_body<T>(ctx); }
};
struct MomentumBodies {
  template <typename T>
  MomentumUpdate<T> operator()(const KernelContext& ctx) const { return momentum_body<T>(ctx); }
};

template <class R, class Bodies>
Status update_op(KernelContext& ctx, R& run) {
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    return run(Bodies().template operator()<T>(ctx), ctx.outputs[0]->numel());
  });
}
template <class R>
Status adam_op(KernelContext& ctx, R& run) { return update_op<R, AdamBodies>(ctx, run); }
template <class R>
Status sgd_op(KernelContext& ctx, R& run) { return update_op<R, SgdBodies>(ctx, run); }
template <class R>
Status momentum_op(KernelContext& ctx, R& run) { return update_op<R, MomentumBodies>(ctx, run); }

// Multi-tensor launches: several parts' bodies as one, index i running part k's body at
// i − ends[k−1]. It travels as the launch's parameters (under 4 KB: at most kParts parts), so a
// fused launch needs no table in device memory and a captured graph holds it as it is.
template <class Body, int kParts>
struct MultiBody {
  Body parts[kParts];
  int64_t ends[kParts];  // cumulative element counts
  int count = 0;
  MEMC_HD void operator()(int64_t i) const {
    int lo = 0, hi = count - 1;  // the first part whose end lies past i
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (i < ends[mid]) hi = mid;
      else lo = mid + 1;
    }
    parts[lo](i - (lo ? ends[lo - 1] : 0));
  }
};
template <class Body>
constexpr int multi_parts() {
  const int k = static_cast<int>((3840 - 16) / (sizeof(Body) + sizeof(int64_t)));
  return k < 1 ? 1 : (k > 64 ? 64 : k);
}

// `nodes` as MultiBody launches of at most multi_parts<Body>() parts: part k is part(nodes[k]),
// over the elements of that node's first output.
template <class Body, class R, class Part>
Status run_parts(std::span<KernelContext> nodes, R& run, Part&& part) {
  constexpr int kParts = multi_parts<Body>();
  MultiBody<Body, kParts> multi;
  int64_t total = 0;
  for (size_t k = 0; k < nodes.size(); ++k) {
    multi.parts[multi.count] = part(nodes[k]);
    total += nodes[k].outputs[0]->numel();
    multi.ends[multi.count++] = total;
    if (multi.count == kParts || k + 1 == nodes.size()) {
      MEMC_RETURN_IF_ERROR(run(multi, total));
      multi.count = 0;
      total = 0;
    }
  }
  return Status::Ok();
}

// One update op over `nodes` (consecutive in the schedule) in as few launches as the parameter
// limit allows: each run of nodes with one dtype is cut into MultiBody launches. The same bodies
// as the per-node kernel, so every element gets the same arithmetic.
template <class R, class Bodies>
Status fused_updates(std::span<KernelContext> nodes, R& run) {
  size_t first = 0;
  while (first < nodes.size()) {
    const DType dtype = nodes[first].inputs[0]->dtype();
    size_t last = first + 1;
    while (last < nodes.size() && nodes[last].inputs[0]->dtype() == dtype) ++last;
    MEMC_RETURN_IF_ERROR(dispatch_float(nodes[first], dtype, [&]<typename T>() -> Status {
      using Body = decltype(Bodies().template operator()<T>(nodes[first]));
      return run_parts<Body>(nodes.subspan(first, last - first), run, [](KernelContext& c) { return Bodies().template operator()<T>(c); });
    }));
    first = last;
  }
  return Status::Ok();
}

// Consecutive casts (a mixed-precision step's weight and bias casts before each linear) in as few
// launches as the parameter limit allows: each run of casts between one pair of float storages is
// cut into MultiBody launches of cast_op's own CastFloat, so every element converts as alone.
// Other casts run one by one.
template <class R>
Status fused_casts(std::span<KernelContext> nodes, R& run) {
  auto dtypes = [&](size_t k) { return std::pair(nodes[k].inputs[0]->dtype(), nodes[k].outputs[0]->dtype()); };
  size_t first = 0;
  while (first < nodes.size()) {
    const auto [from, to] = dtypes(first);
    size_t last = first + 1;
    while (last < nodes.size() && dtypes(last) == dtypes(first)) ++last;
    if (!is_float_storage(from) || !is_float_storage(to)) {
      for (size_t k = first; k < last; ++k) MEMC_RETURN_IF_ERROR(cast_op(nodes[k], run));
      first = last;
      continue;
    }
    MEMC_RETURN_IF_ERROR(dispatch_float(nodes[first], from, [&]<typename From>() {
      return dispatch_float(nodes[first], to, [&]<typename To>() -> Status {
        return run_parts<CastFloat<From, To>>(nodes.subspan(first, last - first), run,
                                              [](KernelContext& c) { return CastFloat<From, To>{in<From>(c, 0), out<To>(c, 0)}; });
      });
    }));
    first = last;
  }
  return Status::Ok();
}

// Scratch of adam8bit: the two quantization maps, uploaded by the kernel.
inline int64_t adam8bit_scratch() { return scratch_piece(2 * static_cast<int64_t>(sizeof(QuantMap))); }

// (w, g, m codes, m absmax, v codes, v absmax, lr, step[, skip]) → (w', codes and absmax of m and v)
template <class R>
Status adam8bit_op(KernelContext& ctx, R& run) {
  static const QuantMap maps[2] = {QuantMap::dynamic(true), QuantMap::dynamic(false)};
  const AdamStep adam = adam_settings(ctx.node.attrs, true);
  const int64_t block = ctx.node.attrs.get_int("block", 2048), n = ctx.outputs[0]->numel();
  const StepScalars s = step_scalars(ctx, 6, 7, 8);
  Scratch scratch(ctx);
  MEMC_ASSIGN_OR_RETURN(QuantMap* device_maps, scratch.take<QuantMap>(ctx, 2));
  MEMC_RETURN_IF_ERROR(run.upload(device_maps, maps, static_cast<int64_t>(sizeof(maps))));
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() {
    Adam8bitBlock<T> body{in<T>(ctx, 0), in<T>(ctx, 1), in<uint8_t>(ctx, 2), in<uint8_t>(ctx, 4), in<float>(ctx, 3), in<float>(ctx, 5),
                          out<T>(ctx, 0), out<uint8_t>(ctx, 1), out<uint8_t>(ctx, 3), out<float>(ctx, 2), out<float>(ctx, 4),
                          device_maps, s, adam, n, block};
    return run(body, (n + block - 1) / block);
  });
}

// Adafactor's scratch: u [n] f32, then the row-factor means [matrices] and the Σu² partials (f64).
constexpr int64_t kSumChunk = 4096;
inline int64_t adafactor_scratch(const Shape& w, bool factored) {
  const int64_t n = numel(w), mats = factored ? n / std::max<int64_t>(w[w.size() - 2] * w.back(), 1) : 0;
  return scratch_piece(n * 4) + (factored ? scratch_piece(mats * 8) : 0) + scratch_piece(((n + kSumChunk - 1) / kSumChunk + 1) * 8);
}

// (w, g, [r, c] | v, lr, step[, skip]) → (w', [r', c'] | v')
template <class R>
Status adafactor_op(KernelContext& ctx, R& run) {
  const bool factored = ctx.node.attrs.get_int("factored", 0);
  const int first_scalar = factored ? 4 : 3;
  const AdafactorScalars sc{step_scalars(ctx, first_scalar, first_scalar + 1, first_scalar + 2), ctx.node.attrs.get_float("decay_rate", -0.8),
                            ctx.node.attrs.get_float("eps1", 1e-30), ctx.node.attrs.get_float("clip_threshold", 1.0),
                            ctx.node.attrs.get_float("weight_decay", 0.0)};
  const Shape& shape = ctx.inputs[0]->shape();
  const int64_t n = numel(shape), rows = factored ? shape[shape.size() - 2] : 1, cols = factored ? shape.back() : 1;
  const int64_t mats = factored ? n / std::max<int64_t>(rows * cols, 1) : 0, parts = (n + kSumChunk - 1) / kSumChunk;
  Scratch scratch(ctx);
  MEMC_ASSIGN_OR_RETURN(float* u, scratch.take<float>(ctx, n));
  double* r_avg = nullptr;
  if (factored) {
    MEMC_ASSIGN_OR_RETURN(r_avg, scratch.take<double>(ctx, mats));
  }
  MEMC_ASSIGN_OR_RETURN(double* partial, scratch.take<double>(ctx, parts + 1));
  return dispatch_float(ctx, ctx.inputs[0]->dtype(), [&]<typename T>() -> Status {
    const T* g = in<T>(ctx, 1);
    if (factored) {
      MEMC_RETURN_IF_ERROR(run(AdafactorFactor<T>{g, in<float>(ctx, 2), out<float>(ctx, 1), rows, cols, true, sc}, mats * rows));
      MEMC_RETURN_IF_ERROR(run(AdafactorFactor<T>{g, in<float>(ctx, 3), out<float>(ctx, 2), rows, cols, false, sc}, mats * cols));
      MEMC_RETURN_IF_ERROR(run(AdafactorRowMean{out<float>(ctx, 1), r_avg, rows}, mats));
      MEMC_RETURN_IF_ERROR(run(AdafactorDirection<T>{g, out<float>(ctx, 1), out<float>(ctx, 2), r_avg, nullptr, nullptr, u, rows, cols, sc}, n));
    } else {
      MEMC_RETURN_IF_ERROR(run(AdafactorDirection<T>{g, nullptr, nullptr, nullptr, in<float>(ctx, 2), out<float>(ctx, 1), u, rows, cols, sc}, n));
    }
    MEMC_RETURN_IF_ERROR(run(SumSquares{u, partial, n, kSumChunk}, parts));
    MEMC_RETURN_IF_ERROR(run(AdafactorClip{partial, parts, n, sc.clip}, 1));
    return run(AdafactorApply<T>{in<T>(ctx, 0), u, partial, out<T>(ctx, 0), sc}, n);
  });
}

// Pieces of a flat buffer at their offsets (a unit's gathered parameters).
template <class R>
Status split_flat_op(KernelContext& ctx, R& run) {
  const char* x = static_cast<const char*>(ctx.inputs[0]->raw());
  const std::vector<int64_t> offsets = split_flat_offsets(ctx.node.attrs);
  const size_t elem = dtype_size(ctx.inputs[0]->dtype());
  for (size_t i = 0; i < ctx.outputs.size(); ++i) {
    MEMC_RETURN_IF_ERROR(run.copy(ctx.outputs[i]->raw(), x + offsets[i] * elem, static_cast<int64_t>(ctx.outputs[i]->nbytes())));
  }
  return Status::Ok();
}

// ---- GEMMs ------------------------------------------------------------------------------------
// y[R, N] = x[R, K] · wᵀ + b (transpose_w, w [N, K]) or x · w + b (w [K, N]).
template <class R>
Status linear_op(KernelContext& ctx, R& run) {
  const Tensor &x = *ctx.inputs[0], &w = *ctx.inputs[1];
  const bool transpose_w = ctx.node.attrs.get_int("transpose_w", 1);
  const int64_t k = x.shape().back(), n = transpose_w ? w.shape()[0] : w.shape()[1];
  GemmCall c{.dtype = x.dtype(), .m = k ? x.numel() / k : 0, .n = n, .k = k, .trans_a = false, .trans_b = transpose_w};
  c.a = x.raw(), c.b = w.raw(), c.y = ctx.outputs[0]->raw(), c.bias = in<void>(ctx, 2);
  return run.gemm(c, ctx.workspace, ctx.workspace_bytes);
}

// matmul_bgrad: one GEMM whose epilogue writes the summed operand's sums over k (cuBLASLt's
// BGRADA/BGRADB: a linear layer's bias gradient inside its weight-gradient GEMM). Where cuBLASLt
// offers no algorithm for that epilogue (bad input from gemm()), the plain GEMM and a reduction.
template <class R>
Status matmul_bgrad_op(KernelContext& ctx, R& run) {
  const Tensor &a = *ctx.inputs[0], &b = *ctx.inputs[1];
  const bool ta = ctx.node.attrs.get_int("transpose_a", 0), tb = ctx.node.attrs.get_int("transpose_b", 0);
  const BiasGradSums sums(ctx.node);
  GemmCall c{.dtype = a.dtype(), .m = ta ? a.shape()[1] : a.shape()[0], .n = tb ? b.shape()[0] : b.shape()[1],
             .k = ta ? a.shape()[0] : a.shape()[1], .trans_a = ta, .trans_b = tb};
  c.a = a.raw(), c.b = b.raw(), c.y = ctx.outputs[0]->raw();
  c.bias_grad = ctx.outputs[1]->raw(), c.bias_grad_of = static_cast<int>(sums.operand);
  if (Status fused = run.gemm(c, ctx.workspace, ctx.workspace_bytes); fused.ok() || fused.kind() != ErrorKind::kBadInput) return fused;
  c.bias_grad = nullptr;
  MEMC_RETURN_IF_ERROR(run.gemm(c, ctx.workspace, ctx.workspace_bytes));
  KernelContext reduce{sums.reduce, {ctx.inputs[sums.operand]}, {ctx.outputs[1]}};
  reduce.stream = ctx.stream;
  return reduce_op(reduce, run, ReduceOp::kSum);
}

// matmul_acc: y = [acc +] op(a)·op(b), one GEMM with beta = 1 onto y (acc's own buffer where
// the plan let y take it over, else a copy of it) or, without acc, beta = 0; f32 over 16-bit a
// and b where y is f32.
template <class R>
Status matmul_acc_op(KernelContext& ctx, R& run) {
  const Tensor *acc = ctx.inputs[0], &a = *ctx.inputs[1], &b = *ctx.inputs[2];
  Tensor& y = *ctx.outputs[0];
  if (acc != nullptr && y.raw() != acc->raw()) MEMC_RETURN_IF_ERROR(run.copy(y.raw(), acc->raw(), static_cast<int64_t>(y.nbytes())));
  const MatmulAccDims d(ctx.node, a.shape(), b.shape());
  GemmCall c{.dtype = a.dtype(), .m = d.m, .n = d.n, .k = d.k, .trans_a = d.ta, .trans_b = d.tb};
  c.a = a.raw(), c.b = b.raw(), c.y = y.raw();
  c.accumulate = acc != nullptr;
  c.y_f32 = y.dtype() == DType::kF32 && a.dtype() != DType::kF32;
  return run.gemm(c, ctx.workspace, ctx.workspace_bytes);
}

// Batched matmul with transposes where one strided batch describes it: both operands of rank
// ≥ 2 with equal batch dims, or one of them unbatched (its stride is 0).
template <class R>
Status matmul_op(KernelContext& ctx, R& run) {
  const Tensor &a = *ctx.inputs[0], &b = *ctx.inputs[1];
  const Shape &sa = a.shape(), &sb = b.shape();
  if (sa.size() < 2 || sb.size() < 2) return unsupported(ctx, "1-D operands");
  const bool ta = ctx.node.attrs.get_int("transpose_a", 0), tb = ctx.node.attrs.get_int("transpose_b", 0);
  const int64_t m = ta ? sa.back() : sa[sa.size() - 2], k = ta ? sa[sa.size() - 2] : sa.back();
  const int64_t n = tb ? sb[sb.size() - 2] : sb.back();
  const int64_t batch_a = a.numel() / std::max<int64_t>(sa[sa.size() - 1] * sa[sa.size() - 2], 1);
  const int64_t batch_b = b.numel() / std::max<int64_t>(sb[sb.size() - 1] * sb[sb.size() - 2], 1);
  const Shape batch_dims_a(sa.begin(), sa.end() - 2), batch_dims_b(sb.begin(), sb.end() - 2);
  if (batch_a > 1 && batch_b > 1 && batch_dims_a != batch_dims_b) {
    return unsupported(ctx, str_cat("batch dims [", shape_str(batch_dims_a), "] and [", shape_str(batch_dims_b),
                                    "] broadcast in a way one strided batch cannot express"));
  }
  GemmCall c{.dtype = a.dtype(), .m = m, .n = n, .k = k, .trans_a = ta, .trans_b = tb};
  c.batch = std::max(batch_a, batch_b);
  c.stride_a = batch_a > 1 ? m * k : 0;
  c.stride_b = batch_b > 1 ? k * n : 0;
  c.a = a.raw(), c.b = b.raw(), c.y = ctx.outputs[0]->raw();
  if (c.dtype == DType::kF32 || c.dtype == DType::kBF16 || c.dtype == DType::kF16) return run.gemm(c, ctx.workspace, ctx.workspace_bytes);
  return run(MatmulAny{c.a, c.b, c.y, c.dtype, m, n, k, c.stride_a, c.stride_b, ta, tb}, c.batch * m * n);
}

}  // namespace memc::cuda::ops
