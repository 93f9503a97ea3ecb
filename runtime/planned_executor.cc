#include "runtime/planned_executor.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "backends/comm/communicator.h"
#include "ir/op_registry.h"
#include "runtime/op_profile.h"

namespace memc {

// MEMC_GROUP_KERNELS=0 runs every node alone on a backend that fuses consecutive nodes of an op
// (its group kernels: optimizer updates, casts), so a group kernel suspected on a new device is
// ruled out without a build (bench/device_check.sh tries it).
static bool group_kernels_from_env() {
  const char* v = std::getenv("MEMC_GROUP_KERNELS");
  return !(v && std::strcmp(v, "0") == 0);
}

Expected<PlannedExecutor> PlannedExecutor::create(const Module& module, DeviceMemory& memory, int64_t planned_workspace_bytes) {
  PlannedExecutor ex;
  ex.module_ = module;
  ex.backend_ = &memory.backend();
  MEMC_ASSIGN_OR_RETURN(ex.plan_, MemoryPlan().run(ex.module_));
  ex.arena_bytes_ = ex.plan_.space(MemSpace::kDevice).arena_bytes;
  // Offloaded values (optimizer state, master weights) live in the host arena: pinned host
  // memory, outside the device accountant's count. On the CPU backend both are RAM; the split is
  // what a GPU run has, and the device peak measured is the device arena's.
  ex.host_arena_bytes_ = ex.plan_.space(MemSpace::kHost).arena_bytes;
  ex.workspace_bytes_ = std::max(max_workspace_bytes(*ex.backend_, ex.module_), planned_workspace_bytes);
  for (NodeId n : ex.module_.schedule()) {  // every kernel resolved before any memory is taken
    const Node& node = ex.module_.node(n);
    const Kernel* kernel = ex.backend_->find_kernel(node.op);
    if (!kernel) return Status::BadInput(str_cat("the ", ex.backend_->name(), " backend has no kernel for memc.", node.op));
    bool shares = false;
    for (ValueId out : node.outputs) {
      for (ValueId in : node.inputs) {
        if (in != kNoValue && ex.plan_.liveness.buffer_of[out] == ex.plan_.liveness.buffer_of[in]) shares = true;
      }
    }
    const OpDef* def = node.def;
    // A view's bytes are its input's already; a transfer's done (a view of its pending buffer)
    // still runs: it orders the compute stream after the copy.
    const bool view = def && (def->flags & kOpView) && !(def->flags & kOpTransfer);
    ex.steps_.push_back({n, kernel, shares, view && shares, ex.backend_->workspace_bytes(ex.module_, node)});
  }
  // Consecutive nodes of one op the backend runs together (fused optimizer updates). The plan
  // lets a node's output reuse bytes an earlier node read for the last time; run together they
  // would race, so a run ends before a node whose bytes meet another member's.
  auto region = [&](ValueId v) {
    const Slice& s = ex.plan_.slice_of(v);
    return std::tuple<MemSpace, int64_t, int64_t>{ex.module_.value(v).space, s.offset, s.offset + s.size};
  };
  auto meet = [&](ValueId a, ValueId b) {
    const auto [sa, a0, a1] = region(a);
    const auto [sb, b0, b1] = region(b);
    return sa == sb && a0 < b1 && b0 < a1;
  };
  auto separate = [&](size_t first, size_t next) {  // node `next` shares no bytes with first..next-1
    const Node& n = ex.module_.node(ex.steps_[next].node);
    for (size_t k = first; k < next; ++k) {
      const Node& member = ex.module_.node(ex.steps_[k].node);
      for (ValueId out : n.outputs) {
        for (ValueId v : member.inputs) if (v != kNoValue && meet(out, v)) return false;
        for (ValueId v : member.outputs) if (meet(out, v)) return false;
      }
      for (ValueId in : n.inputs) {
        for (ValueId v : member.outputs) if (in != kNoValue && meet(in, v)) return false;
      }
    }
    return true;
  };
  for (size_t i = 0; i < ex.steps_.size();) {
    const std::string& op = ex.module_.node(ex.steps_[i].node).op;
    size_t j = i + 1;
    while (j < ex.steps_.size() && ex.module_.node(ex.steps_[j].node).op == op && separate(i, j)) ++j;
    const GroupKernel group = j - i > 1 && group_kernels_from_env() ? ex.backend_->find_group_kernel(op) : nullptr;
    if (group) {
      ex.steps_[i].group = group;
      ex.steps_[i].group_size = static_cast<int>(j - i);
    }
    i = j;
  }
  MEMC_ASSIGN_OR_RETURN(ex.arena_, memory.allocate(ex.arena_bytes_, "the device arena"));
  if (ex.workspace_bytes_ > 0) {
    MEMC_ASSIGN_OR_RETURN(ex.workspace_, memory.allocate(ex.workspace_bytes_, "kernel workspace"));
  }
  if (ex.host_arena_bytes_ > 0) {
    MEMC_ASSIGN_OR_RETURN(ex.host_arena_, memory.allocate_host(ex.host_arena_bytes_, "the host arena"));
  }
  return ex;
}

Tensor PlannedExecutor::tensor(ValueId v) const {
  const TensorType& t = module_.value(v).type;
  return Tensor::borrow(t.dtype, t.shape, const_cast<void*>(address(v)));
}

const void* PlannedExecutor::address(ValueId v) const {
  const char* base = static_cast<const char*>(module_.value(v).space == MemSpace::kHost ? host_arena_.get() : arena_.get());
  return base + plan_.slice_of(v).offset;
}

Expected<Tensor> PlannedExecutor::fetch(ValueId v) const {
  const Tensor slot = tensor(v);
  Tensor host = Tensor::zeros(slot.dtype(), slot.shape());
  MEMC_RETURN_IF_ERROR(backend_->copy(host.raw(), slot.raw(), static_cast<int64_t>(slot.nbytes())));
  return host;
}

Status PlannedExecutor::set_argument(const std::string& name, const Tensor& value) {
  for (ValueId a : module_.arguments()) {
    const Value& arg = module_.value(a);
    if (arg.name != name && arg.source_name != name) continue;
    MEMC_RETURN_IF_ERROR(check_argument(arg, value));
    Tensor slot = tensor(a);
    return backend_->copy(slot.raw(), value.raw(), static_cast<int64_t>(value.nbytes()));
  }
  return Status::BadInput("the plan has no argument '" + name + "'");
}

static bool poison_outputs_from_env() {
  const char* v = std::getenv("MEMC_CHECK_WORKSPACE");
  return v && std::strcmp(v, "1") == 0;
}

// MEMC_CUDA_GRAPHS=0 runs every step kernel by kernel on a backend that could replay graphs.
static bool graphs_from_env() {
  const char* v = std::getenv("MEMC_CUDA_GRAPHS");
  return !(v && std::strcmp(v, "0") == 0);
}

Status PlannedExecutor::run(const ExecOptions& options) {
  // Check mode: every output a kernel does not share with an input is filled with NaN bytes
  // first, so a kernel that leaves part of its output unwritten shows up as NaN downstream.
  const bool poison = options.check_workspace || poison_outputs_from_env();
  // A collective's output is written on its communicator's stream, which the checks do not wait on.
  if (options.node_check && options.comm) return Status::Internal("node checks do not run with collectives");
  const Stream stream = backend_->compute_stream();
  // The run state (Backend::run_state_bytes) leads the workspace: this step's number.
  if (backend_->run_state_bytes()) MEMC_RETURN_IF_ERROR(backend_->copy(workspace_.get(), &options.step, sizeof(options.step)));
  const bool graphs = backend_->can_capture() && !poison && !op_profile_enabled() && !options.comm && !options.node_check && graphs_from_env();
  if (graphs && graph_ && graph_options_.training == options.training && graph_options_.seed == options.seed &&
      graph_options_.batch_row_offset == options.batch_row_offset) {
    MEMC_RETURN_IF_ERROR(backend_->launch(Graph{graph_.get()}, stream));
    return backend_->synchronize(stream);
  }
  if (graphs && eager_runs_ > 0) return capture_and_launch(options, stream);
  ++eager_runs_;
  const Status launched = launch_kernels(options, stream, poison);
  // The collectives the compute stream waits on first, with the communicator's deadline: a dead
  // peer fails here instead of hanging the stream's synchronize.
  const Status settled = options.comm ? options.comm->settle() : Status::Ok();
  MEMC_RETURN_IF_ERROR(launched);
  MEMC_RETURN_IF_ERROR(settled);
  return backend_->synchronize(stream);
}

Status PlannedExecutor::capture_and_launch(const ExecOptions& options, Stream stream) {
  graph_.reset();
  MEMC_RETURN_IF_ERROR(backend_->begin_capture(stream));
  const Status launched = launch_kernels(options, stream, false);
  Expected<Graph> graph = backend_->end_capture(stream);  // ends the capture on every path
  MEMC_RETURN_IF_ERROR(launched);
  if (!graph.ok()) return graph.status();
  Backend* backend = backend_;
  graph_ = std::shared_ptr<void>(graph->handle, [backend](void* h) { backend->destroy(Graph{h}); });
  graph_options_ = options;
  MEMC_RETURN_IF_ERROR(backend_->launch(*graph, stream));
  return backend_->synchronize(stream);
}

// Host copies of `values` once both streams are done with them (a node check's view).
Expected<std::vector<Tensor>> PlannedExecutor::host_copies(const std::vector<Tensor>& values) const {
  MEMC_RETURN_IF_ERROR(backend_->synchronize(backend_->compute_stream()));
  MEMC_RETURN_IF_ERROR(backend_->synchronize(backend_->copy_stream()));
  std::vector<Tensor> host;
  for (const Tensor& t : values) {
    if (!t.defined()) {
      host.emplace_back();
      continue;
    }
    Tensor& h = host.emplace_back(Tensor::zeros(t.dtype(), t.shape()));
    MEMC_RETURN_IF_ERROR(backend_->copy(h.raw(), t.raw(), static_cast<int64_t>(t.nbytes())));
  }
  return host;
}

// One step under ExecOptions::node_check, a node or a fused run: every member's inputs copied to
// the host before it runs (an in-place kernel overwrites them), the kernel or the group kernel,
// then the check of each member with its outputs' copies.
Status PlannedExecutor::run_checked(const Step& step, std::span<KernelContext> members, const std::vector<std::vector<Tensor>>& inputs,
                                    const std::vector<std::vector<Tensor>>& outputs, const ExecOptions& options) const {
  std::vector<std::vector<Tensor>> before;
  for (size_t g = 0; g < members.size(); ++g) {
    MEMC_ASSIGN_OR_RETURN(std::vector<Tensor> copies, host_copies(inputs[g]));
    before.push_back(std::move(copies));
  }
  MEMC_RETURN_IF_ERROR(members.size() > 1 ? step.group(members) : (*step.kernel)(members[0]));
  for (size_t g = 0; g < members.size(); ++g) {
    MEMC_ASSIGN_OR_RETURN(const std::vector<Tensor> after, host_copies(outputs[g]));
    MEMC_RETURN_IF_ERROR(options.node_check(members[g], before[g], after));
  }
  return Status::Ok();
}

// Every scheduled kernel, launched on `stream` in order (asynchronous on a device backend).
Status PlannedExecutor::launch_kernels(const ExecOptions& options, Stream stream, bool poison) {
  const int64_t run_state = backend_->run_state_bytes();
  const Stream copy_stream = backend_->copy_stream();  // transfers' async pairs run there
  const bool timed = op_profile_enabled();  // per-node times: no fused runs
  const bool checked = static_cast<bool>(options.node_check);  // each node (a fused run's each member) checked
  if (timed && options.train_step) begin_profiled_step();
  // Per node of a fused run: its tensors (stable: reserved) and its context.
  std::vector<std::vector<Tensor>> inputs, outputs;
  std::vector<KernelContext> contexts;
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Step& step = steps_[s];
    if (step.skip) continue;  // a view's output is its input's bytes already: nothing to do
    const size_t count = step.group && !timed ? static_cast<size_t>(step.group_size) : 1;
    if (inputs.size() < count) inputs.resize(count), outputs.resize(count);  // kept: no allocation per node
    for (size_t g = 0; g < count; ++g) inputs[g].clear(), outputs[g].clear();
    contexts.clear();
    contexts.reserve(count);
    for (size_t g = 0; g < count; ++g) {
      const Step& member = steps_[s + g];
      const Node& node = module_.node(member.node);
      for (ValueId v : node.inputs) inputs[g].push_back(v == kNoValue ? Tensor() : tensor(v));
      for (ValueId v : node.outputs) outputs[g].push_back(tensor(v));
      if (poison && !member.in_place) {
        for (Tensor& t : outputs[g]) MEMC_RETURN_IF_ERROR(backend_->fill(t.raw(), 0xFF, static_cast<int64_t>(t.nbytes())));
      }
      KernelContext& ctx = contexts.emplace_back(KernelContext{node, {}, {}, options.training, options.seed, options.step});
      ctx.comm = options.comm;
      ctx.batch_row_offset = options.batch_row_offset;
      for (size_t k = 0; k < node.inputs.size(); ++k) ctx.inputs.push_back(node.inputs[k] == kNoValue ? nullptr : &inputs[g][k]);
      for (Tensor& t : outputs[g]) ctx.outputs.push_back(&t);
      ctx.workspace = static_cast<char*>(workspace_.get()) + run_state;
      ctx.workspace_bytes = member.workspace_bytes - run_state;
      if (run_state) ctx.device_step = static_cast<const int64_t*>(workspace_.get());
      ctx.stream = stream.handle;
      ctx.copy_stream = copy_stream.handle;
    }
    if (count > 1) {
      const std::span<KernelContext> members(contexts);
      if (Status st = checked ? run_checked(step, members, inputs, outputs, options) : step.group(members); !st.ok()) {
        return st.with_context(str_cat("memc.", module_.node(step.node).op, " (", count, " nodes fused): "));
      }
      s += count - 1;
      continue;
    }
    const Node& node = module_.node(step.node);
    KernelContext& ctx = contexts[0];
    const auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    const double span_start = timed && options.train_step ? profiled_step_ms() : 0.0;
    Status st = checked ? run_checked(step, std::span<KernelContext>(contexts), inputs, outputs, options) : (*step.kernel)(ctx);
    if (timed && st.ok()) {
      if (options.comm) MEMC_RETURN_IF_ERROR(options.comm->settle());  // a done's span holds its wait
      MEMC_RETURN_IF_ERROR(backend_->synchronize(stream));
      record_op_time(node.op, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      if (options.train_step) {
        // a done node's pending input comes from its start node: the pair the timeline joins
        const bool done = node.op.ends_with("_done") && !node.inputs.empty() && node.inputs[0] != kNoValue;
        const int64_t pair = done ? static_cast<int64_t>(module_.value(node.inputs[0]).producer) : -1;
        record_span(static_cast<int64_t>(step.node), pair, node.op, span_start, profiled_step_ms());
      }
    }
    if (!st.ok()) return st.with_context(str_cat("memc.", node.op, node.source.empty() ? "" : " (" + node.source + ")", ": "));
  }
  return Status::Ok();
}

}  // namespace memc
