// The bias halves of a GEMM (matmul.cpp): rows filled with the bias before
// the GEMM adds into them, and the bias gradient as column sums of dout.
#pragma once

#include <cuda_runtime.h>

#include "ztrain/kernels.h"

namespace ztrain::cuda {

// out: (N,OC) rows set to bias (OC).
void fill_bias_rows(float* out, ConstTypedPtr bias, int N, int OC, cudaStream_t stream);
// dbias: (OC) += column sums of dout (N,OC); partial: column_slices(N) * OC floats.
void add_bias_gradient(TypedPtr dbias, const float* dout, int N, int OC, float* partial,
                       cudaStream_t stream);
// Floats of scratch add_bias_gradient needs.
std::size_t bias_gradient_scratch(int N, int OC);

}  // namespace ztrain::cuda
