// The exp-bound row loops of vector_math.h on 16 lanes (AVX-512), chosen at
// run time where the processor has AVX-512 F, BW and VL (exp_loops()).
// Each is its AVX2 twin operation for operation: the same Cephes exp (the
// power of two built from the rounded exponent with integer operations),
// the same divisions and fused multiply-adds, so a lane gives the AVX2
// lane's bits. A row's sum adds the two halves of each 16-lane block into
// one 8-lane accumulator, low half first, which is the AVX2 loop's order,
// and ends with its lane sum and scalar tail; elements the AVX2 loop leaves
// to its scalar tail go through that tail. A host with AVX-512 therefore
// computes every activation, probability and loss to the bits of one
// without.
//
// What it buys: the exp and the division run on twice the lanes per
// instruction. On the 2-core AMD EPYC (Zen 4) VM, GELU's forward took 0.19
// ns an element against 0.41 for the AVX2 loop (bench/RESULTS.md has the
// step's figures).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/vector_math.h"

namespace ztrain::vec {
namespace {

// exp8 of vector_math.cpp on 16 lanes.
ZTRAIN_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

ZTRAIN_AVX512 inline __m512 sigmoid16(__m512 g) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

// sqrt(2/pi) (x + 0.044715 x^3)
ZTRAIN_AVX512 inline __m512 gelu_u16(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  return _mm512_mul_ps(_mm512_set1_ps(kGeluScale),
                       _mm512_fmadd_ps(_mm512_set1_ps(kGeluCubic), x3, x));
}

// Runs block(i, k) over [0, n) in blocks of 16 lanes, then one block of 8
// under a mask where 8 are left; returns where the AVX2 loop's scalar tail
// begins (n rounded down to 8).
template <class F>
ZTRAIN_AVX512 inline std::size_t in_blocks(std::size_t n, F&& block) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) block(i, static_cast<__mmask16>(0xffff));
  if (i + 8 <= n) {
    block(i, static_cast<__mmask16>(0x00ff));
    i += 8;
  }
  return i;
}

ZTRAIN_AVX512 inline __m512 load(const float* p, std::size_t i, __mmask16 k) {
  return _mm512_maskz_loadu_ps(k, p + i);
}

// The sum of the lanes of an 8-lane accumulator, as exp_shifted_sum_avx2
// takes it: in lane order.
ZTRAIN_AVX512 inline float lane_sum(__m256 acc) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

ZTRAIN_AVX512 void gelu_forward_avx512(float* out, const float* inp, const float* bias,
                                       std::size_t n) {
  const std::size_t i = in_blocks(n, [&](std::size_t at, __mmask16 k) ZTRAIN_AVX512 {
    __m512 x = load(inp, at, k);
    if (bias) x = _mm512_add_ps(x, load(bias, at, k));
    const __m512 u = gelu_u16(x);
    _mm512_mask_storeu_ps(out + at, k, _mm512_mul_ps(x, sigmoid16(_mm512_add_ps(u, u))));
  });
  if (i < n) gelu_forward_avx2(out + i, inp + i, bias ? bias + i : nullptr, n - i);
}

ZTRAIN_AVX512 void gelu_backward_avx512(float* dinp, float* dbias, const float* inp,
                                        const float* bias, const float* dout, std::size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), two_k = _mm512_set1_ps(2.0f * kGeluScale);
  const __m512 c3 = _mm512_set1_ps(3.0f * kGeluCubic);
  const std::size_t i = in_blocks(n, [&](std::size_t at, __mmask16 k) ZTRAIN_AVX512 {
    __m512 x = load(inp, at, k);
    if (bias) x = _mm512_add_ps(x, load(bias, at, k));
    const __m512 u = gelu_u16(x);
    const __m512 s = sigmoid16(_mm512_add_ps(u, u));
    const __m512 du = _mm512_mul_ps(two_k, _mm512_fmadd_ps(c3, _mm512_mul_ps(x, x), one));
    const __m512 grad =
        _mm512_fmadd_ps(_mm512_mul_ps(x, _mm512_mul_ps(s, _mm512_sub_ps(one, s))), du, s);
    const __m512 d = _mm512_mul_ps(grad, load(dout, at, k));
    _mm512_mask_storeu_ps(dinp + at, k, d);
    if (dbias) _mm512_mask_storeu_ps(dbias + at, k, _mm512_add_ps(load(dbias, at, k), d));
  });
  if (i < n)
    gelu_backward_avx2(dinp + i, dbias ? dbias + i : nullptr, inp + i, bias ? bias + i : nullptr,
                       dout + i, n - i);
}

ZTRAIN_AVX512 void swiglu_forward_avx512(float* out, const float* gate, const float* up,
                                         std::size_t n) {
  const std::size_t i = in_blocks(n, [&](std::size_t at, __mmask16 k) ZTRAIN_AVX512 {
    const __m512 g = load(gate, at, k);
    _mm512_mask_storeu_ps(out + at, k,
                          _mm512_mul_ps(_mm512_mul_ps(g, sigmoid16(g)), load(up, at, k)));
  });
  if (i < n) swiglu_forward_avx2(out + i, gate + i, up + i, n - i);
}

ZTRAIN_AVX512 void swiglu_backward_avx512(float* dgate, float* dup, const float* dout,
                                          const float* gate, const float* up, std::size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const std::size_t i = in_blocks(n, [&](std::size_t at, __mmask16 k) ZTRAIN_AVX512 {
    const __m512 g = load(gate, at, k), u = load(up, at, k), d = load(dout, at, k);
    const __m512 sig = sigmoid16(g);
    const __m512 dsilu = _mm512_mul_ps(sig, _mm512_fmadd_ps(g, _mm512_sub_ps(one, sig), one));
    _mm512_mask_storeu_ps(dgate + at, k,
                          _mm512_fmadd_ps(_mm512_mul_ps(d, u), dsilu, load(dgate, at, k)));
    _mm512_mask_storeu_ps(dup + at, k, _mm512_fmadd_ps(d, _mm512_mul_ps(g, sig), load(dup, at, k)));
  });
  if (i < n) swiglu_backward_avx2(dgate + i, dup + i, dout + i, gate + i, up + i, n - i);
}

ZTRAIN_AVX512 float exp_shifted_sum_avx512(float* x, std::size_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  const std::size_t i = in_blocks(n, [&](std::size_t at, __mmask16 k) ZTRAIN_AVX512 {
    const __m512 e = exp16(_mm512_sub_ps(load(x, at, k), s));
    _mm512_mask_storeu_ps(x + at, k, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    if (k == 0xffff)
      acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  });
  float sum = lane_sum(acc);
  for (std::size_t j = i; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

ZTRAIN_AVX512 float softmax_row_avx512(float* x, std::size_t n, std::size_t len) {
  // The maximum is the same in any order.
  __m512 mx = _mm512_set1_ps(-INFINITY);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
  float maxv = _mm512_reduce_max_ps(mx);
  for (; i < n; ++i) maxv = std::max(maxv, x[i]);
  const float sum = exp_shifted_sum_avx512(x, n, maxv);
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  const std::size_t tail = in_blocks(n, [&](std::size_t at, __mmask16 k) ZTRAIN_AVX512 {
    _mm512_mask_storeu_ps(x + at, k, _mm512_mul_ps(load(x, at, k), inv));
  });
  for (i = tail; i < n; ++i) x[i] *= 1.0f / sum;
  std::fill(x + n, x + len, 0.0f);
  return maxv + std::log(sum);
}

ZTRAIN_AVX512 void softmax_backward_row_avx512(float* p, float* dp, std::size_t n, std::size_t len,
                                               float lse, float d, float scale) {
  const __m512 l = _mm512_set1_ps(lse), dv = _mm512_set1_ps(d), s = _mm512_set1_ps(scale);
  const std::size_t i = in_blocks(n, [&](std::size_t at, __mmask16 k) ZTRAIN_AVX512 {
    const __m512 pi = exp16(_mm512_sub_ps(load(p, at, k), l));
    _mm512_mask_storeu_ps(p + at, k, pi);
    const __m512 g = _mm512_sub_ps(load(dp, at, k), dv);
    _mm512_mask_storeu_ps(dp + at, k, _mm512_mul_ps(_mm512_mul_ps(pi, g), s));
  });
  if (i < n) softmax_backward_row_avx2(p + i, dp + i, n - i, n - i, lse, d, scale);
  std::fill(p + n, p + len, 0.0f);
  std::fill(dp + n, dp + len, 0.0f);
}

}  // namespace

const ExpLoops& exp_loops_avx512() {
  static const ExpLoops loops{gelu_forward_avx512,        gelu_backward_avx512,
                              swiglu_forward_avx512,      swiglu_backward_avx512,
                              exp_shifted_sum_avx512,     softmax_row_avx512,
                              softmax_backward_row_avx512};
  return loops;
}

}  // namespace ztrain::vec
