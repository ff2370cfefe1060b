// AdamW over a shard in one pass (master, moments, gradient, the 16-bit
// working copy).
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

}  // namespace ztrain::cuda
