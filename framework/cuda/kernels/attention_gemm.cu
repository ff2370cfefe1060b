// Causal attention as tensor-core GEMMs, for 16-bit runs: q, k and v are
// rounded to the run's type O (bf16 or fp16) into head-major copies, and
// each head's scores, probabilities and their gradients are cuBLASLt
// batched GEMMs with fp32 accumulation, as the run's other GEMMs round
// their activations. The T x T scores exist only for a chunk of heads at a
// time (kScoreBytes of scratch), never for the whole batch; the forward
// keeps only lse, and backward recomputes the scores from q and k. Score
// rows are padded to a multiple of 8 elements, so 16-bit operands stay
// 16-byte aligned for the tensor cores. A sequence too long for one head's
// scores to fit kScoreBytes goes to the flash kernel (attention.cu).
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

// attention_ints' shape as the kernels and GemmCall index it, with the
// operand type.
struct Sizes : AttentionInts {
  DType type;                                                            // of the GEMM operands
  int ld() const { return (T + 7) / 8 * 8; }                             // of a score row
  std::size_t head() const { return static_cast<std::size_t>(T) * hs; }  // elements of one head
  std::size_t all_heads() const { return static_cast<std::size_t>(B) * NH; }
  std::size_t heads() const { return all_heads() * head(); }                 // elements of them all
  std::size_t scores() const { return static_cast<std::size_t>(T) * ld(); }  // per head
  // Heads whose scores fit kScoreBytes (at least one).
  std::size_t chunk() const {
    return std::clamp<std::size_t>(kScoreBytes / (scores() * 10), 1, all_heads());
  }
};

// The three products of attention over `heads` heads from `first`, all
// heads (T, hs) in O (head-major copies) and scores (T, ld) per head:
//   scores   out[i][j] = alpha sum_d x[i][d] y[j][d]   (S = q k^T, dP = dout v^T)
//   weighted out[i][d] = alpha sum_j m[i][j] y[j][d]   (out = P v, dq = dS k)
//   transposed out[j][d] = alpha sum_i m[i][j] y[i][d] (dv = P^T dout, dk = dS^T q)
struct Products {
  const Sizes& a;
  std::size_t first;
  int heads;
  const void* at(const Buffer& x) const {
    return static_cast<const char*>(x.data()) + first * a.head() * dtype_size(a.type);
  }
  float* at32(const Buffer& x) const { return x.as<float>() + first * a.head(); }
  std::int64_t head() const { return static_cast<std::int64_t>(a.head()); }
  std::int64_t score() const { return static_cast<std::int64_t>(a.scores()); }
  // S^T' = y' (transposed) . x': m = n = T, k = hs.
  GemmCall scores(const Buffer& x, const Buffer& y, float* out, float alpha) const {
    return {at(y), a.type, true, a.hs, at(x),   a.type, false, a.hs,   out,    DType::f32, a.ld(),
            a.T,   a.T,    a.hs, 0.0f, nullptr, alpha,  heads, head(), head(), score()};
  }
  // out' (hs x T) = y' (hs x T) . m' (T x T, ld): m = hs, n = k = T.
  GemmCall weighted(const void* m, const Buffer& y, float* out, float alpha) const {
    return {at(y), a.type, false, a.hs, m,       a.type, false, a.ld(), out,     DType::f32, a.hs,
            a.hs,  a.T,    a.T,   0.0f, nullptr, alpha,  heads, head(), score(), head()};
  }
  // out' (hs x T) = y' (hs x T) . m'^T: as weighted, B transposed.
  GemmCall transposed(const void* m, const Buffer& y, float* out, float alpha) const {
    GemmCall g = weighted(m, y, out, alpha);
    g.b_trans = true;
    return g;
  }
};

// dst (B, NH, T, hs) in the operand type = src head h / group of (B, T,
// heads, hs) rows of `stride` floats, rounded once.
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

void to_head_major(const Buffer& dst, const float* src, const Sizes& a, int group, int stride,
                   cudaStream_t stream) {
  with_type(a.type, [&](auto tag) {
    using O = decltype(tag);
    to_head_major_kernel<O><<<blocks_for(a.heads(), kThreads), kThreads, 0, stream>>>(
        dst.as<O>(), src, a.B, a.T, a.NH, group, a.hs, stride);
  });
  ZTRAIN_CUDA_LAUNCHED();
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

template <bool kAdd>
void from_head_major(float* dst, const Buffer& src, const Sizes& a, int group, int stride,
                     cudaStream_t stream) {
  const std::size_t n = a.heads() / static_cast<std::size_t>(group);
  from_head_major_kernel<kAdd><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      dst, src.as<float>(), a.B, a.T, a.NH, group, a.hs, stride);
  ZTRAIN_CUDA_LAUNCHED();
}

// One block per score row r of a chunk (head r / T, query i = r % T; rows
// ld apart; the chunk's first row is row0 of the batch's): p = the causal
// softmax of the row over keys [first_key, i] in O, lse[row0 + r] its
// log-sum-exp.
template <class O>
__global__ void softmax_rows_kernel(O* p, float* lse, const float* s, int ld, std::size_t row0,
                                    AttentionInts a) {
  __shared__ float shared[32];
  const std::size_t r = blockIdx.x;
  const int T = a.T, i = static_cast<int>(r % T), lo = a.first_key(row0 + r, i);
  const float* row = s + r * ld;
  float m = -INFINITY;
  for (int j = lo + threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_max(m, shared);
  float sum = 0.0f;
  for (int j = lo + threadIdx.x; j <= i; j += blockDim.x) sum += expf(row[j] - m);
  sum = block_sum(sum, shared);
  const float inv = 1.0f / sum;
  O* out = p + r * ld;
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    out[j] = from_f32<O>(j >= lo && j <= i ? expf(row[j] - m) * inv : 0.0f);
  if (threadIdx.x == 0) lse[row0 + r] = m + logf(sum);
}

// Over the rows x T scores of a chunk (rows ld apart, the first row0 of
// the batch's): p in O = exp(s - lse of the row), 0 outside the keys the
// row sees; with dp, p (dp - delta of the row) instead (dS).
template <class O>
__global__ void probs_kernel(O* p, const float* s, const float* lse, const float* dp,
                             const float* delta, int ld, std::size_t rows, std::size_t row0,
                             AttentionInts a) {
  const int T = a.T;
  const std::size_t n = rows * T;
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = e / T, at = r * ld + e % T;
    const int i = static_cast<int>(r % T), j = static_cast<int>(e % T);
    float x = 0.0f;
    if (j <= i && j >= a.first_key(row0 + r, i)) {
      x = expf(s[at] - lse[r]);
      if (dp) x *= dp[at] - delta[r];
    }
    p[at] = from_f32<O>(x);
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

// s narrowed for op `op` (attention.cu's shape_of has checked the heads).
Sizes sizes_of(AttentionShape s, DType type, const char* op) {
  return {attention_ints(s, op), type};
}

}  // namespace

bool CudaKernels::attention_fits_gemms(AttentionShape s) const {
  const Sizes a = sizes_of(s, attention_type_, "attention");
  return attention_type_ != DType::f32 && a.all_heads() > 0 && a.scores() * 10 <= kScoreBytes;
}

void CudaKernels::attention_forward_gemm(float* out, float* lse, AttentionInputs in,
                                         AttentionShape shape) const {
  const Sizes a = sizes_of(shape, attention_type_, "attention_forward");
  const std::size_t n = a.heads(), esize = dtype_size(a.type), chunk = a.chunk();
  Buffer qh = scratch(n * esize), kh = scratch(n * esize), vh = scratch(n * esize),
         oh = scratch(n * sizeof(float));
  Buffer s = scratch(sizeof(float) * chunk * a.scores()), p = scratch(esize * chunk * a.scores());
  to_head_major(qh, in.q, a, 1, a.q_stride, stream_);
  to_head_major(kh, in.k, a, a.group(), a.kv_stride, stream_);
  to_head_major(vh, in.v, a, a.group(), a.kv_stride, stream_);
  for (std::size_t h0 = 0; h0 < a.all_heads(); h0 += chunk) {
    const Products x{a, h0, static_cast<int>(std::min(chunk, a.all_heads() - h0))};
    gemm(x.scores(qh, kh, s.as<float>(), a.scale));  // S = scale q k^T
    with_type(a.type, [&](auto tag) {
      using O = decltype(tag);
      softmax_rows_kernel<O><<<static_cast<unsigned>(x.heads) * a.T, kThreads, 0, stream_>>>(
          p.as<O>(), lse, s.as<float>(), a.ld(), h0 * a.T, a);
    });
    ZTRAIN_CUDA_LAUNCHED();
    gemm(x.weighted(p.data(), vh, x.at32(oh), 1.0f));  // out = P v
  }
  from_head_major<false>(out, oh, a, 1, a.NH * a.hs, stream_);
}

void CudaKernels::attention_backward_gemm(AttentionGrads d, const float* dout, const float* out,
                                          AttentionInputs in, const float* lse,
                                          AttentionShape shape) const {
  const Sizes a = sizes_of(shape, attention_type_, "attention_backward");
  const std::size_t n = a.heads(), esize = dtype_size(a.type), chunk = a.chunk();
  const std::size_t rows = a.all_heads() * a.T;
  Buffer qh = scratch(n * esize), kh = scratch(n * esize), vh = scratch(n * esize),
         doh = scratch(n * esize);
  Buffer dqh = scratch(n * sizeof(float)), dkh = scratch(n * sizeof(float)),
         dvh = scratch(n * sizeof(float)), delta = scratch(rows * sizeof(float));
  Buffer s = scratch(sizeof(float) * chunk * a.scores()),
         dp = scratch(sizeof(float) * chunk * a.scores()), p = scratch(esize * chunk * a.scores());
  delta_kernel<<<static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0,
                 stream_>>>(delta.as<float>(), dout, out, a.B, a.T, a.NH, a.hs);
  ZTRAIN_CUDA_LAUNCHED();
  to_head_major(qh, in.q, a, 1, a.q_stride, stream_);
  to_head_major(kh, in.k, a, a.group(), a.kv_stride, stream_);
  to_head_major(vh, in.v, a, a.group(), a.kv_stride, stream_);
  to_head_major(doh, dout, a, 1, a.NH * a.hs, stream_);
  for (std::size_t h0 = 0; h0 < a.all_heads(); h0 += chunk) {
    const Products x{a, h0, static_cast<int>(std::min(chunk, a.all_heads() - h0))};
    const std::size_t chunk_rows = static_cast<std::size_t>(x.heads) * a.T;
    // P = exp(S - lse) (S = scale q k^T again), or with dp, dS = P (dP - delta).
    const auto probs = [&](const float* with_dp) {
      with_type(a.type, [&](auto tag) {
        using O = decltype(tag);
        probs_kernel<O><<<blocks_for(chunk_rows * a.T, kThreads), kThreads, 0, stream_>>>(
            p.as<O>(), s.as<float>(), lse + h0 * a.T, with_dp, delta.as<float>() + h0 * a.T, a.ld(),
            chunk_rows, h0 * a.T, a);
      });
      ZTRAIN_CUDA_LAUNCHED();
    };
    gemm(x.scores(qh, kh, s.as<float>(), a.scale));
    probs(nullptr);
    gemm(x.transposed(p.data(), doh, x.at32(dvh), 1.0f));  // dv = P^T dout
    gemm(x.scores(doh, vh, dp.as<float>(), 1.0f));         // dP = dout v^T
    probs(dp.as<float>());  // dS over P (the dv GEMM, before it in the stream, has read P)
    gemm(x.weighted(p.data(), kh, x.at32(dqh), a.scale));    // dq = scale dS k
    gemm(x.transposed(p.data(), qh, x.at32(dkh), a.scale));  // dk = scale dS^T q
  }
  from_head_major<true>(d.dq, dqh, a, 1, a.q_stride, stream_);
  from_head_major<true>(d.dk, dkh, a, a.group(), a.kv_stride, stream_);
  from_head_major<true>(d.dv, dvh, a, a.group(), a.kv_stride, stream_);
}

}  // namespace ztrain::cuda
