// The Plan: what `memc compile` produces and `memc run` executes, as a type. It sits under the
// planner (which fills it) and the runtime (which reads, writes and runs it: runtime/plan.h,
// docs/PLAN.md for the file).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/training_step.h"

namespace memc {

struct ScheduleOptions {
  std::string kind = "constant";  // constant | cosine | warmup-cosine
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // cosine horizon; 0: epochs × steps per epoch at run time
  double min_lr = 0.0;
};
// What the planner chose; every field can be pinned by its compile flag.
struct Decisions {
  std::string precision = "fp32";
  int64_t micro_batches = 1;
  std::string remat = "none";
  int64_t shard = 0;  // ShardStage: 0 none, 1 zero1, 2 zero2, 3 zero3
  std::string offload = "none";
  std::string attention = "tiled";
  int64_t loss_chunks = 1;  // a language model's head in chunks (passes/loss_chunks.h)
};

// What memory planning predicts for the device (per rank), recomputed identically at load.
struct MemorySummary {
  int64_t predicted_peak_bytes = 0;  // the device arena
  int64_t lower_bound_bytes = 0;     // no-fragmentation bound
  int64_t persistent_bytes = 0;      // params, optimizer states, master weights (live across steps)
  int64_t host_bytes = 0;            // the host arena (offload)
  std::string algorithm;
  std::map<std::string, int64_t> breakdown;  // bytes by category at the peak
  std::map<std::string, int64_t> category_peak_bytes;  // each category's own maximum over the step
};

// A file's size and content checksum when the plan was written.
struct FileDigest {
  std::string path;  // external data: the location as the model stores it (relative to its folder)
  int64_t bytes = 0;
  std::string crc32c;  // 8 hex digits; empty: not recorded (a plan built in memory)
};

struct Plan {
  std::string model_path;     // as written: relative paths resolve against the plan's folder
  int64_t model_bytes = 0;    // size of the model file when compiled (a changed file is refused)
  std::string model_crc32c;   // its content checksum (write_plan records it)
  std::vector<FileDigest> external_data;  // the files its initializers read, with their checksums
  int64_t batch = 0;
  int64_t seq = -1;
  int64_t num_classes = 0;
  int64_t epochs = 1;
  int64_t steps_per_epoch = 0;  // 0: the data decides
  bool dropout = true;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  Decisions decisions;
  int64_t devices = 1;       // ranks the step is sharded over (passes/shard.h); `batch` is their global batch
  int64_t rank_rows() const { return memc::rank_rows(batch, devices); }  // the rows of each rank's step (passes/shard.h)
  // Compute threads the CPU kernels' workspaces were sized for (the GEMM library's scratchpad
  // grows with its threads); `memc run` uses no more by default. 0: not recorded (older plans).
  int64_t threads = 0;
  // The CPU's bf16 GEMM path the kernel workspaces were sized for, "native" or "widened"
  // (backends/cpu/blas.h: onednn_bf16_gemm); `memc run` pins it. Empty: not recorded (older plans).
  std::string bf16_gemm;
  int64_t budget_bytes = 0;  // 0: none given (per device)
  std::string target = "cpu";      // the device profile of the estimate (planner/cost_model.h)
  double estimated_step_ms = 0;    // the cost model's step time on `target`
  // On N > 1 ranks: the collectives' time, all of it and what compute does not hide (both in
  // estimated_step_ms's terms), and how the ranks are joined (planner/cost_model.h
  // interconnect_name; empty on one device or a flat profile).
  double estimated_comm_ms = 0, estimated_comm_exposed_ms = 0;
  std::string interconnect;
  MemorySummary memory;
  // What compiling saw of remat. Not written to the plan file: `memc compile --json` reports it.
  struct RematOutcome {
    bool has_limit = false;           // --remat gave a size
    bool limit_met = true;            // the tapes held at once fit it (always true without one)
    int64_t held_tape_bytes = 0;      // the most tape bytes held at once
    bool kept_without_remat = false;  // remat planned a higher peak: the step without it was kept
    int64_t remat_peak_bytes = 0;     // that higher peak
  } remat_outcome;
  Module train;  // one training step (outputs: loss, logits, then updates)
  Module eval;   // forward pass (outputs: logits)
};

}  // namespace memc
