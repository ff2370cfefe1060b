#include "kernels/cpu/block_gemm.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/vector_math.h"

namespace ztrain::vec {

void block_gemm_reference(const BlockGemm& g) {
  for (std::size_t i = 0; i < g.m; ++i)
    for (std::size_t j = 0; j < g.n; ++j) {
      float acc = 0.0f;
      for (std::size_t p = 0; p < g.k; ++p)
        acc = std::fma(g.a.p[i * g.a.row + p * g.a.col], g.b.p[p * g.b.row + j * g.b.col], acc);
      float& c = g.c[i * g.ldc + j];
      c = g.accumulate ? std::fma(g.alpha, acc, c) : g.alpha * acc;
    }
}

// OpenBLAS wants a leading dimension of at least the row's length even
// where a single row makes it meaningless (m or k of 1).
void block_gemm_blas(const BlockGemm& g) {
  const bool a_rows = g.a.col == 1;
  const std::size_t lda = a_rows ? std::max(g.a.row, g.k) : std::max(g.a.col, g.m);
  blas::sgemm(a_rows ? blas::Op::none : blas::Op::transpose, blas::Op::none, g.m, g.n, g.k, g.alpha,
              g.a.p, lda, g.b.p, std::max(g.b.row, g.n), g.accumulate ? 1.0f : 0.0f, g.c, g.ldc);
}

BlockGemmFn block_gemm() {
  return have_avx512() ? block_gemm_avx512 : block_gemm_blas;
}

const char* block_gemm_name() {
  return have_avx512() ? "ztrain's AVX-512 kernel" : "OpenBLAS (no AVX-512 here)";
}

// In tiles of 16 x 16, so that both the rows read and the rows written
// stay in the L1 cache while a tile is turned.
void transpose(float* dst, const float* src, std::size_t rows, std::size_t cols, std::size_t ld) {
  constexpr std::size_t kTile = 16;
  for (std::size_t r0 = 0; r0 < rows; r0 += kTile)
    for (std::size_t c0 = 0; c0 < cols; c0 += kTile) {
      const std::size_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (std::size_t r = r0; r < r1; ++r)
        for (std::size_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * ld + c];
    }
}

}  // namespace ztrain::vec
