// What every kernel file shares: reading and writing typed operands in
// fp32, dispatching on a DType to a template, warp and block sums in a
// fixed order, launch sizes, and attention's shape in ints.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cuda_check.h"
#include "ztrain/dtype.h"
#include "ztrain/error.h"
#include "ztrain/kernels.h"

namespace ztrain::cuda {

// An AttentionShape as attention's kernels index it, in ints, with the
// softmax scale 1/sqrt(hs): both attention paths (attention.cu's flash
// kernels, attention_gemm.cu's tensor-core GEMMs) narrow it once per op.
struct AttentionInts {
  int B, T, NH, NKV, hs, q_stride, kv_stride;
  float scale;
  const std::int32_t* positions;  // (B,T) on the device, or null (AttentionShape's)
  __host__ __device__ int group() const { return NH / NKV; }
  // The first key query i of score row r (head r / T of the batch's B*NH)
  // sees: its example's first token in a packed row, else 0.
  __device__ int first_key(std::size_t r, int i) const {
    return positions ? i - positions[r / T / NH * T + i] : 0;
  }
};

inline AttentionInts attention_ints(AttentionShape s, const char* op) {
  return {to_int(s.B, op, "B"),
          to_int(s.T, op, "T"),
          to_int(s.NH, op, "NH"),
          to_int(s.NKV, op, "NKV"),
          to_int(s.hs, op, "hs"),
          to_int(s.q_stride, op, "q_stride"),
          to_int(s.kv_stride, op, "kv_stride"),
          1.0f / sqrtf(static_cast<float>(s.hs)),
          s.positions};
}

template <class T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half x) {
  return __half2float(x);
}

// Round to nearest, ties to even, as dtype.h's conversions.
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// f(T{}) with T the C++ type of `t`.
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      f(float{});
      return;
    case DType::bf16:
      f(__nv_bfloat16{});
      return;
    case DType::f16:
      f(__half{});
      return;
  }
  throw InternalError("cuda kernels: unknown dtype");
}

// Sum over the 32 lanes of a warp; every lane gets the same bits (a
// butterfly adds the same pairs in the same order on every run).
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024);
// every thread gets the result. `shared` holds 32 values.
template <class V>
__device__ V block_sum(V x, V* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  x = warp_sum(x);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  const int warps = blockDim.x / 32;
  V t = lane < warps ? shared[lane] : V(0);
  return warp_sum(t);
}
__device__ inline float block_max(float x, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float t = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(t);
}

// Blocks for n elements at `threads` per block, one element per thread
// (grid-stride loops cover the rest past the grid limit).
inline unsigned blocks_for(std::size_t n, unsigned threads) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535u * 16u ? (b == 0 ? 1 : b) : 65535u * 16u);
}

}  // namespace ztrain::cuda
