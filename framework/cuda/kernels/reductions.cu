// Reductions to one number that stays on the GPU: the sum of squares
// behind the global gradient norm, the norm's finishing arithmetic, and
// a micro-batch's mean loss added to the step's total. Fixed chunks of
// kChunk elements, one block each, summed in double; the partials are
// added in order by one thread. No sum depends on the GPU's scheduling, so
// results are the same bits run to run; nothing is copied to the host.
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

// *acc += the partials in order (a sum of squares).
__global__ void add_in_order_kernel(double* acc, const double* partial, std::size_t k) {
  double s = 0.0;
  for (std::size_t i = 0; i < k; ++i) s += partial[i];
  *acc += s;
}

// *acc += the partials' total / n, rounded to fp32 (a mean loss).
__global__ void add_mean_kernel(double* acc, const double* partial, std::size_t k, std::size_t n) {
  double s = 0.0;
  for (std::size_t i = 0; i < k; ++i) s += partial[i];
  *acc += static_cast<float>(s / static_cast<double>(n));
}

__global__ void unscale_kernel(StepScalars* s, double loss_scale) {
  s->sum_squares /= loss_scale * loss_scale;
  s->reduced = static_cast<float>(s->sum_squares);
}

// The cpu reference's arithmetic (reference_kernels.cpp), in the same
// IEEE double and float operations.
__global__ void finish_kernel(StepScalars* s, bool across_ranks, double loss_scale,
                              double grad_clip) {
  const double norm = sqrt(across_ranks ? static_cast<double>(s->reduced) : s->sum_squares);
  s->grad_norm = norm;
  s->skip = isfinite(norm) ? 0 : 1;
  float clip = 1.0f;
  if (grad_clip > 0 && isfinite(norm) && norm / grad_clip > 1.0)
    clip = static_cast<float>(1.0 / (norm / grad_clip));
  s->grad_mult = static_cast<float>(1.0 / loss_scale) * clip;
}

}  // namespace

// The partial sums into scratch (freed in stream order), then `finish`.
template <class Partial, class Finish>
void CudaKernels::reduce_on_device(std::size_t n, Partial&& launch_partials,
                                   Finish&& finish) const {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  Buffer partial = scratch(sizeof(double) * chunks);
  launch_partials(partial.as<double>(), static_cast<unsigned>(chunks));
  ZTRAIN_CUDA_LAUNCHED();
  finish(partial.as<double>(), chunks);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::sum_squares_add(StepScalars* s, ConstTypedPtr x, std::size_t n) const {
  if (n == 0) return;
  with_type(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_on_device(
        n,
        [&](double* partial, unsigned chunks) {
          partial_sum_kernel<T, true>
              <<<chunks, kSumThreads, 0, stream_>>>(partial, static_cast<const T*>(x.data), n);
        },
        [&](const double* partial, std::size_t chunks) {
          add_in_order_kernel<<<1, 1, 0, stream_>>>(&s->sum_squares, partial, chunks);
        });
  });
}

void CudaKernels::grad_norm_unscale(StepScalars* s, double loss_scale) const {
  unscale_kernel<<<1, 1, 0, stream_>>>(s, loss_scale);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::grad_norm_finish(StepScalars* s, bool across_ranks, double loss_scale,
                                   double grad_clip) const {
  finish_kernel<<<1, 1, 0, stream_>>>(s, across_ranks, loss_scale, grad_clip);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::mean_add(double* acc, const float* x, std::size_t n) const {
  if (n == 0) return;
  reduce_on_device(
      n,
      [&](double* partial, unsigned chunks) {
        partial_sum_kernel<float, false><<<chunks, kSumThreads, 0, stream_>>>(partial, x, n);
      },
      [&](const double* partial, std::size_t chunks) {
        add_mean_kernel<<<1, 1, 0, stream_>>>(acc, partial, chunks, n);
      });
}

}  // namespace ztrain::cuda
