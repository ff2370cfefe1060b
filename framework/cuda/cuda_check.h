// Checks on CUDA, cuBLASLt and NCCL return codes inside libztrain_cuda: a
// failure becomes a ztrain::Error naming the call, its source line and the
// library's own description, so a message read in a job log says what
// failed where without a debugger. And the one check on a dimension
// narrowed to the kernels' int indices.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <string>

#include "ztrain/error.h"

namespace ztrain::cuda {

[[noreturn]] void fail_cuda(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line);

// Dimension `dim` of op `op` (a std::size_t of a kernels.h shape) as the int
// the GPU kernels index with and GemmCall carries: an op converts its
// shape with this once, at its top, so a size past INT_MAX is an
// InternalError naming it, never an index that wraps.
inline int to_int(std::size_t n, const char* op, const char* dim) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw InternalError(std::string("cuda ") + op + ": " + dim + " = " + std::to_string(n) +
                        " does not fit the kernels' int indices");
  return static_cast<int>(n);
}

}  // namespace ztrain::cuda

#define ZTRAIN_CUDA(call)                                                                          \
  do {                                                                                             \
    const cudaError_t ztrain_e_ = (call);                                                          \
    if (ztrain_e_ != cudaSuccess) ::ztrain::cuda::fail_cuda(ztrain_e_, #call, __FILE__, __LINE__); \
  } while (0)

#define ZTRAIN_CUBLAS(call)                                              \
  do {                                                                   \
    const cublasStatus_t ztrain_s_ = (call);                             \
    if (ztrain_s_ != CUBLAS_STATUS_SUCCESS)                              \
      ::ztrain::cuda::fail_cublas(ztrain_s_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad launch configuration shows here, at the
// launch, rather than at the next synchronisation.
#define ZTRAIN_CUDA_LAUNCHED() ZTRAIN_CUDA(cudaPeekAtLastError())
