#include "runtime/checkpoint.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "runtime/safetensors.h"
#include "runtime/shard_state.h"

namespace memc {

namespace {

const char* kCheckpointFile = "checkpoint.safetensors";

// A double as text that reads back to the same value.
std::string exact(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Reads `dir`'s checkpoint into `state`, whose names, dtypes and shapes it must hold exactly, and
// returns its position; every metadata field is checked (an edited or foreign file is refused).
Expected<Position> load_checkpoint(const std::string& dir, StateMap& state, uint64_t seed) {
  const std::string path = (std::filesystem::path(dir) / kCheckpointFile).string();
  MEMC_ASSIGN_OR_RETURN(SafetensorsFile file, read_safetensors(path, /*require_checksums=*/true));
  for (auto& [name, tensor] : state) {
    auto it = file.tensors.find(name);
    if (it == file.tensors.end()) return Status::BadInput(path + ": no tensor '" + name + "' (checkpoint of another model or optimizer?)");
    if (it->second.dtype() != tensor.dtype() || it->second.shape() != tensor.shape()) {
      return Status::BadInput(str_cat(path, ": tensor '", name, "' is ", dtype_name(it->second.dtype()), "[", shape_str(it->second.shape()),
                                      "], the plan needs ", dtype_name(tensor.dtype()), "[", shape_str(tensor.shape()), "]"));
    }
    tensor = it->second;
  }
  if (file.tensors.size() != state.size()) return Status::BadInput(path + ": holds tensors the plan does not have (another model?)");
  // Every count is a whole non-negative decimal number; anything else is an edited or corrupt file.
  auto count = [&](const char* key, int64_t& out) -> Status {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) return Status::BadInput(str_cat(path, ": metadata '", key, "' is missing"));
    const std::string& text = it->second;
    if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) {
      return Status::BadInput(str_cat(path, ": metadata '", key, "' = '", text, "' is not a non-negative integer"));
    }
    out = std::stoll(text);
    return Status::Ok();
  };
  Position p;
  MEMC_RETURN_IF_ERROR(count("step", p.step));
  MEMC_RETURN_IF_ERROR(count("epoch", p.epoch));
  MEMC_RETURN_IF_ERROR(count("step_in_epoch", p.step_in_epoch));
  auto saved_seed = file.metadata.find("seed");  // a uint64, compared as written
  if (saved_seed == file.metadata.end()) return Status::BadInput(path + ": metadata 'seed' is missing");
  if (saved_seed->second != std::to_string(seed)) {
    return Status::BadInput(str_cat(path, ": written with --seed ", saved_seed->second, ", this run has --seed ", seed));
  }
  if (p.step_in_epoch > p.step) {
    return Status::BadInput(str_cat(path, ": metadata step_in_epoch ", p.step_in_epoch, " exceeds step ", p.step));
  }
  if (file.metadata.count("loss_scale")) {
    char* end = nullptr;
    const std::string& text = file.metadata.at("loss_scale");
    p.scaler.scale = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(p.scaler.scale) || p.scaler.scale <= 0) {
      return Status::BadInput(str_cat(path, ": metadata 'loss_scale' = '", text, "' is not a positive finite number"));
    }
    MEMC_RETURN_IF_ERROR(count("loss_scale_clean_steps", p.scaler.clean_steps));
    MEMC_RETURN_IF_ERROR(count("applied_steps", p.scaler.applied));
    if (p.scaler.applied > p.step) return Status::BadInput(str_cat(path, ": metadata applied_steps ", p.scaler.applied, " exceeds step ", p.step));
  }
  return p;
}

}  // namespace

Status save_checkpoint(const std::string& dir, const StateMap& state, int64_t step, int64_t epoch, int64_t step_in_epoch,
                       uint64_t seed, const Scaler& scaler) {
  SafetensorsFile file;
  file.tensors = state;
  file.metadata = {{"memc_version", memc_version()}, {"step", std::to_string(step)}, {"epoch", std::to_string(epoch)},
                   {"step_in_epoch", std::to_string(step_in_epoch)}, {"seed", std::to_string(seed)}};
  if (scaler.scale > 0) {
    file.metadata["loss_scale"] = exact(scaler.scale);
    file.metadata["loss_scale_clean_steps"] = std::to_string(scaler.clean_steps);
    file.metadata["applied_steps"] = std::to_string(scaler.applied);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::BadInput(dir + ": cannot create checkpoint folder: " + ec.message());
  return write_safetensors((std::filesystem::path(dir) / kCheckpointFile).string(), file);
}

Expected<Position> restore_checkpoint(const std::string& dir, const Plan& plan, StateMap& state, uint64_t seed, int rank,
                                      Backend& backend) {
  MEMC_ASSIGN_OR_RETURN(StateMap staged, consolidated_template(plan, state));  // shapes and dtypes to check against
  MEMC_ASSIGN_OR_RETURN(Position pos, load_checkpoint(dir, staged, seed));
  MEMC_RETURN_IF_ERROR(distribute_state(plan, staged, state, rank, backend));
  return pos;
}

Expected<FolderLock> take_checkpoint_folder(const RunOptions& options) {
  if (options.checkpoint_dir.empty()) return FolderLock();
  MEMC_ASSIGN_OR_RETURN(FolderLock lock, FolderLock::acquire(options.checkpoint_dir));
  const std::string checkpoint = (std::filesystem::path(options.checkpoint_dir) / kCheckpointFile).string();
  remove_stale_temps(checkpoint);
  if (!options.resume && std::filesystem::exists(checkpoint)) {
    return Status::BadInput(options.checkpoint_dir + ": holds a checkpoint already; pass --resume to continue it or choose another folder");
  }
  return lock;
}

}  // namespace memc
