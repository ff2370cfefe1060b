// GEMM bias forward (broadcast rows) and backward (column sums).
#include "cuda/kernels/bias.h"
#include "cuda/kernels/column_sums.cuh"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

// out: (N,OC), bias: (OC)
template <class W>
__global__ void fill_rows_kernel(float* out, const W* bias, int N, int OC) {
  const std::size_t n = static_cast<std::size_t>(N) * OC;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = to_f32(bias[i % OC]);
}

struct Dout {
  const float* d;
  int OC;
  __device__ float operator()(int n, int c) const {
    return d[static_cast<std::size_t>(n) * OC + c];
  }
};

}  // namespace

void fill_bias_rows(float* out, ConstTypedPtr bias, int N, int OC, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(N) * OC;
  if (n == 0) return;
  with_type(bias.dtype, [&](auto tag) {
    using W = decltype(tag);
    fill_rows_kernel<W>
        <<<blocks_for(n, 256), 256, 0, stream>>>(out, static_cast<const W*>(bias.data), N, OC);
  });
  ZTRAIN_CUDA_LAUNCHED();
}

void add_bias_gradient(TypedPtr dbias, const float* dout, int N, int OC, float* partial,
                       cudaStream_t stream) {
  add_column_sums(dbias, partial, Dout{dout, OC}, N, OC, stream);
}

std::size_t bias_gradient_scratch(int N, int OC) {
  return static_cast<std::size_t>(column_slices(N)) * OC;
}

}  // namespace ztrain::cuda
