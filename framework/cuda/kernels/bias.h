// The bias gradient of a GEMM (matmul.cpp): column sums of dout. (The
// forward's bias is cuBLASLt's epilogue.)
#pragma once

#include <cuda_runtime.h>

#include "ztrain/kernels.h"

namespace ztrain::cuda {

// dbias: (OC) += column sums of dout (N,OC); partial: column_slices(N) * OC floats.
void add_bias_gradient(TypedPtr dbias, const float* dout, int N, int OC, float* partial,
                       cudaStream_t stream);
// Floats of scratch add_bias_gradient needs.
std::size_t bias_gradient_scratch(int N, int OC);

}  // namespace ztrain::cuda
