// Column sums without atomics, for the parameter gradients of norms and
// biases: out[c] += sum over rows n of f(n, c), summed in a fixed order
// whatever the GPU (so results are bit-identical run to run) and, for a
// 16-bit out, rounded once.
//
// Stage 1: blocks of 32 channels x 8 row lanes take fixed slices of
// kSliceRows rows; each thread sums its rows in order, the 8 lanes are
// added in order, and the slice's sums go to partial[slice][c] (fp32).
// Stage 2: one thread per channel adds the slices in order into out.
#pragma once

#include "cuda/kernels/common.cuh"
#include "ztrain/kernels.h"

namespace ztrain::cuda {

inline constexpr int kSliceRows = 256;

template <class F>
__global__ void column_partials_kernel(float* partial, F f, int N, int C) {
  __shared__ float lanes[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int n0 = blockIdx.y * kSliceRows;
  const int n1 = min(N, n0 + kSliceRows);
  float s = 0.0f;
  if (c < C)
    for (int n = n0 + static_cast<int>(threadIdx.y); n < n1; n += 8) s += f(n, c);
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.0f;
    for (int y = 0; y < 8; ++y) t += lanes[y][threadIdx.x];
    partial[static_cast<std::size_t>(blockIdx.y) * C + c] = t;
  }
}

template <class G>
__global__ void column_finish_kernel(G* out, const float* partial, int slices, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int k = 0; k < slices; ++k) s += partial[static_cast<std::size_t>(k) * C + c];
  out[c] = from_f32<G>(to_f32(out[c]) + s);
}

// out (typed, C) += column sums of f over N rows; partial: scratch of
// column_slices(N) * C floats.
inline int column_slices(int N) {
  return (N + kSliceRows - 1) / kSliceRows;
}

template <class F>
void add_column_sums(TypedPtr out, float* partial, F f, int N, int C, cudaStream_t stream) {
  if (!out || C == 0) return;
  const int slices = column_slices(N);
  if (slices > 65535)
    throw InternalError("cuda column sums: " + std::to_string(N) +
                        " rows need more slices than a grid's y dimension holds");
  if (slices > 0) {
    column_partials_kernel<<<dim3((C + 31) / 32, slices), dim3(32, 8), 0, stream>>>(partial, f, N,
                                                                                    C);
    ZTRAIN_CUDA_LAUNCHED();
  }
  with_type(out.dtype, [&](auto tag) {
    using G = decltype(tag);
    column_finish_kernel<G>
        <<<(C + 255) / 256, 256, 0, stream>>>(static_cast<G*>(out.data), partial, slices, C);
  });
  ZTRAIN_CUDA_LAUNCHED();
}

}  // namespace ztrain::cuda
