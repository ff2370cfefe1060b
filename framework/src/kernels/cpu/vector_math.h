// Vectorised elementwise math for the fast cpu kernels: an 8-wide AVX2+FMA
// exp (Cephes' expf: range reduction by ln 2, degree-6 polynomial, about
// 2 ulp) and the loops built on it, chosen at run time when the processor
// has AVX2, FMA and F16C (have_avx2_fma); the scalar loops of
// ReferenceKernels serve otherwise. 16-bit operands are converted in
// registers: bf16 by shifts, f16 by F16C, both bit-exact with dtype.h's
// scalar conversions (to_f32/from_f32 fall back to dtype.h's convert).
#pragma once

#include <cstddef>

#include "ztrain/kernels.h"

namespace ztrain::vec {

// GELU's tanh form: sqrt(2/pi) and the cubic term's coefficient.
inline constexpr float kGeluScale = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;

// True when the running processor can execute the vector versions: AVX2,
// FMA and F16C (every processor with the first two has the third).
bool have_avx2_fma();

// dst = src widened to fp32, exact; n elements.
void to_f32(ConstTypedPtr src, float* dst, std::size_t n);
// dst = src rounded to dst's type as float_to_bf16 / float_to_f16 round
// (nearest even, NaN kept quiet); n elements.
void from_f32(const float* src, TypedPtr dst, std::size_t n);
// Both use the vector loops when have_avx2_fma() and scalar ones otherwise.

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x = inp + bias;
// all (n), bias null for none (one row of an MLP's pre-activation)
void gelu_forward_avx2(float* out, const float* inp, const float* bias, std::size_t n);
// dinp = gelu'(x) * dout (written), x = inp + bias; dbias += dinp when not
// null; all (n)
void gelu_backward_avx2(float* dinp, float* dbias, const float* inp, const float* bias,
                        const float* dout, std::size_t n);
// out = g sigmoid(g) u
void swiglu_forward_avx2(float* out, const float* gate, const float* up, std::size_t n);
// dgate += dout u sigmoid(g) (1 + g (1 - sigmoid(g))); dup += dout g sigmoid(g)
void swiglu_backward_avx2(float* dgate, float* dup, const float* dout, const float* gate,
                          const float* up, std::size_t n);
// x[i] = exp(x[i] - shift); returns the sum of the results (in float, in a
// fixed order).
float exp_shifted_sum_avx2(float* x, std::size_t n, float shift);
// One row of probabilities in place (attention's causal rows, the
// cross-entropy's logits): x[0, n) = softmax(x[0, n)), x[n, len) = 0.
// Returns the row's log-sum-exp.
float softmax_row_avx2(float* x, std::size_t n, std::size_t len);
// One row of attention's backward, in place: for j < n, p[j] = exp(p[j] -
// lse) (the probability recomputed from its score) and dp[j] = p[j] (dp[j]
// - d) scale (the score's gradient); both 0 on [n, len).
void softmax_backward_row_avx2(float* p, float* dp, std::size_t n, std::size_t len, float lse,
                               float d, float scale);

// The exp-bound loops above as a table of functions.
struct ExpLoops {
  void (*gelu_forward)(float*, const float*, const float*, std::size_t);
  void (*gelu_backward)(float*, float*, const float*, const float*, const float*, std::size_t);
  void (*swiglu_forward)(float*, const float*, const float*, std::size_t);
  void (*swiglu_backward)(float*, float*, const float*, const float*, const float*, std::size_t);
  float (*exp_shifted_sum)(float*, std::size_t, float);
  float (*softmax_row)(float*, std::size_t, std::size_t);
  void (*softmax_backward_row)(float*, float*, std::size_t, std::size_t, float, float, float);
};
// The AVX2 loops above.
const ExpLoops& exp_loops_avx2();
// The same loops on 16 lanes (exp_loops_avx512.cpp), for processors with
// AVX-512 F, BW and VL (have_avx512): the AVX2 loops' bits, element for
// element and sum for sum.
const ExpLoops& exp_loops_avx512();
// What the fast kernels call: the AVX-512 loops where have_avx512(), else
// the AVX2 ones (callers check have_avx2_fma() first).
const ExpLoops& exp_loops();

// The dot product of a and b, both (n): 8 partial sums in lanes, added in
// a fixed order (attention's rowsum(dO * O) per query row, RMSNorm's sum
// of squares).
float dot_avx2(const float* a, const float* b, std::size_t n);

// out = a + b; all (n). out may alias a or b.
void add_avx2(float* out, const float* a, const float* b, std::size_t n);

// One row's LayerNorm statistics.
struct RowStats {
  float mean, rstd;
};
// One row of LayerNorm: mean, then the variance about it (two passes, as
// the reference), out = (x - mean) rstd w + b (b may be null); all (C).
RowStats layernorm_row_avx2(float* out, const float* x, const float* w, const float* b,
                            std::size_t C, float eps);
// One row of LayerNorm's backward, dnorm = w dout, norm = (x - mean) rstd:
// dinp += (dnorm - mean(dnorm) - norm mean(dnorm norm)) rstd; and the
// caller's fp32 partial sums of the parameter gradients: dw += norm dout,
// db += dout (db may be null).
void layernorm_backward_row_avx2(float* dinp, float* dw, float* db, const float* dout,
                                 const float* x, const float* w, RowStats s, std::size_t C);
// One row of RMSNorm: out = x rstd w; returns rstd = 1 / sqrt(mean(x^2) + eps).
float rmsnorm_row_avx2(float* out, const float* x, const float* w, std::size_t C, float eps);
// One row of RMSNorm's backward: dinp += rstd (w dout - x rstd mean(w dout x
// rstd)); dw += x rstd dout (a partial sum).
void rmsnorm_backward_row_avx2(float* dinp, float* dw, const float* dout, const float* x,
                               const float* w, float rstd, std::size_t C);

// The scalars of one adam loop: the step's hyper-parameters with the
// run's weight decays (0 where it does not decay) and the gradient's
// multiplier.
struct AdamScalars {
  float lr, beta1, beta2, eps, weight_decay, l2, grad_mult, bc1, bc2;
};

// Adam on n elements, as Kernels::adamw: g read (and zeroed if
// zero_grad), working (if not null) written, all in the same pass.
void adamw_avx2(float* p, TypedPtr g, float* m, float* v, TypedPtr working, std::size_t n,
                const AdamScalars& a, bool zero_grad);
// True when the running processor has AVX-512 F, BW and VL.
bool have_avx512();
// adamw_avx2 on 16 lanes (adamw_avx512.cpp): the same bits per element as
// adamw_avx2, tail included.
void adamw_avx512(float* p, TypedPtr g, float* m, float* v, TypedPtr working, std::size_t n,
                  const AdamScalars& a, bool zero_grad);
// Sum of squares of n elements accumulated in double, in a fixed order that
// does not depend on the type.
double sum_squares_avx2(ConstTypedPtr x, std::size_t n);

}  // namespace ztrain::vec
