// Token and position embeddings. Backward must add the rows of every
// position holding the same token into one row of dwte without atomics
// (deterministic) and, for a 16-bit dwte, round once: positions are sorted
// by token (a stable radix sort keeps position order within a token), and
// the first position of each token's run sums the run in fp32 and adds it
// to dwte once.
#include <cub/device/device_radix_sort.cuh>

#include "cuda/cuda_kernels.h"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

constexpr unsigned kThreads = 256;

// Whether the table's slice [first, first + rows) of the vocabulary holds
// token (TokenShape::holds).
__device__ bool holds(std::int32_t token, std::size_t first, std::size_t rows) {
  const auto t = static_cast<std::size_t>(token);
  return t >= first && t - first < rows;
}

// out: (B,T,C) = wte[tokens] + wpe[t]; wpe may be null; a token the slice
// does not hold reads zeros.
template <class W>
__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens, const W* wte,
                                         const W* wpe, int BT, int T, int C, std::size_t first,
                                         std::size_t rows) {
  const std::size_t n = static_cast<std::size_t>(BT) * C;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const std::int32_t token = tokens[bt];
    float e = holds(token, first, rows)
                  ? to_f32(wte[(static_cast<std::size_t>(token) - first) * C + c])
                  : 0.0f;
    if (wpe) e += to_f32(wpe[(bt % T) * C + c]);
    out[i] = e;
  }
}

// Positions 0..BT-1, the values the sort carries along.
__global__ void iota_kernel(std::int32_t* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = i;
}

// One block per sorted position; only the first of a token's run works:
// dwte[token] += the dout rows of the run, added one by one in position
// order onto the widened gradient (the cpu reference's order, so fp32
// results are its bits), rounded once. A token the slice does not hold
// adds nothing.
template <class G>
__global__ void embedding_backward_wte_kernel(G* dwte, const float* dout,
                                              const std::int32_t* sorted_tokens,
                                              const std::int32_t* sorted_pos, int BT, int C,
                                              std::size_t first, std::size_t rows) {
  const int j = blockIdx.x;
  const std::int32_t token = sorted_tokens[j];
  if ((j > 0 && sorted_tokens[j - 1] == token) || !holds(token, first, rows)) return;
  int end = j + 1;
  while (end < BT && sorted_tokens[end] == token) ++end;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    G& g = dwte[(static_cast<std::size_t>(token) - first) * C + c];
    float s = to_f32(g);
    for (int r = j; r < end; ++r) s += dout[static_cast<std::size_t>(sorted_pos[r]) * C + c];
    g = from_f32<G>(s);
  }
}

// dwpe: (T,C) += dout[b,t] for b in order; one thread per (t,c).
template <class G>
__global__ void embedding_backward_wpe_kernel(G* dwpe, const float* dout, int B, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(T) * C;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float s = to_f32(dwpe[i]);
    for (int b = 0; b < B; ++b) s += dout[static_cast<std::size_t>(b) * n + i];
    dwpe[i] = from_f32<G>(s);
  }
}

}  // namespace

void CudaKernels::embedding_forward(float* out, const std::int32_t* tokens, ConstTypedPtr wte,
                                    ConstTypedPtr wpe, TokenShape s) const {
  const int BT = to_int(s.B * s.T, "embedding_forward", "B*T"),
            T = to_int(s.T, "embedding_forward", "T"), C = to_int(s.C, "embedding_forward", "C");
  const std::size_t n = s.B * s.T * s.C;
  if (n == 0) return;
  if (wpe && wpe.dtype != wte.dtype)
    throw InternalError("cuda embedding_forward: wte and wpe of different types");
  with_type(wte.dtype, [&](auto tag) {
    using W = decltype(tag);
    embedding_forward_kernel<W><<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
        out, tokens, static_cast<const W*>(wte.data), static_cast<const W*>(wpe.data), BT, T, C,
        s.vocab_first, s.vocab_rows);
  });
  ZTRAIN_CUDA_LAUNCHED();
}

void CudaKernels::embedding_backward(TypedPtr dwte, TypedPtr dwpe, const float* dout,
                                     const std::int32_t* tokens, TokenShape s) const {
  const int B = to_int(s.B, "embedding_backward", "B"), T = to_int(s.T, "embedding_backward", "T"),
            C = to_int(s.C, "embedding_backward", "C"),
            BT = to_int(s.B * s.T, "embedding_backward", "B*T");
  if (BT == 0 || C == 0) return;
  if (dwte) {
    // Sort (token, position) pairs by token; the sort's scratch comes
    // from the device's allocator like every other.
    Buffer pos = scratch(sizeof(std::int32_t) * BT);
    Buffer keys = scratch(sizeof(std::int32_t) * BT);
    Buffer vals = scratch(sizeof(std::int32_t) * BT);
    iota_kernel<<<(BT + kThreads - 1) / kThreads, kThreads, 0, stream_>>>(pos.as<std::int32_t>(),
                                                                          BT);
    ZTRAIN_CUDA_LAUNCHED();
    std::size_t temp_bytes = 0;
    ZTRAIN_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens,
                                                keys.as<std::int32_t>(), pos.as<std::int32_t>(),
                                                vals.as<std::int32_t>(), BT, 0, 32, stream_));
    Buffer temp = scratch(temp_bytes);
    ZTRAIN_CUDA(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, tokens,
                                                keys.as<std::int32_t>(), pos.as<std::int32_t>(),
                                                vals.as<std::int32_t>(), BT, 0, 32, stream_));
    with_type(dwte.dtype, [&](auto tag) {
      using G = decltype(tag);
      embedding_backward_wte_kernel<G><<<BT, kThreads, 0, stream_>>>(
          static_cast<G*>(dwte.data), dout, keys.as<std::int32_t>(), vals.as<std::int32_t>(), BT, C,
          s.vocab_first, s.vocab_rows);
    });
    ZTRAIN_CUDA_LAUNCHED();
  }
  if (dwpe) {
    const std::size_t n = s.T * s.C;
    with_type(dwpe.dtype, [&](auto tag) {
      using G = decltype(tag);
      embedding_backward_wpe_kernel<G><<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
          static_cast<G*>(dwpe.data), dout, B, T, C);
    });
    ZTRAIN_CUDA_LAUNCHED();
  }
}

}  // namespace ztrain::cuda
