// libztrain_cuda's entry point: the table of its factories.
#include "cuda/cuda_backend.h"

#ifdef ZTRAIN_HAVE_NCCL
#include "cuda/nccl_communicator.h"
#endif

extern "C" const ztrain::cuda::Backend* ztrain_cuda_backend() {
  static const ztrain::cuda::Backend backend{
      ztrain::cuda::kBackendVersion,         &ztrain::cuda::cuda_device_count,
      &ztrain::cuda::make_cuda_device,       &ztrain::cuda::make_cuda_kernels,
#ifdef ZTRAIN_HAVE_NCCL
      &ztrain::cuda::make_nccl_communicator,
#else
      nullptr,
#endif
  };
  return &backend;
}
