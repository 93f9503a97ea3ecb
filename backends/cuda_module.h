// The CUDA module: the CUDA backend, its kernels, cuDNN attention and the NCCL communicator live
// in libmemc_cuda.so, which libmemc opens with dlopen on the first GPU run (as ONNX Runtime loads
// its execution providers). A CPU run never maps cudart, cuBLASLt, cuDNN or NCCL, and the same
// build runs where none of them is installed. Planning for a GPU target needs no module
// (backends/cuda/target.h).
//
// Where the module is looked for: $MEMC_CUDA_MODULE if set, else libmemc_cuda.so beside libmemc.
// Missing, unloadable (a CUDA library it needs is absent) or from another build: one line naming
// the file and why, as bad input (exit 2).
#pragma once
#include <memory>
#include <string>

#include "backends/backend.h"
#include "support/status.h"

namespace memc {
namespace comm {
class Communicator;
}

namespace cuda {

struct DeviceInfo {
  int count = 0;             // devices visible to the runtime
  std::string name;          // device 0
  int64_t total_bytes = 0;   // device 0 memory
  int sm_major = 0, sm_minor = 0;
  std::string error;         // why count is 0 (no driver, no device)
};

// What the module exports, through one C symbol (kModuleSymbol) returning a pointer to this. Both
// sides are built together from one tree and share libmemc's types; abi guards against a module
// left from another build.
struct ModuleApi {
  int abi = 0;
  DeviceInfo (*probe)() = nullptr;
  // Device K with its streams; bad input naming why where there is no driver or no such device.
  Expected<std::unique_ptr<Backend>> (*open)(int device) = nullptr;
  // TF32 for f32 GEMMs (off unless `memc run --tf32`).
  void (*set_tf32)(bool allowed) = nullptr;
  // Collectives between GPU ranks over NCCL, bootstrapped through `bootstrap` (MPI); nullptr
  // where the module was built without NCCL.
  Expected<std::unique_ptr<comm::Communicator>> (*nccl_communicator)(comm::Communicator& bootstrap, int device,
                                                                     double timeout_s) = nullptr;
};
inline constexpr int kModuleAbi = 2;  // 2: Backend::allocate_zeroed
inline constexpr const char* kModuleSymbol = "memc_cuda_module";
inline constexpr const char* kModuleFile = "libmemc_cuda.so";

// Loads the module once per process (later calls return the same result, failure included).
Expected<const ModuleApi*> load_module();
// The module if an earlier call loaded it, else nullptr: never loads it.
const ModuleApi* loaded_module();
// Where load_module() looks.
std::string module_path();

}  // namespace cuda
}  // namespace memc
