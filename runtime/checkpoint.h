// The checkpoint of `memc run` (runtime/trainer.h): one safetensors file, checkpoint.safetensors
// in the --checkpoint folder, holding the job's consolidated state (runtime/shard_state.h,
// whatever the number of ranks that wrote it) and, as metadata, where training stands: step,
// epoch, step in epoch, seed and the loss scaler. Every field is checked on --resume, so a
// resumed run continues with the identical loss sequence or is refused (exit 2).
#pragma once
#include <cstdint>
#include <string>

#include "backends/backend.h"
#include "runtime/file_guard.h"
#include "runtime/plan.h"
#include "runtime/trainer.h"

namespace memc {

// Dynamic loss scaling's state, carried across steps and checkpoints.
struct Scaler {
  double scale = 0;          // 0: the plan does not scale its loss
  int64_t clean_steps = 0;   // consecutive steps without inf/NaN since the last change of scale
  int64_t applied = 0;       // optimizer updates applied (skipped steps excluded): Adam's t
};

// Where training stands: steps taken, and the epoch and batch the next step starts at.
struct Position {
  int64_t step = 0, epoch = 0, step_in_epoch = 0;
  Scaler scaler;  // as saved; scale 0 when the checkpoint has none
};

// Writes `dir`/checkpoint.safetensors (the folder is created), atomically.
Status save_checkpoint(const std::string& dir, const StateMap& state, int64_t step, int64_t epoch, int64_t step_in_epoch,
                       uint64_t seed, const Scaler& scaler);

// Overwrites the arena state with a checkpoint's tensors (checked first, so a bad file changes nothing).
// A checkpoint holds the consolidated per-parameter state whatever the number of ranks that
// wrote it (runtime/shard_state.h); each rank takes its blocks.
Expected<Position> restore_checkpoint(const std::string& dir, const Plan& plan, StateMap& state, uint64_t seed, int rank,
                                      Backend& backend);

// One run at a time holds a checkpoint folder; a dead writer's temporaries go first. Without
// --resume a folder that holds a checkpoint already is refused. No folder: an empty lock.
Expected<FolderLock> take_checkpoint_folder(const RunOptions& options);

}  // namespace memc
