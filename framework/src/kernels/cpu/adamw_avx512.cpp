// AdamW on 16 lanes (AVX-512), chosen at run time where the processor has
// AVX-512 F, BW and VL. The arithmetic is vector_math.cpp's AVX2 update,
// operation for operation (the same multiplies by reciprocals, the same
// fused multiply-adds), so a lane gives the AVX2 lane's bits, and the
// elements the AVX2 loop leaves to its scalar tail go through that same
// tail: a host with AVX-512 steps every element to the same bits as one
// without, so replicas on mixed hosts cannot drift apart. 16-bit operands
// are converted with integer operations, as dtype.h's scalar conversions
// (the AVX-512 BF16 instruction rounds denormals to zero, which they do
// not).
//
// What it buys: nothing measurable on the 2-core Sapphire Rapids machine
// it was written on (bench_adamw, 1e8 elements: 0.571 against the AVX2
// loop's 0.572 ns/element; bench/RESULTS.md), where the update is bound by
// memory bandwidth. It is the path for processors with more bandwidth per
// core, where the AVX2 loop's instruction count could become the limit.
#include <cstdint>

#include "kernels/cpu/adamw_dispatch.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/vector_math.h"

namespace ztrain::vec {
namespace {

// 16 lanes of a typed operand under mask k (masked-off lanes read as 0 and
// are not written).
template <DType t>
__m512 load16(const void* base, std::size_t i, __mmask16 k);
template <DType t>
void store16(void* base, std::size_t i, __m512 x, __mmask16 k);

ZTRAIN_AVX512 inline __m256i load_u16x16(const void* base, std::size_t i, __mmask16 k) {
  return _mm256_maskz_loadu_epi16(k, static_cast<const std::uint16_t*>(base) + i);
}

template <>
ZTRAIN_AVX512 inline __m512 load16<DType::f32>(const void* base, std::size_t i, __mmask16 k) {
  return _mm512_maskz_loadu_ps(k, static_cast<const float*>(base) + i);
}
template <>
ZTRAIN_AVX512 inline __m512 load16<DType::bf16>(const void* base, std::size_t i, __mmask16 k) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load_u16x16(base, i, k)), 16));
}
// vcvtph2ps quiets a signalling NaN, f16_to_float keeps it: the quiet bit
// is cleared again in those lanes (as the AVX2 load does).
template <>
ZTRAIN_AVX512 inline __m512 load16<DType::f16>(const void* base, std::size_t i, __mmask16 k) {
  const __m256i h = load_u16x16(base, i, k);
  const __m512i bits = _mm512_castps_si512(_mm512_cvtph_ps(h));
  const __m512i mag = _mm512_and_si512(_mm512_cvtepu16_epi32(h), _mm512_set1_epi32(0x7fff));
  const __mmask16 snan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7c00)) &
                         _mm512_cmple_epi32_mask(mag, _mm512_set1_epi32(0x7dff));
  return _mm512_castsi512_ps(
      _mm512_mask_andnot_epi32(bits, snan, _mm512_set1_epi32(0x00400000), bits));
}

template <>
ZTRAIN_AVX512 inline void store16<DType::f32>(void* base, std::size_t i, __m512 x, __mmask16 k) {
  _mm512_mask_storeu_ps(static_cast<float*>(base) + i, k, x);
}
// float_to_bf16: add 0x7fff plus the lowest kept bit (nearest, ties to
// even; overflow carries into infinity), NaN just sets the quiet bit.
template <>
ZTRAIN_AVX512 inline void store16<DType::bf16>(void* base, std::size_t i, __m512 x, __mmask16 k) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
  const __m512i r = _mm512_srli_epi32(_mm512_mask_blend_epi32(nan, rounded, quiet), 16);
  _mm256_mask_storeu_epi16(static_cast<std::uint16_t*>(base) + i, k, _mm512_cvtepi32_epi16(r));
}
template <>
ZTRAIN_AVX512 inline void store16<DType::f16>(void* base, std::size_t i, __m512 x, __mmask16 k) {
  _mm256_mask_storeu_epi16(static_cast<std::uint16_t*>(base) + i, k,
                           _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

struct Coefficients {
  __m512 b1, b2, one_b1, one_b2, inv_bc1, inv_bc2, eps, wd, l2, neg_lr, mult;
};

// One block of 16 (or, under k, fewer) elements from i.
template <DType G, DType W, bool kWork>
ZTRAIN_AVX512 inline void adamw16(const Coefficients& c, float* p, void* g, float* m, float* v,
                                  void* working, std::size_t i, __mmask16 k, bool zero_grad) {
  const __m512 pi = _mm512_maskz_loadu_ps(k, p + i);
  const __m512 gi = _mm512_fmadd_ps(c.l2, pi, _mm512_mul_ps(load16<G>(g, i, k), c.mult));
  if (zero_grad) store16<G>(g, i, _mm512_setzero_ps(), k);
  const __m512 mi =
      _mm512_fmadd_ps(c.b1, _mm512_maskz_loadu_ps(k, m + i), _mm512_mul_ps(c.one_b1, gi));
  const __m512 vi = _mm512_fmadd_ps(c.b2, _mm512_maskz_loadu_ps(k, v + i),
                                    _mm512_mul_ps(_mm512_mul_ps(c.one_b2, gi), gi));
  _mm512_mask_storeu_ps(m + i, k, mi);
  _mm512_mask_storeu_ps(v + i, k, vi);
  const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(vi, c.inv_bc2)), c.eps);
  const __m512 update =
      _mm512_fmadd_ps(c.wd, pi, _mm512_div_ps(_mm512_mul_ps(mi, c.inv_bc1), denom));
  const __m512 pn = _mm512_fmadd_ps(c.neg_lr, update, pi);
  _mm512_mask_storeu_ps(p + i, k, pn);
  if constexpr (kWork) store16<W>(working, i, pn, k);
}

template <DType G, DType W, bool kWork>
ZTRAIN_AVX512 void adamw_loop(float* p, void* g, float* m, float* v, void* working, std::size_t n,
                              const AdamScalars& a, bool zero_grad) {
  const Coefficients c{_mm512_set1_ps(a.beta1),        _mm512_set1_ps(a.beta2),
                       _mm512_set1_ps(1.0f - a.beta1), _mm512_set1_ps(1.0f - a.beta2),
                       _mm512_set1_ps(1.0f / a.bc1),   _mm512_set1_ps(1.0f / a.bc2),
                       _mm512_set1_ps(a.eps),          _mm512_set1_ps(a.weight_decay),
                       _mm512_set1_ps(a.l2),           _mm512_set1_ps(-a.lr),
                       _mm512_set1_ps(a.grad_mult)};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) adamw16<G, W, kWork>(c, p, g, m, v, working, i, 0xffff, zero_grad);
  // Eight more under a mask where the AVX2 loop has a vector of them; the
  // last n % 8 through the AVX2 loop itself, whose scalar tail they take
  // there: every element gets the AVX2 path's bits, whatever the host.
  if (i + 8 <= n) {
    adamw16<G, W, kWork>(c, p, g, m, v, working, i, 0x00ff, zero_grad);
    i += 8;
  }
  if (i < n)
    adamw_avx2(p + i, {static_cast<char*>(g) + i * dtype_size(G), G}, m + i, v + i,
               kWork ? TypedPtr{static_cast<char*>(working) + i * dtype_size(W), W} : TypedPtr{},
               n - i, a, zero_grad);
}

// The loop for adamw_typed.
struct Loop {
  template <DType G, DType W, bool kWork, class... Args>
  static void run(Args... args) {
    adamw_loop<G, W, kWork>(args...);
  }
};

}  // namespace

bool have_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

void adamw_avx512(float* p, TypedPtr g, float* m, float* v, TypedPtr working, std::size_t n,
                  const AdamScalars& a, bool zero_grad) {
  adamw_typed<Loop>(p, g, m, v, working, n, a, zero_grad);
}

}  // namespace ztrain::vec
