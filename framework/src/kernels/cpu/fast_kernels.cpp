// The fast cpu kernels: where the reference loops leave the machine idle,
// these restructure the op around BLAS or vector-friendly loops. Each
// overrides its ReferenceKernels twin and is tested against it.
#include <cblas.h>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <algorithm>
#include <cmath>

#include "kernels/cpu/reference_kernels.h"

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

class FastKernels final : public ReferenceKernels {
 public:
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
