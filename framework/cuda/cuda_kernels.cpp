// CudaKernels' setup: the cuBLASLt handle and workspace, and op scratch.
#include "cuda/cuda_kernels.h"

#include "cuda/cuda_check.h"

namespace ztrain::cuda {
namespace {

// cuBLASLt's guidance for Hopper: 32 MiB of workspace lets its heuristics
// pick the fastest kernels (split-K, stream-K); smaller cards need less,
// but the difference is noise next to a model's activations.
constexpr std::size_t kGemmWorkspace = std::size_t{32} << 20;

}  // namespace

CudaKernels::CudaKernels(CudaDevice& device, const KernelOptions& options)
    : device_(device),
      stream_(device.compute()),
      tf32_(options.tf32),
      attention_type_(options.attention) {
  ZTRAIN_CUBLAS(cublasLtCreate(&lt_));
  workspace_ =
      device_.allocate(Tier::device, Category::activations, kGemmWorkspace, Fill::undefined);
}

CudaKernels::~CudaKernels() {
  cublasLtDestroy(lt_);
}

Buffer CudaKernels::scratch(std::size_t bytes) const {
  return device_.allocate(Tier::device, Category::activations, bytes, Fill::undefined);
}

std::unique_ptr<Kernels> make_cuda_kernels(Device& device, const KernelOptions& options) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (!cuda) throw InternalError("make_cuda_kernels: '" + device.name() + "' is not a cuda device");
  return std::make_unique<CudaKernels>(*cuda, options);
}

}  // namespace ztrain::cuda
