#include "backends/cuda_module.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace memc::cuda {

std::string module_path() {
  if (const char* env = std::getenv("MEMC_CUDA_MODULE"); env && *env) return env;
  // Beside the library that holds this function: libmemc.so in the build folder or an install.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&module_path), &info) && info.dli_fname) {
    const std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash != std::string::npos) return self.substr(0, slash + 1) + kModuleFile;
  }
  return kModuleFile;  // the dynamic linker's search path
}

namespace {

struct Loaded {
  const ModuleApi* api = nullptr;
  Status status = Status::Ok();
};

using ModuleEntry = const ModuleApi* (*)();

Loaded load() {
  const std::string path = module_path();
#ifdef MEMC_CUDA_MODULE_BUILT
  const char* built = "";
#else
  const char* built = " (this memc was built without CUDA: no nvcc was found at build time)";
#endif
  // RTLD_LOCAL: the CUDA libraries' symbols stay the module's own.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    return {nullptr, Status::BadInput(str_cat("the CUDA module ", path, " cannot be loaded", built, ": ", why ? why : "unknown reason"))};
  }
  auto entry = reinterpret_cast<ModuleEntry>(dlsym(handle, kModuleSymbol));
  const ModuleApi* api = entry ? entry() : nullptr;
  if (!api) return {nullptr, Status::BadInput(str_cat("the CUDA module ", path, " has no ", kModuleSymbol, ": not a memc CUDA module"))};
  if (api->abi != kModuleAbi) {
    return {nullptr, Status::BadInput(str_cat("the CUDA module ", path, " is from another memc build (interface ", api->abi, ", this memc's ",
                                              kModuleAbi, ")"))};
  }
  return {api, Status::Ok()};
}

std::once_flag g_once;
Loaded g_loaded;
std::atomic<const ModuleApi*> g_api{nullptr};

}  // namespace

Expected<const ModuleApi*> load_module() {
  std::call_once(g_once, [] {
    g_loaded = load();
    g_api.store(g_loaded.api, std::memory_order_release);
  });
  if (!g_loaded.status.ok()) return g_loaded.status;
  return g_loaded.api;
}

const ModuleApi* loaded_module() { return g_api.load(std::memory_order_acquire); }

}  // namespace memc::cuda
