// Softmax cross-entropy over the vocabulary. Forward turns the fp32 logits
// into probabilities in place (the only fp32 copy of them) and writes each
// row's loss; backward turns the probabilities into dlogits in place.
// One block per row: a block max, a block sum of exp(x - max), a scale. A
// row whose target is kIgnoreTarget has a loss of 0 and zero dlogits.
// The vocabulary-parallel ops (crossentropy_slice_*) take the same steps
// apart, for the caller's all-reduces between them.
#include "cuda/cuda_kernels.h"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

constexpr unsigned kThreads = 512;

// The block's row x[0, V): its maximum, and its exponentials shifted by m
// in place with their sum (every thread gets the result; both end on a
// barrier).
__device__ float block_row_max(const float* x, int V, float* shared) {
  float m = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, x[i]);
  return block_max(m, shared);
}
__device__ float block_row_exp(float* x, int V, float m, float* shared) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float e = expf(x[i] - m);
    x[i] = e;
    s += e;
  }
  return block_sum(s, shared);
}

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
  const float m = block_row_max(x, V, shared);  // its barriers also publish target_logit
  const float s = block_row_exp(x, V, m, shared);
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

// The vocabulary-parallel loss (kernels.h): one block per row of the
// slice for the max and the sums, one thread per row for the loss.
// logits: (N,V); row_max: (N)
__global__ void slice_max_kernel(float* row_max, const float* logits, int V) {
  __shared__ float shared[32];
  const float m = block_row_max(logits + static_cast<std::size_t>(blockIdx.x) * V, V, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

// logits -> exp(logit - row_max) in place; sums: (2,N), the exp sums, then
// the target's logit where the slice [first, first + V) holds it, else 0.
__global__ void slice_sums_kernel(float* sums, float* logits, const float* row_max,
                                  const std::int32_t* targets, int N, int V, std::size_t first) {
  __shared__ float shared[32];
  float* x = logits + static_cast<std::size_t>(blockIdx.x) * V;
  const std::int32_t target = targets[blockIdx.x];
  const auto local = static_cast<std::size_t>(target) - first;
  const bool held = target != kIgnoreTarget && local < static_cast<std::size_t>(V);
  if (threadIdx.x == 0) sums[N + blockIdx.x] = held ? x[local] : 0.0f;
  __syncthreads();  // the target's logit read before any thread overwrites it
  const float s = block_row_exp(x, V, row_max[blockIdx.x], shared);
  if (threadIdx.x == 0) sums[blockIdx.x] = s;
}

__global__ void slice_loss_kernel(float* losses, const float* row_max, const float* sums,
                                  const std::int32_t* targets, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  losses[n] = targets[n] == kIgnoreTarget ? 0.0f : logf(sums[n]) + row_max[n] - sums[N + n];
}

// exps: (N,V) -> (exps / sums[0] - onehot(target)) * dloss
__global__ void slice_backward_kernel(float* exps, const float* sums, const std::int32_t* targets,
                                      float dloss, int V, std::size_t first) {
  float* p = exps + static_cast<std::size_t>(blockIdx.x) * V;
  const std::int32_t target = targets[blockIdx.x];
  const float inv = 1.0f / sums[blockIdx.x];
  const auto local = static_cast<std::size_t>(target) - first;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float onehot = static_cast<std::size_t>(i) == local ? 1.0f : 0.0f;
    p[i] = target == kIgnoreTarget ? 0.0f : (p[i] * inv - onehot) * dloss;
  }
}

}  // namespace

void CudaKernels::crossentropy_slice_max(float* row_max, const float* logits, VocabShape s) const {
  const int N = to_int(s.N, "crossentropy_slice_max", "N"),
            V = to_int(s.V, "crossentropy_slice_max", "V");
  if (N == 0) return;
  slice_max_kernel<<<N, kThreads, 0, stream_>>>(row_max, logits, V);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::crossentropy_slice_sums(float* sums, float* logits, const float* row_max,
                                          const std::int32_t* targets, VocabShape s) const {
  const int N = to_int(s.N, "crossentropy_slice_sums", "N"),
            V = to_int(s.V, "crossentropy_slice_sums", "V");
  if (N == 0) return;
  slice_sums_kernel<<<N, kThreads, 0, stream_>>>(sums, logits, row_max, targets, N, V, s.first);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::crossentropy_slice_loss(float* losses, const float* row_max, const float* sums,
                                          const std::int32_t* targets, std::size_t N) const {
  const int n = to_int(N, "crossentropy_slice_loss", "N");
  if (n == 0) return;
  slice_loss_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream_>>>(losses, row_max, sums,
                                                                       targets, n);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::crossentropy_slice_backward(float* exps, const float* sums,
                                              const std::int32_t* targets, float dloss,
                                              VocabShape s) const {
  const int N = to_int(s.N, "crossentropy_slice_backward", "N"),
            V = to_int(s.V, "crossentropy_slice_backward", "V");
  if (N == 0) return;
  slice_backward_kernel<<<N, kThreads, 0, stream_>>>(exps, sums, targets, dloss, V, s.first);
  ZTRAIN_CUDA_LAUNCHED();
}

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
