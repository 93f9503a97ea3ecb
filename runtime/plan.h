// The plan file `memc compile` writes and `memc run` / `memc inspect PLAN` read: a JSON
// document (docs/PLAN.md) holding the format version, the memc version that wrote it, the
// model it came from (path and size, for the weights), the training hyperparameters, the
// planner's decisions, and two IR texts: the training step and the forward pass used for
// evaluation. A plan from another format version is refused.
#pragma once
#include <string>
#include <vector>

#include "planner/plan.h"

namespace memc {

// 2: the model file and its external data are recorded with their CRC-32C (1 had sizes only).
inline constexpr int kPlanFormatVersion = 2;
const char* memc_version();

// The learning rate of 1-based optimizer step `step` (a runtime scalar, never in the IR).
double learning_rate(const ScheduleOptions& s, int64_t step, int64_t total_steps);

Status write_plan(const std::string& path, const Plan& plan);
Expected<Plan> read_plan(const std::string& path);
// The model path of a plan resolved against the plan file's folder.
std::string resolve_model_path(const std::string& plan_path, const Plan& plan);
// Every file the plan reads weights from: the model, then its external data.
std::vector<std::string> plan_input_files(const std::string& plan_path, const Plan& plan);
// Size and CRC-32C of a file, read in chunks.
Expected<FileDigest> digest_file(const std::string& path);
// Refuses (exit 2) a model or external-data file that differs from what the plan recorded;
// plans built in memory (no checksum) are checked by size only.
Status check_model_unchanged(const std::string& plan_path, const Plan& plan);

}  // namespace memc
