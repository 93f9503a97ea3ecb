#include "backends/backend.h"

#include <cstring>
#include <map>
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/target.h"
#include "backends/cuda_module.h"

namespace memc {

Expected<void*> Backend::allocate_zeroed(MemoryKind kind, int64_t bytes) {
  MEMC_ASSIGN_OR_RETURN(void* p, allocate(kind, bytes));
  if (kind == MemoryKind::kDevice) {
    if (Status st = fill(p, 0, bytes); !st.ok()) {
      deallocate(kind, p);
      return st;
    }
  } else if (bytes > 0) {
    std::memset(p, 0, static_cast<size_t>(bytes));
  }
  return p;
}

Backend& cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}

const Backend& planning_backend(const std::string& target) {
  // The GPU profiles of planner/cost_model.h; everything else (cpu, a calibrated .json) is a CPU.
  static const cuda::CudaTarget ampere(8), hopper(9);
  if (target == "a100") return ampere;
  if (target == "h100" || target == "h200") return hopper;
  return cpu_backend();
}

int64_t max_workspace_bytes(const Backend& backend, const Module& module) {
  int64_t bytes = 0;
  for (NodeId id : module.schedule()) bytes = std::max(bytes, backend.workspace_bytes(module, module.node(id)));
  return bytes;
}

Expected<Backend*> open_backend(const std::string& device) {
  if (device == "cpu") return &cpu_backend();
  int index = 0;
  if (device != "cuda") {
    const std::string prefix = "cuda:";
    if (device.rfind(prefix, 0) != 0 || device.size() == prefix.size() ||
        device.find_first_not_of("0123456789", prefix.size()) != std::string::npos || device.size() > prefix.size() + 4) {
      return Status::BadInput("--device '" + device + "': cpu, cuda or cuda:K");
    }
    index = std::stoi(device.substr(prefix.size()));
  }
  // One per device for the process's lifetime: streams and the context are set up once.
  static std::map<int, std::unique_ptr<Backend>> opened;
  if (auto it = opened.find(index); it != opened.end()) return it->second.get();
  // The CUDA module is loaded here, on the first GPU device a process opens (backends/cuda_module.h).
  Expected<const cuda::ModuleApi*> module = cuda::load_module();
  if (!module.ok()) return module.status().with_context(str_cat("--device cuda:", index, ": "));
  MEMC_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, (*module)->open(index));
  return (opened[index] = std::move(backend)).get();
}

}  // namespace memc
