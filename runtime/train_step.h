// The training step's machinery, shared by `memc run` (runtime/trainer.cc: epochs over a data
// set) and the Session (runtime/session.h: a caller's own loop, the Python package): the context
// every step reads, one step on a batch, and the state in and out of the arena. Internal to runtime/.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "passes/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/dataset.h"
#include "runtime/planned_executor.h"
#include "runtime/trainer.h"

namespace memc {

// How the training step scales its loss: a plan with a "loss_scale" argument has a "found_inf" output.
struct LossScaling {
  bool scaled = false;
  int found_inf_output = -1;  // its index among the step's outputs
};

// What every step of a run reads; the arena behind `exec` and `state` lives in run_plan.
struct TrainContext {
  const Plan& plan;
  const RunOptions& options;
  PlannedExecutor& exec;
  const StateMap& state;  // views of the arena
  Backend& backend;
  comm::Communicator* comm;  // nullptr: one device; host buffers (checks, gathered state, reports)
  comm::Communicator* kernel_comm;  // the collective kernels': comm on the CPU, NCCL on GPU ranks
  int rank;
  int64_t epochs, per_epoch;  // of the schedule (RunData)
  LossScaling scaling;
  std::vector<InputSpec> specs;  // the step's data inputs
  bool tty;                      // stderr is a terminal: it also sees a line per step
  int64_t horizon() const { return epochs * per_epoch; }
  RankSlice slice() const { return rank_slice(plan.batch, plan.devices, rank); }  // this rank's rows of a global batch
};

// What one step gave back.
struct StepOutcome {
  double loss = 0;
  double ms = 0;      // wall time of the step
  bool skip = false;  // loss scaling found an inf/NaN gradient: the update was skipped
};

// The data inputs of a module (its inputs but the labels), with their types.
std::vector<InputSpec> data_inputs(const Module& m);
// Adds the module's parameters and optimizer states from `state` to `feeds`, by source name.
void add_state_feeds(const Module& m, const StateMap& state, std::map<std::string, Tensor>& feeds);
Tensor f32_scalar(double v);

// The backend of a run (RunOptions::device says how an empty one is chosen).
Expected<Backend*> select_backend(const std::string& device, const Plan& plan, comm::Communicator* comm);
// The plan's workspace bytes where it was planned for this kind of backend, else 0 (a GPU plan run
// on the CPU sizes the CPU's own): PlannedExecutor::create's, so the region is as planned however
// many threads the run has.
int64_t planned_workspace_bytes(const Plan& plan, const Backend& backend);
// Streams the plan's weights into the executor's arena; the map holds views of the arena.
Expected<StateMap> load_into_arena(const std::string& plan_path, const Plan& plan, PlannedExecutor& exec, int rank);
// The state as host tensors (the arena's views on the CPU), and consolidated over ranks.
Expected<StateMap> host_state(Backend& backend, const StateMap& state);
Expected<StateMap> whole_state(Backend& backend, const Plan& plan, const StateMap& state, comm::Communicator* comm);
Expected<LossScaling> loss_scaling(const Module& step, const RunOptions& options);
Expected<Scaler> initial_scaler(const LossScaling& scaling, const RunOptions& options, const Position& pos);
void update_scaler(Scaler& scaler, bool skip, int64_t growth_interval);
// Step `step` (1-based) on batch `b` of `order` over `data`; updates land in place.
Expected<StepOutcome> run_step(const TrainContext& ctx, const Dataset& data, const std::vector<int64_t>& order, int64_t b,
                               int64_t step, bool first_of_run, const Scaler& scaler);
// The same step on feeds already made: this rank's batch (inputs by name, labels under
// kLabelsArg) and the scalars add_step_scalars gives (the learning rate, Adam's step, the loss scale).
Expected<StepOutcome> run_step_on(const TrainContext& ctx, const std::map<std::string, Tensor>& feeds, int64_t step, bool first_of_run);
void add_step_scalars(const TrainContext& ctx, int64_t step, const Scaler& scaler, std::map<std::string, Tensor>& feeds);
// Accuracy of the evaluation forward over `data` with `state` (host tensors); `counted` samples.
Expected<double> evaluate(const Plan& plan, const StateMap& state, const Dataset& data, int64_t& counted);

}  // namespace memc
