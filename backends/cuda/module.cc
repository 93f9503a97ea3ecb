// The CUDA module's one entry point (backends/cuda_module.h): libmemc_cuda.so exports
// memc_cuda_module(), and libmemc finds everything else through the table it returns.
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda_module.h"
#ifdef MEMC_HAVE_NCCL
#include "backends/comm/nccl_communicator.h"
#endif

namespace memc::cuda {
namespace {

Expected<std::unique_ptr<Backend>> open_device(int device) {
  MEMC_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::open(device));
  return std::unique_ptr<Backend>(std::move(backend));
}

#ifdef MEMC_HAVE_NCCL
Expected<std::unique_ptr<comm::Communicator>> nccl_communicator(comm::Communicator& bootstrap, int device, double timeout_s) {
  MEMC_ASSIGN_OR_RETURN(std::unique_ptr<comm::NcclCommunicator> nccl, comm::NcclCommunicator::create(bootstrap, device, timeout_s));
  return std::unique_ptr<comm::Communicator>(std::move(nccl));
}
#endif

const ModuleApi kApi{
    .abi = kModuleAbi,
    .probe = &probe,
    .open = &open_device,
    .set_tf32 = &set_tf32,
#ifdef MEMC_HAVE_NCCL
    .nccl_communicator = &nccl_communicator,
#endif
};

}  // namespace
}  // namespace memc::cuda

extern "C" __attribute__((visibility("default"))) const memc::cuda::ModuleApi* memc_cuda_module() { return &memc::cuda::kApi; }
