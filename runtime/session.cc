#include "runtime/session.h"

#include <numeric>

#include "runtime/device_memory.h"
#include "runtime/executor.h"
#include "runtime/host_memory.h"
#include "runtime/train_step.h"

namespace memc {

struct Session::Impl {
  Plan plan;
  RunOptions options;  // what the shared step reads: the seed
  Backend* backend = nullptr;
  std::unique_ptr<DeviceMemory> memory;
  std::unique_ptr<PlannedExecutor> exec;
  StateMap state;  // views of the arena
  LossScaling scaling;
  Scaler scaler;
  std::vector<InputSpec> train_specs, eval_specs;
  LabelSpec labels;  // what the step's labels are (a class per sample, or per position)
  int64_t horizon = 0, steps = 0;
  double last_step_ms = 0;  // the last step's run, without the batch's checks and copy
  std::unique_ptr<TrainContext> ctx;
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

// The schedule's horizon: the caller's, else the plan's; 0 when neither says (a constant
// schedule needs none; step() refuses the others then).
static int64_t schedule_horizon(const Plan& plan, const SessionOptions& options) {
  if (options.total_steps > 0) return options.total_steps;
  if (plan.schedule.total_steps > 0) return plan.schedule.total_steps;
  if (plan.steps_per_epoch > 0) return plan.epochs * plan.steps_per_epoch;
  return 0;
}

Expected<std::unique_ptr<Session>> Session::open(const std::string& plan_path, const SessionOptions& options) {
  auto impl = std::make_unique<Impl>();
  MEMC_ASSIGN_OR_RETURN(impl->plan, read_plan(plan_path));
  const Plan& plan = impl->plan;
  if (plan.devices > 1) {
    return Status::BadInput(str_cat(plan_path, ": the plan is sharded over ", plan.devices, " devices; run it as ranks (mpirun -np ", plan.devices,
                                    " memc run ...)"));
  }
  if (host_memory().threads == 0) {  // nothing ran `memc` in this process yet: set up as it would (runtime/host_memory.h)
    set_compute_threads(plan.threads > 0 ? std::min(plan.threads, available_cores()) : available_cores());
    MEMC_RETURN_IF_ERROR(prepare_host_memory().status());
  }
  impl->horizon = schedule_horizon(plan, options);
  impl->options.seed = options.seed;
  impl->options.device = options.device;
  MEMC_ASSIGN_OR_RETURN(impl->backend, select_backend(options.device, plan, nullptr));
  impl->memory = std::make_unique<DeviceMemory>(*impl->backend);
  MEMC_ASSIGN_OR_RETURN(PlannedExecutor exec,
                        PlannedExecutor::create(plan.train, *impl->memory, planned_workspace_bytes(plan, *impl->backend)));
  impl->exec = std::make_unique<PlannedExecutor>(std::move(exec));
  MEMC_ASSIGN_OR_RETURN(impl->state, load_into_arena(plan_path, plan, *impl->exec, 0));
  MEMC_ASSIGN_OR_RETURN(impl->scaling, loss_scaling(impl->exec->module(), impl->options));
  MEMC_ASSIGN_OR_RETURN(impl->scaler, initial_scaler(impl->scaling, impl->options, Position{}));
  impl->train_specs = data_inputs(plan.train);
  impl->eval_specs = data_inputs(plan.eval);
  impl->labels = label_spec(plan.train, plan.num_classes);
  impl->ctx.reset(new TrainContext{.plan = impl->plan, .options = impl->options, .exec = *impl->exec, .state = impl->state,
                                   .backend = *impl->backend, .comm = nullptr, .kernel_comm = nullptr, .rank = 0, .epochs = 1,
                                   .per_epoch = impl->horizon, .scaling = impl->scaling, .specs = impl->train_specs, .tty = false});
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

// `arrays` as a data set of exactly `rows` samples for `specs`, checked as `memc run` checks files.
static Expected<Dataset> batch_dataset(const TensorMap& arrays, const std::vector<InputSpec>& specs, int64_t rows, const LabelSpec& labels,
                                       bool labelled) {
  TensorMap with_labels;  // predict's inputs, with labels the checks ask for (a step's come with its batch)
  if (!labelled) {
    with_labels = arrays;
    Shape shape{rows};
    shape.insert(shape.end(), labels.sample.begin(), labels.sample.end());
    with_labels["y"] = Tensor::zeros(DType::kI64, shape);
  }
  MEMC_ASSIGN_OR_RETURN(Dataset data, dataset_from_arrays("the batch", labelled ? arrays : with_labels, specs, labels));
  if (data.size != rows) return Status::BadInput(str_cat("the batch has ", data.size, " samples; the plan's batch is ", rows));
  return data;
}

Expected<double> Session::step(const TensorMap& batch) {
  Impl& s = *impl_;
  if (s.horizon <= 0 && s.plan.schedule.kind != "constant") {
    return Status::BadInput(str_cat("the plan's ", s.plan.schedule.kind, " schedule needs its length: give total_steps, or compile with --steps-per-epoch"));
  }
  if (!batch.count("y")) return Status::BadInput("the batch has no 'y' (int64 labels)");
  MEMC_ASSIGN_OR_RETURN(Dataset data, batch_dataset(batch, s.train_specs, s.plan.batch, s.labels, true));
  // The batch is the step's rows in order: its checked arrays are the feeds (copied once, into the arena).
  std::map<std::string, Tensor> feeds = std::move(data.inputs);
  feeds[kLabelsArg] = data.labels;
  add_step_scalars(*s.ctx, s.steps + 1, s.scaler, feeds);
  MEMC_ASSIGN_OR_RETURN(const StepOutcome outcome, run_step_on(*s.ctx, feeds, s.steps + 1, false));
  ++s.steps;
  s.last_step_ms = outcome.ms;
  if (s.scaling.scaled) update_scaler(s.scaler, outcome.skip, s.options.growth_interval);
  return outcome.loss;
}

Expected<Tensor> Session::predict(const TensorMap& inputs) {
  Impl& s = *impl_;
  MEMC_ASSIGN_OR_RETURN(const Dataset data, batch_dataset(inputs, s.eval_specs, s.plan.batch, s.labels, false));
  std::vector<int64_t> order(static_cast<size_t>(s.plan.batch));
  std::iota(order.begin(), order.end(), int64_t{0});
  MEMC_ASSIGN_OR_RETURN(auto feeds, make_batch(data, order, 0, s.plan.batch, s.eval_specs, kLabelsArg));
  MEMC_ASSIGN_OR_RETURN(const StateMap host, whole_state(*s.backend, s.plan, s.state, nullptr));
  add_state_feeds(s.plan.eval, host, feeds);
  MEMC_ASSIGN_OR_RETURN(std::vector<Tensor> out, execute(s.plan.eval, feeds, ExecOptions{.training = false}));
  return out.at(0);
}

Expected<StateMap> Session::state() const {
  MEMC_ASSIGN_OR_RETURN(const StateMap whole, whole_state(*impl_->backend, impl_->plan, impl_->state, nullptr));
  StateMap copies;
  for (const auto& [name, view] : whole) copies[name] = view.clone();  // the arena's views change with every step
  return copies;
}

Status Session::restore(const std::string& checkpoint_dir) {
  Impl& s = *impl_;
  MEMC_ASSIGN_OR_RETURN(const Position pos, restore_checkpoint(checkpoint_dir, s.plan, s.state, s.options.seed, 0, *s.backend));
  s.steps = pos.step;
  if (s.scaling.scaled) s.scaler = pos.scaler;
  return Status::Ok();
}

const Plan& Session::plan() const { return impl_->plan; }
int64_t Session::steps() const { return impl_->steps; }
double Session::last_step_ms() const { return impl_->last_step_ms; }
int64_t Session::measured_peak_bytes() const { return impl_->memory->peak_bytes(); }
std::string Session::device() const { return std::string(impl_->backend->name()); }

}  // namespace memc
