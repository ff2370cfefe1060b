// AdamW over a shard in one pass (master, moments, gradient, the 16-bit
// working copy), and the sum of squares behind the global gradient norm.
#include "cuda/cuda_kernels.h"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

constexpr unsigned kThreads = 256;

struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay, grad_mult, bc1, bc2;
  bool zero_grad;
};

// p, m, v: (n) fp32; g: (n) of type G; working: (n) of type W or null.
// The update is the cpu reference's, term for term.
template <class G, class W>
__global__ void adamw_kernel(float* p, G* g, float* m, float* v, W* working, std::size_t n,
                             AdamParams a) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float gi = to_f32(g[i]) * a.grad_mult;
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / a.bc1;
    const float vhat = vi / a.bc2;
    const float pi = p[i] - a.lr * (a.weight_decay * p[i] + mhat / (sqrtf(vhat) + a.eps));
    p[i] = pi;
    if (a.zero_grad) g[i] = from_f32<G>(0.0f);
    if (working) working[i] = from_f32<W>(pi);
  }
}

// Fixed chunks of kChunk elements, one block each, summed in double; the
// partials are added in order by one block. Neither depends on the GPU.
constexpr std::size_t kChunk = 65536;
constexpr unsigned kSumThreads = 512;

template <class T>
__global__ void sum_squares_partial_kernel(double* partial, const T* x, std::size_t n) {
  __shared__ double shared[32];
  const std::size_t begin = blockIdx.x * kChunk;
  const std::size_t end = begin + kChunk < n ? begin + kChunk : n;
  double s = 0.0;
  for (std::size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double xi = to_f32(x[i]);
    s += xi * xi;
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

void CudaKernels::adamw(float* p, TypedPtr g, float* m, float* v, TypedPtr working, std::size_t n,
                        float lr, float beta1, float beta2, float eps, float weight_decay,
                        float grad_mult, float bc1, float bc2, GradAfter grad_after) const {
  if (n == 0) return;
  const AdamParams a{
      lr, beta1, beta2, eps, weight_decay, grad_mult, bc1, bc2, grad_after == GradAfter::zeroed};
  // Without a working copy the kernel is instantiated with W = float and
  // a null pointer.
  const DType wt = working ? working.dtype : DType::f32;
  with_type(g.dtype, [&](auto gtag) {
    using G = decltype(gtag);
    with_type(wt, [&](auto wtag) {
      using W = decltype(wtag);
      adamw_kernel<G, W><<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
          p, static_cast<G*>(g.data), m, v, static_cast<W*>(working.data), n, a);
    });
  });
  ZTRAIN_CUDA_LAUNCHED();
}

double CudaKernels::sum_squares(ConstTypedPtr x, std::size_t n) const {
  if (n == 0) return 0.0;
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  Buffer partial = scratch(sizeof(double) * (chunks + 1));
  double* out = partial.as<double>() + chunks;
  with_type(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    sum_squares_partial_kernel<T><<<static_cast<unsigned>(chunks), kSumThreads, 0, stream_>>>(
        partial.as<double>(), static_cast<const T*>(x.data), n);
  });
  ZTRAIN_CUDA_LAUNCHED();
  sum_in_order_kernel<<<1, 1, 0, stream_>>>(out, partial.as<double>(), chunks);
  ZTRAIN_CUDA_LAUNCHED();
  double result = 0.0;
  ZTRAIN_CUDA(cudaMemcpyAsync(&result, out, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  ZTRAIN_CUDA(cudaStreamSynchronize(stream_));
  return result;
}

}  // namespace ztrain::cuda
