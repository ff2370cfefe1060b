#include "kernels/cpu/vector_math.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/adamw_dispatch.h"

namespace ztrain::vec {
namespace {

#define ZTRAIN_AVX2 __attribute__((target("avx2,fma,f16c")))

// 8 lanes of a typed operand, to and from fp32 registers.
template <DType t>
__m256 load8(const void* base, std::size_t i);
template <DType t>
void store8(void* base, std::size_t i, __m256 x);

ZTRAIN_AVX2 inline __m128i load_u16x8(const void* base, std::size_t i) {
  return _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(base) + i));
}
ZTRAIN_AVX2 inline void store_u16x8(void* base, std::size_t i, __m128i h) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(base) + i), h);
}

template <>
ZTRAIN_AVX2 inline __m256 load8<DType::f32>(const void* base, std::size_t i) {
  return _mm256_loadu_ps(static_cast<const float*>(base) + i);
}
template <>
ZTRAIN_AVX2 inline __m256 load8<DType::bf16>(const void* base, std::size_t i) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load_u16x8(base, i)), 16));
}
// F16C quiets a signalling NaN, f16_to_float keeps it as it is: the quiet
// bit is cleared again in those lanes, so both give the same bits.
template <>
ZTRAIN_AVX2 inline __m256 load8<DType::f16>(const void* base, std::size_t i) {
  const __m128i h = load_u16x8(base, i);
  const __m256i bits = _mm256_castps_si256(_mm256_cvtph_ps(h));
  const __m256i mag = _mm256_and_si256(_mm256_cvtepu16_epi32(h), _mm256_set1_epi32(0x7fff));
  const __m256i snan = _mm256_andnot_si256(_mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7dff)),
                                           _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7c00)));
  return _mm256_castsi256_ps(
      _mm256_andnot_si256(_mm256_and_si256(snan, _mm256_set1_epi32(0x00400000)), bits));
}

template <>
ZTRAIN_AVX2 inline void store8<DType::f32>(void* base, std::size_t i, __m256 x) {
  _mm256_storeu_ps(static_cast<float*>(base) + i, x);
}
// float_to_bf16 on 8 lanes: add 0x7fff plus the lowest kept bit (nearest,
// ties to even; overflow carries into infinity), NaN just sets the quiet bit.
template <>
ZTRAIN_AVX2 inline void store8<DType::bf16>(void* base, std::size_t i, __m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  // packus works within 128-bit halves: lanes 0-3 land in 64-bit word 0,
  // lanes 4-7 in word 2.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  store_u16x8(base, i, _mm256_castsi256_si128(packed));
}
template <>
ZTRAIN_AVX2 inline void store8<DType::f16>(void* base, std::size_t i, __m256 x) {
  store_u16x8(base, i, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

// The same, one element at a time, for the tails.
template <DType t>
float load1(const void* base, std::size_t i) {
  if constexpr (t == DType::f32) return static_cast<const float*>(base)[i];
  if constexpr (t == DType::bf16) return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
  if constexpr (t == DType::f16) return f16_to_float(static_cast<const std::uint16_t*>(base)[i]);
}
template <DType t>
void store1(void* base, std::size_t i, float x) {
  if constexpr (t == DType::f32) static_cast<float*>(base)[i] = x;
  if constexpr (t == DType::bf16) static_cast<std::uint16_t*>(base)[i] = float_to_bf16(x);
  if constexpr (t == DType::f16) static_cast<std::uint16_t*>(base)[i] = float_to_f16(x);
}

template <DType t>
ZTRAIN_AVX2 void to_f32_avx2(const void* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8<t>(src, i));
  for (; i < n; ++i) dst[i] = load1<t>(src, i);
}

template <DType t>
ZTRAIN_AVX2 void from_f32_avx2(const float* src, void* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) store8<t>(dst, i, _mm256_loadu_ps(src + i));
  for (; i < n; ++i) store1<t>(dst, i, src[i]);
}

// Cephes expf on 8 lanes. Inputs are clamped to [-87, 88] so that the
// power of two stays a normal float (exp(-inf) gives 1.6e-38, not 0, and
// large inputs saturate at 1.7e38): callers use it where that is harmless
// (tanh, sigmoid, softmax after subtracting the maximum).
ZTRAIN_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-87.0f);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

ZTRAIN_AVX2 inline __m256 sigmoid8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}

ZTRAIN_AVX2 inline __m256 gelu_u(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  return _mm256_mul_ps(_mm256_set1_ps(kGeluScale),
                       _mm256_fmadd_ps(_mm256_set1_ps(kGeluCubic), x3, x));
}

// The tails (n % 8) use the same formulas in scalar code.
float sigmoid_scalar(float z) {
  return 1.0f / (1.0f + std::exp(-z));
}

}  // namespace

const ExpLoops& exp_loops_avx2() {
  static const ExpLoops loops{gelu_forward_avx2,        gelu_backward_avx2,   swiglu_forward_avx2,
                              swiglu_backward_avx2,     exp_shifted_sum_avx2, softmax_row_avx2,
                              softmax_backward_row_avx2};
  return loops;
}

const ExpLoops& exp_loops() {
  return have_avx512() ? exp_loops_avx512() : exp_loops_avx2();
}

bool have_avx2_fma() {
  // F16C from CPUID leaf 1 (ECX bit 29): not every compiler's
  // __builtin_cpu_supports knows the name.
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return yes;
}

void to_f32(ConstTypedPtr src, float* dst, std::size_t n) {
  if (src.dtype == DType::f32 || !have_avx2_fma())
    return convert(src.data, src.dtype, dst, DType::f32, n);
  if (src.dtype == DType::bf16) return to_f32_avx2<DType::bf16>(src.data, dst, n);
  to_f32_avx2<DType::f16>(src.data, dst, n);
}

void from_f32(const float* src, TypedPtr dst, std::size_t n) {
  if (dst.dtype == DType::f32 || !have_avx2_fma())
    return convert(src, DType::f32, dst.data, dst.dtype, n);
  if (dst.dtype == DType::bf16) return from_f32_avx2<DType::bf16>(src, dst.data, n);
  from_f32_avx2<DType::f16>(src, dst.data, n);
}

// 0.5 (1 + tanh(u)) = sigmoid(2u), which avoids the cancellation in 1 + tanh
// for negative inputs. x = inp + bias, the bias loaded beside each vector
// (a zero vector when there is none).
ZTRAIN_AVX2 void gelu_forward_avx2(float* out, const float* inp, const float* bias, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(inp + i);
    if (bias) x = _mm256_add_ps(x, _mm256_loadu_ps(bias + i));
    const __m256 u = gelu_u(x);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(x, sigmoid8(_mm256_add_ps(u, u))));
  }
  for (; i < n; ++i) {
    const float x = inp[i] + (bias ? bias[i] : 0.0f);
    out[i] = x * sigmoid_scalar(2.0f * kGeluScale * (x + kGeluCubic * x * x * x));
  }
}

// d/dx [x s(2u)] = s + 2 x s (1 - s) u', u' = k (1 + 3 c x^2)
ZTRAIN_AVX2 void gelu_backward_avx2(float* dinp, float* dbias, const float* inp, const float* bias,
                                    const float* dout, std::size_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), two_k = _mm256_set1_ps(2.0f * kGeluScale);
  const __m256 c3 = _mm256_set1_ps(3.0f * kGeluCubic);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(inp + i);
    if (bias) x = _mm256_add_ps(x, _mm256_loadu_ps(bias + i));
    const __m256 u = gelu_u(x);
    const __m256 s = sigmoid8(_mm256_add_ps(u, u));
    const __m256 du = _mm256_mul_ps(two_k, _mm256_fmadd_ps(c3, _mm256_mul_ps(x, x), one));
    const __m256 grad =
        _mm256_fmadd_ps(_mm256_mul_ps(x, _mm256_mul_ps(s, _mm256_sub_ps(one, s))), du, s);
    const __m256 d = _mm256_mul_ps(grad, _mm256_loadu_ps(dout + i));
    _mm256_storeu_ps(dinp + i, d);
    if (dbias) _mm256_storeu_ps(dbias + i, _mm256_add_ps(_mm256_loadu_ps(dbias + i), d));
  }
  for (; i < n; ++i) {
    const float x = inp[i] + (bias ? bias[i] : 0.0f);
    const float s = sigmoid_scalar(2.0f * kGeluScale * (x + kGeluCubic * x * x * x));
    const float grad =
        s + x * s * (1.0f - s) * 2.0f * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = grad * dout[i];
    if (dbias) dbias[i] += dinp[i];
  }
}

ZTRAIN_AVX2 void swiglu_forward_avx2(float* out, const float* gate, const float* up,
                                     std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

ZTRAIN_AVX2 void swiglu_backward_avx2(float* dgate, float* dup, const float* dout,
                                      const float* gate, const float* up, std::size_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i),
                 d = _mm256_loadu_ps(dout + i);
    const __m256 sig = sigmoid8(g);
    const __m256 dsilu = _mm256_mul_ps(sig, _mm256_fmadd_ps(g, _mm256_sub_ps(one, sig), one));
    _mm256_storeu_ps(dgate + i,
                     _mm256_fmadd_ps(_mm256_mul_ps(d, u), dsilu, _mm256_loadu_ps(dgate + i)));
    _mm256_storeu_ps(dup + i, _mm256_fmadd_ps(d, _mm256_mul_ps(g, sig), _mm256_loadu_ps(dup + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    dgate[i] += dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] += dout[i] * g * sig;
  }
}

ZTRAIN_AVX2 float exp_shifted_sum_avx2(float* x, std::size_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = 0;
  for (float l : lanes) sum += l;
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

ZTRAIN_AVX2 float softmax_row_avx2(float* x, std::size_t n, std::size_t len) {
  __m256 mx = _mm256_set1_ps(-INFINITY);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  float maxv = -INFINITY;
  for (float l : lanes) maxv = std::max(maxv, l);
  for (; i < n; ++i) maxv = std::max(maxv, x[i]);
  const float sum = exp_shifted_sum_avx2(x, n, maxv);
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= 1.0f / sum;
  std::fill(x + n, x + len, 0.0f);
  return maxv + std::log(sum);
}

ZTRAIN_AVX2 void softmax_backward_row_avx2(float* p, float* dp, std::size_t n, std::size_t len,
                                           float lse, float d, float scale) {
  const __m256 l = _mm256_set1_ps(lse), dv = _mm256_set1_ps(d), s = _mm256_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 pi = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i), l));
    _mm256_storeu_ps(p + i, pi);
    const __m256 g = _mm256_sub_ps(_mm256_loadu_ps(dp + i), dv);
    _mm256_storeu_ps(dp + i, _mm256_mul_ps(_mm256_mul_ps(pi, g), s));
  }
  for (; i < n; ++i) {
    p[i] = std::exp(p[i] - lse);
    dp[i] = p[i] * (dp[i] - d) * scale;
  }
  std::fill(p + n, p + len, 0.0f);
  std::fill(dp + n, dp + len, 0.0f);
}

namespace {

// The sum of 8 lanes, in a fixed order.
ZTRAIN_AVX2 inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

}  // namespace

ZTRAIN_AVX2 float dot_avx2(const float* a, const float* b, std::size_t n) {
  __m256 acc = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float sum = hsum8(acc);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

ZTRAIN_AVX2 void add_avx2(float* out, const float* a, const float* b, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

ZTRAIN_AVX2 RowStats layernorm_row_avx2(float* out, const float* x, const float* w, const float* b,
                                        std::size_t C, float eps) {
  __m256 acc = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= C; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
  float sum = hsum8(acc);
  for (; i < C; ++i) sum += x[i];
  const float m = sum / static_cast<float>(C);
  const __m256 mv = _mm256_set1_ps(m);
  acc = _mm256_setzero_ps();
  for (i = 0; i + 8 <= C; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), mv);
    acc = _mm256_fmadd_ps(d, d, acc);
  }
  float var = hsum8(acc);
  for (; i < C; ++i) var += (x[i] - m) * (x[i] - m);
  const float r = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  for (i = 0; i + 8 <= C; i += 8) {
    const __m256 norm = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), rv);
    const __m256 bias = b ? _mm256_loadu_ps(b + i) : _mm256_setzero_ps();
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(norm, _mm256_loadu_ps(w + i), bias));
  }
  for (; i < C; ++i) out[i] = (x[i] - m) * r * w[i] + (b ? b[i] : 0.0f);
  return {m, r};
}

ZTRAIN_AVX2 void layernorm_backward_row_avx2(float* dinp, float* dw, float* db, const float* dout,
                                             const float* x, const float* w, RowStats s,
                                             std::size_t C) {
  const __m256 mv = _mm256_set1_ps(s.mean), rv = _mm256_set1_ps(s.rstd);
  __m256 a = _mm256_setzero_ps(), an = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= C; i += 8) {
    const __m256 d = _mm256_loadu_ps(dout + i);
    const __m256 norm = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), rv);
    const __m256 dnorm = _mm256_mul_ps(_mm256_loadu_ps(w + i), d);
    a = _mm256_add_ps(a, dnorm);
    an = _mm256_fmadd_ps(dnorm, norm, an);
    _mm256_storeu_ps(dw + i, _mm256_fmadd_ps(norm, d, _mm256_loadu_ps(dw + i)));
    if (db) _mm256_storeu_ps(db + i, _mm256_add_ps(_mm256_loadu_ps(db + i), d));
  }
  float dnorm_mean = hsum8(a), dnorm_norm_mean = hsum8(an);
  for (; i < C; ++i) {
    const float norm = (x[i] - s.mean) * s.rstd, dnorm = w[i] * dout[i];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
    dw[i] += norm * dout[i];
    if (db) db[i] += dout[i];
  }
  dnorm_mean /= static_cast<float>(C);
  dnorm_norm_mean /= static_cast<float>(C);
  const __m256 dm = _mm256_set1_ps(dnorm_mean), dnm = _mm256_set1_ps(dnorm_norm_mean);
  for (i = 0; i + 8 <= C; i += 8) {
    const __m256 norm = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), rv);
    const __m256 dnorm = _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(dout + i));
    const __m256 g = _mm256_fnmadd_ps(norm, dnm, _mm256_sub_ps(dnorm, dm));
    _mm256_storeu_ps(dinp + i, _mm256_fmadd_ps(g, rv, _mm256_loadu_ps(dinp + i)));
  }
  for (; i < C; ++i) {
    const float norm = (x[i] - s.mean) * s.rstd;
    dinp[i] += (w[i] * dout[i] - dnorm_mean - norm * dnorm_norm_mean) * s.rstd;
  }
}

ZTRAIN_AVX2 float rmsnorm_row_avx2(float* out, const float* x, const float* w, std::size_t C,
                                   float eps) {
  const float ss = dot_avx2(x, x, C);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  std::size_t i = 0;
  for (; i + 8 <= C; i += 8)
    _mm256_storeu_ps(
        out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(w + i)));
  for (; i < C; ++i) out[i] = x[i] * r * w[i];
  return r;
}

ZTRAIN_AVX2 void rmsnorm_backward_row_avx2(float* dinp, float* dw, const float* dout,
                                           const float* x, const float* w, float rstd,
                                           std::size_t C) {
  const __m256 rv = _mm256_set1_ps(rstd);
  __m256 acc = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= C; i += 8) {
    const __m256 d = _mm256_loadu_ps(dout + i);
    const __m256 xr = _mm256_mul_ps(_mm256_loadu_ps(x + i), rv);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(w + i), d), xr, acc);
    _mm256_storeu_ps(dw + i, _mm256_fmadd_ps(xr, d, _mm256_loadu_ps(dw + i)));
  }
  float dot = hsum8(acc);
  for (; i < C; ++i) {
    dot += w[i] * dout[i] * x[i] * rstd;
    dw[i] += x[i] * rstd * dout[i];
  }
  dot /= static_cast<float>(C);
  const __m256 dv = _mm256_set1_ps(dot);
  for (i = 0; i + 8 <= C; i += 8) {
    const __m256 xr = _mm256_mul_ps(_mm256_loadu_ps(x + i), rv);
    const __m256 g =
        _mm256_fnmadd_ps(xr, dv, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(dout + i)));
    _mm256_storeu_ps(dinp + i, _mm256_fmadd_ps(rv, g, _mm256_loadu_ps(dinp + i)));
  }
  for (; i < C; ++i) dinp[i] += rstd * (w[i] * dout[i] - x[i] * rstd * dot);
}

namespace {

// The update, typed by the gradient G and the working copy W (kWork false:
// none wanted). The f32 gradient without a working copy is the plain fp32
// update; the others differ only in how g and working are loaded and stored.
template <DType G, DType W, bool kWork>
ZTRAIN_AVX2 void adamw_loop(float* p, void* g, float* m, float* v, void* working, std::size_t n,
                            const AdamScalars& a, bool zero_grad) {
  const __m256 b1 = _mm256_set1_ps(a.beta1), b2 = _mm256_set1_ps(a.beta2);
  const __m256 one_b1 = _mm256_set1_ps(1.0f - a.beta1), one_b2 = _mm256_set1_ps(1.0f - a.beta2);
  const __m256 inv_bc1 = _mm256_set1_ps(1.0f / a.bc1), inv_bc2 = _mm256_set1_ps(1.0f / a.bc2);
  const __m256 e = _mm256_set1_ps(a.eps), wd = _mm256_set1_ps(a.weight_decay);
  const __m256 l2 = _mm256_set1_ps(a.l2);
  const __m256 neg_lr = _mm256_set1_ps(-a.lr), mult = _mm256_set1_ps(a.grad_mult);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 gi = _mm256_fmadd_ps(l2, pi, _mm256_mul_ps(load8<G>(g, i), mult));
    if (zero_grad) store8<G>(g, i, _mm256_setzero_ps());
    const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(one_b1, gi));
    const __m256 vi =
        _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(_mm256_mul_ps(one_b2, gi), gi));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 denom = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vi, inv_bc2)), e);
    const __m256 update = _mm256_fmadd_ps(wd, pi, _mm256_div_ps(_mm256_mul_ps(mi, inv_bc1), denom));
    const __m256 pn = _mm256_fmadd_ps(neg_lr, update, pi);
    _mm256_storeu_ps(p + i, pn);
    if constexpr (kWork) store8<W>(working, i, pn);
  }
  for (; i < n; ++i) {
    const float gi = load1<G>(g, i) * a.grad_mult + a.l2 * p[i];
    if (zero_grad) store1<G>(g, i, 0.0f);
    m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    p[i] -= a.lr * (a.weight_decay * p[i] + (m[i] / a.bc1) / (std::sqrt(v[i] / a.bc2) + a.eps));
    if constexpr (kWork) store1<W>(working, i, p[i]);
  }
}

// The loop for adamw_typed.
struct Loop {
  template <DType G, DType W, bool kWork, class... Args>
  static void run(Args... args) {
    adamw_loop<G, W, kWork>(args...);
  }
};

template <DType t>
ZTRAIN_AVX2 double sum_squares_loop(const void* x, std::size_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xi = load8<t>(x, i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(xi));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(xi, 1));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) {
    const double xi = load1<t>(x, i);
    sum += xi * xi;
  }
  return sum;
}

}  // namespace

void adamw_avx2(float* p, TypedPtr g, float* m, float* v, TypedPtr working, std::size_t n,
                const AdamScalars& a, bool zero_grad) {
  adamw_typed<Loop>(p, g, m, v, working, n, a, zero_grad);
}

double sum_squares_avx2(ConstTypedPtr x, std::size_t n) {
  switch (x.dtype) {
    case DType::f32:
      return sum_squares_loop<DType::f32>(x.data, n);
    case DType::bf16:
      return sum_squares_loop<DType::bf16>(x.data, n);
    case DType::f16:
      return sum_squares_loop<DType::f16>(x.data, n);
  }
  return 0;
}

}  // namespace ztrain::vec
