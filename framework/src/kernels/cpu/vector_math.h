// Vectorised elementwise math for the fast cpu kernels: an 8-wide AVX2+FMA
// exp (Cephes' expf: range reduction by ln 2, degree-6 polynomial, about
// 2 ulp) and the loops built on it, chosen at run time when the processor
// has AVX2 and FMA; the scalar loops of ReferenceKernels serve otherwise.
#pragma once

#include <cstddef>

namespace ztrain::vec {

// True when the running processor can execute the AVX2+FMA versions.
bool have_avx2_fma();

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); all (n)
void gelu_forward_avx2(float* out, const float* inp, std::size_t n);
// dinp += gelu'(inp) * dout
void gelu_backward_avx2(float* dinp, const float* inp, const float* dout, std::size_t n);
// out = g sigmoid(g) u
void swiglu_forward_avx2(float* out, const float* gate, const float* up, std::size_t n);
// dgate += dout u sigmoid(g) (1 + g (1 - sigmoid(g))); dup += dout g sigmoid(g)
void swiglu_backward_avx2(float* dgate, float* dup, const float* dout, const float* gate,
                          const float* up, std::size_t n);
// x[i] = exp(x[i] - shift); returns the sum of the results (in float, in a
// fixed order).
float exp_shifted_sum_avx2(float* x, std::size_t n, float shift);

// AdamW on n elements, as Kernels::adamw (gradients zeroed after use).
void adamw_avx2(float* p, float* g, float* m, float* v, std::size_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, float grad_mult, float bc1, float bc2);
// Sum of squares of n floats accumulated in double, in a fixed order.
double sum_squares_avx2(const float* x, std::size_t n);

}  // namespace ztrain::vec
