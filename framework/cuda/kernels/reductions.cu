// Reductions to one number on the host: the sum of squares behind the
// global gradient norm and the sum of a micro-batch's losses. Fixed chunks
// of kChunk elements, one block each, summed in double; the partials are
// added in order by one thread. Neither depends on the GPU, so results are
// the same bits run to run.
#include "cuda/cuda_kernels.h"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

constexpr std::size_t kChunk = 65536;
constexpr unsigned kSumThreads = 512;

// partial[chunk] = the chunk's sum of x, or of x squared.
template <class T, bool kSquares>
__global__ void partial_sum_kernel(double* partial, const T* x, std::size_t n) {
  __shared__ double shared[32];
  const std::size_t begin = blockIdx.x * kChunk;
  const std::size_t end = begin + kChunk < n ? begin + kChunk : n;
  double s = 0.0;
  for (std::size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double xi = to_f32(x[i]);
    s += kSquares ? xi * xi : xi;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_in_order_kernel(double* out, const double* partial, std::size_t k) {
  double s = 0.0;
  for (std::size_t i = 0; i < k; ++i) s += partial[i];
  *out = s;
}

}  // namespace

// The partial sums, their ordered total, and the copy to the host.
template <class Partial>
double CudaKernels::reduce_to_host(std::size_t n, Partial&& launch_partials) const {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  Buffer partial = scratch(sizeof(double) * (chunks + 1));
  double* out = partial.as<double>() + chunks;
  launch_partials(partial.as<double>(), static_cast<unsigned>(chunks));
  ZTRAIN_CUDA_LAUNCHED();
  sum_in_order_kernel<<<1, 1, 0, stream_>>>(out, partial.as<double>(), chunks);
  ZTRAIN_CUDA_LAUNCHED();
  double result = 0.0;
  ZTRAIN_CUDA(cudaMemcpyAsync(&result, out, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  ZTRAIN_CUDA(cudaStreamSynchronize(stream_));
  return result;
}

double CudaKernels::sum_squares(ConstTypedPtr x, std::size_t n) const {
  if (n == 0) return 0.0;
  double result = 0.0;
  with_type(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    result = reduce_to_host(n, [&](double* partial, unsigned chunks) {
      partial_sum_kernel<T, true>
          <<<chunks, kSumThreads, 0, stream_>>>(partial, static_cast<const T*>(x.data), n);
    });
  });
  return result;
}

double CudaKernels::sum(const float* x, std::size_t n) const {
  if (n == 0) return 0.0;
  return reduce_to_host(n, [&](double* partial, unsigned chunks) {
    partial_sum_kernel<float, false><<<chunks, kSumThreads, 0, stream_>>>(partial, x, n);
  });
}

}  // namespace ztrain::cuda
