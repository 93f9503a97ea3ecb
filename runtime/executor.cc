#include "runtime/executor.h"

#include "backends/cpu/kernels.h"

namespace memc {

static Status check_feed(const Value& arg, const Tensor& t) {
  if (t.dtype() != arg.type.dtype || t.shape() != arg.type.shape) {
    return Status::BadInput(str_cat("input '", arg.source_name.empty() ? arg.name : arg.source_name, "' has ",
                                    dtype_name(t.dtype()), "[", shape_str(t.shape()), "], expected ",
                                    dtype_name(arg.type.dtype), "[", shape_str(arg.type.shape), "]"));
  }
  return Status::Ok();
}

Expected<std::vector<Tensor>> execute(const Module& module, const std::map<std::string, Tensor>& feeds,
                                      const ExecOptions& options) {
  std::vector<Tensor> slots(module.values().size());
  for (ValueId id : module.arguments()) {
    const Value& arg = module.value(id);
    auto it = feeds.find(arg.name);
    if (it == feeds.end() && !arg.source_name.empty()) it = feeds.find(arg.source_name);
    if (it != feeds.end()) {
      MEMC_RETURN_IF_ERROR(check_feed(arg, it->second));
      slots[id] = it->second;
      continue;
    }
    auto w = module.weights().find(id);
    if (w != module.weights().end() && w->second.defined()) {
      slots[id] = w->second;
      continue;
    }
    const char* why = arg.role == Role::kParam ? " has no data (a skeleton model holds shapes only)" : " was not given";
    return Status::BadInput(str_cat(role_name(arg.role), " '", arg.source_name.empty() ? arg.name : arg.source_name, "'", why));
  }

  // Last use of each value, so buffers can be released early.
  const std::vector<NodeId> order = module.schedule();
  std::vector<int> last_use(module.values().size(), -1);
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    for (ValueId v : module.node(order[i]).inputs) {
      if (v != kNoValue) last_use[v] = i;
    }
  }
  for (ValueId v : module.outputs()) last_use[v] = static_cast<int>(order.size());

  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const Node& node = module.node(order[i]);
    const cpu::Kernel* kernel = cpu::find_kernel(node.op);
    if (!kernel) return Status::BadInput(str_cat("no CPU kernel for memc.", node.op, node.source.empty() ? "" : " (" + node.source + ")"));
    cpu::KernelContext ctx{node, {}, {}, options.training, options.seed, options.step};
    for (ValueId v : node.inputs) ctx.inputs.push_back(v == kNoValue ? nullptr : &slots[v]);
    for (ValueId v : node.outputs) {
      const TensorType& t = module.value(v).type;
      slots[v] = Tensor::zeros(t.dtype, t.shape);
      ctx.outputs.push_back(&slots[v]);
    }
    Status st = (*kernel)(ctx);
    if (!st.ok()) return st.with_context(str_cat("memc.", node.op, node.source.empty() ? "" : " (" + node.source + ")", ": "));
    for (ValueId v : node.inputs) {
      if (v != kNoValue && last_use[v] == i && module.value(v).producer != kNoNode) slots[v] = Tensor();
    }
  }
  std::vector<Tensor> results;
  for (ValueId v : module.outputs()) results.push_back(slots[v]);
  return results;
}

}  // namespace memc
