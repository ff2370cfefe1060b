// Elementwise ops: GELU, SwiGLU, add, RoPE, casts between types (also the
// one that rounds an fp32 operand to 16 bits for a tensor-core GEMM) and
// the accumulation of one typed buffer into another. Grid-stride loops, one
// element per thread per pass; the math is the cpu reference's, line for
// line (x * sigmoid(2u) for GELU, avoiding 1 + tanh's cancellation).
#include "cuda/cuda_kernels.h"
#include "cuda/kernels/bias.h"
#include "cuda/kernels/cast.h"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

#define ZTRAIN_GRID_STRIDE(i, n)                                                                 \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

// out, pre: (n) = (N,H); bias: (H) in fp32 or null. x = pre + bias.
__global__ void gelu_forward_kernel(float* out, const float* pre, const float* bias, std::size_t H,
                                    std::size_t n) {
  ZTRAIN_GRID_STRIDE(i, n) {
    const float x = pre[i] + (bias ? bias[i % H] : 0.0f);
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = x / (1.0f + expf(-2.0f * u));
  }
}

// dpre = gelu'(pre + bias) * dout, written; all (n) = (N,H)
__global__ void gelu_backward_kernel(float* dpre, const float* pre, const float* bias,
                                     std::size_t H, const float* dout, std::size_t n) {
  ZTRAIN_GRID_STRIDE(i, n) {
    const float x = pre[i] + (bias ? bias[i % H] : 0.0f);
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float s = 1.0f / (1.0f + expf(-2.0f * u));
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dpre[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
  }
}

// out = silu(gate) * up; all (n)
__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up,
                                      std::size_t n) {
  ZTRAIN_GRID_STRIDE(i, n) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout,
                                       const float* gate, const float* up, std::size_t n) {
  ZTRAIN_GRID_STRIDE(i, n) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + expf(-g));
    dgate[i] += dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] += dout[i] * g * sig;
  }
}

__global__ void add_kernel(float* out, const float* a, const float* b, std::size_t n) {
  ZTRAIN_GRID_STRIDE(i, n) {
    out[i] = a[i] + b[i];
  }
}

__global__ void scale_kernel(float* x, float alpha, std::size_t n) {
  ZTRAIN_GRID_STRIDE(i, n) {
    x[i] *= alpha;
  }
}

// x: (B,T,H,hs) rows of `stride`; cos, sin: (T, hs/2), row t for token
// (b,t), or row positions[b*T + t] where given (packed rows). One thread
// per pair (i, i + hs/2); direction -1 applies the inverse rotation.
__global__ void rope_kernel(float* x, const float* cos, const float* sin,
                            const std::int32_t* positions, int B, int T, int H, int hs, int stride,
                            float direction) {
  const int half = hs / 2;
  const std::size_t pairs = static_cast<std::size_t>(B) * T * H * half;
  ZTRAIN_GRID_STRIDE(j, pairs) {
    const int i = static_cast<int>(j % half);
    const std::size_t bth = j / half;
    const int h = static_cast<int>(bth % H);
    const std::size_t bt = bth / H;
    const int t = positions ? positions[bt] : static_cast<int>(bt % T);
    float* r = x + bt * stride + static_cast<std::size_t>(h) * hs;
    const float c = cos[static_cast<std::size_t>(t) * half + i];
    const float s = direction * sin[static_cast<std::size_t>(t) * half + i];
    const float x0 = r[i], x1 = r[i + half];
    r[i] = x0 * c - x1 * s;
    r[i + half] = x1 * c + x0 * s;
  }
}

// rope_kernel over x as s lays it out: rope_forward's rotation (direction
// 1) or rope_backward's inverse (-1); `op` names the caller in a narrowing
// error.
void launch_rope(float* x, const float* cos, const float* sin, HeadShape s, float direction,
                 const char* op, cudaStream_t stream) {
  const int B = to_int(s.B, op, "B"), T = to_int(s.T, op, "T"), H = to_int(s.H, op, "H"),
            hs = to_int(s.hs, op, "hs"), stride = to_int(s.stride, op, "stride");
  const std::size_t pairs = s.B * s.T * s.H * (s.hs / 2);
  if (pairs == 0) return;
  rope_kernel<<<blocks_for(pairs, kThreads), kThreads, 0, stream>>>(x, cos, sin, s.positions, B, T,
                                                                    H, hs, stride, direction);
  ZTRAIN_CUDA_LAUNCHED();
}

template <class D, class S>
__global__ void cast_kernel(D* out, const S* in, std::size_t n) {
  ZTRAIN_GRID_STRIDE(i, n) {
    out[i] = from_f32<D>(to_f32(in[i]));
  }
}

// dst += src, the sum in fp32, rounded once.
template <class T>
__global__ void accumulate_kernel(T* dst, const T* src, std::size_t n) {
  ZTRAIN_GRID_STRIDE(i, n) {
    dst[i] = from_f32<T>(to_f32(dst[i]) + to_f32(src[i]));
  }
}

}  // namespace

// The bias in fp32 scratch (a 16-bit one cast once), null for none.
Buffer CudaKernels::bias_f32(ConstTypedPtr bias, std::size_t H) const {
  if (!bias) return {};
  Buffer b = scratch(sizeof(float) * H);
  launch_cast({b.data(), DType::f32}, bias, H, stream_);
  return b;
}

// s is (N, H).
void CudaKernels::gelu_forward(float* out, const float* pre, ConstTypedPtr bias, RowShape s) const {
  const std::size_t n = s.N * s.C;
  if (n == 0) return;
  const Buffer b = bias_f32(bias, s.C);
  gelu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
      out, pre, b ? b.as<float>() : nullptr, s.C, n);
  ZTRAIN_CUDA_LAUNCHED();
}

// dbias from dpre's column sums after the elementwise pass (bias.h), the
// sums matmul_backward computes for any other bias. s is (N, H).
void CudaKernels::gelu_backward(float* dpre, TypedPtr dbias, const float* pre, ConstTypedPtr bias,
                                const float* dout, RowShape s) const {
  const int N = to_int(s.N, "gelu_backward", "N"), H = to_int(s.C, "gelu_backward", "H");
  const std::size_t n = s.N * s.C;
  if (n == 0) return;
  const Buffer b = bias_f32(bias, s.C);
  gelu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
      dpre, pre, b ? b.as<float>() : nullptr, s.C, dout, n);
  ZTRAIN_CUDA_LAUNCHED();
  if (!dbias) return;
  Buffer partial = scratch(sizeof(float) * bias_gradient_scratch(N, H));
  add_bias_gradient(dbias, dpre, N, H, partial.as<float>(), stream_);
}

void CudaKernels::swiglu_forward(float* out, const float* gate, const float* up,
                                 std::size_t n) const {
  if (n == 0) return;
  swiglu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(out, gate, up, n);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                  const float* up, std::size_t n) const {
  if (n == 0) return;
  swiglu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(dgate, dup, dout, gate,
                                                                            up, n);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::add(float* out, const float* a, const float* b, std::size_t n) const {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(out, a, b, n);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::scale(float* x, float alpha, std::size_t n) const {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(x, alpha, n);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::rope_forward(float* x, const float* cos, const float* sin, HeadShape s) const {
  launch_rope(x, cos, sin, s, 1.0f, "rope_forward", stream_);
}

void CudaKernels::rope_backward(float* dx, const float* cos, const float* sin, HeadShape s) const {
  launch_rope(dx, cos, sin, s, -1.0f, "rope_backward", stream_);
}

Buffer CudaKernels::rounded(const float* x, std::size_t n, DType type) const {
  Buffer b = scratch(n * dtype_size(type));
  if (n == 0) return b;
  launch_cast({b.data(), type}, x, n, stream_);
  return b;
}

void launch_cast(TypedPtr dst, ConstTypedPtr src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (dst.dtype == src.dtype) {
    ZTRAIN_CUDA(cudaMemcpyAsync(dst.data, src.data, n * dtype_size(dst.dtype),
                                cudaMemcpyDeviceToDevice, stream));
    return;
  }
  with_type(dst.dtype, [&](auto dtag) {
    using D = decltype(dtag);
    with_type(src.dtype, [&](auto stag) {
      using S = decltype(stag);
      cast_kernel<D, S><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<D*>(dst.data), static_cast<const S*>(src.data), n);
    });
  });
  ZTRAIN_CUDA_LAUNCHED();
}

void launch_accumulate(TypedPtr dst, ConstTypedPtr src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_type(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    accumulate_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dst.data), static_cast<const T*>(src.data), n);
  });
  ZTRAIN_CUDA_LAUNCHED();
}

}  // namespace ztrain::cuda
