// The fast cpu kernels: where the reference loops leave the machine idle,
// these restructure the op around BLAS or vector-friendly loops. Each
// overrides its ReferenceKernels twin and is tested against it.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/adamw_runs.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/block_gemm.h"
#include "kernels/cpu/reference_kernels.h"
#include "kernels/cpu/vector_math.h"

namespace ztrain {
namespace {

// OpenBLAS runs single-threaded inside a oneTBB loop (the loop owns the
// cores); the previous thread count comes back when the scope ends.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(blas::threads()) { blas::set_threads(1); }
  ~SingleThreadedBlas() { blas::set_threads(saved_); }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

// Query rows per block: a block of queries needs keys [0, block end), so the
// causal half of the score matrix is never computed, and a thread's scratch
// stays (kQueryBlock x T) scores with the head's keys and values turned,
// (hs x T) each.
constexpr std::size_t kQueryBlock = 64;

// Per-thread scratch that grows to the largest request and is then reused:
// no allocation in the steady state.
std::vector<float>& scratch(int slot, std::size_t n) {
  thread_local std::vector<float> buffers[4];
  auto& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b;
}

// Splits [0, n) into chunks that start on multiples of 8, so every chunk but
// the last runs whole vectors; the grain (in elements) keeps chunks large
// enough to amortise scheduling.
constexpr std::size_t kElementGrain = 8192;

template <class F>
void parallel_chunks(std::size_t n, std::size_t grain, F&& f) {
  const std::size_t blocks = (n + 7) / 8;
  oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, blocks, grain / 8),
                            [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
                              f(r.begin() * 8, std::min(n, r.end() * 8));
                            });
}

// A 16-bit operand is converted a tile at a time into fp32 scratch of
// about this many floats (1 MiB), and multiplied from there: never a
// whole-tensor copy. Smaller tiles cost more BLAS packing per flop: at
// C = 3072 a 512 KiB tile is 32 rows, and measured 10 % slower.
constexpr std::size_t kTileFloats = 262144;

// Rows of a tile `cols` wide: a multiple of 16, at least 16.
std::size_t tile_rows(std::size_t cols) {
  return std::max<std::size_t>(16, kTileFloats / cols / 16 * 16);
}

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

// Rows per block when blocks of output channels are the parallel tasks:
// a tile at most, and small enough to give at least 16 tasks, so a narrow
// layer (or a small model) still spreads over the threads. Shapes alone
// decide it, never the thread count, so results stay reproducible.
std::size_t task_rows(std::size_t OC, std::size_t C) {
  return std::max<std::size_t>(16, std::min(tile_rows(C), ceil_div(ceil_div(OC, 16), 16) * 16));
}

// Rows and columns of dinp one matmul_backward task owns: blocks of columns
// too, so that a small N (a few sequences of a short context) still keeps
// every thread busy.
constexpr std::size_t kDinpRows = 256, kDinpCols = 128;
// Rows of w widened at a time for dinp: the inner dimension of every task's
// GEMM, so it must not be small (a GEMM with K = 32 spends its time reading
// and writing dinp); 256 rows of C = 3072 is 3 MiB of fp32, shared by all
// tasks, each reading 128 KiB of it.
constexpr std::size_t kDinpTileRows = 256;

// Attention's softmax rows and rowsum(dO * O) (vector_math.h says what each
// computes): the AVX2 loops where the processor has them, the same in scalar
// code where it does not.
float softmax_row(float* x, std::size_t n, std::size_t len) {
  if (vec::have_avx2_fma()) return vec::exp_loops().softmax_row(x, n, len);
  const float maxv = *std::max_element(x, x + n);
  float sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - maxv);
    sum += x[i];
  }
  for (std::size_t i = 0; i < n; ++i) x[i] /= sum;
  std::fill(x + n, x + len, 0.0f);
  return maxv + std::log(sum);
}

float row_dot(const float* a, const float* b, std::size_t n) {
  if (vec::have_avx2_fma()) return vec::dot_avx2(a, b, n);
  float sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void softmax_backward_row(float* p, float* dp, std::size_t n, std::size_t len, float lse, float d,
                          float scale) {
  if (vec::have_avx2_fma())
    return vec::exp_loops().softmax_backward_row(p, dp, n, len, lse, d, scale);
  for (std::size_t j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - lse);
    dp[j] = p[j] * (dp[j] - d) * scale;
  }
  std::fill(p + n, p + len, 0.0f);
  std::fill(dp + n, dp + len, 0.0f);
}

// The same over a row's keys [lo, seen) of a score row of len (the keys
// before lo are another example's, where rows pack examples): zero
// elsewhere.
float softmax_span(float* x, std::size_t lo, std::size_t seen, std::size_t len) {
  std::fill(x, x + lo, 0.0f);
  return softmax_row(x + lo, seen - lo, len - lo);
}

void softmax_backward_span(float* p, float* dp, std::size_t lo, std::size_t seen, std::size_t len,
                           float lse, float d, float scale) {
  std::fill(p, p + lo, 0.0f);
  std::fill(dp, dp + lo, 0.0f);
  softmax_backward_row(p + lo, dp + lo, seen - lo, len - lo, lse, d, scale);
}

// A row's worth of parameters in fp32 (a norm's weight or bias, GELU's fc
// bias): a 16-bit one widened once per call, an fp32 one used where it is.
// Null stays null.
class RowWeights {
 public:
  RowWeights(ConstTypedPtr p, std::size_t C) {
    if (!p || p.dtype == DType::f32) {
      ptr_ = static_cast<const float*>(p.data);
      return;
    }
    buf_.resize(C);
    vec::to_f32(p, buf_.data(), buf_.size());
    ptr_ = buf_.data();
  }
  const float* get() const { return ptr_; }

 private:
  std::vector<float> buf_;
  const float* ptr_;
};

// Rows per task of the norms' forward: 16 rows of C = 768 are 48 KiB read
// and written, the work of kElementGrain's 8192-element chunks several
// times over, so a task's scheduling stays small beside it.
constexpr std::size_t kNormRowGrain = 16;
// Rows whose parameter gradients (a norm's weight and bias, the MLP's fc
// bias under GELU) one task sums into its own fp32 partial (N / 64 partials
// of C floats each, added in block order afterwards): the backward reads
// each row once, and the sums do not depend on the thread count.
constexpr std::size_t kGradBlockRows = 64;

// g (C) += the sum of blocked_rows' partials of `stride` floats each (g's
// part of each at `offset` within it), in block order, rounded once into
// g's type. Nothing for a null g.
void add_partials(TypedPtr g, const std::vector<float>& partials, std::size_t offset,
                  std::size_t stride, std::size_t C) {
  if (!g) return;
  constexpr std::size_t kCols = 256;
  oneapi::tbb::parallel_for(std::size_t{0}, ceil_div(C, kCols), [&](std::size_t blk) {
    const std::size_t c0 = blk * kCols, nc = std::min(C, c0 + kCols) - c0;
    float* acc = scratch(0, nc).data();
    vec::to_f32(g.at(c0), acc, nc);
    for (std::size_t b = offset; b < partials.size(); b += stride)
      vec::add_avx2(acc, acc, partials.data() + b + c0, nc);
    vec::from_f32(acc, g.at(c0), nc);
  });
}

// Row blocks of kGradBlockRows in parallel, each calling row(n, partial)
// on its rows with its own zeroed fp32 partial of `width` floats; returns
// the partials, block after block.
template <class Row>
std::vector<float> blocked_rows(std::size_t N, std::size_t width, Row&& row) {
  const std::size_t blocks = ceil_div(N, kGradBlockRows);
  std::vector<float> partial(blocks * width, 0.0f);
  oneapi::tbb::parallel_for(std::size_t{0}, blocks, [&](std::size_t blk) {
    float* p = partial.data() + blk * width;
    const std::size_t end = std::min(N, (blk + 1) * kGradBlockRows);
    for (std::size_t n = blk * kGradBlockRows; n < end; ++n) row(n, p);
  });
  return partial;
}

// Rows in parallel, each handed to f(n, x) with x its input: inp's row,
// or, when b_add is given, the residual sum inp + b_add written into res's
// row first, so the norm reads it while it is still in cache.
template <class F>
void residual_rows(float* res, const float* inp, const float* b_add, RowShape s, F&& f) {
  const std::size_t C = s.C;
  oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, s.N, kNormRowGrain),
                            [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
                              for (std::size_t n = r.begin(); n < r.end(); ++n) {
                                const float* x = inp + n * C;
                                if (b_add) {
                                  vec::add_avx2(res + n * C, x, b_add + n * C, C);
                                  x = res + n * C;
                                }
                                f(n, x);
                              }
                            });
}

// LayerNorm over rows, the residual add first when b_add is given.
void layernorm_rows(float* res, float* out, float* mean, float* rstd, const float* inp,
                    const float* b_add, ConstTypedPtr w, ConstTypedPtr bias, RowShape s,
                    float eps) {
  const RowWeights wf(w, s.C), bf(bias, s.C);
  residual_rows(res, inp, b_add, s, [&](std::size_t n, const float* x) {
    const vec::RowStats st =
        vec::layernorm_row_avx2(out + n * s.C, x, wf.get(), bf.get(), s.C, eps);
    mean[n] = st.mean;
    rstd[n] = st.rstd;
  });
}

// RMSNorm over rows, the residual add first when b_add is given.
void rmsnorm_rows(float* res, float* out, float* rstd, const float* inp, const float* b_add,
                  ConstTypedPtr w, RowShape s, float eps) {
  const RowWeights wf(w, s.C);
  residual_rows(res, inp, b_add, s, [&](std::size_t n, const float* x) {
    rstd[n] = vec::rmsnorm_row_avx2(out + n * s.C, x, wf.get(), s.C, eps);
  });
}

// The ops with a fast form; the others are ReferenceKernels'.
class FastKernels final : public ReferenceKernels {
 public:
  ZTRAIN_KERNEL_OVERRIDE(embedding_forward);
  ZTRAIN_KERNEL_OVERRIDE(embedding_backward);
  ZTRAIN_KERNEL_OVERRIDE(layernorm_forward);
  ZTRAIN_KERNEL_OVERRIDE(add_layernorm_forward);
  ZTRAIN_KERNEL_OVERRIDE(layernorm_backward);
  ZTRAIN_KERNEL_OVERRIDE(rmsnorm_forward);
  ZTRAIN_KERNEL_OVERRIDE(add_rmsnorm_forward);
  ZTRAIN_KERNEL_OVERRIDE(rmsnorm_backward);
  ZTRAIN_KERNEL_OVERRIDE(matmul_forward);
  ZTRAIN_KERNEL_OVERRIDE(matmul_backward);
  ZTRAIN_KERNEL_OVERRIDE(gelu_forward);
  ZTRAIN_KERNEL_OVERRIDE(gelu_backward);
  ZTRAIN_KERNEL_OVERRIDE(swiglu_forward);
  ZTRAIN_KERNEL_OVERRIDE(swiglu_backward);
  ZTRAIN_KERNEL_OVERRIDE(adamw);
  ZTRAIN_KERNEL_OVERRIDE(sum_squares_add);
  ZTRAIN_KERNEL_OVERRIDE(softmax_crossentropy_forward);
  ZTRAIN_KERNEL_OVERRIDE(crossentropy_slice_sums);
  ZTRAIN_KERNEL_OVERRIDE(attention_forward);
  ZTRAIN_KERNEL_OVERRIDE(attention_backward);
  ZTRAIN_KERNEL_OVERRIDE(attention_block_forward);
  ZTRAIN_KERNEL_OVERRIDE(attention_block_backward);
};

// 16-bit tables are widened a row at a time, straight into out.
void FastKernels::embedding_forward(float* out, const std::int32_t* tokens, ConstTypedPtr wte,
                                    ConstTypedPtr wpe, TokenShape s) const {
  if (wte.dtype == DType::f32 && wpe.dtype == DType::f32)
    return ReferenceKernels::embedding_forward(out, tokens, wte, wpe, s);
  const std::size_t row = s.C;
  oneapi::tbb::parallel_for(std::size_t{0}, s.B * s.T, [&](std::size_t bt) {
    float* o = out + bt * row;
    if (s.holds(tokens[bt]))
      vec::to_f32(wte.at((static_cast<std::size_t>(tokens[bt]) - s.vocab_first) * row), o, row);
    else
      std::fill(o, o + row, 0.0f);
    if (!wpe) return;
    float* p = scratch(0, row).data();
    vec::to_f32(wpe.at(bt % s.T * row), p, row);
    for (std::size_t c = 0; c < row; ++c) o[c] += p[c];
  });
}

// With a 16-bit table, the positions are grouped by token (a stable
// counting sort), and each token's row is widened once, gets its dout rows
// added in position order, and is rounded back once: the same fp32 sums,
// in the same order, as the reference's whole-table copy. dwpe likewise
// per t, over b in order.
void FastKernels::embedding_backward(TypedPtr dwte, TypedPtr dwpe, const float* dout,
                                     const std::int32_t* tokens, TokenShape s) const {
  if (dwte.dtype == DType::f32 && dwpe.dtype == DType::f32)
    return ReferenceKernels::embedding_backward(dwte, dwpe, dout, tokens, s);
  const std::size_t BT = s.B * s.T, row = s.C;
  if (BT == 0) return;
  // The table's row of each position, SIZE_MAX where it holds none.
  std::vector<std::size_t> local(BT, SIZE_MAX);
  std::size_t V = 0;
  for (std::size_t bt = 0; bt < BT; ++bt)
    if (s.holds(tokens[bt])) {
      local[bt] = static_cast<std::size_t>(tokens[bt]) - s.vocab_first;
      V = std::max(V, local[bt] + 1);
    }
  std::vector<std::size_t> start(V + 1, 0);
  for (std::size_t bt = 0; bt < BT; ++bt)
    if (local[bt] != SIZE_MAX) ++start[local[bt] + 1];
  for (std::size_t v = 0; v < V; ++v) start[v + 1] += start[v];
  std::vector<std::size_t> order(BT), next(start.begin(), start.end() - 1);
  for (std::size_t bt = 0; bt < BT; ++bt)
    if (local[bt] != SIZE_MAX) order[next[local[bt]]++] = bt;
  std::vector<std::size_t> used;
  for (std::size_t v = 0; v < V; ++v)
    if (start[v + 1] > start[v]) used.push_back(v);
  auto add_rows = [&](TypedPtr grad, std::size_t r, auto&& rows) {
    float* acc = scratch(0, row).data();
    vec::to_f32(grad.at(r * row), acc, row);
    rows([&](std::size_t bt) {
      const float* d = dout + bt * row;
      for (std::size_t c = 0; c < row; ++c) acc[c] += d[c];
    });
    vec::from_f32(acc, grad.at(r * row), row);
  };
  if (dwte)  // null: a frozen table
    oneapi::tbb::parallel_for(std::size_t{0}, used.size(), [&](std::size_t u) {
      const std::size_t v = used[u];
      add_rows(dwte, v, [&](auto&& add) {
        for (std::size_t i = start[v]; i < start[v + 1]; ++i) add(order[i]);
      });
    });
  if (!dwpe) return;
  oneapi::tbb::parallel_for(std::size_t{0}, s.T, [&](std::size_t t) {
    add_rows(dwpe, t, [&](auto&& add) {
      for (std::size_t b = 0; b < s.B; ++b) add(b * s.T + t);
    });
  });
}

// The norms: rows in parallel, one vector pass per statistic
// (vector_math.h); backward sums the parameter gradients per block of
// rows (blocked_rows) and adds the partials once (add_partials).
void FastKernels::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                    ConstTypedPtr w, ConstTypedPtr b, RowShape s, float eps) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::layernorm_forward(out, mean, rstd, inp, w, b, s, eps);
  layernorm_rows(nullptr, out, mean, rstd, inp, nullptr, w, b, s, eps);
}

void FastKernels::add_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                        const float* a, const float* b, ConstTypedPtr w,
                                        ConstTypedPtr bias, RowShape s, float eps) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::add_layernorm_forward(res, out, mean, rstd, a, b, w, bias, s, eps);
  layernorm_rows(res, out, mean, rstd, a, b, w, bias, s, eps);
}

void FastKernels::layernorm_backward(float* dinp, TypedPtr dw, TypedPtr db, const float* dout,
                                     const float* inp, ConstTypedPtr w, const float* mean,
                                     const float* rstd, RowShape s) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, s);
  const std::size_t C = s.C;
  const RowWeights wf(w, C);
  const std::vector<float> partial = blocked_rows(s.N, 2 * C, [&](std::size_t n, float* p) {
    vec::layernorm_backward_row_avx2(dinp + n * C, p, p + C, dout + n * C, inp + n * C, wf.get(),
                                     {mean[n], rstd[n]}, C);
  });
  add_partials(dw, partial, 0, 2 * C, C);
  add_partials(db, partial, C, 2 * C, C);
}

void FastKernels::rmsnorm_forward(float* out, float* rstd, const float* inp, ConstTypedPtr w,
                                  RowShape s, float eps) const {
  if (!vec::have_avx2_fma()) return ReferenceKernels::rmsnorm_forward(out, rstd, inp, w, s, eps);
  rmsnorm_rows(nullptr, out, rstd, inp, nullptr, w, s, eps);
}

void FastKernels::add_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                      const float* b, ConstTypedPtr w, RowShape s,
                                      float eps) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::add_rmsnorm_forward(res, out, rstd, a, b, w, s, eps);
  rmsnorm_rows(res, out, rstd, a, b, w, s, eps);
}

void FastKernels::rmsnorm_backward(float* dinp, TypedPtr dw, const float* dout, const float* inp,
                                   ConstTypedPtr w, const float* rstd, RowShape s) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, s);
  const std::size_t C = s.C;
  const RowWeights wf(w, C);
  const std::vector<float> partial = blocked_rows(s.N, C, [&](std::size_t n, float* p) {
    vec::rmsnorm_backward_row_avx2(dinp + n * C, p, dout + n * C, inp + n * C, wf.get(), rstd[n],
                                   C);
  });
  add_partials(dw, partial, 0, C, C);
}

// 16-bit w: blocks of task_rows(OC, C) output channels, each widened into
// scratch and multiplied (single-threaded BLAS) into its columns of out,
// the blocks in parallel. A block's result does not depend on which
// thread computes it.
void FastKernels::matmul_forward(float* out, const float* inp, ConstTypedPtr w, ConstTypedPtr bias,
                                 MatmulShape s) const {
  if (w.dtype == DType::f32) return ReferenceKernels::matmul_forward(out, inp, w, bias, s);
  // Named copies, not a structured binding: lambdas below capture them,
  // which clang before 16 refuses for bindings.
  const std::size_t N = s.N, C = s.C, OC = s.OC;
  const std::size_t rows = task_rows(OC, C);
  SingleThreadedBlas single;
  oneapi::tbb::parallel_for(std::size_t{0}, ceil_div(OC, rows), [&](std::size_t blk) {
    const std::size_t o0 = blk * rows, nr = std::min(OC, o0 + rows) - o0;
    float* wb = scratch(0, nr * C).data();
    vec::to_f32(w.at(o0 * C), wb, nr * C);
    float beta = 0.0f;
    if (bias) {
      float* bb = scratch(1, nr).data();
      vec::to_f32(bias.at(o0), bb, nr);
      for (std::size_t n = 0; n < N; ++n) std::copy(bb, bb + nr, out + n * OC + o0);
      beta = 1.0f;
    }
    blas::sgemm(blas::Op::none, blas::Op::transpose, N, nr, C, 1.0f, inp, C, wb, C, beta, out + o0,
                OC);
  });
}

// Each operand by its own type: the fp32 ones go through the reference's
// GEMMs unchanged, the 16-bit ones through tiles.
// dinp with 16-bit w: OC tiles in order, each widened once (in parallel)
//   into the caller's scratch; then tasks owning a kDinpRows x kDinpCols
//   block of dinp add dout[rows, tile] @ tile[:, cols]. Converting per
//   task instead would widen w once per block.
// 16-bit dw: a task owns a tile of dw rows, widens it, adds
//   dout[:, rows]^T @ inp with one GEMM and rounds it back once.
// 16-bit dbias: column sums in fp32 from the widened value, rounded once.
void FastKernels::matmul_backward(float* dinp, TypedPtr dw, TypedPtr dbias, const float* dout,
                                  const float* inp, ConstTypedPtr w, MatmulShape s) const {
  const std::size_t N = s.N, C = s.C, OC = s.OC;
  const bool w16 = dinp && w.dtype != DType::f32;
  const bool dw16 = dw.dtype != DType::f32;
  const bool db16 = dbias && dbias.dtype != DType::f32;
  ReferenceKernels::matmul_backward(w16 ? nullptr : dinp, dw16 ? nullptr : dw,
                                    db16 ? nullptr : dbias, dout, inp, w, s);
  if (!w16 && !dw16 && !db16) return;
  SingleThreadedBlas single;
  if (w16) {
    float* tile = scratch(2, kDinpTileRows * C).data();
    for (std::size_t o0 = 0; o0 < OC; o0 += kDinpTileRows) {
      const std::size_t no = std::min(OC, o0 + kDinpTileRows) - o0;
      oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, no, 16),
                                [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
                                  vec::to_f32(w.at((o0 + r.begin()) * C), tile + r.begin() * C,
                                              r.size() * C);
                                });
      const std::size_t col_blocks = ceil_div(C, kDinpCols);
      oneapi::tbb::parallel_for(
          std::size_t{0}, ceil_div(N, kDinpRows) * col_blocks, [&](std::size_t blk) {
            const std::size_t n0 = blk / col_blocks * kDinpRows;
            const std::size_t nn = std::min(N, n0 + kDinpRows) - n0;
            const std::size_t c0 = blk % col_blocks * kDinpCols;
            const std::size_t nc = std::min(C, c0 + kDinpCols) - c0;
            blas::sgemm(blas::Op::none, blas::Op::none, nn, nc, no, 1.0f, dout + n0 * OC + o0, OC,
                        tile + c0, C, 1.0f, dinp + n0 * C + c0, C);
          });
    }
  }
  if (dw16) {
    const std::size_t rows = task_rows(OC, C);
    oneapi::tbb::parallel_for(std::size_t{0}, ceil_div(OC, rows), [&](std::size_t blk) {
      const std::size_t o0 = blk * rows, nr = std::min(OC, o0 + rows) - o0;
      float* tile = scratch(0, nr * C).data();
      vec::to_f32(dw.at(o0 * C), tile, nr * C);
      blas::sgemm(blas::Op::transpose, blas::Op::none, nr, C, N, 1.0f, dout + o0, OC, inp, C, 1.0f,
                  tile, C);
      vec::from_f32(tile, dw.at(o0 * C), nr * C);
    });
  }
  if (db16) {
    constexpr std::size_t kCols = 256;
    oneapi::tbb::parallel_for(std::size_t{0}, ceil_div(OC, kCols), [&](std::size_t blk) {
      const std::size_t o0 = blk * kCols, no = std::min(OC, o0 + kCols) - o0;
      float* acc = scratch(0, no).data();
      vec::to_f32(dbias.at(o0), acc, no);
      for (std::size_t n = 0; n < N; ++n) {
        const float* d = dout + n * OC + o0;
        for (std::size_t o = 0; o < no; ++o) acc[o] += d[o];
      }
      vec::from_f32(acc, dbias.at(o0), no);
    });
  }
}

// GELU with the fc bias added in registers: rows in parallel forward;
// backward writes dpre and sums dbias per block of rows (blocked_rows, as
// the norms' parameter gradients), so dpre is not read a second time.
void FastKernels::gelu_forward(float* out, const float* pre, ConstTypedPtr bias, RowShape s) const {
  if (!vec::have_avx2_fma()) return ReferenceKernels::gelu_forward(out, pre, bias, s);
  const std::size_t H = s.C;
  const RowWeights bf(bias, H);
  const std::size_t grain = std::max<std::size_t>(1, kElementGrain / std::max<std::size_t>(H, 1));
  oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, s.N, grain),
                            [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
                              for (std::size_t n = r.begin(); n < r.end(); ++n)
                                vec::exp_loops().gelu_forward(out + n * H, pre + n * H, bf.get(),
                                                              H);
                            });
}

void FastKernels::gelu_backward(float* dpre, TypedPtr dbias, const float* pre, ConstTypedPtr bias,
                                const float* dout, RowShape s) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::gelu_backward(dpre, dbias, pre, bias, dout, s);
  const std::size_t H = s.C;
  const RowWeights bf(bias, H);
  const std::vector<float> partial = blocked_rows(s.N, dbias ? H : 0, [&](std::size_t n, float* p) {
    vec::exp_loops().gelu_backward(dpre + n * H, dbias ? p : nullptr, pre + n * H, bf.get(),
                                   dout + n * H, H);
  });
  add_partials(dbias, partial, 0, H, H);
}

void FastKernels::swiglu_forward(float* out, const float* gate, const float* up,
                                 std::size_t n) const {
  if (!vec::have_avx2_fma()) return ReferenceKernels::swiglu_forward(out, gate, up, n);
  parallel_chunks(n, kElementGrain, [&](std::size_t a, std::size_t b) {
    vec::exp_loops().swiglu_forward(out + a, gate + a, up + a, b - a);
  });
}

void FastKernels::swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                  const float* up, std::size_t n) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::swiglu_backward(dgate, dup, dout, gate, up, n);
  parallel_chunks(n, kElementGrain, [&](std::size_t a, std::size_t b) {
    vec::exp_loops().swiglu_backward(dgate + a, dup + a, dout + a, gate + a, up + a, b - a);
  });
}

// One parallel loop over the chunks of every run (adamw_runs.h).
void FastKernels::adamw(float* p, TypedPtr g, float* m, float* v, TypedPtr working,
                        const AdamWRun* runs, std::size_t run_count, const AdamWHyper& h,
                        const StepScalars* s, GradAfter grad_after) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::adamw(p, g, m, v, working, runs, run_count, h, s, grad_after);
  if (s->skip) return zero_runs(g, runs, run_count);
  const auto loop = vec::have_avx512() ? vec::adamw_avx512 : vec::adamw_avx2;
  const float grad_mult = s->grad_mult;
  const std::vector<AdamWChunk> chunks = adamw_chunks(runs, run_count, 65536);
  oneapi::tbb::parallel_for(std::size_t{0}, chunks.size(), [&](std::size_t c) {
    const std::uint64_t a = chunks[c].begin;
    const bool decay = chunks[c].decay;
    const vec::AdamScalars scalars{
        h.lr,      h.beta1, h.beta2, h.eps, decay ? h.weight_decay : 0.0f, decay ? h.l2 : 0.0f,
        grad_mult, h.bc1,   h.bc2};
    loop(p + a, g.at(a), m + a, v + a, working ? working.at(a) : nullptr, chunks[c].end - a,
         scalars, grad_after == GradAfter::zeroed);
  });
}

// Fixed 64K-element chunks, each summed by one vector loop, combined in
// order: independent of the thread count.
void FastKernels::sum_squares_add(StepScalars* s, ConstTypedPtr x, std::size_t n) const {
  if (!vec::have_avx2_fma()) return ReferenceKernels::sum_squares_add(s, x, n);
  constexpr std::size_t kChunk = 65536;
  const std::size_t chunks = ceil_div(n, kChunk);
  std::vector<double> partial(chunks);
  oneapi::tbb::parallel_for(std::size_t{0}, chunks, [&](std::size_t c) {
    partial[c] =
        vec::sum_squares_avx2(x.at(c * kChunk), std::min(n, (c + 1) * kChunk) - c * kChunk);
  });
  double total = 0;
  for (double sum : partial) total += sum;
  s->sum_squares += total;
}

// logits: (N,V) -> probs in place; losses: (N). Each row is attention's
// softmax row (vector passes for the maximum, exp and sum, and the
// scale); the loss is its log-sum-exp less the target's logit.
void FastKernels::softmax_crossentropy_forward(float* losses, float* logits,
                                               const std::int32_t* targets, RowShape s) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::softmax_crossentropy_forward(losses, logits, targets, s);
  const std::size_t V = s.C;
  oneapi::tbb::parallel_for(std::size_t{0}, s.N, [&](std::size_t n) {
    float* x = logits + n * V;
    if (targets[n] == kIgnoreTarget) {
      losses[n] = 0.0f;
      return;
    }
    const float target_logit = x[targets[n]];
    losses[n] = vec::exp_loops().softmax_row(x, V, V) - target_logit;
  });
}

// The slice's exps and their sum: one vector pass per row (the same
// exp as the whole row's softmax).
void FastKernels::crossentropy_slice_sums(float* sums, float* logits, const float* row_max,
                                          const std::int32_t* targets, VocabShape s) const {
  if (!vec::have_avx2_fma())
    return ReferenceKernels::crossentropy_slice_sums(sums, logits, row_max, targets, s);
  oneapi::tbb::parallel_for(std::size_t{0}, s.N, [&](std::size_t n) {
    float* x = logits + n * s.V;
    sums[s.N + n] = s.holds(targets[n]) ? x[static_cast<std::size_t>(targets[n]) - s.first] : 0.0f;
    sums[n] = vec::exp_loops().exp_shifted_sum(x, s.V, row_max[n]);
  });
}

void FastKernels::attention_forward(float* out, float* lse, AttentionInputs in,
                                    AttentionShape s) const {
  attention_block_forward(out, lse, in, whole_block(s));
}

void FastKernels::attention_backward(AttentionGrads d, const float* dout, const float* out,
                                     AttentionInputs in, const float* lse, AttentionShape s) const {
  attention_block_backward(d, dout, out, in, lse, whole_block(s));
}

// The keys a block of queries [i0, i1) of an attention block meets: on the
// diagonal keys [from, i1), from the first query's example's first token
// (the causal half of the score matrix is never computed, nor the scores
// of earlier examples in a packed row), else all of them; and row i's own.
std::size_t keys_met(const AttentionBlock& s, std::size_t i1) {
  return s.causal ? i1 : s.keys;
}
std::size_t keys_seen(const AttentionBlock& s, std::size_t i) {
  return s.causal ? i + 1 : s.keys;
}

// A causal block of queries [i0, i1) against keys [k0, k0 + n): query row
// r's last key is r + last, last = i0 - k0. Its scores past that are not
// wanted, its probabilities and their gradients are zero there, and so are
// their transposes' before it: the three bands of its products.
struct CausalBands {
  vec::CausalBand scores, probs, turned;
};
CausalBands causal_bands(const AttentionBlock& s, std::size_t last) {
  if (!s.causal) return {};
  constexpr std::size_t none = vec::CausalBand::kNone;
  return {{none, none, last}, {last, none, none}, {none, last, none}};
}

// Per (batch, head, block of the block's queries [i0, i1)): S = scale *
// Q K[k0:k1]^T as a GEMM over the n keys the queries meet, softmax row by
// row over the keys each sees (keeping its log-sum-exp), then O = P
// V[k0:k1]. Heads run in parallel, each product one block_gemm (K^T, the
// head's keys turned once, so that its rows are contiguous).
void FastKernels::attention_block_forward(float* out, float* lse, AttentionInputs in,
                                          AttentionBlock s) const {
  const std::size_t NH = s.NH, hs = s.hs, C = s.C();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const vec::BlockGemmFn gemm = vec::block_gemm();
  SingleThreadedBlas single;
  oneapi::tbb::parallel_for(std::size_t{0}, s.B * NH, [&](std::size_t bh) {
    const std::size_t b = bh / NH, h = bh % NH, kvh = h / s.group();
    const float* qh = in.q + (b * s.T + s.first) * s.q_stride + h * hs;
    const float* vh = in.v + b * s.Tkv * s.kv_stride + kvh * hs;
    float* oh = out + (b * s.T + s.first) * C + h * hs;
    float* lh = lse + bh * s.T + s.first;
    float* sc = scratch(0, kQueryBlock * s.keys).data();
    float* kt = scratch(1, hs * s.keys).data();  // (hs, keys)
    vec::transpose(kt, in.k + b * s.Tkv * s.kv_stride + kvh * hs, s.keys, hs, s.kv_stride);
    for (std::size_t i0 = 0; i0 < s.rows; i0 += kQueryBlock) {
      const std::size_t i1 = std::min(s.rows, i0 + kQueryBlock), rows = i1 - i0;
      const std::size_t k0 = s.first_key(b, i0), n = keys_met(s, i1) - k0;
      const auto [scores, probs, turned] = causal_bands(s, i0 - k0);
      const vec::MatrixView q_rows{qh + i0 * s.q_stride, s.q_stride, 1};
      const vec::MatrixView v_rows{vh + k0 * s.kv_stride, s.kv_stride, 1};
      gemm({rows, n, hs, q_rows, {kt + k0, s.keys, 1}, sc, n, scale, false, scores});
      for (std::size_t r = 0; r < rows; ++r)
        lh[i0 + r] =
            softmax_span(sc + r * n, s.first_key(b, i0 + r) - k0, keys_seen(s, i0 + r) - k0, n);
      gemm({rows, hs, n, {sc, n, 1}, v_rows, oh + i0 * C, C, 1.0f, false, probs});
    }
  });
}

// Per (batch, key/value head), its query heads in order (they share dk,
// dv), per block of the block's queries [i0, i1) against the n keys they
// meet, [k0, k0 + n): P = exp(scale Q K^T - lse); dV += P^T dO; dP = dO V^T;
// dS = P (dP - rowsum(dO * O)) * scale; dQ += dS K; dK += dS^T Q. K^T and
// V^T are the head's keys and values turned once.
void FastKernels::attention_block_backward(AttentionGrads d, const float* dout, const float* out,
                                           AttentionInputs in, const float* lse,
                                           AttentionBlock s) const {
  const std::size_t NH = s.NH, NKV = s.NKV, hs = s.hs, C = s.C();
  const std::size_t group = s.group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const vec::BlockGemmFn gemm = vec::block_gemm();
  SingleThreadedBlas single;
  oneapi::tbb::parallel_for(std::size_t{0}, s.B * NKV, [&](std::size_t bk) {
    const std::size_t b = bk / NKV, kvh = bk % NKV;
    const std::size_t kv_off = b * s.Tkv * s.kv_stride + kvh * hs;
    float* p = scratch(0, kQueryBlock * s.keys).data();
    float* ds = scratch(1, kQueryBlock * s.keys).data();
    float* kt = scratch(2, hs * s.keys).data();  // (hs, keys)
    float* vt = scratch(3, hs * s.keys).data();
    vec::transpose(kt, in.k + kv_off, s.keys, hs, s.kv_stride);
    vec::transpose(vt, in.v + kv_off, s.keys, hs, s.kv_stride);
    for (std::size_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      const std::size_t bh = b * NH + h;
      const std::size_t q_off = (b * s.T + s.first) * s.q_stride + h * hs;
      const std::size_t o_off = (b * s.T + s.first) * C + h * hs;
      const float* lh = lse + bh * s.T + s.first;
      for (std::size_t i0 = 0; i0 < s.rows; i0 += kQueryBlock) {
        const std::size_t i1 = std::min(s.rows, i0 + kQueryBlock), rows = i1 - i0;
        const std::size_t k0 = s.first_key(b, i0), n = keys_met(s, i1) - k0;
        const std::size_t kv = kv_off + k0 * s.kv_stride;
        const auto [scores, probs, turned] = causal_bands(s, i0 - k0);
        const float* qb = in.q + q_off + i0 * s.q_stride;
        const float* dob = dout + o_off + i0 * C;
        const float* ob = out + o_off + i0 * C;
        const vec::MatrixView q_rows{qb, s.q_stride, 1}, do_rows{dob, C, 1};
        const vec::MatrixView k_rows{in.k + kv, s.kv_stride, 1};
        float* dqb = d.dq + q_off + i0 * s.q_stride;
        gemm({rows, n, hs, q_rows, {kt + k0, s.keys, 1}, p, n, scale, false, scores});
        gemm({rows, n, hs, do_rows, {vt + k0, s.keys, 1}, ds, n, 1.0f, false, scores});
        for (std::size_t r = 0; r < rows; ++r) {
          const float rowsum = row_dot(dob + r * C, ob + r * C, hs);
          softmax_backward_span(p + r * n, ds + r * n, s.first_key(b, i0 + r) - k0,
                                keys_seen(s, i0 + r) - k0, n, lh[i0 + r], rowsum, scale);
        }
        gemm({n, hs, rows, {p, 1, n}, do_rows, d.dv + kv, s.kv_stride, 1.0f, true, turned});
        gemm({rows, hs, n, {ds, n, 1}, k_rows, dqb, s.q_stride, 1.0f, true, probs});
        gemm({n, hs, rows, {ds, 1, n}, q_rows, d.dk + kv, s.kv_stride, 1.0f, true, turned});
      }
    }
  });
}

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() {
  return std::make_unique<FastKernels>();
}

}  // namespace ztrain
