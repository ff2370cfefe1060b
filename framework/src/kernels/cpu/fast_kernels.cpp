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

// Query rows per block: a block of queries needs keys [0, block end), so the
// causal half of the score matrix is never computed, and scratch stays
// (kQueryBlock x T) per thread.
constexpr int kQueryBlock = 64;

// Per-thread scratch that grows to the largest request and is then reused:
// no allocation in the steady state.
std::vector<float>& scratch(int slot, std::size_t n) {
  thread_local std::vector<float> buffers[2];
  auto& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b;
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

float exp_shifted_sum(float* x, int n, float shift) {
  float sum = 0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
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

  // Per (batch, head, block of queries [t0, t1)): S = scale * Q K[0:t1]^T as
  // a GEMM, causal softmax row by row (keeping each row's log-sum-exp), then
  // O = P V[0:t1]. Heads run in parallel with single-threaded BLAS.
  // q: (B,T,NH,hs) rows of q_stride; k, v: (B,T,NKV,hs) rows of kv_stride;
  // out: (B,T,NH*hs); lse: (B,NH,T)
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
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
      float* oh = out + static_cast<std::size_t>(b) * T * C + h * hs;
      float* lh = lse + static_cast<std::size_t>(bh) * T;
      float* s = scratch(0, static_cast<std::size_t>(kQueryBlock) * T).data();
      for (int t0 = 0; t0 < T; t0 += kQueryBlock) {
        const int t1 = std::min(T, t0 + kQueryBlock), rows = t1 - t0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, hs, scale,
                    qh + static_cast<std::size_t>(t0) * q_stride, q_stride, kh, kv_stride, 0.0f, s,
                    t1);
        for (int r = 0; r < rows; ++r) {
          float* row = s + static_cast<std::size_t>(r) * t1;
          const int t = t0 + r;
          const float maxv = *std::max_element(row, row + t + 1);
          const float sum = vec::have_avx2_fma()
                                ? vec::exp_shifted_sum_avx2(row, static_cast<std::size_t>(t) + 1, maxv)
                                : exp_shifted_sum(row, t + 1, maxv);
          const float inv = 1.0f / sum;
          for (int j = 0; j <= t; ++j) row[j] *= inv;
          std::fill(row + t + 1, row + t1, 0.0f);
          lh[t] = maxv + std::log(sum);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, t1, 1.0f, s, t1, vh,
                    kv_stride, 0.0f, oh + static_cast<std::size_t>(t0) * C, C);
      }
    });
  }

  // Per (batch, key/value head), its query heads in order (they share dk,
  // dv), per block of queries [t0, t1) against keys [0, t1):
  // P = exp(scale Q K^T - lse); dV += P^T dO; dP = dO V^T;
  // dS = P (dP - rowsum(dO * O)) * scale; dQ += dS K; dK += dS^T Q.
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* q, const float* k, const float* v, const float* lse, int B,
                          int T, int NH, int NKV, int hs, int q_stride,
                          int kv_stride) const override {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int group = NH / NKV, C = NH * hs;
    SingleThreadedBlas single;
    oneapi::tbb::parallel_for(0, B * NKV, [&](int bk) {
      const int b = bk / NKV, kvh = bk % NKV;
      const std::size_t kv_off = static_cast<std::size_t>(b) * T * kv_stride + kvh * hs;
      float* p = scratch(0, static_cast<std::size_t>(kQueryBlock) * T).data();
      float* ds = scratch(1, static_cast<std::size_t>(kQueryBlock) * T).data();
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const std::size_t bh = static_cast<std::size_t>(b) * NH + h;
        const std::size_t q_off = static_cast<std::size_t>(b) * T * q_stride + h * hs;
        const std::size_t o_off = static_cast<std::size_t>(b) * T * C + h * hs;
        for (int t0 = 0; t0 < T; t0 += kQueryBlock) {
          const int t1 = std::min(T, t0 + kQueryBlock), rows = t1 - t0;
          const float* qb = q + q_off + static_cast<std::size_t>(t0) * q_stride;
          const float* dob = dout + o_off + static_cast<std::size_t>(t0) * C;
          const float* ob = out + o_off + static_cast<std::size_t>(t0) * C;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, hs, scale, qb, q_stride,
                      k + kv_off, kv_stride, 0.0f, p, t1);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, hs, 1.0f, dob, C,
                      v + kv_off, kv_stride, 0.0f, ds, t1);
          for (int r = 0; r < rows; ++r) {
            const int t = t0 + r;
            float* pr = p + static_cast<std::size_t>(r) * t1;
            float* dr = ds + static_cast<std::size_t>(r) * t1;
            const float l = lse[bh * T + t];
            const float* dor = dob + static_cast<std::size_t>(r) * C;
            const float* orow = ob + static_cast<std::size_t>(r) * C;
            float d = 0;
            for (int i = 0; i < hs; ++i) d += dor[i] * orow[i];
            for (int j = 0; j <= t; ++j) {
              pr[j] = std::exp(pr[j] - l);
              dr[j] = pr[j] * (dr[j] - d) * scale;
            }
            std::fill(pr + t + 1, pr + t1, 0.0f);
            std::fill(dr + t + 1, dr + t1, 0.0f);
          }
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, hs, rows, 1.0f, p, t1, dob, C,
                      1.0f, dv + kv_off, kv_stride);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, t1, 1.0f, ds, t1,
                      k + kv_off, kv_stride, 1.0f, dq + q_off + static_cast<std::size_t>(t0) * q_stride,
                      q_stride);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, hs, rows, 1.0f, ds, t1, qb,
                      q_stride, 1.0f, dk + kv_off, kv_stride);
        }
      }
    });
  }

};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() {
  return std::make_unique<FastKernels>();
}

}  // namespace ztrain
