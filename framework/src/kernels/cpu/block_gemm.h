// Attention's small products: C (m x n) = alpha A (m x k) B (k x n), or
// that plus C, for one block of queries against the keys it meets (64 rows
// by up to T keys, a head's size deep, and their transposes in the
// backward).
//
// OpenBLAS packs both operands on every call and tunes its kernels for
// large products: on the 2-core AMD EPYC (Zen 4) VM its Cooperlake kernels
// ran attention's S = Q K^T blocks at 172-175 GFLOP/s against 221-224 for
// a 2048^3 sgemm, its Haswell kernels at 107-110 against 120-124. The
// products fit the caches, and the kernel here packs nothing: it keeps an
// 8 x 32 tile of C in 16 AVX-512 registers, broadcasts A's elements and
// loads B's rows in place, which measured 232-240 GFLOP/s on those blocks.
// B's rows must be contiguous, so attention transposes K and V once per
// head (transpose()) and reads Q, P and dO as they lie.
//
// Each element of C is one chain of fused multiply-adds over p = 0 .. k-1
// from zero, then alpha times it, fused with C's element when
// accumulating: the AVX-512 kernel gives the plain reference's bits,
// whatever the blocking or the thread count. Processors without AVX-512
// run the products on OpenBLAS (block_gemm_blas), in its order.
//
// Thread safety: every function may run on many threads at once, each on
// its own C. Errors: none; the views must lie within their buffers (the
// caller's shapes), and an A the BLAS path is given has one unit stride.
#pragma once

#include <cstddef>

#include "kit/kit_export.h"

namespace ztrain::vec {

// A matrix in memory: element (i, j) at p[i * row + j * col].
struct MatrixView {
  const float* p;
  std::size_t row, col;
};

// Where a block of causal attention is zero or unwanted, which the AVX-512
// kernel skips a tile at a time (kNone: nowhere). A's row i is zero past
// column i + a_last (a query's probabilities past its last key) or before
// column i - a_first (a key's, turned: the queries before the first that
// sees it); C's element (i, j) is not wanted past column i + c_last (scores
// past a query's last key, which its softmax overwrites), and is left
// unspecified there. OpenBLAS and the reference compute everything: where A
// is zero as promised, every path gives the same C where it is wanted.
struct CausalBand {
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t a_last = kNone, a_first = kNone, c_last = kNone;
};

// C (m x n), rows of ldc, = alpha A B, plus C when accumulate. B's rows are
// contiguous (b.col == 1); A may be stored either way (a.col == 1, or
// a.row == 1 for an operand used transposed).
struct BlockGemm {
  std::size_t m, n, k;
  MatrixView a;  // (m x k)
  MatrixView b;  // (k x n)
  float* c;
  std::size_t ldc;
  float alpha;
  bool accumulate;
  CausalBand band = {};
};

// The plain loops, the order above, every element (the band ignored).
void block_gemm_reference(const BlockGemm& g);
// The AVX-512 kernel (have_avx512()): the reference's bits.
void block_gemm_avx512(const BlockGemm& g);
// One OpenBLAS sgemm.
void block_gemm_blas(const BlockGemm& g);

using BlockGemmFn = void (*)(const BlockGemm&);
// What the fast attention calls: the AVX-512 kernel where have_avx512(),
// else OpenBLAS.
BlockGemmFn block_gemm();
// What block_gemm() runs, for the start-up report (`-v`, `ztrain plugins
// -v`): "ztrain's AVX-512 kernel" or "OpenBLAS (no AVX-512 here)".
ZTRAIN_KIT const char* block_gemm_name();

// dst (cols x rows), rows of `rows` floats, = the transpose of src (rows x
// cols), rows of ld floats (a head's keys or values, turned so that each
// of its dimensions is a contiguous row over the keys).
void transpose(float* dst, const float* src, std::size_t rows, std::size_t cols, std::size_t ld);

}  // namespace ztrain::vec
