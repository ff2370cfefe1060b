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
// causal half of the score matrix is never computed, and scratch stays
// (kQueryBlock x T) per thread.
constexpr int kQueryBlock = 64;

// Per-thread scratch that grows to the largest request and is then reused:
// no allocation in the steady state.
std::vector<float>& scratch(int slot, std::size_t n) {
  thread_local std::vector<float> buffers[3];
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
int tile_rows(int cols) {
  return std::max(16, static_cast<int>(kTileFloats / static_cast<std::size_t>(cols)) / 16 * 16);
}

int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// Rows per block when blocks of output channels are the parallel tasks:
// a tile at most, and small enough to give at least 16 tasks, so a narrow
// layer (or a small model) still spreads over the threads. Shapes alone
// decide it, never the thread count, so results stay reproducible.
int task_rows(int OC, int C) {
  return std::max(16, std::min(tile_rows(C), ceil_div(ceil_div(OC, 16), 16) * 16));
}

// Rows and columns of dinp one matmul_backward task owns: blocks of columns
// too, so that a small N (a few sequences of a short context) still keeps
// every thread busy.
constexpr int kDinpRows = 256, kDinpCols = 128;
// Rows of w widened at a time for dinp: the inner dimension of every task's
// GEMM, so it must not be small (a GEMM with K = 32 spends its time reading
// and writing dinp); 256 rows of C = 3072 is 3 MiB of fp32, shared by all
// tasks, each reading 128 KiB of it.
constexpr int kDinpTileRows = 256;

// Elements from row r0 on of a matrix with C columns.
std::size_t at_row(int r0, int C) {
  return static_cast<std::size_t>(r0) * static_cast<std::size_t>(C);
}

// Attention's softmax rows and rowsum(dO * O) (vector_math.h says what each
// computes): the AVX2 loops where the processor has them, the same in scalar
// code where it does not.
float softmax_row(float* x, int n, int len) {
  if (vec::have_avx2_fma())
    return vec::softmax_row_avx2(x, static_cast<std::size_t>(n), static_cast<std::size_t>(len));
  const float maxv = *std::max_element(x, x + n);
  float sum = 0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - maxv);
    sum += x[i];
  }
  for (int i = 0; i < n; ++i) x[i] /= sum;
  std::fill(x + n, x + len, 0.0f);
  return maxv + std::log(sum);
}

float row_dot(const float* a, const float* b, int n) {
  if (vec::have_avx2_fma()) return vec::dot_avx2(a, b, static_cast<std::size_t>(n));
  float sum = 0;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void softmax_backward_row(float* p, float* dp, int n, int len, float lse, float d, float scale) {
  if (vec::have_avx2_fma())
    return vec::softmax_backward_row_avx2(p, dp, static_cast<std::size_t>(n),
                                          static_cast<std::size_t>(len), lse, d, scale);
  for (int j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - lse);
    dp[j] = p[j] * (dp[j] - d) * scale;
  }
  std::fill(p + n, p + len, 0.0f);
  std::fill(dp + n, dp + len, 0.0f);
}

// A row's worth of parameters in fp32 (a norm's weight or bias, GELU's fc
// bias): a 16-bit one widened once per call, an fp32 one used where it is.
// Null stays null.
class RowWeights {
 public:
  RowWeights(ConstTypedPtr p, int C) {
    if (!p || p.dtype == DType::f32) {
      ptr_ = static_cast<const float*>(p.data);
      return;
    }
    buf_.resize(static_cast<std::size_t>(C));
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
constexpr int kNormRowGrain = 16;
// Rows whose parameter gradients (a norm's weight and bias, the MLP's fc
// bias under GELU) one task sums into its own fp32 partial (N / 64 partials
// of C floats each, added in block order afterwards): the backward reads
// each row once, and the sums do not depend on the thread count.
constexpr int kGradBlockRows = 64;

// g (C) += the sum of blocked_rows' partials of `stride` floats each (g's
// part of each at `offset` within it), in block order, rounded once into
// g's type. Nothing for a null g.
void add_partials(TypedPtr g, const std::vector<float>& partials, std::size_t offset,
                  std::size_t stride, int C) {
  if (!g) return;
  constexpr std::size_t kCols = 256;
  const auto cols = static_cast<std::size_t>(C);
  oneapi::tbb::parallel_for(std::size_t{0}, (cols + kCols - 1) / kCols, [&](std::size_t blk) {
    const std::size_t c0 = blk * kCols, nc = std::min(cols, c0 + kCols) - c0;
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
std::vector<float> blocked_rows(int N, std::size_t width, Row&& row) {
  const int blocks = ceil_div(N, kGradBlockRows);
  std::vector<float> partial(static_cast<std::size_t>(blocks) * width, 0.0f);
  oneapi::tbb::parallel_for(0, blocks, [&](int blk) {
    float* p = partial.data() + static_cast<std::size_t>(blk) * width;
    for (int n = blk * kGradBlockRows; n < std::min(N, (blk + 1) * kGradBlockRows); ++n) row(n, p);
  });
  return partial;
}

// Rows in parallel, each handed to f(n, x) with x its input: inp's row,
// or, when b_add is given, the residual sum inp + b_add written into res's
// row first, so the norm reads it while it is still in cache.
template <class F>
void residual_rows(float* res, const float* inp, const float* b_add, int N, int C, F&& f) {
  const auto row = static_cast<std::size_t>(C);
  oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<int>(0, N, kNormRowGrain),
                            [&](const oneapi::tbb::blocked_range<int>& r) {
                              for (int n = r.begin(); n < r.end(); ++n) {
                                const float* x = inp + at_row(n, C);
                                if (b_add) {
                                  vec::add_avx2(res + at_row(n, C), x, b_add + at_row(n, C), row);
                                  x = res + at_row(n, C);
                                }
                                f(n, x);
                              }
                            });
}

// LayerNorm over rows, the residual add first when b_add is given.
void layernorm_rows(float* res, float* out, float* mean, float* rstd, const float* inp,
                    const float* b_add, ConstTypedPtr w, ConstTypedPtr bias, int N, int C,
                    float eps) {
  const RowWeights wf(w, C), bf(bias, C);
  residual_rows(res, inp, b_add, N, C, [&](int n, const float* x) {
    const vec::RowStats s = vec::layernorm_row_avx2(out + at_row(n, C), x, wf.get(), bf.get(),
                                                    static_cast<std::size_t>(C), eps);
    mean[n] = s.mean;
    rstd[n] = s.rstd;
  });
}

// RMSNorm over rows, the residual add first when b_add is given.
void rmsnorm_rows(float* res, float* out, float* rstd, const float* inp, const float* b_add,
                  ConstTypedPtr w, int N, int C, float eps) {
  const RowWeights wf(w, C);
  residual_rows(res, inp, b_add, N, C, [&](int n, const float* x) {
    rstd[n] =
        vec::rmsnorm_row_avx2(out + at_row(n, C), x, wf.get(), static_cast<std::size_t>(C), eps);
  });
}

class FastKernels final : public ReferenceKernels {
 public:
  // 16-bit tables are widened a row at a time, straight into out.
  void embedding_forward(float* out, const std::int32_t* tokens, ConstTypedPtr wte,
                         ConstTypedPtr wpe, int B, int T, int C) const override {
    if (wte.dtype == DType::f32 && wpe.dtype == DType::f32)
      return ReferenceKernels::embedding_forward(out, tokens, wte, wpe, B, T, C);
    const std::size_t BT = static_cast<std::size_t>(B) * T, row = static_cast<std::size_t>(C);
    oneapi::tbb::parallel_for(std::size_t{0}, BT, [&](std::size_t bt) {
      float* o = out + bt * row;
      vec::to_f32(wte.at(static_cast<std::size_t>(tokens[bt]) * row), o, row);
      if (!wpe) return;
      float* p = scratch(0, row).data();
      vec::to_f32(wpe.at(bt % static_cast<std::size_t>(T) * row), p, row);
      for (std::size_t c = 0; c < row; ++c) o[c] += p[c];
    });
  }

  // With a 16-bit table, the positions are grouped by token (a stable
  // counting sort), and each token's row is widened once, gets its dout rows
  // added in position order, and is rounded back once: the same fp32 sums,
  // in the same order, as the reference's whole-table copy. dwpe likewise
  // per t, over b in order.
  void embedding_backward(TypedPtr dwte, TypedPtr dwpe, const float* dout,
                          const std::int32_t* tokens, int B, int T, int C) const override {
    if (dwte.dtype == DType::f32 && dwpe.dtype == DType::f32)
      return ReferenceKernels::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
    const std::size_t BT = static_cast<std::size_t>(B) * T, row = static_cast<std::size_t>(C);
    if (BT == 0) return;
    const std::size_t V = static_cast<std::size_t>(*std::max_element(tokens, tokens + BT)) + 1;
    std::vector<std::size_t> start(V + 1, 0);
    for (std::size_t bt = 0; bt < BT; ++bt) ++start[static_cast<std::size_t>(tokens[bt]) + 1];
    for (std::size_t v = 0; v < V; ++v) start[v + 1] += start[v];
    std::vector<std::size_t> order(BT), next(start.begin(), start.end() - 1);
    for (std::size_t bt = 0; bt < BT; ++bt)
      order[next[static_cast<std::size_t>(tokens[bt])]++] = bt;
    std::vector<std::int32_t> used;
    for (std::size_t v = 0; v < V; ++v)
      if (start[v + 1] > start[v]) used.push_back(static_cast<std::int32_t>(v));
    auto add_rows = [&](TypedPtr grad, std::size_t r, auto&& rows) {
      float* acc = scratch(0, row).data();
      vec::to_f32(grad.at(r * row), acc, row);
      rows([&](std::size_t bt) {
        const float* d = dout + bt * row;
        for (std::size_t c = 0; c < row; ++c) acc[c] += d[c];
      });
      vec::from_f32(acc, grad.at(r * row), row);
    };
    oneapi::tbb::parallel_for(std::size_t{0}, used.size(), [&](std::size_t u) {
      const auto v = static_cast<std::size_t>(used[u]);
      add_rows(dwte, v, [&](auto&& add) {
        for (std::size_t i = start[v]; i < start[v + 1]; ++i) add(order[i]);
      });
    });
    if (!dwpe) return;
    oneapi::tbb::parallel_for(0, T, [&](int t) {
      add_rows(dwpe, static_cast<std::size_t>(t), [&](auto&& add) {
        for (int b = 0; b < B; ++b) add(static_cast<std::size_t>(b) * T + t);
      });
    });
  }

  // The norms: rows in parallel, one vector pass per statistic
  // (vector_math.h); backward sums the parameter gradients per block of
  // rows (blocked_rows) and adds the partials once (add_partials).
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, ConstTypedPtr w,
                         ConstTypedPtr b, int N, int C, float eps) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
    layernorm_rows(nullptr, out, mean, rstd, inp, nullptr, w, b, N, C, eps);
  }
  void add_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                             const float* b, ConstTypedPtr w, ConstTypedPtr bias, int N, int C,
                             float eps) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::add_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C,
                                                     eps);
    layernorm_rows(res, out, mean, rstd, a, b, w, bias, N, C, eps);
  }
  void layernorm_backward(float* dinp, TypedPtr dw, TypedPtr db, const float* dout,
                          const float* inp, ConstTypedPtr w, const float* mean, const float* rstd,
                          int N, int C) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    const RowWeights wf(w, C);
    const auto row = static_cast<std::size_t>(C);
    const std::vector<float> partial = blocked_rows(N, 2 * row, [&](int n, float* p) {
      vec::layernorm_backward_row_avx2(dinp + at_row(n, C), p, p + row, dout + at_row(n, C),
                                       inp + at_row(n, C), wf.get(), {mean[n], rstd[n]}, row);
    });
    add_partials(dw, partial, 0, 2 * row, C);
    add_partials(db, partial, row, 2 * row, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, ConstTypedPtr w, int N, int C,
                       float eps) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
    rmsnorm_rows(nullptr, out, rstd, inp, nullptr, w, N, C, eps);
  }
  void add_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                           ConstTypedPtr w, int N, int C, float eps) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::add_rmsnorm_forward(res, out, rstd, a, b, w, N, C, eps);
    rmsnorm_rows(res, out, rstd, a, b, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, TypedPtr dw, const float* dout, const float* inp,
                        ConstTypedPtr w, const float* rstd, int N, int C) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    const RowWeights wf(w, C);
    const auto row = static_cast<std::size_t>(C);
    const std::vector<float> partial = blocked_rows(N, row, [&](int n, float* p) {
      vec::rmsnorm_backward_row_avx2(dinp + at_row(n, C), p, dout + at_row(n, C),
                                     inp + at_row(n, C), wf.get(), rstd[n], row);
    });
    add_partials(dw, partial, 0, row, C);
  }

  // 16-bit w: blocks of task_rows(OC, C) output channels, each widened into
  // scratch and multiplied (single-threaded BLAS) into its columns of out,
  // the blocks in parallel. A block's result does not depend on which
  // thread computes it.
  void matmul_forward(float* out, const float* inp, ConstTypedPtr w, ConstTypedPtr bias, int N,
                      int C, int OC) const override {
    if (w.dtype == DType::f32) return ReferenceKernels::matmul_forward(out, inp, w, bias, N, C, OC);
    const int rows = task_rows(OC, C);
    SingleThreadedBlas single;
    oneapi::tbb::parallel_for(0, ceil_div(OC, rows), [&](int blk) {
      const int o0 = blk * rows, nr = std::min(OC, o0 + rows) - o0;
      float* wb = scratch(0, at_row(nr, C)).data();
      vec::to_f32(w.at(at_row(o0, C)), wb, at_row(nr, C));
      float beta = 0.0f;
      if (bias) {
        float* bb = scratch(1, static_cast<std::size_t>(nr)).data();
        vec::to_f32(bias.at(static_cast<std::size_t>(o0)), bb, static_cast<std::size_t>(nr));
        for (int n = 0; n < N; ++n)
          std::copy(bb, bb + nr, out + static_cast<std::size_t>(n) * OC + o0);
        beta = 1.0f;
      }
      blas::sgemm(blas::Op::none, blas::Op::transpose, N, nr, C, 1.0f, inp, C, wb, C, beta,
                  out + o0, OC);
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
  void matmul_backward(float* dinp, TypedPtr dw, TypedPtr dbias, const float* dout,
                       const float* inp, ConstTypedPtr w, int N, int C, int OC) const override {
    const bool w16 = dinp && w.dtype != DType::f32;
    const bool dw16 = dw.dtype != DType::f32;
    const bool db16 = dbias && dbias.dtype != DType::f32;
    ReferenceKernels::matmul_backward(w16 ? nullptr : dinp, dw16 ? nullptr : dw,
                                      db16 ? nullptr : dbias, dout, inp, w, N, C, OC);
    if (!w16 && !dw16 && !db16) return;
    SingleThreadedBlas single;
    if (w16) {
      const int orows = kDinpTileRows;
      float* tile = scratch(2, at_row(orows, C)).data();
      for (int o0 = 0; o0 < OC; o0 += orows) {
        const int no = std::min(OC, o0 + orows) - o0;
        oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<int>(0, no, 16),
                                  [&](const oneapi::tbb::blocked_range<int>& r) {
                                    vec::to_f32(w.at(at_row(o0 + r.begin(), C)),
                                                tile + at_row(r.begin(), C),
                                                at_row(static_cast<int>(r.size()), C));
                                  });
        const int col_blocks = ceil_div(C, kDinpCols);
        oneapi::tbb::parallel_for(0, ceil_div(N, kDinpRows) * col_blocks, [&](int blk) {
          const int n0 = blk / col_blocks * kDinpRows, nn = std::min(N, n0 + kDinpRows) - n0;
          const int c0 = blk % col_blocks * kDinpCols, nc = std::min(C, c0 + kDinpCols) - c0;
          blas::sgemm(blas::Op::none, blas::Op::none, nn, nc, no, 1.0f, dout + at_row(n0, OC) + o0,
                      OC, tile + c0, C, 1.0f, dinp + at_row(n0, C) + c0, C);
        });
      }
    }
    if (dw16) {
      const int rows = task_rows(OC, C);
      oneapi::tbb::parallel_for(0, ceil_div(OC, rows), [&](int blk) {
        const int o0 = blk * rows, nr = std::min(OC, o0 + rows) - o0;
        float* tile = scratch(0, at_row(nr, C)).data();
        vec::to_f32(dw.at(at_row(o0, C)), tile, at_row(nr, C));
        blas::sgemm(blas::Op::transpose, blas::Op::none, nr, C, N, 1.0f, dout + o0, OC, inp, C,
                    1.0f, tile, C);
        vec::from_f32(tile, dw.at(at_row(o0, C)), at_row(nr, C));
      });
    }
    if (db16) {
      constexpr int kCols = 256;
      oneapi::tbb::parallel_for(0, ceil_div(OC, kCols), [&](int blk) {
        const int o0 = blk * kCols, no = std::min(OC, o0 + kCols) - o0;
        float* acc = scratch(0, static_cast<std::size_t>(no)).data();
        vec::to_f32(dbias.at(static_cast<std::size_t>(o0)), acc, static_cast<std::size_t>(no));
        for (int n = 0; n < N; ++n) {
          const float* d = dout + static_cast<std::size_t>(n) * OC + o0;
          for (int o = 0; o < no; ++o) acc[o] += d[o];
        }
        vec::from_f32(acc, dbias.at(static_cast<std::size_t>(o0)), static_cast<std::size_t>(no));
      });
    }
  }

  // GELU with the fc bias added in registers: rows in parallel forward;
  // backward writes dpre and sums dbias per block of rows (blocked_rows, as
  // the norms' parameter gradients), so dpre is not read a second time.
  void gelu_forward(float* out, const float* pre, ConstTypedPtr bias, int N, int H) const override {
    if (!vec::have_avx2_fma()) return ReferenceKernels::gelu_forward(out, pre, bias, N, H);
    const RowWeights bf(bias, H);
    const int grain = std::max(1, static_cast<int>(kElementGrain) / std::max(H, 1));
    oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<int>(0, N, grain),
                              [&](const oneapi::tbb::blocked_range<int>& r) {
                                for (int n = r.begin(); n < r.end(); ++n)
                                  vec::gelu_forward_avx2(out + at_row(n, H), pre + at_row(n, H),
                                                         bf.get(), static_cast<std::size_t>(H));
                              });
  }
  void gelu_backward(float* dpre, TypedPtr dbias, const float* pre, ConstTypedPtr bias,
                     const float* dout, int N, int H) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::gelu_backward(dpre, dbias, pre, bias, dout, N, H);
    const RowWeights bf(bias, H);
    const auto row = static_cast<std::size_t>(H);
    const std::vector<float> partial = blocked_rows(N, dbias ? row : 0, [&](int n, float* p) {
      vec::gelu_backward_avx2(dpre + at_row(n, H), dbias ? p : nullptr, pre + at_row(n, H),
                              bf.get(), dout + at_row(n, H), row);
    });
    add_partials(dbias, partial, 0, row, H);
  }
  void swiglu_forward(float* out, const float* gate, const float* up,
                      std::size_t n) const override {
    if (!vec::have_avx2_fma()) return ReferenceKernels::swiglu_forward(out, gate, up, n);
    parallel_chunks(n, kElementGrain, [&](std::size_t a, std::size_t b) {
      vec::swiglu_forward_avx2(out + a, gate + a, up + a, b - a);
    });
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, std::size_t n) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::swiglu_backward(dgate, dup, dout, gate, up, n);
    parallel_chunks(n, kElementGrain, [&](std::size_t a, std::size_t b) {
      vec::swiglu_backward_avx2(dgate + a, dup + a, dout + a, gate + a, up + a, b - a);
    });
  }

  // One parallel loop over the chunks of every run (adamw_runs.h).
  void adamw(float* p, TypedPtr g, float* m, float* v, TypedPtr working, const AdamWRun* runs,
             std::size_t run_count, const AdamWHyper& h, const StepScalars* s,
             GradAfter grad_after) const override {
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
  void sum_squares_add(StepScalars* s, ConstTypedPtr x, std::size_t n) const override {
    if (!vec::have_avx2_fma()) return ReferenceKernels::sum_squares_add(s, x, n);
    constexpr std::size_t kChunk = 65536;
    const std::size_t chunks = (n + kChunk - 1) / kChunk;
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
  void softmax_crossentropy_forward(float* losses, float* logits, const std::int32_t* targets,
                                    int N, int V) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::softmax_crossentropy_forward(losses, logits, targets, N, V);
    const auto row = static_cast<std::size_t>(V);
    oneapi::tbb::parallel_for(0, N, [&](int n) {
      float* x = logits + static_cast<std::size_t>(n) * row;
      const float target_logit = x[targets[n]];
      losses[n] = vec::softmax_row_avx2(x, row, row) - target_logit;
    });
  }

  // Per (batch, head, block of queries [t0, t1)): S = scale * Q K[0:t1]^T as
  // a GEMM, causal softmax row by row (keeping each row's log-sum-exp), then
  // O = P V[0:t1]. Heads run in parallel with single-threaded BLAS.
  // q: (B,T,NH,hs) rows of q_stride; k, v: (B,T,NKV,hs) rows of kv_stride;
  // out: (B,T,NH*hs); lse: (B,NH,T)
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         int B, int T, int NH, int NKV, int hs, int q_stride,
                         int kv_stride) const override {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int group = NH / NKV, C = NH * hs;
    SingleThreadedBlas single;
    oneapi::tbb::parallel_for(0, B * NH, [&](int bh) {
      const int b = bh / NH, h = bh % NH, kvh = h / group;
      const float* qh = q + static_cast<std::size_t>(b) * T * q_stride + h * hs;
      const float* kh = k + static_cast<std::size_t>(b) * T * kv_stride + kvh * hs;
      const float* vh = v + static_cast<std::size_t>(b) * T * kv_stride + kvh * hs;
      float* oh = out + static_cast<std::size_t>(b) * T * C + h * hs;
      float* lh = lse + static_cast<std::size_t>(bh) * T;
      float* s = scratch(0, static_cast<std::size_t>(kQueryBlock) * T).data();
      for (int t0 = 0; t0 < T; t0 += kQueryBlock) {
        const int t1 = std::min(T, t0 + kQueryBlock), rows = t1 - t0;
        blas::sgemm(blas::Op::none, blas::Op::transpose, rows, t1, hs, scale,
                    qh + static_cast<std::size_t>(t0) * q_stride, q_stride, kh, kv_stride, 0.0f, s,
                    t1);
        for (int r = 0; r < rows; ++r)
          lh[t0 + r] = softmax_row(s + static_cast<std::size_t>(r) * t1, t0 + r + 1, t1);
        blas::sgemm(blas::Op::none, blas::Op::none, rows, hs, t1, 1.0f, s, t1, vh, kv_stride, 0.0f,
                    oh + static_cast<std::size_t>(t0) * C, C);
      }
    });
  }

  // Per (batch, key/value head), its query heads in order (they share dk,
  // dv), per block of queries [t0, t1) against keys [0, t1):
  // P = exp(scale Q K^T - lse); dV += P^T dO; dP = dO V^T;
  // dS = P (dP - rowsum(dO * O)) * scale; dQ += dS K; dK += dS^T Q.
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* q, const float* k, const float* v, const float* lse, int B,
                          int T, int NH, int NKV, int hs, int q_stride,
                          int kv_stride) const override {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int group = NH / NKV, C = NH * hs;
    SingleThreadedBlas single;
    oneapi::tbb::parallel_for(0, B * NKV, [&](int bk) {
      const int b = bk / NKV, kvh = bk % NKV;
      const std::size_t kv_off = static_cast<std::size_t>(b) * T * kv_stride + kvh * hs;
      float* p = scratch(0, static_cast<std::size_t>(kQueryBlock) * T).data();
      float* ds = scratch(1, static_cast<std::size_t>(kQueryBlock) * T).data();
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const std::size_t bh = static_cast<std::size_t>(b) * NH + h;
        const std::size_t q_off = static_cast<std::size_t>(b) * T * q_stride + h * hs;
        const std::size_t o_off = static_cast<std::size_t>(b) * T * C + h * hs;
        for (int t0 = 0; t0 < T; t0 += kQueryBlock) {
          const int t1 = std::min(T, t0 + kQueryBlock), rows = t1 - t0;
          const float* qb = q + q_off + static_cast<std::size_t>(t0) * q_stride;
          const float* dob = dout + o_off + static_cast<std::size_t>(t0) * C;
          const float* ob = out + o_off + static_cast<std::size_t>(t0) * C;
          blas::sgemm(blas::Op::none, blas::Op::transpose, rows, t1, hs, scale, qb, q_stride,
                      k + kv_off, kv_stride, 0.0f, p, t1);
          blas::sgemm(blas::Op::none, blas::Op::transpose, rows, t1, hs, 1.0f, dob, C, v + kv_off,
                      kv_stride, 0.0f, ds, t1);
          for (int r = 0; r < rows; ++r) {
            const int t = t0 + r;
            float* pr = p + static_cast<std::size_t>(r) * t1;
            float* dr = ds + static_cast<std::size_t>(r) * t1;
            const float l = lse[bh * T + t];
            const float d = row_dot(dob + static_cast<std::size_t>(r) * C,
                                    ob + static_cast<std::size_t>(r) * C, hs);
            softmax_backward_row(pr, dr, t + 1, t1, l, d, scale);
          }
          blas::sgemm(blas::Op::transpose, blas::Op::none, t1, hs, rows, 1.0f, p, t1, dob, C, 1.0f,
                      dv + kv_off, kv_stride);
          blas::sgemm(blas::Op::none, blas::Op::none, rows, hs, t1, 1.0f, ds, t1, k + kv_off,
                      kv_stride, 1.0f, dq + q_off + static_cast<std::size_t>(t0) * q_stride,
                      q_stride);
          blas::sgemm(blas::Op::transpose, blas::Op::none, t1, hs, rows, 1.0f, ds, t1, qb, q_stride,
                      1.0f, dk + kv_off, kv_stride);
        }
      }
    });
  }
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() {
  return std::make_unique<FastKernels>();
}

}  // namespace ztrain
