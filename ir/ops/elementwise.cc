// Elementwise ops: unary math, broadcasting binary ops, where, cast, dropout, copy.
#include "ir/fused_program.h"
#include "ir/ops/ops.h"

namespace memc {
namespace {

Status same_type(const ShapeContext& c, std::vector<TensorType>& out) {
  out = {c.inputs[0]};
  return Status::Ok();
}

ShapeFn unary_shape(bool float_only) {
  return [float_only](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
    if (float_only && !is_float(c.inputs[0].dtype)) {
      return Status::BadInput(str_cat("needs a float input, got ", dtype_name(c.inputs[0].dtype)));
    }
    return same_type(c, out);
  };
}

ShapeFn binary_shape(bool comparison, bool logical) {
  return [=](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
    const TensorType &a = c.inputs[0], &b = c.inputs[1];
    if (a.dtype != b.dtype) {
      return Status::BadInput(str_cat("operand dtypes differ: ", dtype_name(a.dtype), " vs ", dtype_name(b.dtype)));
    }
    if (logical && a.dtype != DType::kBool) return Status::BadInput("logical op needs i1 operands");
    MEMC_ASSIGN_OR_RETURN(Shape shape, broadcast_shapes(a.shape, b.shape));
    out = {TensorType{comparison ? DType::kBool : a.dtype, shape}};
    return Status::Ok();
  };
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  const uint32_t ew = kOpElementwise | kOpInplaceOk;
  struct Unary {
    const char* name;
    bool float_only;
    int flops;
    const char* doc;
  };
  const Unary unary[] = {
      {"neg", false, 1, "y = -x"},
      {"abs", false, 1, "y = |x|"},
      {"sign", false, 1, "y = sign(x)"},
      {"exp", true, 4, "y = e^x"},
      {"log", true, 4, "y = ln x"},
      {"sqrt", true, 2, "y = √x"},
      {"rsqrt", true, 2, "y = 1/√x"},
      {"reciprocal", true, 1, "y = 1/x"},
      {"tanh", true, 6, "y = tanh x"},
      {"sigmoid", true, 5, "y = 1/(1+e^-x)"},
      {"relu", false, 1, "y = max(x, 0)"},
      {"leaky_relu", true, 2, "y = x ≥ 0 ? x : alpha·x {alpha}"},
      {"erf", true, 8, "y = erf x"},
      {"gelu", true, 10, "y = x·Φ(x) {approximate = \"none\" | \"tanh\"}"},
      {"floor", true, 1, "y = ⌊x⌋"},
      {"ceil", true, 1, "y = ⌈x⌉"},
      {"round", true, 1, "y = round half to even"},
      {"sin", true, 8, "y = sin x"},
      {"cos", true, 8, "y = cos x"},
      {"asin", true, 8, "y = arcsin x"},
      {"acos", true, 8, "y = arccos x"},
      {"atan", true, 8, "y = arctan x"},
      {"softplus", true, 6, "y = ln(1+e^x)"},
  };
  for (const Unary& u : unary) {
    const int flops = u.flops;
    r.add({.name = u.name, .min_inputs = 1, .max_inputs = 1, .flags = ew, .shape = unary_shape(u.float_only),
           .flops = [flops](const Node&, std::span<const TensorType>, std::span<const TensorType> o) {
             return flops * o[0].numel();
           },
           .doc = u.doc});
  }
  r.add({.name = "not", .min_inputs = 1, .max_inputs = 1, .flags = ew | kOpNoGradient,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           if (c.inputs[0].dtype != DType::kBool) return Status::BadInput("needs an i1 input");
           return same_type(c, out);
         },
         .doc = "logical not"});

  const char* arithmetic[] = {"add", "sub", "mul", "div", "pow", "max", "min", "mod"};
  for (const char* name : arithmetic) {
    r.add({.name = name, .min_inputs = 2, .max_inputs = 2, .flags = ew, .shape = binary_shape(false, false),
           .doc = "numpy-broadcast binary arithmetic (mod {fmod = 0|1}; max, min {ties = first|second|split}: who takes a tie's gradient)"});
  }
  const char* comparisons[] = {"equal", "less", "less_equal", "greater", "greater_equal"};
  for (const char* name : comparisons) {
    r.add({.name = name, .min_inputs = 2, .max_inputs = 2, .flags = kOpElementwise | kOpNoGradient,
           .shape = binary_shape(true, false), .doc = "numpy-broadcast comparison to i1"});
  }
  const char* logical[] = {"and", "or", "xor"};
  for (const char* name : logical) {
    r.add({.name = name, .min_inputs = 2, .max_inputs = 2, .flags = kOpElementwise | kOpNoGradient,
           .shape = binary_shape(true, true), .doc = "numpy-broadcast logical op on i1"});
  }

  r.add({.name = "where", .min_inputs = 3, .max_inputs = 3, .flags = kOpElementwise,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           if (c.inputs[0].dtype != DType::kBool) return Status::BadInput("condition must be i1");
           if (c.inputs[1].dtype != c.inputs[2].dtype) return Status::BadInput("branch dtypes differ");
           MEMC_ASSIGN_OR_RETURN(Shape s, broadcast_shapes(c.inputs[0].shape, c.inputs[1].shape));
           MEMC_ASSIGN_OR_RETURN(s, broadcast_shapes(s, c.inputs[2].shape));
           out = {TensorType{c.inputs[1].dtype, s}};
           return Status::Ok();
         },
         .doc = "y = cond ? a : b, numpy-broadcast"});

  r.add({.name = "cast", .min_inputs = 1, .max_inputs = 1, .flags = kOpElementwise,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           auto to = parse_dtype(c.node.attrs.get_string("to", ""));
           if (!to) return Status::BadInput("attribute 'to' names no dtype");
           out = {TensorType{*to, c.inputs[0].shape}};
           return Status::Ok();
         },
         .flops = [](const Node&, std::span<const TensorType>, std::span<const TensorType>) { return int64_t{0}; },
         .doc = "converts dtype {to}; float→16-bit rounds to nearest even"});

  r.add({.name = "copy", .min_inputs = 1, .max_inputs = 1, .flags = kOpElementwise, .shape = same_type,
         .flops = [](const Node&, std::span<const TensorType>, std::span<const TensorType>) { return int64_t{0}; },
         .doc = "y = x (a materialized copy within one memory space)"});
  // Offload's explicit moves (passes/offload.h): the output lives in the other memory space. On
  // CUDA they run on the copy stream from the pinned host arena; on the CPU they are memcpy.
  // copy_to_device differentiates (streamed parameters, passes/shard.h; rule in
  // grad_elementwise.cc): the gradient stays on the device, and the offload pass stages it to
  // the host for the update that reads it.
  for (const char* name : {"copy_to_host", "copy_to_device"}) {
    const bool to_device = name[8] == 'd';
    r.add({.name = name, .min_inputs = 1, .max_inputs = 1, .flags = kOpTransfer | (to_device ? 0u : kOpNoGradient), .shape = same_type,
           .flops = [](const Node&, std::span<const TensorType>, std::span<const TensorType>) { return int64_t{0}; },
           .doc = std::string("y = x, moved ") + (to_device ? "from host to device memory" : "from device to host memory")});
    // The async pair the offload pass turns each transfer into, as collectives have: the start
    // queues the copy on the copy stream and returns the pending buffer (contents undefined until
    // done; `after`, read for order only, is a prefetch point); the done orders the compute after
    // it and is a view of pending (the same bytes, now complete), so a weight's new value lands
    // straight in its argument's storage. The done reads x, so liveness keeps the source while
    // it moves.
    const std::string moved = to_device ? "host to device" : "device to host";
    r.add({.name = str_cat(name, "_start"), .min_inputs = 1, .max_inputs = 2, .flags = kOpTransfer | kOpNoGradient,
           .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
             out = {c.inputs[0]};
             return Status::Ok();
           },
           .flops = [](const Node&, std::span<const TensorType>, std::span<const TensorType>) { return int64_t{0}; },
           .doc = str_cat("(x[, after]) → pending: x's copy from ", moved, " memory, started on the copy stream")});
    r.add({.name = str_cat(name, "_done"), .min_inputs = 2, .max_inputs = 3, .flags = kOpTransfer | kOpNoGradient | kOpView,
           .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
             if (!(c.inputs[0] == c.inputs[1])) {
               return Status::BadInput(str_cat("pending buffer is ", type_str(c.inputs[0]), ", the copy of ", type_str(c.inputs[1])));
             }
             out = {c.inputs[0]};
             return Status::Ok();
           },
           .flops = [](const Node&, std::span<const TensorType>, std::span<const TensorType>) { return int64_t{0}; },
           .doc = str_cat("(pending, x[, after]) → the completed copy of x from ", moved, " memory, a view of pending")});
  }

  r.add({.name = "dropout", .min_inputs = 1, .max_inputs = 1, .num_outputs = -1,
         .flags = kOpElementwise | kOpRandom,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           const double ratio = c.node.attrs.get_float("ratio", 0.5);
           if (!(ratio >= 0.0 && ratio < 1.0)) return Status::BadInput(str_cat("ratio ", ratio, " not in [0, 1)"));
           if (!is_float(c.inputs[0].dtype)) return Status::BadInput("needs a float input");
           out = {c.inputs[0]};
           // Optional second output: the keep mask.
           if (c.node.outputs.size() >= 2) out.push_back(TensorType{DType::kBool, c.inputs[0].shape});
           return Status::Ok();
         },
         .doc = "training: y = x·mask/(1-ratio), mask from counter RNG (seed, step, node; element i draws counter rng_offset + i); inference: y = x"});

  // A chain of the ops above as one kernel (ir/fused_program.h; passes/fuse_elementwise.h). Its
  // outputs may share its first input's buffer: element i reads every input at its own
  // position before it writes, and an input of the output's byte size maps one to one.
  r.add({.name = "fused_elementwise", .min_inputs = 1, .max_inputs = kFusedMaxInputs, .num_outputs = -1,
         .flags = kOpElementwise | kOpInplaceOk | kOpNoGradient,
         .shape = [](const ShapeContext& c, std::vector<TensorType>& out) -> Status {
           MEMC_ASSIGN_OR_RETURN(const FusedProgram p,
                                 read_typed_fused_program(c.node.attrs, std::vector<TensorType>(c.inputs.begin(), c.inputs.end())));
           out.clear();
           for (int r : p.results) out.push_back(p.types[r]);
           return Status::Ok();
         },
         .flops = [](const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) -> int64_t {
           auto p = read_fused_program(node.attrs, static_cast<int>(in.size()));
           if (!p.ok() || out.empty()) return 0;
           int64_t total = 0;  // each step's own count over the output's elements
           for (const FusedStep& s : p->steps) {
             const OpDef* def = OpRegistry::get().find(s.op);
             Node step;
             step.op = s.op, step.attrs = s.attrs;
             total += def && def->flops ? def->flops(step, out.subspan(0, 1), out.subspan(0, 1)) : out[0].numel();
           }
           return total;
         },
         .doc = "a chain of elementwise ops in one kernel {ops, args, step_attrs, results} (ir/fused_program.h)"});
}

}  // namespace memc
