// Elementwise kernels outside CudaKernels: the device's typed copies and
// accumulation (CudaDevice::convert, accumulate) use them, and the cast
// also makes the kernels' 16-bit GEMM operands.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "ztrain/tensor.h"

namespace ztrain::cuda {

// dst (n, GPU memory) = src (n, GPU memory) in dst's type, rounded to
// nearest even, on `stream`.
void launch_cast(TypedPtr dst, ConstTypedPtr src, std::size_t n, cudaStream_t stream);
// dst (n) += src (n), one type, both GPU memory, each sum in fp32 rounded
// once, on `stream`.
void launch_accumulate(TypedPtr dst, ConstTypedPtr src, std::size_t n, cudaStream_t stream);

}  // namespace ztrain::cuda
