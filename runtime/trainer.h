// `memc run`: loads a plan and its weights, trains on an .npz in seeded shuffled batches with
// a progress line, evaluates accuracy, checkpoints (safetensors, atomic) and resumes with the
// identical loss sequence, and reports.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/comm/communicator.h"
#include "runtime/op_profile.h"
#include "runtime/plan.h"

namespace memc {

struct RunOptions {
  std::string data;             // training .npz (empty: evaluate only)
  std::string eval;             // evaluation .npz
  int64_t epochs = -1;          // -1: the plan's
  int64_t steps = -1;           // stop after this many optimizer steps of this run (-1: no limit); more than
                                // the schedule has left (epochs × batches per epoch) is refused
  uint64_t seed = 0;
  std::string checkpoint_dir;   // write checkpoint.safetensors here after each epoch and at the end
  bool resume = false;          // continue from checkpoint_dir
  std::string dump_grads;       // gradients of the first step, by initializer name
  bool quiet = false;
  // The backend (backends/backend.h): "cpu", "cuda" or "cuda:K"; empty picks cuda when the plan
  // targets a GPU, a device is present and the CUDA backend has a kernel for every op, else cpu.
  std::string device;
  bool tf32 = false;  // f32 GEMMs on CUDA may use TF32 (off: fp32 matches the CPU backend)
  // Dynamic loss scaling (plans with a "loss_scale" argument: fp16-mixed), torch.cuda.amp.GradScaler's
  // defaults: the scale halves and the step is skipped on an inf/NaN gradient, and doubles after
  // growth_interval consecutive clean steps.
  double initial_loss_scale = 65536.0;
  int64_t growth_interval = 2000;
  // A plan sharded over N devices (passes/shard.h) runs as N ranks of one job: this rank's
  // communicator (nullptr: one device). Each rank trains on its slice of every global batch;
  // rank 0 writes the consolidated checkpoint.
  comm::Communicator* comm = nullptr;
  // GPU ranks: makes the collective kernels' communicator on CUDA device `device` (NCCL, its
  // unique id broadcast over `bootstrap`, the host communicator above); unset when memc was
  // built without NCCL, and then a sharded run on GPUs is refused.
  std::function<Expected<std::unique_ptr<comm::Communicator>>(comm::Communicator& bootstrap, int device)> device_communicator;
  // Called after each step taken, with its 1-based step and loss (the Python package's progress
  // bar and callbacks, when memc run trains in its process). Returning false ends training there,
  // as --steps would (a checkpoint is written as at the end). Not called in a sharded job.
  std::function<bool(int64_t step, double loss)> on_step;
};

struct RunReport {
  int64_t steps = 0;               // optimizer steps taken by this process
  int64_t total_steps = 0;         // including those before a resume
  std::vector<double> losses;      // per step taken here
  double final_loss = 0;
  double accuracy = -1;            // on --eval; -1 when not evaluated
  int64_t eval_samples = 0;
  double step_ms = 0;              // mean wall time of a step
  double loop_step_ms = 0;         // the same with its batch's reading, checks and copy in, and the loss out
  double samples_per_s = 0;
  int64_t measured_peak_bytes = 0;  // high-water mark of device allocations while training
  int64_t load_peak_bytes = 0;      // the same while loading weights (they stream into the arena)
  bool loss_scaling = false;        // the plan scales the loss (fp16-mixed)
  int64_t skipped_steps = 0;        // steps of this process whose update was skipped (inf/NaN gradient)
  double loss_scale = 0;            // the scale after the last step (0 without loss scaling)
  std::string device;               // the backend that ran the step ("cpu", "cuda:0")
  std::string status = "ok";        // "ok" | "diverged" (a non-finite loss stopped training: see error)
  std::string error;                // one line naming the step, when status is not ok
  int64_t diverged_step = 0;        // the 1-based step whose loss was not finite
  int rank = 0, ranks = 1;          // this process's rank in a sharded run, and how many there are
  std::string communicator;         // the ranks' collectives: "mpi" (CPU ranks) or "nccl" (GPU ranks); empty on one device
  std::vector<int64_t> rank_peak_bytes;  // every rank's measured_peak_bytes, in rank order (sharded runs)
  // --profile: every rank's last training step as it saw it (runtime/op_profile.h), in rank order.
  std::vector<StepTimeline> rank_timelines;
  // The device's own count of bytes in use (Backend::device_bytes_in_use; -1 on the CPU): once the
  // backend is open, before memc allocates (the runtime's context), and after the last step.
  int64_t device_in_use_at_open = -1, device_in_use_after_training = -1;
};

// The state a run carries between steps, keyed by source name: parameters by initializer
// name, optimizer states as "<state>.<initializer>".
using StateMap = std::map<std::string, Tensor>;

// A diverging run is not an error here: the report comes back with status "diverged" so the
// caller can still write it. Bad data, an empty --eval set, a --steps beyond the schedule, a
// checkpoint folder held by another run or a corrupt checkpoint are errors (exit 2).
Expected<RunReport> run_plan(const std::string& plan_path, const Plan& plan, const RunOptions& options, StateMap* final_state = nullptr);

// Where a gradient computation runs: one device, or one rank of a sharded job (then every rank
// calls it with its slice of the batch, and each gets the whole gradients).
struct GradientRun {
  comm::Communicator* comm = nullptr;
  int64_t batch_row_offset = 0;  // the rank's first row of the global batch (dropout draws)
};

// Loss ("loss") and the gradient of every parameter (keyed by initializer name) for one batch
// (`batch` holds the data inputs and "labels"), without changing `state`. The gradients of a
// sharded or streamed plan's flat units come out per parameter, gathered from every rank.
Expected<std::map<std::string, Tensor>> compute_gradients(const Plan& plan, const StateMap& state,
                                                          const std::map<std::string, Tensor>& batch, uint64_t seed,
                                                          int64_t step, const GradientRun& where = {});

// Loads the parameters of `plan` from its model file and zero optimizer states.
Expected<StateMap> initial_state(const std::string& plan_path, const Plan& plan);

}  // namespace memc
