// LayerNorm and RMSNorm, forward (with or without the residual add before
// it) and backward. Rows: one warp per row of
// C channels (lanes stride the row, warp sums combine them), eight rows per
// block. Parameter gradients: column sums (column_sums.cuh), so every
// dw[c] is summed in a fixed order and a 16-bit one is rounded once.
#include "cuda/cuda_kernels.h"
#include "cuda/kernels/column_sums.cuh"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

constexpr int kRowsPerBlock = 8;

__device__ __forceinline__ int row_of_warp() {
  return blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
}

// With a residual (add not null): res = inp + add, each lane its own
// channels, and the row is normalised from res (the lane reads back what it
// wrote). Returns the row to normalise.
__device__ __forceinline__ const float* residual_row(float* res, const float* inp, const float* add,
                                                     int n, int C, int lane) {
  const std::size_t row = static_cast<std::size_t>(n) * C;
  if (!add) return inp + row;
  for (int c = lane; c < C; c += 32) res[row + c] = inp[row + c] + add[row + c];
  return res + row;
}

// out: (N,C) = (x - mean) * rstd * w + b with x = inp (+ add, kept in res);
// mean, rstd: (N)
template <class W>
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, float* res,
                                         const float* inp, const float* add, const W* w, const W* b,
                                         int N, int C, float eps) {
  const int n = row_of_warp(), lane = threadIdx.x % 32;
  if (n >= N) return;
  const float* x = residual_row(res, inp, add, n, C, lane);
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float r = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  float* o = out + static_cast<std::size_t>(n) * C;
  for (int c = lane; c < C; c += 32)
    o[c] = (x[c] - m) * r * to_f32(w[c]) + (b ? to_f32(b[c]) : 0.0f);
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// dinp: (N,C) += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
template <class W>
__global__ void layernorm_backward_kernel(float* dinp, const float* dout, const float* inp,
                                          const W* w, const float* mean, const float* rstd, int N,
                                          int C) {
  const int n = row_of_warp(), lane = threadIdx.x % 32;
  if (n >= N) return;
  const float* x = inp + static_cast<std::size_t>(n) * C;
  const float* d = dout + static_cast<std::size_t>(n) * C;
  const float m = mean[n], r = rstd[n];
  float a = 0.0f, an = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float dnorm = to_f32(w[c]) * d[c];
    a += dnorm;
    an += dnorm * (x[c] - m) * r;
  }
  a = warp_sum(a) / static_cast<float>(C);
  an = warp_sum(an) / static_cast<float>(C);
  float* di = dinp + static_cast<std::size_t>(n) * C;
  for (int c = lane; c < C; c += 32) {
    const float norm = (x[c] - m) * r;
    di[c] += (to_f32(w[c]) * d[c] - a - norm * an) * r;
  }
}

// out: (N,C) = x * rstd * w with x = inp (+ add, kept in res); rstd: (N)
template <class W>
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, float* res, const float* inp,
                                       const float* add, const W* w, int N, int C, float eps) {
  const int n = row_of_warp(), lane = threadIdx.x % 32;
  if (n >= N) return;
  const float* x = residual_row(res, inp, add, n, C, lane);
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
  const float r = rsqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  float* o = out + static_cast<std::size_t>(n) * C;
  for (int c = lane; c < C; c += 32) o[c] = x[c] * r * to_f32(w[c]);
  if (lane == 0) rstd[n] = r;
}

// dinp: (N,C) += rstd * (w * dout - inp * rstd * mean(w * dout * inp * rstd))
template <class W>
__global__ void rmsnorm_backward_kernel(float* dinp, const float* dout, const float* inp,
                                        const W* w, const float* rstd, int N, int C) {
  const int n = row_of_warp(), lane = threadIdx.x % 32;
  if (n >= N) return;
  const float* x = inp + static_cast<std::size_t>(n) * C;
  const float* d = dout + static_cast<std::size_t>(n) * C;
  const float r = rstd[n];
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) dot += to_f32(w[c]) * d[c] * x[c] * r;
  dot = warp_sum(dot) / static_cast<float>(C);
  float* di = dinp + static_cast<std::size_t>(n) * C;
  for (int c = lane; c < C; c += 32) di[c] += r * (to_f32(w[c]) * d[c] - x[c] * r * dot);
}

// The per-element terms of the parameter gradients.
struct NormalisedTimesDout {  // layernorm dw: (x - mean) * rstd * dout
  const float *x, *d, *mean, *rstd;
  int C;
  __device__ float operator()(int n, int c) const {
    const std::size_t i = static_cast<std::size_t>(n) * C + c;
    return (x[i] - mean[n]) * rstd[n] * d[i];
  }
};
struct ScaledTimesDout {  // rmsnorm dw: x * rstd * dout
  const float *x, *d, *rstd;
  int C;
  __device__ float operator()(int n, int c) const {
    const std::size_t i = static_cast<std::size_t>(n) * C + c;
    return x[i] * rstd[n] * d[i];
  }
};
struct Dout {  // layernorm db: dout
  const float* d;
  int C;
  __device__ float operator()(int n, int c) const { return d[static_cast<std::size_t>(n) * C + c]; }
};

unsigned row_blocks(int N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

void CudaKernels::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                    ConstTypedPtr w, ConstTypedPtr b, RowShape s, float eps) const {
  add_layernorm_forward(nullptr, out, mean, rstd, inp, nullptr, w, b, s, eps);
}

void CudaKernels::add_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                        const float* a, const float* b, ConstTypedPtr w,
                                        ConstTypedPtr bias, RowShape s, float eps) const {
  const int N = to_int(s.N, "add_layernorm_forward", "N"),
            C = to_int(s.C, "add_layernorm_forward", "C");
  if (N == 0) return;
  if (bias && bias.dtype != w.dtype)
    throw InternalError("cuda layernorm: w and b of different types");
  with_type(w.dtype, [&](auto tag) {
    using W = decltype(tag);
    layernorm_forward_kernel<W><<<row_blocks(N), 32 * kRowsPerBlock, 0, stream_>>>(
        out, mean, rstd, res, a, b, static_cast<const W*>(w.data), static_cast<const W*>(bias.data),
        N, C, eps);
  });
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::layernorm_backward(float* dinp, TypedPtr dw, TypedPtr db, const float* dout,
                                     const float* inp, ConstTypedPtr w, const float* mean,
                                     const float* rstd, RowShape s) const {
  const int N = to_int(s.N, "layernorm_backward", "N"), C = to_int(s.C, "layernorm_backward", "C");
  if (N == 0) return;
  with_type(w.dtype, [&](auto tag) {
    using W = decltype(tag);
    layernorm_backward_kernel<W><<<row_blocks(N), 32 * kRowsPerBlock, 0, stream_>>>(
        dinp, dout, inp, static_cast<const W*>(w.data), mean, rstd, N, C);
  });
  ZTRAIN_CUDA_LAUNCHED();
  Buffer partial = scratch(sizeof(float) * column_slices(N) * s.C);
  add_column_sums(dw, partial.as<float>(), NormalisedTimesDout{inp, dout, mean, rstd, C}, N, C,
                  stream_);
  add_column_sums(db, partial.as<float>(), Dout{dout, C}, N, C, stream_);
}

void CudaKernels::rmsnorm_forward(float* out, float* rstd, const float* inp, ConstTypedPtr w,
                                  RowShape s, float eps) const {
  add_rmsnorm_forward(nullptr, out, rstd, inp, nullptr, w, s, eps);
}

void CudaKernels::add_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                      const float* b, ConstTypedPtr w, RowShape s,
                                      float eps) const {
  const int N = to_int(s.N, "add_rmsnorm_forward", "N"),
            C = to_int(s.C, "add_rmsnorm_forward", "C");
  if (N == 0) return;
  with_type(w.dtype, [&](auto tag) {
    using W = decltype(tag);
    rmsnorm_forward_kernel<W><<<row_blocks(N), 32 * kRowsPerBlock, 0, stream_>>>(
        out, rstd, res, a, b, static_cast<const W*>(w.data), N, C, eps);
  });
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::rmsnorm_backward(float* dinp, TypedPtr dw, const float* dout, const float* inp,
                                   ConstTypedPtr w, const float* rstd, RowShape s) const {
  const int N = to_int(s.N, "rmsnorm_backward", "N"), C = to_int(s.C, "rmsnorm_backward", "C");
  if (N == 0) return;
  with_type(w.dtype, [&](auto tag) {
    using W = decltype(tag);
    rmsnorm_backward_kernel<W><<<row_blocks(N), 32 * kRowsPerBlock, 0, stream_>>>(
        dinp, dout, inp, static_cast<const W*>(w.data), rstd, N, C);
  });
  ZTRAIN_CUDA_LAUNCHED();
  Buffer partial = scratch(sizeof(float) * column_slices(N) * s.C);
  add_column_sums(dw, partial.as<float>(), ScaledTimesDout{inp, dout, rstd, C}, N, C, stream_);
}

}  // namespace ztrain::cuda
