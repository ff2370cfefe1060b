// Causal attention as tensor-core GEMMs, for 16-bit runs: q, k and v are
// rounded to the run's type O (bf16 or fp16) into head-major copies, and
// each head's scores, probabilities and their gradients are cuBLASLt
// batched GEMMs with fp32 accumulation, as the run's other GEMMs round
// their activations. The T x T scores exist only for a chunk of heads at a
// time (kScoreBytes of scratch), never for the whole batch; the forward
// keeps only lse, and backward recomputes the scores from q and k.
//
// Per head, row-major (rows are query positions i, columns key positions
// j), scale = 1/sqrt(hs):
//   forward   S = scale q k^T        P = causal softmax(S), lse = logsumexp
//             out = P v
//   backward  S again, P = exp(S - lse) (0 for j > i)
//             dv = P^T dout          dP = dout v^T
//             dS = P (dP - delta),   delta_i = dout_i . out_i
//             dq = scale dS k        dk = scale dS^T q
// Grouped key/value heads are expanded to one copy per query head (so every
// GEMM batch has one stride); their gradients are summed back over the
// group in a fixed order. Every sum has a fixed order: results are
// bit-identical run to run.
//
// Column-major to cuBLAS: a row-major (T, hs) head is a (hs x T) matrix
// with ld hs, and a row-major (T, T) score matrix is (T x T) with ld T,
// so S^T = k^T' q' reads "A = k transposed, B = q" (as in matmul.cpp).
#include <algorithm>

#include "cuda/cuda_kernels.h"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {

namespace {

constexpr unsigned kThreads = 256;

// The scores of at most this many bytes of heads at once (S fp32, P in O,
// dP fp32: 10 bytes per score): at T = 1024 that is 25 heads a chunk, at
// T = 4096 one or two, while the GEMMs of a chunk still fill the GPU.
constexpr std::size_t kScoreBytes = std::size_t{256} << 20;

struct Sizes {
  int B, T, NH, NKV, hs, q_stride, kv_stride;
  DType type;  // of the GEMM operands
  float scale;
  std::size_t head() const { return static_cast<std::size_t>(T) * hs; }  // elements of one head
  std::size_t all_heads() const { return static_cast<std::size_t>(B) * NH; }
  std::size_t heads() const { return all_heads() * head(); }              // elements of them all
  std::size_t scores() const { return static_cast<std::size_t>(T) * T; }  // per head
  // Heads whose scores fit kScoreBytes (at least one).
  std::size_t chunk() const {
    return std::clamp<std::size_t>(kScoreBytes / (scores() * 10), 1, all_heads());
  }
};

// dst (B, NH, T, hs) in O = src head h / group of (B, T, heads, hs) rows of
// `stride` floats, rounded once.
template <class O>
__global__ void to_head_major_kernel(O* dst, const float* src, int B, int T, int NH, int group,
                                     int hs, int stride) {
  const std::size_t n = static_cast<std::size_t>(B) * NH * T * hs;
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(e % hs);
    const std::size_t row = e / hs;  // (b*NH + h)*T + t
    const int t = static_cast<int>(row % T), h = static_cast<int>(row / T % NH);
    const std::size_t b = row / (static_cast<std::size_t>(T) * NH);
    dst[e] = from_f32<O>(src[(b * T + t) * stride + static_cast<std::size_t>(h / group) * hs + d]);
  }
}

// dst rows (B, T, heads, hs) of `stride` floats: kAdd ? += : =, for head j
// the sum over g < group of src head j*group + g, (B, NH, T, hs) fp32.
template <bool kAdd>
__global__ void from_head_major_kernel(float* dst, const float* src, int B, int T, int NH,
                                       int group, int hs, int stride) {
  const int heads = NH / group;
  const std::size_t n = static_cast<std::size_t>(B) * T * heads * hs;
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(e % hs);
    const int j = static_cast<int>(e / hs % heads);
    const std::size_t bt = e / (static_cast<std::size_t>(hs) * heads);
    const std::size_t b = bt / T, t = bt % T;
    float sum = 0.0f;
    for (int g = 0; g < group; ++g)
      sum += src[((b * NH + static_cast<std::size_t>(j) * group + g) * T + t) * hs + d];
    float& out = dst[bt * stride + static_cast<std::size_t>(j) * hs + d];
    out = kAdd ? out + sum : sum;
  }
}

// One block per score row r of a chunk (head r / T, query i = r % T):
// p = causal softmax of the row into O, lse[head0 * T + r] = its
// log-sum-exp.
template <class O>
__global__ void softmax_rows_kernel(O* p, float* lse, const float* s, int T,
                                    std::size_t head0_rows) {
  __shared__ float shared[32];
  const std::size_t r = blockIdx.x;
  const int i = static_cast<int>(r % T);
  const float* row = s + r * T;
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_max(m, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) sum += expf(row[j] - m);
  sum = block_sum(sum, shared);
  const float inv = 1.0f / sum;
  O* out = p + r * T;
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    out[j] = from_f32<O>(j <= i ? expf(row[j] - m) * inv : 0.0f);
  if (threadIdx.x == 0) lse[head0_rows + r] = m + logf(sum);
}

// p (n = rows x T) in O = exp(s - lse of the row), 0 past the diagonal.
template <class O>
__global__ void probs_kernel(O* p, const float* s, const float* lse, int T, std::size_t n) {
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = e / T;
    const int i = static_cast<int>(r % T), j = static_cast<int>(e % T);
    p[e] = from_f32<O>(j <= i ? expf(s[e] - lse[r]) : 0.0f);
  }
}

// ds (n = rows x T) in O = p (dp - delta of the row), p from s and lse in
// fp32, 0 past the diagonal.
template <class O>
__global__ void dscores_kernel(O* ds, const float* s, const float* dp, const float* lse,
                               const float* delta, int T, std::size_t n) {
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = e / T;
    const int i = static_cast<int>(r % T), j = static_cast<int>(e % T);
    ds[e] = from_f32<O>(j <= i ? expf(s[e] - lse[r]) * (dp[e] - delta[r]) : 0.0f);
  }
}

// delta (B, NH, T) = dout . out per query row, one warp a row.
__global__ void delta_kernel(float* delta, const float* dout, const float* out, int B, int T,
                             int NH, int hs) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<std::size_t>(B) * NH * T) return;
  const std::size_t t = row % T, h = row / T % NH, b = row / (static_cast<std::size_t>(T) * NH);
  const std::size_t at = (b * T + t) * (static_cast<std::size_t>(NH) * hs) + h * hs;
  float d = 0.0f;
  for (int c = lane; c < hs; c += 32) d += dout[at + c] * out[at + c];
  d = warp_sum(d);
  if (lane == 0) delta[row] = d;
}

}  // namespace

void CudaKernels::attention_forward_gemm(float* out, float* lse, const float* q, const float* k,
                                         const float* v, int B, int T, int NH, int NKV, int hs,
                                         int q_stride, int kv_stride) const {
  const Sizes a{B,
                T,
                NH,
                NKV,
                hs,
                q_stride,
                kv_stride,
                attention_type_,
                1.0f / sqrtf(static_cast<float>(hs))};
  const std::size_t n = a.heads(), esize = dtype_size(a.type);
  Buffer qh = scratch(n * esize), kh = scratch(n * esize), vh = scratch(n * esize),
         oh = scratch(n * sizeof(float));
  const std::size_t chunk = a.chunk();
  Buffer s = scratch(sizeof(float) * chunk * a.scores()), p = scratch(esize * chunk * a.scores());
  with_type(a.type, [&](auto tag) {
    using O = decltype(tag);
    const auto head_major = [&](void* dst, const float* src, int group, int stride) {
      to_head_major_kernel<O><<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
          static_cast<O*>(dst), src, a.B, T, a.NH, group, hs, stride);
      ZTRAIN_CUDA_LAUNCHED();
    };
    head_major(qh.data(), q, 1, a.q_stride);
    head_major(kh.data(), k, a.NH / a.NKV, a.kv_stride);
    head_major(vh.data(), v, a.NH / a.NKV, a.kv_stride);
    const auto at = [&](const Buffer& x, std::size_t head) {
      return static_cast<const char*>(x.data()) + head * a.head() * esize;
    };
    for (std::size_t h0 = 0; h0 < a.all_heads(); h0 += chunk) {
      const int heads = static_cast<int>(std::min(chunk, a.all_heads() - h0));
      const auto T64 = static_cast<std::int64_t>(T), H64 = static_cast<std::int64_t>(a.head());
      // S = scale q k^T
      gemm({at(kh, h0), a.type,   true,       hs,    at(qh, h0), a.type, false,
            hs,         s.data(), DType::f32, T,     T,          T,      hs,
            0.0f,       nullptr,  a.scale,    heads, H64,        H64,    T64 * T64});
      softmax_rows_kernel<O><<<static_cast<unsigned>(heads) * T, kThreads, 0, stream_>>>(
          p.as<O>(), lse, s.as<float>(), T, h0 * T);
      ZTRAIN_CUDA_LAUNCHED();
      // out = P v
      gemm({at(vh, h0), a.type,    false,
            hs,         p.data(),  a.type,
            false,      T,         oh.as<float>() + h0 * a.head(),
            DType::f32, hs,        hs,
            T,          T,         0.0f,
            nullptr,    1.0f,      heads,
            H64,        T64 * T64, H64});
    }
  });
  from_head_major_kernel<false><<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
      out, oh.as<float>(), a.B, T, a.NH, 1, hs, a.NH * hs);
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::attention_backward_gemm(float* dq, float* dk, float* dv, const float* dout,
                                          const float* out, const float* q, const float* k,
                                          const float* v, const float* lse, int B, int T, int NH,
                                          int NKV, int hs, int q_stride, int kv_stride) const {
  const Sizes a{B,
                T,
                NH,
                NKV,
                hs,
                q_stride,
                kv_stride,
                attention_type_,
                1.0f / sqrtf(static_cast<float>(hs))};
  const std::size_t n = a.heads(), esize = dtype_size(a.type);
  const std::size_t chunk = a.chunk();
  const int group = NH / NKV;
  Buffer qh = scratch(n * esize), kh = scratch(n * esize), vh = scratch(n * esize),
         doh = scratch(n * esize);
  Buffer dqh = scratch(n * sizeof(float)), dkh = scratch(n * sizeof(float)),
         dvh = scratch(n * sizeof(float));
  const std::size_t rows = static_cast<std::size_t>(a.B) * a.NH * T;
  Buffer delta = scratch(rows * sizeof(float));
  Buffer s = scratch(sizeof(float) * chunk * a.scores()),
         dp = scratch(sizeof(float) * chunk * a.scores()), p = scratch(esize * chunk * a.scores());
  delta_kernel<<<static_cast<unsigned>((rows + 7) / 8), kThreads, 0, stream_>>>(
      delta.as<float>(), dout, out, a.B, T, a.NH, hs);
  ZTRAIN_CUDA_LAUNCHED();
  with_type(a.type, [&](auto tag) {
    using O = decltype(tag);
    const auto head_major = [&](void* dst, const float* src, int g, int stride) {
      to_head_major_kernel<O><<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
          static_cast<O*>(dst), src, a.B, T, a.NH, g, hs, stride);
      ZTRAIN_CUDA_LAUNCHED();
    };
    head_major(qh.data(), q, 1, a.q_stride);
    head_major(kh.data(), k, group, a.kv_stride);
    head_major(vh.data(), v, group, a.kv_stride);
    head_major(doh.data(), dout, 1, a.NH * hs);
    const auto at = [&](const Buffer& x, std::size_t head) {
      return static_cast<const char*>(x.data()) + head * a.head() * esize;
    };
    const auto at32 = [&](const Buffer& x, std::size_t head) {
      return x.as<float>() + head * a.head();
    };
    for (std::size_t h0 = 0; h0 < a.all_heads(); h0 += chunk) {
      const int heads = static_cast<int>(std::min(chunk, a.all_heads() - h0));
      const auto T64 = static_cast<std::int64_t>(T), H64 = static_cast<std::int64_t>(a.head());
      const std::size_t scores = static_cast<std::size_t>(heads) * a.scores();
      // S = scale q k^T, then P = exp(S - lse)
      gemm({at(kh, h0), a.type,   true,       hs,    at(qh, h0), a.type, false,
            hs,         s.data(), DType::f32, T,     T,          T,      hs,
            0.0f,       nullptr,  a.scale,    heads, H64,        H64,    T64 * T64});
      probs_kernel<O><<<blocks_for(scores, kThreads), kThreads, 0, stream_>>>(
          p.as<O>(), s.as<float>(), lse + h0 * T, T, scores);
      ZTRAIN_CUDA_LAUNCHED();
      // dv = P^T dout: (hs x T_k) = dout' (hs x T_q) . P'^T
      gemm({at(doh, h0), a.type,        false,      hs,    p.data(), a.type,    true,
            T,           at32(dvh, h0), DType::f32, hs,    hs,       T,         T,
            0.0f,        nullptr,       1.0f,       heads, H64,      T64 * T64, H64});
      // dP = dout v^T
      gemm({at(vh, h0), a.type,    true,       hs,    at(doh, h0), a.type, false,
            hs,         dp.data(), DType::f32, T,     T,           T,      hs,
            0.0f,       nullptr,   1.0f,       heads, H64,         H64,    T64 * T64});
      // dS = P (dP - delta), over P's buffer (the dv GEMM before it in the
      // stream has read it)
      dscores_kernel<O><<<blocks_for(scores, kThreads), kThreads, 0, stream_>>>(
          p.as<O>(), s.as<float>(), dp.as<float>(), lse + h0 * T, delta.as<float>() + h0 * T, T,
          scores);
      ZTRAIN_CUDA_LAUNCHED();
      // dq = scale dS k: (hs x T_q) = k' (hs x T_k) . dS'
      gemm({at(kh, h0), a.type,        false,      hs,    p.data(), a.type,    false,
            T,          at32(dqh, h0), DType::f32, hs,    hs,       T,         T,
            0.0f,       nullptr,       a.scale,    heads, H64,      T64 * T64, H64});
      // dk = scale dS^T q: (hs x T_k) = q' (hs x T_q) . dS'^T
      gemm({at(qh, h0), a.type,        false,      hs,    p.data(), a.type,    true,
            T,          at32(dkh, h0), DType::f32, hs,    hs,       T,         T,
            0.0f,       nullptr,       a.scale,    heads, H64,      T64 * T64, H64});
    }
  });
  const auto add_back = [&](float* dst, const Buffer& src, int g, int stride) {
    const std::size_t m = n / static_cast<std::size_t>(g);
    from_head_major_kernel<true><<<blocks_for(m, kThreads), kThreads, 0, stream_>>>(
        dst, src.as<float>(), a.B, T, a.NH, g, hs, stride);
    ZTRAIN_CUDA_LAUNCHED();
  };
  add_back(dq, dqh, 1, a.q_stride);
  add_back(dk, dkh, group, a.kv_stride);
  add_back(dv, dvh, group, a.kv_stride);
}

}  // namespace ztrain::cuda
