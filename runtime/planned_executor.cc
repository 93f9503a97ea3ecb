#include "runtime/planned_executor.h"

#include <cstring>

#include "backends/cpu/kernels.h"
#include "ir/op_registry.h"

namespace memc {

Expected<PlannedExecutor> PlannedExecutor::create(const Module& module, DeviceMemory& memory) {
  PlannedExecutor ex;
  ex.module_ = module;
  MEMC_ASSIGN_OR_RETURN(ex.plan_, MemoryPlan().run(ex.module_));
  const SpacePlan& device = ex.plan_.space(MemSpace::kDevice);
  ex.arena_bytes_ = device.arena_bytes;
  // Offloaded values (optimizer state, master weights) live in the host arena: host memory,
  // outside the device accountant. On the CPU backend both are RAM; the split is what a GPU
  // run has, and the device peak measured is the device arena's.
  ex.host_arena_bytes_ = ex.plan_.space(MemSpace::kHost).arena_bytes;
  if (ex.host_arena_bytes_ > 0) ex.host_arena_ = std::make_unique<char[]>(static_cast<size_t>(ex.host_arena_bytes_));
  ex.workspace_bytes_ = max_workspace_bytes(ex.module_);
  MEMC_ASSIGN_OR_RETURN(ex.arena_, memory.allocate(ex.arena_bytes_, "the device arena"));
  if (ex.workspace_bytes_ > 0) {
    MEMC_ASSIGN_OR_RETURN(ex.workspace_, memory.allocate(ex.workspace_bytes_, "kernel workspace"));
  }
  for (NodeId n : ex.module_.schedule()) {
    const Node& node = ex.module_.node(n);
    const cpu::Kernel* kernel = cpu::find_kernel(node.op);
    if (!kernel) return Status::BadInput(str_cat("no CPU kernel for memc.", node.op));
    bool shares = false;
    for (ValueId out : node.outputs) {
      for (ValueId in : node.inputs) {
        if (in != kNoValue && ex.plan_.liveness.buffer_of[out] == ex.plan_.liveness.buffer_of[in]) shares = true;
      }
    }
    const OpDef* def = OpRegistry::get().find(node.op);
    const bool view = def && (def->flags & kOpView);
    ex.steps_.push_back({n, kernel, shares, view && shares, cpu::cpu_workspace_bytes(ex.module_, node)});
  }
  return ex;
}

Tensor PlannedExecutor::tensor(ValueId v) const {
  const TensorType& t = module_.value(v).type;
  char* base = module_.value(v).space == MemSpace::kHost ? host_arena_.get() : static_cast<char*>(arena_.get());
  return Tensor::borrow(t.dtype, t.shape, base + plan_.slice_of(v).offset);
}

Status PlannedExecutor::set_argument(const std::string& name, const Tensor& value) {
  for (ValueId a : module_.arguments()) {
    const Value& arg = module_.value(a);
    if (arg.name != name && arg.source_name != name) continue;
    MEMC_RETURN_IF_ERROR(check_argument(arg, value));
    Tensor slot = tensor(a);
    if (value.nbytes()) std::memcpy(slot.raw(), value.raw(), value.nbytes());
    return Status::Ok();
  }
  return Status::BadInput("the plan has no argument '" + name + "'");
}

Status PlannedExecutor::run(const ExecOptions& options) {
  std::vector<Tensor> inputs, outputs;
  for (const Step& step : steps_) {
    if (step.skip) continue;  // a view's output is its input's bytes already: nothing to do
    const Node& node = module_.node(step.node);
    inputs.clear();
    outputs.clear();
    for (ValueId v : node.inputs) inputs.push_back(v == kNoValue ? Tensor() : tensor(v));
    for (ValueId v : node.outputs) outputs.push_back(tensor(v));
    // Kernels may accumulate into their outputs; arena bytes are reused, so clear them first,
    // unless an output shares an input's bytes (in-place updates).
    if (!step.in_place) {
      for (Tensor& t : outputs) std::memset(t.raw(), 0, t.nbytes());
    }
    cpu::KernelContext ctx{node, {}, {}, options.training, options.seed, options.step};
    for (size_t k = 0; k < node.inputs.size(); ++k) ctx.inputs.push_back(node.inputs[k] == kNoValue ? nullptr : &inputs[k]);
    for (Tensor& t : outputs) ctx.outputs.push_back(&t);
    ctx.workspace = workspace_.get();
    ctx.workspace_bytes = step.workspace_bytes;
    Status st = (*step.kernel)(ctx);
    if (!st.ok()) return st.with_context(str_cat("memc.", node.op, node.source.empty() ? "" : " (" + node.source + ")", ": "));
  }
  return Status::Ok();
}

}  // namespace memc
