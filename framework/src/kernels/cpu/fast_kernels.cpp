// The fast cpu kernels: where the reference loops leave the machine idle,
// these restructure the op around BLAS or vector-friendly loops. Each
// overrides its ReferenceKernels twin and is tested against it.
#include <cblas.h>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/reference_kernels.h"
#include "kernels/cpu/vector_math.h"

namespace ztrain {
namespace {

// OpenBLAS runs single-threaded inside a oneTBB loop (the loop owns the
// cores); the previous thread count comes back when the scope ends.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~SingleThreadedBlas() { openblas_set_num_threads(saved_); }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

// Row t of a causal score matrix s: (T) -> softmax over [0, t], zero after.
void causal_softmax_row(float* s, int t, int T) {
  float maxv = -INFINITY;
  for (int j = 0; j <= t; ++j) maxv = std::max(maxv, s[j]);
  float sum = 0;
  for (int j = 0; j <= t; ++j) {
    s[j] = std::exp(s[j] - maxv);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int j = 0; j <= t; ++j) s[j] *= inv;
  std::fill(s + t + 1, s + T, 0.0f);
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

class FastKernels final : public ReferenceKernels {
 public:
  void gelu_forward(float* out, const float* inp, std::size_t n) const override {
    if (!vec::have_avx2_fma()) return ReferenceKernels::gelu_forward(out, inp, n);
    parallel_chunks(n, kElementGrain, [&](std::size_t a, std::size_t b) {
      vec::gelu_forward_avx2(out + a, inp + a, b - a);
    });
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout,
                     std::size_t n) const override {
    if (!vec::have_avx2_fma()) return ReferenceKernels::gelu_backward(dinp, inp, dout, n);
    parallel_chunks(n, kElementGrain, [&](std::size_t a, std::size_t b) {
      vec::gelu_backward_avx2(dinp + a, inp + a, dout + a, b - a);
    });
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

  void adamw(float* p, float* g, float* m, float* v, std::size_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float grad_mult, float bc1,
             float bc2) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::adamw(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_mult,
                                     bc1, bc2);
    parallel_chunks(n, 65536, [&](std::size_t a, std::size_t b) {
      vec::adamw_avx2(p + a, g + a, m + a, v + a, b - a, lr, beta1, beta2, eps, weight_decay,
                      grad_mult, bc1, bc2);
    });
  }

  // Fixed 64K-element chunks, each summed by one vector loop, combined in
  // order: independent of the thread count.
  double sum_squares(const float* x, std::size_t n) const override {
    if (!vec::have_avx2_fma()) return ReferenceKernels::sum_squares(x, n);
    constexpr std::size_t kChunk = 65536;
    const std::size_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> partial(chunks);
    oneapi::tbb::parallel_for(std::size_t{0}, chunks, [&](std::size_t c) {
      partial[c] =
          vec::sum_squares_avx2(x + c * kChunk, std::min(n, (c + 1) * kChunk) - c * kChunk);
    });
    double total = 0;
    for (double s : partial) total += s;
    return total;
  }

  // logits: (N,V) -> probs in place; losses: (N). One pass for the maximum,
  // one vectorised pass for exp and the sum, one to normalise.
  void softmax_crossentropy_forward(float* losses, float* logits, const std::int32_t* targets,
                                    int N, int V) const override {
    if (!vec::have_avx2_fma())
      return ReferenceKernels::softmax_crossentropy_forward(losses, logits, targets, N, V);
    oneapi::tbb::parallel_for(0, N, [&](int n) {
      float* x = logits + static_cast<std::size_t>(n) * V;
      const float maxv = *std::max_element(x, x + V);
      const float target_logit = x[targets[n]];
      const float sum = vec::exp_shifted_sum_avx2(x, static_cast<std::size_t>(V), maxv);
      const float inv = 1.0f / sum;
      for (int i = 0; i < V; ++i) x[i] *= inv;
      losses[n] = std::log(sum) + maxv - target_logit;
    });
  }

  // Per (batch, head): S = scale * Q K^T and O = P V as GEMMs on the strided
  // head slices; heads run in parallel with single-threaded BLAS.
  // q: (B,T,NH,hs) rows of q_stride; k, v: (B,T,NKV,hs) rows of kv_stride;
  // out: (B,T,NH*hs); probs: (B,NH,T,T)
  void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
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
      float* p = probs + static_cast<std::size_t>(bh) * T * T;
      float* o = out + static_cast<std::size_t>(b) * T * C + h * hs;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, qh, q_stride, kh,
                  kv_stride, 0.0f, p, T);
      for (int t = 0; t < T; ++t) causal_softmax_row(p + static_cast<std::size_t>(t) * T, t, T);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, vh, kv_stride,
                  0.0f, o, C);
    });
  }

  // Per (batch, key/value head), its query heads in order (they share dk, dv):
  // dV += P^T dO; dP = dO V^T; dS = P (dP - rowsum(P dP)) * scale;
  // dQ += dS K; dK += dS^T Q.
  void attention_backward(float* dq, float* dk, float* dv, float* dscratch, const float* dout,
                          const float* q, const float* k, const float* v, const float* probs, int B,
                          int T, int NH, int NKV, int hs, int q_stride,
                          int kv_stride) const override {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int group = NH / NKV, C = NH * hs;
    SingleThreadedBlas single;
    oneapi::tbb::parallel_for(0, B * NKV, [&](int bk) {
      const int b = bk / NKV, kvh = bk % NKV;
      const std::size_t kv_off = static_cast<std::size_t>(b) * T * kv_stride + kvh * hs;
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const std::size_t bh = static_cast<std::size_t>(b) * NH + h;
        const float* p = probs + bh * T * T;
        float* ds = dscratch + bh * T * T;
        const float* doh = dout + static_cast<std::size_t>(b) * T * C + h * hs;
        const std::size_t q_off = static_cast<std::size_t>(b) * T * q_stride + h * hs;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, doh, C, 1.0f,
                    dv + kv_off, kv_stride);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, doh, C, v + kv_off,
                    kv_stride, 0.0f, ds, T);
        for (int t = 0; t < T; ++t) {
          const float* pr = p + static_cast<std::size_t>(t) * T;
          float* dr = ds + static_cast<std::size_t>(t) * T;
          float dot = 0;
          for (int j = 0; j <= t; ++j) dot += pr[j] * dr[j];
          for (int j = 0; j <= t; ++j) dr[j] = pr[j] * (dr[j] - dot) * scale;
          std::fill(dr + t + 1, dr + T, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, ds, T, k + kv_off,
                    kv_stride, 1.0f, dq + q_off, q_stride);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, ds, T, q + q_off,
                    q_stride, 1.0f, dk + kv_off, kv_stride);
      }
    });
  }
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() {
  return std::make_unique<FastKernels>();
}

}  // namespace ztrain
