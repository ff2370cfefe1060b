// The CUDA backend: libztrain_cuda, built beside libztrain where the CUDA
// toolkit is found, and used only by runs with [device] kind = "cuda", so
// a CPU installation never needs the CUDA libraries at run time.
//
// make_cuda_device opens one GPU: a caching allocator over cudaMalloc for
// the device tier (under the tier's budget, see caching_allocator.h), a
// host tier pinned with cudaHostAlloc when asked, and three streams
// (compute, communication, copy). make_cuda_kernels gives the Kernels of
// that device: every op of kernels.h on device pointers, on its compute
// stream.
//
// Ownership: the caller owns what the factories return; the Kernels must
// not outlive their Device.
// Thread safety: as Device and Kernels (ztrain/device.h, ztrain/kernels.h).
// The options and the entry table libztrain loads the backend through are
// in kit/cuda_backend_abi.h.
// Errors: cuda_device_count never throws (0 and the runtime's reason when
// there is no usable GPU); the factories raise ztrain::Error naming the
// failing CUDA call, OutOfMemoryError past the memory the card or the
// budget allows.
#pragma once

#include <memory>
#include <string>

#include "kit/cuda_backend_abi.h"
#include "ztrain/device.h"
#include "ztrain/kernels.h"

namespace ztrain::cuda {

// GPUs this process can use; 0 with the reason in *why when none.
ZTRAIN_API int cuda_device_count(std::string* why);

ZTRAIN_API std::unique_ptr<Device> make_cuda_device(const CudaOptions& options);

ZTRAIN_API std::unique_ptr<Kernels> make_cuda_kernels(Device& device, const KernelOptions& options);

}  // namespace ztrain::cuda
