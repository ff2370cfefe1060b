// The CUDA backend's entry table: what libztrain's host finds in
// libztrain_cuda.so when a run asks for the cuda device (loader/cuda_loader.h
// loads it by name beside libztrain), so the host never links the CUDA
// libraries; and the options the table's factories take. Shared by the
// backend (cuda/) and the loader, neither reaching into the other.
//
// Layout: a table of another kBackendVersion is refused, not called; bump
// it when a member or an option changes.
#pragma once

#include <memory>
#include <string>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/dtype.h"
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

struct KernelOptions {
  // fp32 GEMMs may round their inputs to TF32 (10-bit mantissa) for tensor
  // cores; off, fp32 GEMMs are exact fp32.
  bool tf32 = false;
  // The run's precision. 16-bit: attention runs as tensor-core GEMMs on
  // q, k, v and the probabilities rounded to it (as a 16-bit run's other
  // GEMMs round their activations); f32: the exact fp32 flash kernel.
  DType attention = DType::f32;
};

inline constexpr int kBackendVersion = 2;

// What libztrain finds in libztrain_cuda when a run asks for the cuda
// device (loader/cuda_loader.h loads it by name beside libztrain), so the
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
extern "C" __attribute__((visibility("default"))) const ztrain::cuda::Backend*
ztrain_cuda_backend();
