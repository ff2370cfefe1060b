// block_gemm.h's kernel on AVX-512: tiles of 8 x 32, whose 16 accumulators
// stay in registers through the whole sum over p, each step loading B's
// row p (two vectors, masked past the panel's columns) and broadcasting
// A's column p one row at a time. Nothing is packed: the operands are read
// where they lie (attention's blocks fit the L2 cache). In a causal block
// a tile skips the terms where A is zero and the tiles of C nobody wants
// (CausalBand): 14 % of attention's products at 256 tokens in blocks of
// 64 queries.
#include <algorithm>
#include <array>
#include <utility>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/block_gemm.h"

namespace ztrain::vec {
namespace {

constexpr std::size_t kRows = 8;
constexpr std::size_t kCols = 32;

// The lanes of the 16 from column j that lie before `cols`.
__mmask16 lanes(std::size_t j, std::size_t cols) {
  if (j >= cols) return 0;
  return cols - j >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (cols - j)) - 1);
}

// The terms [begin, end) of a tile's sums.
struct Span {
  std::size_t begin, end;
};

// The terms a tile of rows [i0, i1) adds: those where some row's A may be
// nonzero (g.band).
Span terms(const BlockGemm& g, std::size_t i0, std::size_t i1) {
  const CausalBand& band = g.band;
  const std::size_t end = band.a_last == CausalBand::kNone ? g.k : std::min(g.k, i1 + band.a_last);
  const std::size_t begin =
      band.a_first == CausalBand::kNone || i0 <= band.a_first ? 0 : i0 - band.a_first;
  return {std::min(begin, end), end};
}

// C[i0 .. i0+R, j0 .. j0+32) with the columns past m0, m1 left alone, each
// sum over the terms ps (A zero elsewhere); kFull: every column there, so B
// loads unmasked.
template <std::size_t R, bool kFull>
ZTRAIN_AVX512 void tile(const BlockGemm& g, std::size_t i0, std::size_t j0, Span ps, __mmask16 m0,
                        __mmask16 m1) {
  __m512 acc[R][2];
  for (std::size_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const float* a = g.a.p + i0 * g.a.row;
  const float* b = g.b.p + j0;
  for (std::size_t p = ps.begin; p < ps.end; ++p) {
    const float* brow = b + p * g.b.row;
    const __m512 b0 = kFull ? _mm512_loadu_ps(brow) : _mm512_maskz_loadu_ps(m0, brow);
    const __m512 b1 = kFull ? _mm512_loadu_ps(brow + 16) : _mm512_maskz_loadu_ps(m1, brow + 16);
    for (std::size_t r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * g.a.row + p * g.a.col]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    }
  }
  const __m512 alpha = _mm512_set1_ps(g.alpha);
  for (std::size_t r = 0; r < R; ++r) {
    float* c = g.c + (i0 + r) * g.ldc + j0;
    for (std::size_t v = 0; v < 2; ++v) {
      const __mmask16 m = v == 0 ? m0 : m1;
      const __m512 out =
          g.accumulate ? _mm512_fmadd_ps(alpha, acc[r][v], _mm512_maskz_loadu_ps(m, c + 16 * v))
                       : _mm512_mul_ps(alpha, acc[r][v]);
      _mm512_mask_storeu_ps(c + 16 * v, m, out);
    }
  }
}

// The tile of R rows at (i0, j0), its first `cols` columns.
template <std::size_t R>
struct Tile {
  ZTRAIN_AVX512 static void run(const BlockGemm& g, std::size_t i0, std::size_t j0,
                                std::size_t cols) {
    const Span ps = terms(g, i0, i0 + R);
    if (cols == kCols) return tile<R, true>(g, i0, j0, ps, 0xffff, 0xffff);
    tile<R, false>(g, i0, j0, ps, lanes(0, cols), lanes(16, cols));
  }
};

// Whether a tile of rows [.., i1) from column j0 holds any element of C
// that is wanted (g.band).
bool wanted(const BlockGemm& g, std::size_t i1, std::size_t j0) {
  return g.band.c_last == CausalBand::kNone || j0 < i1 + g.band.c_last;
}

}  // namespace

// Every wanted tile of C: columns outermost, so that a panel of B stays in
// the L1 cache while every row tile passes over it; the last panel's
// columns and the last tile's rows may be short, each tile height its own
// instantiation (tiles[R], R rows).
void block_gemm_avx512(const BlockGemm& g) {
  using TileFn = void (*)(const BlockGemm&, std::size_t, std::size_t, std::size_t);
  static constexpr std::array<TileFn, kRows + 1> tiles =
      []<std::size_t... R>(std::index_sequence<R...>) {
    return std::array<TileFn, kRows + 1>{nullptr, &Tile<R + 1>::run...};
  }
  (std::make_index_sequence<kRows>());
  for (std::size_t j0 = 0; j0 < g.n; j0 += kCols) {
    const std::size_t cols = std::min(kCols, g.n - j0);
    std::size_t i0 = 0;
    for (; i0 + kRows <= g.m; i0 += kRows)
      if (wanted(g, i0 + kRows, j0)) tiles[kRows](g, i0, j0, cols);
    if (i0 < g.m && wanted(g, g.m, j0)) tiles[g.m - i0](g, i0, j0, cols);
  }
}

}  // namespace ztrain::vec
