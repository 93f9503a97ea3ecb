#include "runtime/trainer.h"
#include "runtime/train_step.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "backends/cuda_module.h"
#include "frontend/onnx_weights.h"
#include "frontend/param_audit.h"
#include "passes/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/dataset.h"
#include "runtime/executor.h"
#include "runtime/planned_executor.h"
#include "runtime/shard_state.h"

namespace memc {

using Clock = std::chrono::steady_clock;

std::vector<InputSpec> data_inputs(const Module& m) {
  std::vector<InputSpec> specs;
  for (ValueId a : m.arguments()) {
    const Value& v = m.value(a);
    if (v.role == Role::kInput && v.source_name != kLabelsArg) specs.push_back({v.source_name, v.type});
  }
  return specs;
}

// Feeds of a module: its stateful arguments from `state`, by source name.
void add_state_feeds(const Module& m, const StateMap& state, std::map<std::string, Tensor>& feeds) {
  for (ValueId a : m.arguments()) {
    const Value& v = m.value(a);
    if (!is_model_state(v.role) && v.role != Role::kOptimizerState) continue;
    auto it = state.find(v.source_name);
    if (it != state.end()) feeds[v.source_name] = it->second;
  }
}

Tensor f32_scalar(double v) {
  Tensor t = Tensor::zeros(DType::kF32, {});
  t.data<float>()[0] = static_cast<float>(v);
  return t;
}

// Runs the forward module over `data` and returns the fraction of correct argmax predictions
// (token labels: of the positions not ignored; `counted` is then the positions').
// Batches of the evaluation forward's own size: the global batch, or one rank's slice where the
// export fixes its batch.
Expected<double> evaluate(const Plan& plan, const StateMap& state, const Dataset& data, int64_t& counted) {
  const std::vector<InputSpec> specs = data_inputs(plan.eval);
  const ValueId logits_value = plan.eval.outputs().empty() ? kNoValue : plan.eval.outputs()[0];
  const Shape logits_shape = logits_value == kNoValue ? Shape{} : plan.eval.value(logits_value).type.shape;
  const int64_t batch = logits_shape.empty() ? plan.batch : logits_shape[0];
  std::vector<int64_t> order(static_cast<size_t>(data.size));
  for (int64_t i = 0; i < data.size; ++i) order[i] = i;
  // Static batch: a short tail reuses earlier samples but counts only the new ones.
  while (static_cast<int64_t>(order.size()) < batch) order.push_back(order[order.size() % std::max<int64_t>(data.size, 1)]);
  int64_t correct = 0;
  counted = 0;
  for (int64_t start = 0; start < data.size; start += batch) {
    const int64_t window = std::min<int64_t>(start, static_cast<int64_t>(order.size()) - batch);
    MEMC_ASSIGN_OR_RETURN(auto feeds, make_batch(data, order, window, batch, specs, kLabelsArg));
    add_state_feeds(plan.eval, state, feeds);
    MEMC_ASSIGN_OR_RETURN(std::vector<Tensor> out, execute(plan.eval, feeds, ExecOptions{.training = false}));
    const Tensor& logits = out[0];
    const int64_t classes = logits.shape().back(), positions = logits.numel() / classes / batch;  // token labels: positions > 0
    for (int64_t b = start - window; b < batch && window + b < data.size; ++b) {
      for (int64_t p = 0; p < positions; ++p) {
        const int64_t label = data.labels.data<int64_t>()[order[window + b] * positions + p], row = b * positions + p;
        if (label < 0) continue;  // an ignored position
        int64_t best = 0;
        for (int64_t c = 1; c < classes; ++c) {
          if (logits.get_as_double(row * classes + c) > logits.get_as_double(row * classes + best)) best = c;
        }
        correct += best == label;
        ++counted;
      }
    }
  }
  return counted ? static_cast<double>(correct) / static_cast<double>(counted) : 0.0;
}

// Streams every parameter and buffer of `plan` from its model file, one decoded weight at a
// time, converted to the plan's dtype; refuses a model file that changed since compile.
static Status stream_weights(const std::string& plan_path, const Plan& plan,
                             const std::function<Status(const std::string& name, const Tensor& value)>& sink) {
  const std::string model = resolve_model_path(plan_path, plan);
  MEMC_RETURN_IF_ERROR(check_model_unchanged(plan_path, plan));
  std::map<std::string, TensorType> params;  // the forward's: the training step's may be shards (zero3)
  for (ValueId a : plan.eval.arguments()) {
    const Value& v = plan.eval.value(a);
    if (is_model_state(v.role)) params[v.source_name] = v.type;
  }
  // A parameter untied from an initializer the exporter merged by value starts from its value
  // (frontend/onnx_weights.h, untied_uses).
  std::map<std::string, std::set<std::string>> readers;  // initializer → the parameters it starts
  std::set<std::string> names;                            // the initializers to read
  // A bias the exporter removed for being zero starts from zeros.
  std::set<std::string> zeros;
  for (const UntiedUse& u : untied_uses(plan.eval.metadata())) {
    if (!params.count(u.name)) continue;
    if (u.source.empty()) zeros.insert(u.name);
    else readers[u.source].insert(u.name), names.insert(u.source);
  }
  for (const std::string& name : zeros) {
    const TensorType& type = params.at(name);
    MEMC_RETURN_IF_ERROR(sink(name, Tensor::zeros(type.dtype, type.shape)));
  }
  for (const auto& [name, type] : params) {
    if (zeros.count(name)) continue;
    if (std::none_of(readers.begin(), readers.end(), [&](const auto& r) { return r.second.count(name) > 0; })) names.insert(name);
  }
  return stream_onnx_initializers(model, names, [&](const std::string& name, const Tensor& stored) {
    std::set<std::string> targets = readers.count(name) ? readers.at(name) : std::set<std::string>{};
    if (params.count(name)) targets.insert(name);
    for (const std::string& target : targets) {
      const TensorType& type = params.at(target);
      // A batch-expanded copy (frontend/param_audit.h) trains as its first row.
      const Tensor value = stored.shape() != type.shape && !type.shape.empty() && type.shape[0] == 1 ? first_row(stored) : stored;
      MEMC_RETURN_IF_ERROR(sink(target, value.dtype() == type.dtype ? value : value.cast(type.dtype)));
    }
    return Status::Ok();
  });
}

Expected<StateMap> initial_state(const std::string& plan_path, const Plan& plan) {
  StateMap state;
  for (ValueId a : plan.train.arguments()) {
    const Value& v = plan.train.value(a);
    if (v.role == Role::kOptimizerState) state[v.source_name] = Tensor::zeros(v.type.dtype, v.type.shape);
  }
  MEMC_RETURN_IF_ERROR(stream_weights(plan_path, plan, [&](const std::string& name, const Tensor& value) {
    state[name] = value;
    return Status::Ok();
  }));
  return state;
}

// Creates parameters directly in the training step's planned arena, streaming them from the
// model one at a time in the plan's dtype (no staging copy of the whole model's weights), and
// zeroes optimizer states there. The returned map holds views of the arena, which the
// in-place updates keep current.
// Under zero3 and parameter streaming each unit's parameters are gathered on the host as they
// stream (one unit's worth at a time when the model stores a unit's weights together) and this
// rank's block (the whole unit on one device) goes in.
Expected<StateMap> load_into_arena(const std::string& plan_path, const Plan& plan, PlannedExecutor& exec, int rank) {
  StateMap state;
  for (ValueId a : exec.module().arguments()) {
    const Value& v = exec.module().value(a);
    if (!is_model_state(v.role) && v.role != Role::kOptimizerState) continue;
    state[v.source_name] = exec.tensor(a);  // zeroed arena
    // On the CPU the zeroed arena is untouched pages: the first update would read each state page
    // (mapping the shared zero page) and then write it, one copy-on-write fault per 4 KiB with a
    // TLB shootdown across the compute threads (ViT-B/16's AdamW: 1.3 s of its first step). The
    // states are written here instead, where each page faults in once, as the weights' do.
    if (v.role == Role::kOptimizerState && &exec.backend() == &cpu_backend()) {
      Tensor& t = state[v.source_name];
      MEMC_RETURN_IF_ERROR(exec.backend().fill(t.raw(), 0, static_cast<int64_t>(t.nbytes())));
    }
  }
  MEMC_ASSIGN_OR_RETURN(const ShardLayout layout, shard_layout(plan.train));
  std::map<std::string, const ShardLayout::Unit*> unit_of;
  if (layout.flat_params) {
    for (const ShardLayout::Unit& u : layout.units) {
      for (const std::string& p : u.params) unit_of[p] = &u;
    }
  }
  StateMap pending;  // flat units: whole parameters of units not complete yet
  MEMC_RETURN_IF_ERROR(stream_weights(plan_path, plan, [&](const std::string& name, const Tensor& value) -> Status {
    auto it = unit_of.find(name);
    if (it == unit_of.end()) return exec.set_argument(name, value);
    pending[name] = value.clone();
    const ShardLayout::Unit& u = *it->second;
    for (const std::string& p : u.params) {
      if (!pending.count(p)) return Status::Ok();
    }
    MEMC_ASSIGN_OR_RETURN(const Tensor block, parameter_block(plan, u.name, pending, rank));
    for (const std::string& p : u.params) pending.erase(p);
    return exec.set_argument(u.name, block);
  }));
  if (!pending.empty()) return Status::BadInput(str_cat(resolve_model_path(plan_path, plan), ": parameter '", pending.begin()->first, "' streamed, but not the rest of its unit"));
  // Loading freed the model's protobuf and its decoded weights; glibc keeps freed heap pages
  // (824 MiB after ViT-B/16's 330 MB of weights), which would sit beside the arena for the whole
  // run. Hand them back before the first step.
  malloc_trim(0);
  return state;
}

// The state as host tensors, for checkpoints, evaluation and gradient dumps: the arena views
// themselves on the CPU backend (no copy, so the process stays within its plan), host copies
// through the seam on a device backend.
Expected<StateMap> host_state(Backend& backend, const StateMap& state) {
  if (backend.name() == "cpu") return state;
  StateMap host;
  for (const auto& [name, view] : state) {
    Tensor copy = Tensor::zeros(view.dtype(), view.shape());
    MEMC_RETURN_IF_ERROR(backend.copy(copy.raw(), view.raw(), static_cast<int64_t>(view.nbytes())));
    host[name] = std::move(copy);
  }
  return host;
}

// The job's consolidated state as host tensors (collective in a sharded run).
Expected<StateMap> whole_state(Backend& backend, const Plan& plan, const StateMap& state, comm::Communicator* comm) {
  MEMC_ASSIGN_OR_RETURN(const StateMap host, host_state(backend, state));
  return consolidate_state(plan, host, comm);
}

// A plan for N devices runs as N ranks: the job's size must be the plan's.
static Status check_ranks(const Plan& plan, const RunOptions& options) {
  const int ranks = options.comm ? options.comm->size() : 1;
  if (ranks == plan.devices) return Status::Ok();
  if (plan.devices > 1 && ranks == 1) {
    return Status::BadInput(str_cat("the plan is sharded over ", plan.devices, " devices: start it as ", plan.devices,
                                    " ranks (mpirun -np ", plan.devices, " memc run ...)"));
  }
  return Status::BadInput(str_cat("the plan is for ", plan.devices, " device(s), this job has ", ranks,
                                  " ranks (compile with --devices ", ranks, ")"));
}

// The backend of `memc run --device` (RunOptions::device says how an empty one is chosen).
// A rank's GPU is its rank on its node, as the launcher tells it (Open MPI's mpirun, SLURM's
// srun, MPICH's and Intel MPI's hydra, torchrun-style LOCAL_RANK), else its global rank (one
// node): one GPU per rank. One device: cuda:0, or the --device given.
static int rank_gpu(comm::Communicator* comm) {
  if (!comm) return 0;
  int local = comm->rank();
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"}) {
    const char* value = std::getenv(name);
    if (value && *value) {
      local = std::atoi(value);
      break;
    }
  }
  // More ranks than GPUs on a node share them round-robin (local_rank % gpus); NCCL then needs
  // NCCL_MULTI_RANK_GPU_ENABLE=1 (2.30 and later), and says so through memc if it refuses.
  const cuda::ModuleApi* module = cuda::loaded_module();
  if (!module) {
    Expected<const cuda::ModuleApi*> loaded = cuda::load_module();
    module = loaded.ok() ? *loaded : nullptr;
  }
  const int gpus = module ? module->probe().count : 0;
  return gpus > 0 ? local % gpus : local;
}

int64_t planned_workspace_bytes(const Plan& plan, const Backend& backend) {
  const bool planned_here = (&planning_backend(plan.target) == &cpu_backend()) == (&backend == &cpu_backend());
  const auto workspace = plan.memory.breakdown.find("workspace");
  return planned_here && workspace != plan.memory.breakdown.end() ? workspace->second : 0;
}

Expected<Backend*> select_backend(const std::string& device, const Plan& plan, comm::Communicator* comm) {
  // (asked only where a GPU is wanted: a CPU run never loads the CUDA module)
  auto gpu = [&] { return comm ? str_cat("cuda:", rank_gpu(comm)) : std::string("cuda"); };
  if (!device.empty()) return open_backend(device == "cuda" ? gpu() : device);
  if (plan.target != "a100" && plan.target != "h100" && plan.target != "h200") return &cpu_backend();
  Expected<Backend*> cuda = open_backend(gpu());
  if (!cuda.ok()) return &cpu_backend();
  for (NodeId n : plan.train.schedule()) {
    if (!(*cuda)->find_kernel(plan.train.node(n).op)) return &cpu_backend();
  }
  return *cuda;
}

// The data of a run, loaded and checked before anything else.
struct RunData {
  std::optional<Dataset> train, eval;
  int64_t epochs = 0;     // of the schedule: --epochs, else the plan's
  int64_t per_epoch = 0;  // optimizer steps per epoch (0 without --data)
};

static Expected<RunData> load_run_data(const Plan& plan, const RunOptions& options) {
  RunData data;
  data.epochs = options.epochs >= 0 ? options.epochs : plan.epochs;
  const LabelSpec labels = label_spec(plan.train, plan.num_classes);
  if (!options.data.empty()) {
    MEMC_ASSIGN_OR_RETURN(data.train, load_dataset(options.data, data_inputs(plan.train), labels));
    const int64_t batches = batches_per_epoch(data.train->size, plan.batch);
    data.per_epoch = plan.steps_per_epoch > 0 ? std::min(plan.steps_per_epoch, batches) : batches;
    if (data.per_epoch == 0) return Status::BadInput(str_cat(options.data, ": ", data.train->size, " samples make no batch of ", plan.batch));
  }
  if (!options.eval.empty()) {
    MEMC_ASSIGN_OR_RETURN(data.eval, load_dataset(options.eval, data_inputs(plan.eval), labels));
    if (data.eval->size == 0) return Status::BadInput(options.eval + ": has 0 samples; nothing to evaluate");
  }
  return data;
}

// --steps never silently stops short: the schedule (epochs × batches per epoch) bounds it.
static Status check_steps(const Plan& plan, const RunOptions& options, const RunData& data, int64_t done) {
  const int64_t horizon = data.epochs * data.per_epoch;
  if (!data.train || options.steps < 0 || done + options.steps <= horizon) return Status::Ok();
  return Status::BadInput(str_cat("--steps ", options.steps, ": the schedule has ", horizon, " steps (", data.epochs, " epoch(s) of ",
                                  data.per_epoch, " batches of ", plan.batch, " from ", options.data, ")",
                                  done ? str_cat(", ", done, " of them done") : "", "; ask for at most ", horizon - done,
                                  ", or give --epochs, or compile with more --epochs"));
}

// Every rank of a sharded job reads its slices from the same files.
static Status check_sharded_run(comm::Communicator& comm, const RunOptions& options) {
  if (!options.data.empty()) MEMC_RETURN_IF_ERROR(comm::check_same_file_on_all_ranks(comm, options.data));
  if (!options.eval.empty()) MEMC_RETURN_IF_ERROR(comm::check_same_file_on_all_ranks(comm, options.eval));
  return Status::Ok();
}

// --resume: the arena takes the checkpoint's state, whose position must fit this run's data and --steps.
static Expected<Position> resume_position(const Plan& plan, const RunOptions& options, const RunData& run_data, StateMap& state,
                                          int rank, Backend& backend) {
  MEMC_ASSIGN_OR_RETURN(Position pos, restore_checkpoint(options.checkpoint_dir, plan, state, options.seed, rank, backend));
  const int64_t per_epoch = run_data.per_epoch;
  if (run_data.train && (pos.step_in_epoch > per_epoch || pos.step != pos.epoch * per_epoch + pos.step_in_epoch)) {
    return Status::BadInput(str_cat(options.checkpoint_dir, ": checkpoint position (step ", pos.step, ", epoch ", pos.epoch, ", step_in_epoch ",
                                    pos.step_in_epoch, ") does not fit ", per_epoch, " steps per epoch of ", options.data,
                                    " (other data, or edited metadata)"));
  }
  MEMC_RETURN_IF_ERROR(check_steps(plan, options, run_data, pos.step));
  return pos;
}


// A scaled step has its found_inf output and starts from a positive scale.
Expected<LossScaling> loss_scaling(const Module& step, const RunOptions& options) {
  LossScaling s;
  for (size_t i = 0; i < step.outputs().size(); ++i) {
    if (step.value(step.outputs()[i]).name == kFoundInfOutput) s.found_inf_output = static_cast<int>(i);
  }
  for (ValueId a : step.arguments()) s.scaled |= step.value(a).source_name == kLossScaleArg;
  if (s.scaled && s.found_inf_output < 0) return Status::BadInput("the plan has a loss_scale argument but no found_inf output");
  if (s.scaled && !(options.initial_loss_scale > 0)) return Status::BadInput("the initial loss scale must be positive");
  return s;
}

// The scaler the first step starts from: the checkpoint's on --resume, else the initial scale
// (scale 0 when the plan does not scale its loss).
Expected<Scaler> initial_scaler(const LossScaling& scaling, const RunOptions& options, const Position& pos) {
  if (!scaling.scaled) return Scaler{};
  if (options.resume && pos.scaler.scale <= 0) return Status::BadInput(options.checkpoint_dir + ": checkpoint has no loss scale state");
  return options.resume ? pos.scaler : Scaler{options.initial_loss_scale, 0, pos.step};
}


// Where training stands after the last step taken.
struct TrainProgress {
  int64_t step = 0;     // 1-based over the whole schedule, including steps before a resume
  Position pos;         // where a checkpoint written now resumes
  Scaler scaler;
  double total_ms = 0;  // wall time of the steps this process took
  double loop_ms = 0;   // the same, each with its batch and bookkeeping
  bool stopped = false;  // RunOptions::on_step said to stop
};


// Feeds of step `step`: this rank's slice of batch `b` of `order`, and the runtime scalars. A
// slice one short of the step's rows repeats its first sample, labelled as padding: the loss
// ignores it (passes/shard.h).
static Expected<std::map<std::string, Tensor>> step_feeds(const TrainContext& ctx, const Dataset& data, const std::vector<int64_t>& order,
                                                int64_t b, int64_t step, const Scaler& scaler) {
  const RankSlice slice = ctx.slice();
  const auto first = order.begin() + b * ctx.plan.batch + slice.first;
  std::vector<int64_t> rows(first, first + slice.rows);
  rows.resize(static_cast<size_t>(ctx.plan.rank_rows()), rows.front());
  MEMC_ASSIGN_OR_RETURN(auto feeds, make_batch(data, rows, 0, ctx.plan.rank_rows(), ctx.specs, kLabelsArg));
  // A padding row's labels: the ignored row's, or every position ignored.
  Tensor& labels = feeds[kLabelsArg];
  const int64_t per_row = labels.numel() / ctx.plan.rank_rows();
  std::fill(labels.data<int64_t>() + slice.rows * per_row, labels.data<int64_t>() + labels.numel(), labels.rank() > 1 ? kIgnoreLabel : kPaddingLabel);
  add_step_scalars(ctx, step, scaler, feeds);
  return feeds;
}

void add_step_scalars(const TrainContext& ctx, int64_t step, const Scaler& scaler, std::map<std::string, Tensor>& feeds) {
  feeds[kLrArg] = f32_scalar(learning_rate(ctx.plan.schedule, step, ctx.horizon()));
  // Adam's bias correction counts applied updates: a skipped step does not advance it.
  feeds[kStepArg] = f32_scalar(static_cast<double>(ctx.scaling.scaled ? scaler.applied + 1 : step));
  if (ctx.scaling.scaled) feeds[kLossScaleArg] = f32_scalar(scaler.scale);
}

// --dump-grads: the gradients of `feeds` at the state before the step's update, as f32. In a
// sharded job every rank computes its slice's (collective) and rank 0 writes the whole ones.
static Status dump_gradients(const TrainContext& ctx, const std::map<std::string, Tensor>& feeds, int64_t step) {
  MEMC_ASSIGN_OR_RETURN(const StateMap host, host_state(ctx.backend, ctx.state));
  const GradientRun where{.comm = ctx.comm, .batch_row_offset = ctx.slice().first};
  MEMC_ASSIGN_OR_RETURN(auto grads, compute_gradients(ctx.plan, host, feeds, ctx.options.seed, step, where));
  if (ctx.rank != 0) return Status::Ok();
  TensorMap arrays;
  for (auto& [name, t] : grads) arrays[name] = t.dtype() == DType::kF32 ? t : t.cast(DType::kF32);
  return write_npz(ctx.options.dump_grads, arrays);
}

Expected<StepOutcome> run_step(const TrainContext& ctx, const Dataset& data, const std::vector<int64_t>& order, int64_t b,
                               int64_t step, bool first_of_run, const Scaler& scaler) {
  MEMC_ASSIGN_OR_RETURN(const auto feeds, step_feeds(ctx, data, order, b, step, scaler));
  return run_step_on(ctx, feeds, step, first_of_run);
}

Expected<StepOutcome> run_step_on(const TrainContext& ctx, const std::map<std::string, Tensor>& feeds, int64_t step, bool first_of_run) {
  for (const auto& [name, tensor] : feeds) MEMC_RETURN_IF_ERROR(ctx.exec.set_argument(name, tensor));
  const ExecOptions opts{.training = ctx.plan.dropout, .seed = ctx.options.seed, .step = step, .comm = ctx.kernel_comm,
                         .batch_row_offset = ctx.slice().first, .train_step = true};
  if (!ctx.options.dump_grads.empty() && first_of_run) MEMC_RETURN_IF_ERROR(dump_gradients(ctx, feeds, step));
  StepOutcome outcome;
  const bool timeline = op_profile_enabled() && ctx.kernel_comm;
  if (timeline) ctx.kernel_comm->take_transfer_ms();  // the step's own collectives only
  const auto t0 = Clock::now();
  MEMC_RETURN_IF_ERROR(ctx.exec.run(opts));
  outcome.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (timeline) record_collective_transfers(ctx.kernel_comm->take_transfer_ms());
  const auto& updates = ctx.exec.module().output_updates();
  for (size_t i = 0; i < updates.size(); ++i) {
    if (updates[i] == kNoValue) continue;
    MEMC_CHECK(ctx.exec.address(ctx.exec.module().outputs()[i]) == ctx.exec.address(updates[i]), "update of ", ctx.exec.module().value(updates[i]).name,
               " is not in place");
  }
  MEMC_ASSIGN_OR_RETURN(const Tensor loss_value, ctx.exec.fetch_output(0));
  outcome.loss = loss_value.get_as_double(0);
  if (ctx.scaling.scaled) {
    MEMC_ASSIGN_OR_RETURN(const Tensor found_inf, ctx.exec.fetch_output(ctx.scaling.found_inf_output));
    outcome.skip = found_inf.get_as_double(0) != 0;
  }
  return outcome;
}

// torch.cuda.amp.GradScaler.update: backoff 0.5 on a skipped step, growth 2 after growth_interval clean steps.
void update_scaler(Scaler& scaler, bool skip, int64_t growth_interval) {
  if (skip) {
    scaler.scale *= 0.5;
    scaler.clean_steps = 0;
    return;
  }
  ++scaler.applied;
  if (++scaler.clean_steps >= growth_interval) scaler.scale *= 2.0, scaler.clean_steps = 0;
}

// The precisions a diverged run may try instead: wider ones than `precision`.
static std::string other_precisions(const std::string& precision) {
  if (precision == "fp32") return "";
  if (precision == "bf16-mixed") return ", or --precision fp32";
  return ", or --precision bf16-mixed or fp32";
}

// A non-finite loss ends training (going on only spreads NaN into every weight): the report says why.
static void mark_diverged(const TrainContext& ctx, int64_t step, double loss, RunReport& report) {
  const Plan& plan = ctx.plan;
  report.status = "diverged";
  report.error = str_cat("step ", step, ": training diverged, the loss is ", std::isnan(loss) ? "NaN" : (loss > 0 ? "+inf" : "-inf"),
                         " (precision ", plan.decisions.precision, ", lr ", learning_rate(plan.schedule, step, ctx.horizon()),
                         "; try a lower --lr", other_precisions(plan.decisions.precision),
                         "); no checkpoint was written for this step");
  report.diverged_step = step;
}

// One epoch's steps taken by this process, and when the epoch began.
struct EpochTotals {
  double loss = 0;
  int64_t steps = 0;
  Clock::time_point start;
};

// A terminal's progress line, rewritten in place each step.
static void print_step_line(const TrainContext& ctx, int64_t epoch, int64_t b, double loss, double ms) {
  std::fprintf(stderr, "\repoch %lld/%lld step %lld/%lld loss %.4f %.0f samples/s\033[K", static_cast<long long>(epoch + 1),
               static_cast<long long>(ctx.epochs), static_cast<long long>(b + 1), static_cast<long long>(ctx.per_epoch), loss,
               ctx.plan.batch * 1000.0 / std::max(ms, 1e-3));
}

// One line per epoch (it replaces a terminal's progress line).
static void print_epoch_line(const TrainContext& ctx, int64_t epoch, const EpochTotals& totals) {
  const double seconds = std::chrono::duration<double>(Clock::now() - totals.start).count();
  std::fprintf(stderr, "%sepoch %lld/%lld: %lld steps, mean loss %.4f, %.0f samples/s\n", ctx.tty ? "\r\033[K" : "",
               static_cast<long long>(epoch + 1), static_cast<long long>(ctx.epochs), static_cast<long long>(totals.steps),
               totals.loss / static_cast<double>(totals.steps), static_cast<double>(totals.steps * ctx.plan.batch) / std::max(seconds, 1e-9));
}

// Trains epoch `epoch` from batch `first`; stops at --steps, at a non-finite loss (report.error) or
// when RunOptions::on_step says so.
static Expected<EpochTotals> train_epoch(const TrainContext& ctx, const Dataset& data, int64_t epoch, int64_t first,
                                         TrainProgress& progress, RunReport& report) {
  const RunOptions& options = ctx.options;
  const std::vector<int64_t> order = epoch_order(data.size, options.seed, epoch);
  EpochTotals totals;
  totals.start = Clock::now();
  for (int64_t b = first; b < ctx.per_epoch; ++b) {
    if (options.steps >= 0 && report.steps >= options.steps) break;
    const int64_t step = ++progress.step;
    const auto started = Clock::now();
    MEMC_ASSIGN_OR_RETURN(const StepOutcome outcome, run_step(ctx, data, order, b, step, report.steps == 0, progress.scaler));
    progress.total_ms += outcome.ms;
    if (ctx.scaling.scaled) update_scaler(progress.scaler, outcome.skip, options.growth_interval);
    if (outcome.skip) ++report.skipped_steps;
    if (!std::isfinite(outcome.loss) && !outcome.skip) {
      mark_diverged(ctx, step, outcome.loss, report);
      break;
    }
    report.losses.push_back(outcome.loss);
    ++report.steps;
    totals.loss += outcome.loss;
    ++totals.steps;
    if (!options.quiet && ctx.tty && ctx.rank == 0) print_step_line(ctx, epoch, b, outcome.loss, outcome.ms);
    progress.pos = {step, epoch, b + 1};
    progress.loop_ms += std::chrono::duration<double, std::milli>(Clock::now() - started).count();
    if (options.on_step && !ctx.comm && !options.on_step(step, outcome.loss)) {
      progress.stopped = true;
      break;
    }
  }
  return totals;
}

// Rank 0 writes the job's consolidated state at `progress` (collective: every rank gathers).
static Status write_checkpoint(const TrainContext& ctx, const TrainProgress& progress) {
  MEMC_ASSIGN_OR_RETURN(const StateMap whole, whole_state(ctx.backend, ctx.plan, ctx.state, ctx.comm));
  if (ctx.rank != 0) return Status::Ok();
  const Position& pos = progress.pos;
  return save_checkpoint(ctx.options.checkpoint_dir, whole, pos.step, pos.epoch, pos.step_in_epoch, ctx.options.seed, progress.scaler);
}

// Trains from `progress` to the end of the schedule, --steps or a divergence; checkpoints after each epoch.
static Status train(const TrainContext& ctx, const Dataset& data, TrainProgress& progress, RunReport& report) {
  const RunOptions& options = ctx.options;
  for (int64_t epoch = progress.pos.epoch; epoch < ctx.epochs; ++epoch) {
    const int64_t first = epoch == progress.pos.epoch ? progress.pos.step_in_epoch : 0;
    MEMC_ASSIGN_OR_RETURN(const EpochTotals totals, train_epoch(ctx, data, epoch, first, progress, report));
    if (!report.error.empty()) break;
    if (progress.pos.step_in_epoch >= ctx.per_epoch) progress.pos = {progress.step, epoch + 1, 0};
    if (!options.quiet && totals.steps > 0) print_epoch_line(ctx, epoch, totals);
    if (!options.checkpoint_dir.empty()) MEMC_RETURN_IF_ERROR(write_checkpoint(ctx, progress));
    if ((options.steps >= 0 && report.steps >= options.steps) || progress.stopped) break;
  }
  return Status::Ok();
}

// --profile: every rank's last step timeline to every rank. The ranks run one plan, so they
// have the same collectives; each sends [step_ms, kernel_ms, then start, end, wait, transfer per
// collective].
static Status gather_timelines(comm::Communicator* comm, RunReport& report) {
  const StepTimeline mine = last_step_timeline();
  if (!comm) {
    report.rank_timelines = {mine};
    return Status::Ok();
  }
  const auto ranks = static_cast<size_t>(comm->size());
  int64_t count = static_cast<int64_t>(mine.collectives.size());
  std::vector<int64_t> counts(ranks);
  MEMC_RETURN_IF_ERROR(comm->all_gather(&count, counts.data(), 1, DType::kI64));
  for (int64_t c : counts) {
    if (c != count) return Status::Internal(str_cat("--profile: rank ", comm->rank(), " ran ", count, " collectives, another rank ", c));
  }
  const size_t width = 2 + 4 * static_cast<size_t>(count);
  std::vector<double> send{mine.step_ms, mine.kernel_ms}, all(width * ranks);
  for (const CollectiveSpan& c : mine.collectives) send.insert(send.end(), {c.start_ms, c.end_ms, c.wait_ms, c.transfer_ms});
  MEMC_RETURN_IF_ERROR(comm->all_gather(send.data(), all.data(), static_cast<int64_t>(width), DType::kF64));
  report.rank_timelines.assign(ranks, StepTimeline{});
  for (size_t r = 0; r < ranks; ++r) {
    const double* row = all.data() + r * width;
    StepTimeline& t = report.rank_timelines[r];
    t.step_ms = row[0];
    t.kernel_ms = row[1];
    for (size_t k = 0; k < static_cast<size_t>(count); ++k) {
      t.collectives.push_back({mine.collectives[k].op, row[2 + 4 * k], row[3 + 4 * k], row[4 + 4 * k], row[5 + 4 * k]});
    }
  }
  return Status::Ok();
}

// The report's totals once training stopped (collective: every rank's peak goes to every rank).
static Status finish_training_report(const TrainContext& ctx, const TrainProgress& progress, int64_t peak_bytes, RunReport& report) {
  report.total_steps = report.error.empty() ? progress.step : progress.pos.step;  // a diverged step is not counted
  report.loss_scale = progress.scaler.scale;
  report.measured_peak_bytes = peak_bytes;
  report.rank_peak_bytes.assign(static_cast<size_t>(ctx.plan.devices), report.measured_peak_bytes);
  if (ctx.comm) MEMC_RETURN_IF_ERROR(ctx.comm->all_gather(&report.measured_peak_bytes, report.rank_peak_bytes.data(), 1, DType::kI64));
  if (op_profile_enabled()) MEMC_RETURN_IF_ERROR(gather_timelines(ctx.comm, report));
  report.final_loss = report.losses.empty() ? 0 : report.losses.back();
  report.step_ms = report.steps ? progress.total_ms / static_cast<double>(report.steps) : 0;
  report.loop_step_ms = report.steps ? progress.loop_ms / static_cast<double>(report.steps) : 0;
  report.samples_per_s = report.step_ms > 0 ? ctx.plan.batch * 1000.0 / report.step_ms : 0;
  return Status::Ok();
}

Expected<RunReport> run_plan(const std::string& plan_path, const Plan& plan, const RunOptions& options, StateMap* final_state) {
  if (options.resume && options.checkpoint_dir.empty()) return Status::BadInput("--resume needs --checkpoint DIR");
  // Data first: a bad file is refused before any folder is locked or weight is loaded.
  MEMC_ASSIGN_OR_RETURN(const RunData run_data, load_run_data(plan, options));
  // A resumed run's --steps is checked against the steps its checkpoint has left (resume_position).
  if (!options.resume) MEMC_RETURN_IF_ERROR(check_steps(plan, options, run_data, 0));
  MEMC_RETURN_IF_ERROR(check_ranks(plan, options));
  comm::Communicator* const comm = options.comm && options.comm->size() > 1 ? options.comm : nullptr;
  const int rank = comm ? comm->rank() : 0;
  if (comm) MEMC_RETURN_IF_ERROR(check_sharded_run(*comm, options));
  // Rank 0 writes the checkpoint; the others only read it (--resume).
  RunOptions folder_options = options;
  if (rank != 0) folder_options.checkpoint_dir.clear();
  MEMC_ASSIGN_OR_RETURN(FolderLock lock, take_checkpoint_folder(folder_options));
  MEMC_ASSIGN_OR_RETURN(Backend* backend, select_backend(options.device, plan, comm));
  // The collective kernels' communicator: the host one (MPI) on CPU ranks; on GPU ranks one over
  // device buffers (NCCL), on the rank's GPU.
  std::unique_ptr<comm::Communicator> device_comm;
  if (comm && backend != &cpu_backend()) {
    if (!options.device_communicator) {
      return Status::BadInput("a plan sharded over GPU ranks needs NCCL, and this memc was built without it (CUDA's NCCL at build time)");
    }
    const std::string name(backend->name());  // "cuda:K", the GPU opened (--device may name it)
    MEMC_ASSIGN_OR_RETURN(device_comm, options.device_communicator(*comm, std::stoi(name.substr(name.find(':') + 1))));
  }
  if (const cuda::ModuleApi* module = cuda::loaded_module()) module->set_tf32(options.tf32);  // loaded: a GPU may be in use
  const int64_t in_use_at_open = backend->device_bytes_in_use();
  DeviceMemory device(*backend);
  MEMC_ASSIGN_OR_RETURN(PlannedExecutor exec, PlannedExecutor::create(plan.train, device, planned_workspace_bytes(plan, *backend)));
  MEMC_ASSIGN_OR_RETURN(StateMap state, load_into_arena(plan_path, plan, exec, rank));
  Position pos;
  if (options.resume) {
    MEMC_ASSIGN_OR_RETURN(pos, resume_position(plan, options, run_data, state, rank, *backend));
  }
  RunReport report;
  report.device = std::string(backend->name());
  report.rank = rank;
  report.ranks = static_cast<int>(plan.devices);
  if (comm) report.communicator = std::string((device_comm ? device_comm.get() : comm)->transport());
  report.load_peak_bytes = device.peak_bytes();  // the arena exists before the first weight arrives
  MEMC_ASSIGN_OR_RETURN(const LossScaling scaling, loss_scaling(exec.module(), options));
  MEMC_ASSIGN_OR_RETURN(const Scaler scaler, initial_scaler(scaling, options, pos));
  report.loss_scaling = scaling.scaled;
  if (run_data.train) {
    const TrainContext ctx{.plan = plan, .options = options, .exec = exec, .state = state, .backend = *backend, .comm = comm,
                           .kernel_comm = device_comm ? device_comm.get() : comm, .rank = rank, .epochs = run_data.epochs, .per_epoch = run_data.per_epoch, .scaling = scaling,
                           .specs = data_inputs(plan.train), .tty = isatty(fileno(stderr)) != 0};
    TrainProgress progress{.step = pos.step, .pos = pos, .scaler = scaler};
    MEMC_RETURN_IF_ERROR(train(ctx, *run_data.train, progress, report));
    MEMC_RETURN_IF_ERROR(finish_training_report(ctx, progress, device.peak_bytes(), report));
  }
  report.device_in_use_at_open = in_use_at_open;
  report.device_in_use_after_training = backend->device_bytes_in_use();
  if (run_data.eval && report.error.empty()) {
    MEMC_ASSIGN_OR_RETURN(const StateMap host, whole_state(*backend, plan, state, comm));
    MEMC_ASSIGN_OR_RETURN(report.accuracy, evaluate(plan, host, *run_data.eval, report.eval_samples));
  }
  if (final_state) {
    MEMC_ASSIGN_OR_RETURN(const StateMap whole, whole_state(*backend, plan, state, comm));
    for (const auto& [name, view] : whole) (*final_state)[name] = view.clone();  // the arena goes with exec
  }
  return report;
}

Expected<std::map<std::string, Tensor>> compute_gradients(const Plan& plan, const StateMap& state,
                                                          const std::map<std::string, Tensor>& batch, uint64_t seed,
                                                          int64_t step, const GradientRun& where) {
  Module probe = plan.train;
  MEMC_ASSIGN_OR_RETURN(const ShardLayout layout, shard_layout(plan.train));
  std::set<std::string> units, in_unit;  // the units' names, and their parameters'
  for (const ShardLayout::Unit& u : layout.units) {
    units.insert(u.name);
    in_unit.insert(u.params.begin(), u.params.end());
  }
  std::vector<ValueId> outputs = {probe.outputs()[0]};
  std::vector<std::string> names = {"loss"};
  for (const Value& v : probe.values()) {
    if (v.role != Role::kGrad || v.name.rfind("grad.", 0) != 0) continue;
    const std::string of = v.name.substr(5);
    const ValueId param = probe.find_value(of);
    const bool unit = units.count(of) > 0;
    if (!unit && (param == kNoValue || probe.value(param).role != Role::kParam || in_unit.count(probe.value(param).source_name))) {
      continue;  // zero1/2: a parameter's own gradient is this rank's slice's; its unit's is the mean
    }
    outputs.push_back(v.id);
    names.push_back(unit ? of : probe.value(param).source_name);  // a unit's block, consolidated below
  }
  probe.set_outputs(outputs);
  probe.eliminate_dead_nodes();  // the optimizer updates are not needed
  std::map<std::string, Tensor> feeds = batch;
  add_state_feeds(probe, state, feeds);
  feeds[kLrArg] = f32_scalar(0.0);
  feeds[kStepArg] = f32_scalar(static_cast<double>(step));
  for (ValueId a : probe.arguments()) {  // loss scaling: the runtime's initial scale; gradients come out unscaled
    if (probe.value(a).source_name == kLossScaleArg) feeds[kLossScaleArg] = f32_scalar(RunOptions().initial_loss_scale);
  }
  const ExecOptions options{.training = plan.dropout, .seed = seed, .step = step, .comm = where.comm, .batch_row_offset = where.batch_row_offset};
  MEMC_ASSIGN_OR_RETURN(std::vector<Tensor> out, execute(probe, feeds, options));
  std::map<std::string, Tensor> result;
  for (size_t i = 0; i < out.size(); ++i) result[names[i]] = out[i];
  if (layout.units.empty()) return result;
  return consolidate_state(plan, result, where.comm);  // each unit's blocks → its parameters' gradients
}

}  // namespace memc
