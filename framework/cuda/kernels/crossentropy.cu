// Softmax cross-entropy over the vocabulary. Forward turns the fp32 logits
// into probabilities in place (the only fp32 copy of them) and writes each
// row's loss; backward turns the probabilities into dlogits in place.
// One block per row: a block max, a block sum of exp(x - max), a scale. A
// row whose target is kIgnoreTarget has a loss of 0 and zero dlogits.
#include "cuda/cuda_kernels.h"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

constexpr unsigned kThreads = 512;

// logits: (N,V) -> probabilities; losses: (N) = -log p[target]
__global__ void softmax_crossentropy_forward_kernel(float* losses, float* logits,
                                                    const std::int32_t* targets, int V) {
  __shared__ float shared[32];
  __shared__ float target_logit;
  float* x = logits + static_cast<std::size_t>(blockIdx.x) * V;
  if (targets[blockIdx.x] == kIgnoreTarget) {  // the whole block returns together
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    return;
  }
  if (threadIdx.x == 0) target_logit = x[targets[blockIdx.x]];
  float m = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, x[i]);
  m = block_max(m, shared);  // its barriers also publish target_logit
  float s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float e = expf(x[i] - m);
    x[i] = e;
    s += e;
  }
  s = block_sum(s, shared);
  const float inv = 1.0f / s;
  for (int i = threadIdx.x; i < V; i += blockDim.x) x[i] *= inv;
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) + m - target_logit;
}

// probs: (N,V) -> (probs - onehot(target)) * dloss
__global__ void softmax_crossentropy_backward_kernel(float* probs, const std::int32_t* targets,
                                                     float dloss, int V) {
  float* p = probs + static_cast<std::size_t>(blockIdx.x) * V;
  const int target = targets[blockIdx.x];
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    p[i] = target == kIgnoreTarget ? 0.0f : (i == target ? p[i] - 1.0f : p[i]) * dloss;
}

}  // namespace

// s is (N, V): one block per row.
void CudaKernels::softmax_crossentropy_forward(float* losses, float* logits,
                                               const std::int32_t* targets, RowShape s) const {
  const int N = to_int(s.N, "softmax_crossentropy_forward", "N"),
            V = to_int(s.C, "softmax_crossentropy_forward", "V");
  if (N == 0) return;
  softmax_crossentropy_forward_kernel<<<N, kThreads, 0, stream_>>>(losses, logits, targets, V);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::softmax_crossentropy_backward(float* probs, const std::int32_t* targets,
                                                float dloss, RowShape s) const {
  const int N = to_int(s.N, "softmax_crossentropy_backward", "N"),
            V = to_int(s.C, "softmax_crossentropy_backward", "V");
  if (N == 0) return;
  softmax_crossentropy_backward_kernel<<<N, kThreads, 0, stream_>>>(probs, targets, dloss, V);
  ZTRAIN_CUDA_LAUNCHED();
}

}  // namespace ztrain::cuda
