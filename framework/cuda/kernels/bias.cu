// The GEMM bias gradient: column sums of dout (the forward's bias is the
// GEMM's epilogue, matmul.cpp).
#include "cuda/kernels/bias.h"
#include "cuda/kernels/column_sums.cuh"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

struct Dout {
  const float* d;
  int OC;
  __device__ float operator()(int n, int c) const {
    return d[static_cast<std::size_t>(n) * OC + c];
  }
};

}  // namespace

void add_bias_gradient(TypedPtr dbias, const float* dout, int N, int OC, float* partial,
                       cudaStream_t stream) {
  add_column_sums(dbias, partial, Dout{dout, OC}, N, OC, stream);
}

std::size_t bias_gradient_scratch(int N, int OC) {
  return static_cast<std::size_t>(column_slices(N)) * OC;
}

}  // namespace ztrain::cuda
