// Causal attention with grouped key/value heads, flash-style, in fp32 (the
// kernels of an fp32 run; a 16-bit run's are tensor-core GEMMs,
// attention_gemm.cu): no T x T matrix is ever stored. Forward keeps per query row a running max,
// sum and output (online softmax) and saves lse = max + log(sum); backward recomputes each
// probability from q, k and lse.
//
// Layout of the work: a block of kRows warps takes kRows consecutive rows
// of one head (queries in forward and for dq, keys for dk/dv); the rows it
// pairs them with stream through shared memory in tiles of 32, and lane j
// of a warp owns row j of the tile for the dot products, then dimensions
// lane, lane + 32, ... of the head for the weighted sums. Every output
// element is summed by one lane in a fixed order: results are
// bit-identical run to run. Tile rows are padded by one float so the 32
// lanes reading 32 rows at one column hit 32 banks.
//
// Every op runs on an AttentionBlock (kernels.h), the whole causal
// attention being the block of every query and key: query rows [first,
// first + rows) of q (B,T,NH,hs) rows of q_stride, out, dout (B,T,NH*hs)
// and lse (B,NH,T); key rows [0, keys) of k, v (B,Tkv,NKV,hs) rows of
// kv_stride; a causal block's query i sees keys j <= i (from its
// example's first token, where rows pack examples: AttentionShape's
// positions), another block's every key. hs <= kMaxHead.
#include <type_traits>

#include "cuda/cuda_kernels.h"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

constexpr int kRows = 8;       // warps per block, one row each
constexpr int kTile = 32;      // rows per shared-memory tile: one per lane
constexpr int kMaxHead = 256;  // 8 dimensions per lane

// An AttentionBlock as the kernels index it, in ints, with the softmax
// scale 1/sqrt(hs).
struct Shape {
  int B, NH, NKV, hs, q_stride, kv_stride;
  int T, first, rows, Tkv, keys;
  bool causal;
  float scale;
  const std::int32_t* positions;  // (B,T) on the device, or null
  __host__ __device__ int group() const { return NH / NKV; }
  // Where query i of batch row b lies in q, out and dout (in rows), and
  // its lse in (B,NH,T); where key j lies in k and v.
  __device__ std::size_t q_row(int b, int i) const {
    return static_cast<std::size_t>(b) * T + first + i;
  }
  __device__ std::size_t lse_at(int b, int h, int i) const {
    return (static_cast<std::size_t>(b) * NH + h) * T + first + i;
  }
  __device__ std::size_t kv_row(int b, int j) const {
    return static_cast<std::size_t>(b) * Tkv + j;
  }
  // The keys query i sees; the last key a warp block of queries [i0,
  // i0 + kRows) meets, + 1.
  __device__ int seen(int i) const { return causal ? i + 1 : keys; }
  // The first key query i sees: its example's first token, or 0.
  __device__ int first_key(int b, int i) const {
    return positions ? i - positions[static_cast<std::size_t>(b) * T + first + i] : 0;
  }
  // The first tile of keys a warp block of queries from i0 meets.
  __device__ int first_tile(int b, int i0) const {
    return i0 < rows ? first_key(b, i0) / kTile * kTile : 0;
  }
  __device__ int met(int i0) const { return causal ? min(rows, i0 + kRows) : keys; }
};

// `count` rows from `base` on (rows of `stride` floats), rows [row0, row0
// + kTile) of them, head `head`, into tile (kTile rows of hs + 1); rows
// past count read as zeros.
__device__ void load_tile(float* tile, const float* src, std::size_t base, int row0, int count,
                          int head, int hs, int stride) {
  for (int e = threadIdx.x; e < kTile * hs; e += blockDim.x) {
    const int r = e / hs, c = e % hs;
    const int t = row0 + r;
    tile[r * (hs + 1) + c] = t < count ? src[(base + t) * stride + head * hs + c] : 0.0f;
  }
}

// One row of hs floats into a warp's shared row.
__device__ void load_row(float* row, const float* src, int hs) {
  for (int c = threadIdx.x % 32; c < hs; c += 32) row[c] = src[c];
}

__device__ float dot_row(const float* tile_row, const float* row, int hs) {
  float s = 0.0f;
  for (int i = 0; i < hs; ++i) s += tile_row[i] * row[i];
  return s;
}

// grid: (B*NH, ceil(rows/kRows)); query i = blockIdx.y * kRows + warp.
template <int D>
__global__ void attention_forward_kernel(float* out, float* lse, const float* q, const float* k,
                                         const float* v, Shape s) {
  extern __shared__ float smem[];
  const int hs = s.hs, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* ktile = smem;
  float* vtile = ktile + kTile * (hs + 1);
  float* qrow = vtile + kTile * (hs + 1) + warp * hs;
  const int b = blockIdx.x / s.NH, h = blockIdx.x % s.NH, kvh = h / s.group();
  const int i = blockIdx.y * kRows + warp, met = s.met(blockIdx.y * kRows);
  if (i < s.rows) load_row(qrow, q + s.q_row(b, i) * s.q_stride + h * hs, hs);
  const int seen = i < s.rows ? s.seen(i) : 0, lo = i < s.rows ? s.first_key(b, i) : 0;
  float m = -INFINITY, l = 0.0f, acc[D];
  for (int d = 0; d < D; ++d) acc[d] = 0.0f;
  for (int s0 = s.first_tile(b, blockIdx.y * kRows); s0 < met; s0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    load_tile(ktile, k, s.kv_row(b, 0), s0, s.keys, kvh, hs, s.kv_stride);
    load_tile(vtile, v, s.kv_row(b, 0), s0, s.keys, kvh, hs, s.kv_stride);
    __syncthreads();
    if (s0 >= seen || s0 + kTile <= lo) continue;
    const int key = s0 + lane;
    const bool sees = key >= lo && key < seen;
    const float score = sees ? dot_row(ktile + lane * (hs + 1), qrow, hs) * s.scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(score));
    const float p = sees ? expf(score - m_new) : 0.0f;
    const float rescale = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * rescale + warp_sum(p);
    for (int d = 0; d < D; ++d) acc[d] *= rescale;
    for (int j = 0; j < kTile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const float* vj = vtile + j * (hs + 1);
      for (int d = 0; d < D; ++d) {
        const int c = lane + 32 * d;
        if (c < hs) acc[d] += pj * vj[c];
      }
    }
    m = m_new;
  }
  if (i >= s.rows) return;
  float* o = out + s.q_row(b, i) * (s.NH * hs) + h * hs;
  for (int d = 0; d < D; ++d) {
    const int c = lane + 32 * d;
    if (c < hs) o[c] = acc[d] / l;
  }
  if (lane == 0) lse[s.lse_at(b, h, i)] = m + logf(l);
}

// delta: (B,NH,rows) = dout . out per query of the block, read by both
// backward kernels.
__global__ void attention_delta_kernel(float* delta, const float* dout, const float* out, Shape s) {
  const int row = blockIdx.x * kRows + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= s.B * s.NH * s.rows) return;
  const int i = row % s.rows, bh = row / s.rows, h = bh % s.NH, b = bh / s.NH;
  const std::size_t at = s.q_row(b, i) * (s.NH * s.hs) + h * s.hs;
  float d = 0.0f;
  for (int c = lane; c < s.hs; c += 32) d += dout[at + c] * out[at + c];
  d = warp_sum(d);
  if (lane == 0) delta[row] = d;
}

// dq += sum over keys of ds * k, ds = p (dout . v - delta) * scale.
// grid as forward.
template <int D>
__global__ void attention_dq_kernel(float* dq, const float* dout, const float* q, const float* k,
                                    const float* v, const float* lse, const float* delta, Shape s) {
  extern __shared__ float smem[];
  const int hs = s.hs, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* ktile = smem;
  float* vtile = ktile + kTile * (hs + 1);
  float* qrow = vtile + kTile * (hs + 1) + warp * 2 * hs;
  float* drow = qrow + hs;
  const int b = blockIdx.x / s.NH, h = blockIdx.x % s.NH, kvh = h / s.group();
  const int i = blockIdx.y * kRows + warp, met = s.met(blockIdx.y * kRows);
  const std::size_t at = i < s.rows ? s.q_row(b, i) : 0;
  const int seen = i < s.rows ? s.seen(i) : 0, lo = i < s.rows ? s.first_key(b, i) : 0;
  float row_lse = 0.0f, row_delta = 0.0f;
  if (i < s.rows) {
    load_row(qrow, q + at * s.q_stride + h * hs, hs);
    load_row(drow, dout + at * (s.NH * hs) + h * hs, hs);
    row_lse = lse[s.lse_at(b, h, i)];
    row_delta = delta[(static_cast<std::size_t>(b) * s.NH + h) * s.rows + i];
  }
  float acc[D];
  for (int d = 0; d < D; ++d) acc[d] = 0.0f;
  for (int s0 = s.first_tile(b, blockIdx.y * kRows); s0 < met; s0 += kTile) {
    __syncthreads();
    load_tile(ktile, k, s.kv_row(b, 0), s0, s.keys, kvh, hs, s.kv_stride);
    load_tile(vtile, v, s.kv_row(b, 0), s0, s.keys, kvh, hs, s.kv_stride);
    __syncthreads();
    if (s0 >= seen || s0 + kTile <= lo) continue;
    const int key = s0 + lane;
    float ds = 0.0f;
    if (key >= lo && key < seen) {
      const float p = expf(dot_row(ktile + lane * (hs + 1), qrow, hs) * s.scale - row_lse);
      const float dp = dot_row(vtile + lane * (hs + 1), drow, hs);
      ds = p * (dp - row_delta) * s.scale;
    }
    for (int j = 0; j < kTile; ++j) {
      const float dsj = __shfl_sync(0xffffffffu, ds, j);
      const float* kj = ktile + j * (hs + 1);
      for (int d = 0; d < D; ++d) {
        const int c = lane + 32 * d;
        if (c < hs) acc[d] += dsj * kj[c];
      }
    }
  }
  if (i >= s.rows) return;
  float* o = dq + at * s.q_stride + h * hs;
  for (int d = 0; d < D; ++d) {
    const int c = lane + 32 * d;
    if (c < hs) o[c] += acc[d];
  }
}

// dv_j += sum over the queries that see key j (every head of the group) of
// p * dout; dk_j += sum of ds * q. grid: (B*NKV, ceil(keys/kRows)); key
// j = blockIdx.y * kRows + warp. On the diagonal query i sees key j when
// i >= j (and, in a packed row, i's example starts at or before j), so the
// query tiles start at the warp block's first key.
template <int D>
__global__ void attention_dkv_kernel(float* dk, float* dv, const float* dout, const float* q,
                                     const float* k, const float* v, const float* lse,
                                     const float* delta, Shape s) {
  extern __shared__ float smem[];
  const int hs = s.hs, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* qtile = smem;
  float* dtile = qtile + kTile * (hs + 1);
  float* stats = dtile + kTile * (hs + 1);  // lse[kTile], delta[kTile]
  float* krow = stats + 2 * kTile + warp * 2 * hs;
  float* vrow = krow + hs;
  const int b = blockIdx.x / s.NKV, kvh = blockIdx.x % s.NKV;
  const int key = blockIdx.y * kRows + warp;
  const int from = s.causal ? static_cast<int>(blockIdx.y) * kRows / kTile * kTile : 0;
  const std::size_t at = s.kv_row(b, key < s.keys ? key : 0);
  if (key < s.keys) {
    load_row(krow, k + at * s.kv_stride + kvh * hs, hs);
    load_row(vrow, v + at * s.kv_stride + kvh * hs, hs);
  }
  float dk_acc[D], dv_acc[D];
  for (int d = 0; d < D; ++d) dk_acc[d] = dv_acc[d] = 0.0f;
  for (int h = kvh * s.group(); h < (kvh + 1) * s.group(); ++h) {
    const std::size_t delta_row = (static_cast<std::size_t>(b) * s.NH + h) * s.rows;
    for (int t0 = from; t0 < s.rows; t0 += kTile) {
      __syncthreads();
      load_tile(qtile, q, s.q_row(b, 0), t0, s.rows, h, hs, s.q_stride);
      load_tile(dtile, dout, s.q_row(b, 0), t0, s.rows, h, hs, s.NH * hs);
      for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
        const bool in = t0 + r < s.rows;
        stats[r] = in ? lse[s.lse_at(b, h, t0 + r)] : 0.0f;
        stats[kTile + r] = in ? delta[delta_row + t0 + r] : 0.0f;
      }
      __syncthreads();
      if (key >= s.keys || (s.causal && t0 + kTile - 1 < key)) continue;
      const int t = t0 + lane;
      float p = 0.0f, ds = 0.0f;
      if (t < s.rows && (!s.causal || (t >= key && s.first_key(b, t) <= key))) {
        p = expf(dot_row(qtile + lane * (hs + 1), krow, hs) * s.scale - stats[lane]);
        const float dp = dot_row(dtile + lane * (hs + 1), vrow, hs);
        ds = p * (dp - stats[kTile + lane]) * s.scale;
      }
      for (int j = 0; j < kTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float dsj = __shfl_sync(0xffffffffu, ds, j);
        const float* qj = qtile + j * (hs + 1);
        const float* dj = dtile + j * (hs + 1);
        for (int d = 0; d < D; ++d) {
          const int c = lane + 32 * d;
          if (c < hs) {
            dv_acc[d] += pj * dj[c];
            dk_acc[d] += dsj * qj[c];
          }
        }
      }
    }
  }
  if (key >= s.keys) return;
  for (int d = 0; d < D; ++d) {
    const int c = lane + 32 * d;
    if (c < hs) {
      dk[at * s.kv_stride + kvh * hs + c] += dk_acc[d];
      dv[at * s.kv_stride + kvh * hs + c] += dv_acc[d];
    }
  }
}

// One warp per (batch, head, query of the block): every lane reads the two
// log-sum-exps before lane 0 writes their merge.
__global__ void attention_merge_kernel(float* out, float* lse, const float* block_out,
                                       const float* block_lse, Shape s) {
  const int row = blockIdx.x * kRows + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= s.B * s.NH * s.rows) return;
  const int i = row % s.rows, bh = row / s.rows, h = bh % s.NH, b = bh / s.NH;
  const std::size_t l = s.lse_at(b, h, i), at = s.q_row(b, i) * (s.NH * s.hs) + h * s.hs;
  const float a = lse[l], c = block_lse[l], m = fmaxf(a, c);
  const float merged = m + logf(expf(a - m) + expf(c - m));
  const float wa = expf(a - merged), wc = expf(c - merged);
  for (int e = lane; e < s.hs; e += 32) out[at + e] = wa * out[at + e] + wc * block_out[at + e];
  __syncwarp();
  if (lane == 0) lse[l] = merged;
}

// f(std::integral_constant<int, D>{}) with D the dimensions per lane.
template <class F>
void with_lane_dims(int hs, F&& f) {
  if (hs <= 32)
    f(std::integral_constant<int, 1>{});
  else if (hs <= 64)
    f(std::integral_constant<int, 2>{});
  else if (hs <= 128)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 8>{});
}

// Launches `kernel` with `smem` bytes of dynamic shared memory, raising
// the kernel's limit past the default 48 KiB where a large head needs it.
template <class K, class... Args>
void launch(K kernel, dim3 grid, std::size_t smem, cudaStream_t stream, Args... args) {
  if (smem > 48 * 1024)
    ZTRAIN_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  kernel<<<grid, kRows * 32, smem, stream>>>(args...);
  ZTRAIN_CUDA_LAUNCHED();
}

// s narrowed for op `op`, checked against what the kernels support.
Shape shape_of(AttentionBlock s, const char* op) {
  const Shape shape{to_int(s.B, op, "B"),
                    to_int(s.NH, op, "NH"),
                    to_int(s.NKV, op, "NKV"),
                    to_int(s.hs, op, "hs"),
                    to_int(s.q_stride, op, "q_stride"),
                    to_int(s.kv_stride, op, "kv_stride"),
                    to_int(s.T, op, "T"),
                    to_int(s.first, op, "first"),
                    to_int(s.rows, op, "rows"),
                    to_int(s.Tkv, op, "Tkv"),
                    to_int(s.keys, op, "keys"),
                    s.causal,
                    1.0f / sqrtf(static_cast<float>(s.hs)),
                    s.positions};
  if (shape.hs > kMaxHead || shape.hs <= 0 || shape.NKV <= 0 || shape.NH % shape.NKV != 0)
    throw InternalError("cuda attention: head size " + std::to_string(shape.hs) + " with " +
                        std::to_string(shape.NH) + " query and " + std::to_string(shape.NKV) +
                        " key/value heads is not supported (head size at most " +
                        std::to_string(kMaxHead) + ", query heads a multiple of key/value heads)");
  return shape;
}

unsigned warp_blocks(std::size_t rows) {
  return static_cast<unsigned>((rows + kRows - 1) / kRows);
}

}  // namespace

void CudaKernels::attention_forward(float* out, float* lse, AttentionInputs in,
                                    AttentionShape s) const {
  if (s.B == 0 || s.T == 0) return;
  shape_of(whole_block(s), "attention_forward");
  if (attention_fits_gemms(s)) return attention_forward_gemm(out, lse, in, s);
  attention_block_forward(out, lse, in, whole_block(s));
}

void CudaKernels::attention_backward(AttentionGrads d, const float* dout, const float* out,
                                     AttentionInputs in, const float* lse, AttentionShape s) const {
  if (s.B == 0 || s.T == 0) return;
  shape_of(whole_block(s), "attention_backward");
  if (attention_fits_gemms(s)) return attention_backward_gemm(d, dout, out, in, lse, s);
  attention_block_backward(d, dout, out, in, lse, whole_block(s));
}

void CudaKernels::attention_block_forward(float* out, float* lse, AttentionInputs in,
                                          AttentionBlock s) const {
  if (s.B == 0 || s.rows == 0) return;
  const Shape shape = shape_of(s, "attention_block_forward");
  const dim3 grid(shape.B * shape.NH, warp_blocks(s.rows));
  const std::size_t smem = sizeof(float) * (2 * kTile * (shape.hs + 1) + kRows * shape.hs);
  with_lane_dims(shape.hs, [&](auto dims) {
    launch(attention_forward_kernel<decltype(dims)::value>, grid, smem, stream_, out, lse, in.q,
           in.k, in.v, shape);
  });
}

void CudaKernels::attention_block_backward(AttentionGrads d, const float* dout, const float* out,
                                           AttentionInputs in, const float* lse,
                                           AttentionBlock s) const {
  if (s.B == 0 || s.rows == 0) return;
  const Shape shape = shape_of(s, "attention_block_backward");
  const std::size_t rows = s.B * s.NH * s.rows;
  Buffer delta = scratch(sizeof(float) * rows);
  attention_delta_kernel<<<warp_blocks(rows), kRows * 32, 0, stream_>>>(delta.as<float>(), dout,
                                                                        out, shape);
  ZTRAIN_CUDA_LAUNCHED();
  const std::size_t smem_q = sizeof(float) * (2 * kTile * (shape.hs + 1) + kRows * 2 * shape.hs);
  const std::size_t smem_kv =
      sizeof(float) * (2 * kTile * (shape.hs + 1) + 2 * kTile + kRows * 2 * shape.hs);
  with_lane_dims(shape.hs, [&](auto dims) {
    constexpr int D = decltype(dims)::value;
    launch(attention_dq_kernel<D>, dim3(shape.B * shape.NH, warp_blocks(s.rows)), smem_q, stream_,
           d.dq, dout, in.q, in.k, in.v, lse, static_cast<const float*>(delta.as<float>()), shape);
    launch(attention_dkv_kernel<D>, dim3(shape.B * shape.NKV, warp_blocks(s.keys)), smem_kv,
           stream_, d.dk, d.dv, dout, in.q, in.k, in.v, lse,
           static_cast<const float*>(delta.as<float>()), shape);
  });
}

void CudaKernels::attention_merge(float* out, float* lse, const float* block_out,
                                  const float* block_lse, AttentionBlock s) const {
  if (s.B == 0 || s.rows == 0) return;
  const Shape shape = shape_of(s, "attention_merge");
  attention_merge_kernel<<<warp_blocks(s.B * s.NH * s.rows), kRows * 32, 0, stream_>>>(
      out, lse, block_out, block_lse, shape);
  ZTRAIN_CUDA_LAUNCHED();
}

}  // namespace ztrain::cuda
