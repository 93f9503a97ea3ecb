// A plan held open for a caller's own loop: the arena allocated once, the weights streamed in,
// then one optimizer step per step() call on the batch the caller hands over (numpy arrays or
// torch tensors from the Python package, a test's tensors), predictions with the current
// weights, and the state by initializer name. The same steps as `memc run` on the same batches:
// bit-identical losses and weights (tests/session_test.cc). One device; a sharded plan runs as
// MPI ranks under `memc run`.
#pragma once
#include <memory>
#include <string>

#include "runtime/npz.h"
#include "runtime/trainer.h"

namespace memc {

struct SessionOptions {
  std::string device;         // as RunOptions::device: "cpu", "cuda", "cuda:K", or empty
  uint64_t seed = 0;          // dropout's draws
  // Steps of the learning-rate schedule (its horizon): -1 takes the plan's (its schedule's
  // total_steps, else epochs × steps per epoch); a cosine schedule needs one of them.
  int64_t total_steps = -1;
};

class Session {
 public:
  static Expected<std::unique_ptr<Session>> open(const std::string& plan_path, const SessionOptions& options = {});
  ~Session();

  // One optimizer step on one global batch: every data input (by name; `x` for a single-input
  // model) with the plan's batch rows, and `y`, int64 labels. Returns the loss. Shapes, dtypes,
  // labels and finiteness are checked as `memc run` checks its data (bad input, one line).
  Expected<double> step(const TensorMap& batch);
  // The evaluation forward's output (logits) for `inputs` (the plan's batch rows).
  Expected<Tensor> predict(const TensorMap& inputs);
  // Parameters (by initializer name) and optimizer states ("<state>.<initializer>"), as host copies.
  Expected<StateMap> state() const;
  // Takes the weights, optimizer states and step count of a `memc run --checkpoint` folder (a
  // bad or foreign checkpoint changes nothing: runtime/checkpoint.h).
  Status restore(const std::string& checkpoint_dir);

  const Plan& plan() const;
  int64_t steps() const;                 // optimizer steps taken (skipped fp16 steps included)
  double last_step_ms() const;           // the last step's run as `memc run`'s step_ms times it
  int64_t measured_peak_bytes() const;   // the device accountant's high-water mark
  std::string device() const;

 private:
  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace memc
