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
// Errors: cuda_device_count never throws (0 and the runtime's reason when
// there is no usable GPU); the factories raise ztrain::Error naming the
// failing CUDA call, OutOfMemoryError past the memory the card or the
// budget allows.
#pragma once

#include <memory>
#include <string>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/kernels.h"

namespace ztrain::cuda {

struct CudaOptions {
  // The GPU to open among the visible ones (CUDA_VISIBLE_DEVICES applies).
  int ordinal = 0;
  // Host tier allocations pinned (cudaHostAlloc), so copies to and from the
  // GPU run asynchronously at full speed.
  bool pin_memory = true;
  // Host threads for work done on the CPU (offloaded optimizer steps).
  int host_threads = 1;
};

// GPUs this process can use; 0 with the reason in *why when none.
ZTRAIN_API int cuda_device_count(std::string* why);

ZTRAIN_API std::unique_ptr<Device> make_cuda_device(const CudaOptions& options);

struct KernelOptions {
  // fp32 GEMMs may round their inputs to TF32 (10-bit mantissa) for tensor
  // cores; off, fp32 GEMMs are exact fp32.
  bool tf32 = false;
  // The run's precision. 16-bit: attention runs as tensor-core GEMMs on
  // q, k, v and the probabilities rounded to it (as a 16-bit run's other
  // GEMMs round their activations); f32: the exact fp32 flash kernel.
  DType attention = DType::f32;
};

ZTRAIN_API std::unique_ptr<Kernels> make_cuda_kernels(Device& device, const KernelOptions& options);

inline constexpr int kBackendVersion = 2;

// What libztrain finds in libztrain_cuda when a run asks for the cuda
// device (core/cuda_loader.h loads it by name beside libztrain), so the
// host never links the CUDA libraries. make_nccl is null in a build
// without NCCL.
struct Backend {
  // kBackendVersion of the build that made the library: a table of
  // another layout is refused, not called.
  int version;
  int (*device_count)(std::string* why);
  std::unique_ptr<Device> (*make_device)(const CudaOptions& options);
  std::unique_ptr<Kernels> (*make_kernels)(Device& device, const KernelOptions& options);
  std::unique_ptr<Communicator> (*make_nccl)(Communicator& bootstrap, Device& device,
                                             double timeout_s);
};

}  // namespace ztrain::cuda

// The library's one C entry point (a stable name for dlsym).
extern "C" ZTRAIN_API const ztrain::cuda::Backend* ztrain_cuda_backend();
