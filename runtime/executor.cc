#include "runtime/executor.h"

#include <cstdlib>
#include <cstring>

#include "backends/backend.h"

namespace memc {

namespace {

constexpr uint8_t kPoisonByte = 0xFF;  // all-ones: NaN in every float dtype, so reading scratch before writing it shows
constexpr uint8_t kGuardByte = 0xA5;

// The scratch of one execute() call. In check mode each node's workspace is placed to end
// exactly where a guard region starts (sizes are whole cache lines, so it stays 64-byte
// aligned); the guard is filled before the kernel and verified after it.
class WorkspaceBuffer {
 public:
  WorkspaceBuffer(int64_t max_bytes, bool check) : max_bytes_(max_bytes), check_(check) {
    const int64_t total = max_bytes + (check ? kWorkspaceGuardBytes : 0);
    if (total > 0) buffer_ = Tensor::zeros(DType::kU8, {total});
  }
  void* prepare(int64_t bytes) {
    if (bytes == 0 && !check_) return nullptr;
    auto* base = static_cast<uint8_t*>(buffer_.raw());
    if (!check_) return base;
    uint8_t* workspace = base + (max_bytes_ - bytes);
    std::memset(workspace, kPoisonByte, static_cast<size_t>(bytes));
    std::memset(base + max_bytes_, kGuardByte, kWorkspaceGuardBytes);
    return workspace;
  }
  // Bytes of the guard a kernel overwrote (0: none); only meaningful in check mode.
  int64_t guard_damage() const {
    if (!check_) return 0;
    const auto* guard = static_cast<const uint8_t*>(buffer_.raw()) + max_bytes_;
    int64_t damaged = 0;
    for (int64_t i = 0; i < kWorkspaceGuardBytes; ++i) damaged += guard[i] != kGuardByte;
    return damaged;
  }

 private:
  Tensor buffer_;  // 64-byte aligned
  int64_t max_bytes_;
  bool check_;
};

bool check_workspace_from_env() {
  const char* v = std::getenv("MEMC_CHECK_WORKSPACE");
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace

Status check_argument(const Value& arg, const Tensor& t) {
  if (t.dtype() != arg.type.dtype || t.shape() != arg.type.shape) {
    return Status::BadInput(str_cat(role_name(arg.role), " '", arg.source_name.empty() ? arg.name : arg.source_name, "' has ",
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
      MEMC_RETURN_IF_ERROR(check_argument(arg, it->second));
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

  const Backend& backend = options.kernels ? *options.kernels : cpu_backend();
  std::vector<int64_t> workspace_bytes(order.size());
  int64_t max_bytes = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    workspace_bytes[i] = backend.workspace_bytes(module, module.node(order[i]));
    max_bytes = std::max(max_bytes, workspace_bytes[i]);
  }
  WorkspaceBuffer workspace(max_bytes, options.check_workspace || check_workspace_from_env());

  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const Node& node = module.node(order[i]);
    const Kernel* kernel = backend.find_kernel(node.op);
    if (!kernel) {
      return Status::BadInput(str_cat("no ", backend.name() == "cpu" ? "CPU" : backend.name(), " kernel for memc.", node.op,
                                      node.source.empty() ? "" : " (" + node.source + ")"));
    }
    KernelContext ctx{node, {}, {}, options.training, options.seed, options.step};
    ctx.comm = options.comm;
    ctx.batch_row_offset = options.batch_row_offset;
    ctx.workspace = workspace.prepare(workspace_bytes[i]);
    ctx.workspace_bytes = workspace_bytes[i];
    for (ValueId v : node.inputs) ctx.inputs.push_back(v == kNoValue ? nullptr : &slots[v]);
    for (ValueId v : node.outputs) {
      const TensorType& t = module.value(v).type;
      slots[v] = Tensor::zeros(t.dtype, t.shape);
      if (slots[v].nbytes()) std::memset(slots[v].raw(), kPoisonByte, slots[v].nbytes());  // kernels write every element
      ctx.outputs.push_back(&slots[v]);
    }
    Status st = (*kernel)(ctx);
    if (!st.ok()) return st.with_context(str_cat("memc.", node.op, node.source.empty() ? "" : " (" + node.source + ")", ": "));
    if (const int64_t damaged = workspace.guard_damage()) {
      return Status::Internal(str_cat("memc.", node.op, node.source.empty() ? "" : " (" + node.source + ")",
                                      ": kernel wrote past its declared workspace of ", workspace_bytes[i], " bytes (",
                                      damaged, " guard bytes changed)"));
    }
    for (ValueId v : node.inputs) {
      if (v != kNoValue && last_use[v] == i && module.value(v).producer != kNoNode) slots[v] = Tensor();
    }
  }
  std::vector<Tensor> results;
  for (ValueId v : module.outputs()) results.push_back(slots[v]);
  return results;
}

}  // namespace memc
