// The reference cpu kernels: plain loops parallelised with oneTBB over
// independent rows (or channel blocks where rows would race), GEMMs through
// OpenBLAS with transposes folded into the call. Every reduction has a fixed
// order, so results do not depend on how oneTBB schedules the work. The fast
// kernels (fast_kernels.cpp) override some of these and are tested against
// them.
#include "kernels/cpu/reference_kernels.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/adamw_runs.h"
#include "kernels/cpu/blas.h"

namespace ztrain {
namespace {

template <class F>
void parallel_rows(std::size_t n, std::size_t grain, F&& f) {
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<std::size_t>(0, n, std::max<std::size_t>(1, grain)),
      [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
        for (std::size_t i = r.begin(); i != r.end(); ++i) f(i);
      });
}

template <class F>
void parallel_chunks(std::size_t n, std::size_t grain, F&& f) {
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<std::size_t>(0, n, std::max<std::size_t>(1, grain)),
      [&](const oneapi::tbb::blocked_range<std::size_t>& r) { f(r.begin(), r.end()); });
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

// The reference reads a 16-bit operand through a whole fp32 copy: the
// plainest statement of "read in fp32". f32 operands are used in place, so
// the fp32 results are exactly those of the fp32 loops.
class Widened {
 public:
  Widened(ConstTypedPtr x, std::size_t n) {
    if (!x || x.dtype == DType::f32) {
      data_ = static_cast<const float*>(x.data);
      return;
    }
    copy_.resize(n);
    convert(x.data, x.dtype, copy_.data(), DType::f32, n);
    data_ = copy_.data();
  }
  const float* get() const { return data_; }

 private:
  std::vector<float> copy_;
  const float* data_ = nullptr;
};

// A gradient the op adds into: a 16-bit one is widened to fp32, takes the
// whole op's contribution there, and store() rounds it back once.
class WidenedGrad {
 public:
  WidenedGrad(TypedPtr g, std::size_t n) : g_(g), n_(n) {
    if (!g || g.dtype == DType::f32) {
      data_ = static_cast<float*>(g.data);
      return;
    }
    copy_.resize(n);
    convert(g.data, g.dtype, copy_.data(), DType::f32, n);
    data_ = copy_.data();
  }
  float* get() const { return data_; }
  void store() const {
    if (!copy_.empty()) convert(copy_.data(), DType::f32, g_.data, g_.dtype, n_);
  }

 private:
  TypedPtr g_;
  std::size_t n_;
  std::vector<float> copy_;
  float* data_ = nullptr;
};

// Rows of an embedding table the tokens it holds reach (the table's size
// is not passed).
std::size_t rows_used(const std::int32_t* tokens, TokenShape s) {
  std::size_t used = 0;
  for (std::size_t i = 0; i < s.B * s.T; ++i)
    if (s.holds(tokens[i]))
      used = std::max(used, static_cast<std::size_t>(tokens[i]) - s.vocab_first + 1);
  return used;
}

void rotate(float* x, const float* cos, const float* sin, HeadShape sh, float direction) {
  const std::size_t half = sh.hs / 2;
  parallel_rows(sh.B * sh.T, 16, [&](std::size_t bt) {
    const std::size_t t = sh.positions ? static_cast<std::size_t>(sh.positions[bt]) : bt % sh.T;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (std::size_t h = 0; h < sh.H; ++h) {
      float* r = x + bt * sh.stride + h * sh.hs;
      for (std::size_t i = 0; i < half; ++i) {
        const float x0 = r[i], x1 = r[i + half];
        const float si = direction * s[i];
        r[i] = x0 * c[i] - x1 * si;
        r[i + half] = x1 * c[i] + x0 * si;
      }
    }
  });
}

}  // namespace

// out: (B,T,C), tokens: (B,T), wte: (V,C), wpe: (T,C) or null
void ReferenceKernels::embedding_forward(float* out, const std::int32_t* tokens,
                                         ConstTypedPtr wte_in, ConstTypedPtr wpe_in,
                                         TokenShape s) const {
  const std::size_t BT = s.B * s.T, C = s.C;
  const Widened wte_f(wte_in, rows_used(tokens, s) * C);
  const Widened wpe_f(wpe_in, s.T * C);
  const float* wte = wte_f.get();
  const float* wpe = wpe_f.get();
  parallel_rows(BT, 16, [&](std::size_t bt) {
    const std::size_t t = bt % s.T;
    float* o = out + bt * C;
    if (!s.holds(tokens[bt])) {
      if (wpe) return static_cast<void>(std::copy(wpe + t * C, wpe + (t + 1) * C, o));
      return std::fill(o, o + C, 0.0f);
    }
    const float* e = wte + (static_cast<std::size_t>(tokens[bt]) - s.vocab_first) * C;
    if (wpe) {
      const float* p = wpe + t * C;
      for (std::size_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      std::copy(e, e + C, o);
    }
  });
}

// Parallel over channel blocks so that two rows with the same token never race.
void ReferenceKernels::embedding_backward(TypedPtr dwte_out, TypedPtr dwpe_out, const float* dout,
                                          const std::int32_t* tokens, TokenShape s) const {
  const std::size_t BT = s.B * s.T, C = s.C;
  const WidenedGrad dwte_f(dwte_out, rows_used(tokens, s) * C);
  const WidenedGrad dwpe_f(dwpe_out, s.T * C);
  float* dwte = dwte_f.get();
  float* dwpe = dwpe_f.get();
  parallel_chunks(C, 16, [&](std::size_t c0, std::size_t c1) {
    for (std::size_t bt = 0; bt < BT; ++bt) {
      const float* d = dout + bt * C;
      if (dwte && s.holds(tokens[bt])) {  // null: a frozen table
        float* e = dwte + (static_cast<std::size_t>(tokens[bt]) - s.vocab_first) * C;
        for (std::size_t c = c0; c < c1; ++c) e[c] += d[c];
      }
      if (dwpe) {
        float* p = dwpe + (bt % s.T) * C;
        for (std::size_t c = c0; c < c1; ++c) p[c] += d[c];
      }
    }
  });
  dwte_f.store();
  dwpe_f.store();
}

// inp, out: (N,C); mean, rstd: (N); w, b: (C)
void ReferenceKernels::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                         ConstTypedPtr w_in, ConstTypedPtr b_in, RowShape s,
                                         float eps) const {
  const std::size_t C = s.C;
  const Widened w_f(w_in, C), b_f(b_in, C);
  const float* w = w_f.get();
  const float* b = b_f.get();
  parallel_rows(s.N, 8, [&](std::size_t n) {
    const float* x = inp + n * C;
    float m = 0;
    for (std::size_t c = 0; c < C; ++c) m += x[c];
    m /= static_cast<float>(C);
    float v = 0;
    for (std::size_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= static_cast<float>(C);
    const float r = 1.0f / std::sqrt(v + eps);
    float* o = out + n * C;
    for (std::size_t c = 0; c < C; ++c) o[c] = (x[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  });
}

void ReferenceKernels::layernorm_backward(float* dinp, TypedPtr dw_out, TypedPtr db_out,
                                          const float* dout, const float* inp, ConstTypedPtr w_in,
                                          const float* mean, const float* rstd, RowShape s) const {
  const std::size_t C = s.C;
  const Widened w_f(w_in, C);
  const WidenedGrad dw_f(dw_out, C), db_f(db_out, C);
  const float* w = w_f.get();
  float* dw = dw_f.get();
  float* db = db_f.get();
  parallel_rows(s.N, 8, [&](std::size_t n) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    float dnorm_mean = 0, dnorm_norm_mean = 0;
    for (std::size_t c = 0; c < C; ++c) {
      const float norm = (x[c] - mean[n]) * rstd[n];
      const float dnorm = w[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<float>(C);
    dnorm_norm_mean /= static_cast<float>(C);
    float* di = dinp + n * C;
    for (std::size_t c = 0; c < C; ++c) {
      const float norm = (x[c] - mean[n]) * rstd[n];
      const float dnorm = w[c] * d[c];
      di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
    }
  });
  // A frozen norm (null dw and db) gets no weight gradients.
  if (dw || db)
    parallel_chunks(C, 16, [&](std::size_t c0, std::size_t c1) {
      for (std::size_t n = 0; n < s.N; ++n) {
        const float* x = inp + n * C;
        const float* d = dout + n * C;
        for (std::size_t c = c0; c < c1; ++c) {
          if (dw) dw[c] += (x[c] - mean[n]) * rstd[n] * d[c];
          if (db) db[c] += d[c];
        }
      }
    });
  dw_f.store();
  db_f.store();
}

void ReferenceKernels::add_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                             const float* a, const float* b, ConstTypedPtr w,
                                             ConstTypedPtr bias, RowShape s, float eps) const {
  add(res, a, b, s.N * s.C);
  layernorm_forward(out, mean, rstd, res, w, bias, s, eps);
}

void ReferenceKernels::add_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                           const float* b, ConstTypedPtr w, RowShape s,
                                           float eps) const {
  add(res, a, b, s.N * s.C);
  rmsnorm_forward(out, rstd, res, w, s, eps);
}

// inp, out: (N,C); rstd: (N); w: (C)
void ReferenceKernels::rmsnorm_forward(float* out, float* rstd, const float* inp,
                                       ConstTypedPtr w_in, RowShape s, float eps) const {
  const std::size_t C = s.C;
  const Widened w_f(w_in, C);
  const float* w = w_f.get();
  parallel_rows(s.N, 8, [&](std::size_t n) {
    const float* x = inp + n * C;
    float ss = 0;
    for (std::size_t c = 0; c < C; ++c) ss += x[c] * x[c];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    float* o = out + n * C;
    for (std::size_t c = 0; c < C; ++c) o[c] = x[c] * r * w[c];
    rstd[n] = r;
  });
}

void ReferenceKernels::rmsnorm_backward(float* dinp, TypedPtr dw_out, const float* dout,
                                        const float* inp, ConstTypedPtr w_in, const float* rstd,
                                        RowShape s) const {
  const std::size_t C = s.C;
  const Widened w_f(w_in, C);
  const WidenedGrad dw_f(dw_out, C);
  const float* w = w_f.get();
  float* dw = dw_f.get();
  parallel_rows(s.N, 8, [&](std::size_t n) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    float dot = 0;
    for (std::size_t c = 0; c < C; ++c) dot += w[c] * d[c] * x[c] * rstd[n];
    dot /= static_cast<float>(C);
    float* di = dinp + n * C;
    for (std::size_t c = 0; c < C; ++c) di[c] += rstd[n] * (w[c] * d[c] - x[c] * rstd[n] * dot);
  });
  if (dw)  // null: a frozen norm
    parallel_chunks(C, 16, [&](std::size_t c0, std::size_t c1) {
      for (std::size_t n = 0; n < s.N; ++n) {
        const float* x = inp + n * C;
        const float* d = dout + n * C;
        for (std::size_t c = c0; c < c1; ++c) dw[c] += x[c] * rstd[n] * d[c];
      }
    });
  dw_f.store();
}

namespace {

// dbias (OC) += the column sums of d (N,OC), row after row; nothing for a
// null dbias. A bias's gradient (matmul's, GELU's fc bias).
void add_column_sums(float* dbias, const float* d, std::size_t N, std::size_t OC) {
  if (!dbias) return;
  parallel_chunks(OC, 64, [&](std::size_t o0, std::size_t o1) {
    for (std::size_t n = 0; n < N; ++n) {
      const float* row = d + n * OC;
      for (std::size_t o = o0; o < o1; ++o) dbias[o] += row[o];
    }
  });
}

}  // namespace

// out: (N,OC) = inp (N,C) @ w^T, w: (OC,C)
void ReferenceKernels::matmul_forward(float* out, const float* inp, ConstTypedPtr w_in,
                                      ConstTypedPtr bias_in, MatmulShape s) const {
  // Named copies, not a structured binding: lambdas below capture them,
  // which clang before 16 refuses for bindings.
  const std::size_t N = s.N, C = s.C, OC = s.OC;
  const Widened w_f(w_in, OC * C);
  const Widened bias_f(bias_in, OC);
  const float* w = w_f.get();
  const float* bias = bias_f.get();
  float beta = 0.0f;
  if (bias) {
    parallel_rows(N, 64, [&](std::size_t n) { std::copy(bias, bias + OC, out + n * OC); });
    beta = 1.0f;
  }
  blas::sgemm(blas::Op::none, blas::Op::transpose, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

void ReferenceKernels::matmul_backward(float* dinp, TypedPtr dw_out, TypedPtr dbias_out,
                                       const float* dout, const float* inp, ConstTypedPtr w_in,
                                       MatmulShape s) const {
  const std::size_t N = s.N, C = s.C, OC = s.OC;
  const Widened w_f(dinp ? w_in : nullptr, OC * C);
  const WidenedGrad dw_f(dw_out, OC * C);
  const WidenedGrad dbias_f(dbias_out, OC);
  const float* w = w_f.get();
  float* dw = dw_f.get();
  float* dbias = dbias_f.get();
  // dinp (N,C) += dout (N,OC) @ w (OC,C)
  if (dinp)
    blas::sgemm(blas::Op::none, blas::Op::none, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
  // dw (OC,C) += dout^T (OC,N) @ inp (N,C); null when the fast kernels
  // compute it themselves.
  if (dw)
    blas::sgemm(blas::Op::transpose, blas::Op::none, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
  add_column_sums(dbias, dout, N, OC);
  dw_f.store();
  dbias_f.store();
}

namespace {

// f(i, x) for every element i of s's (N,H) rows, x = pre[i] plus its column's
// bias (none when null), added in fp32 as the fc GEMM's epilogue would.
template <class F>
void each_biased(const float* pre, ConstTypedPtr bias_in, RowShape s, F&& f) {
  const Widened bias_f(bias_in, s.C);
  const float* bias = bias_f.get();
  parallel_rows(s.N, 16, [&](std::size_t n) {
    for (std::size_t h = 0; h < s.C; ++h) {
      const std::size_t i = n * s.C + h;
      f(i, pre[i] + (bias ? bias[h] : 0.0f));
    }
  });
}

}  // namespace

// GELU, tanh form, written as x * sigmoid(2u): 0.5 (1 + tanh(u)) equals
// sigmoid(2u) exactly and avoids the cancellation of 1 + tanh for x < 0.
void ReferenceKernels::gelu_forward(float* out, const float* pre, ConstTypedPtr bias,
                                    RowShape s) const {
  each_biased(pre, bias, s, [&](std::size_t i, float x) {
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = x / (1.0f + std::exp(-2.0f * u));
  });
}

void ReferenceKernels::gelu_backward(float* dpre, TypedPtr dbias_out, const float* pre,
                                     ConstTypedPtr bias, const float* dout, RowShape shape) const {
  each_biased(pre, bias, shape, [&](std::size_t i, float x) {
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float s = 1.0f / (1.0f + std::exp(-2.0f * u));
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dpre[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
  });
  const WidenedGrad dbias_f(dbias_out, shape.C);
  add_column_sums(dbias_f.get(), dpre, shape.N, shape.C);
  dbias_f.store();
}

void ReferenceKernels::swiglu_forward(float* out, const float* gate, const float* up,
                                      std::size_t n) const {
  parallel_chunks(n, 4096, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void ReferenceKernels::swiglu_backward(float* dgate, float* dup, const float* dout,
                                       const float* gate, const float* up, std::size_t n) const {
  parallel_chunks(n, 4096, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) {
      const float g = gate[i];
      const float sig = 1.0f / (1.0f + std::exp(-g));
      const float silu = g * sig;
      dgate[i] += dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
      dup[i] += dout[i] * silu;
    }
  });
}

// x: (B,T,H,hs) rows of `stride`; cos, sin: (T, hs/2)
void ReferenceKernels::rope_forward(float* x, const float* cos, const float* sin,
                                    HeadShape s) const {
  rotate(x, cos, sin, s, 1.0f);
}
void ReferenceKernels::rope_backward(float* dx, const float* cos, const float* sin,
                                     HeadShape s) const {
  rotate(dx, cos, sin, s, -1.0f);
}

void ReferenceKernels::attention_forward(float* out, float* lse, AttentionInputs in,
                                         AttentionShape s) const {
  attention_block_forward(out, lse, in, whole_block(s));
}

void ReferenceKernels::attention_backward(AttentionGrads d, const float* dout, const float* out,
                                          AttentionInputs in, const float* lse,
                                          AttentionShape s) const {
  attention_block_backward(d, dout, out, in, lse, whole_block(s));
}

// Row by row: scores, softmax and the weighted sum of values; lse keeps
// what backward needs to rebuild a row of probabilities. Query first + i
// sees keys [0, i] on the diagonal (from its example's first where rows
// pack examples), all of them otherwise.
void ReferenceKernels::attention_block_forward(float* out, float* lse, AttentionInputs in,
                                               AttentionBlock sh) const {
  const std::size_t NH = sh.NH, hs = sh.hs, C = sh.C();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  parallel_rows(sh.B * NH, 1, [&](std::size_t bh) {
    const std::size_t b = bh / NH, h = bh % NH, kvh = h / sh.group();
    std::vector<float> p(sh.keys);
    for (std::size_t i = 0; i < sh.rows; ++i) {
      const std::size_t t = sh.first + i, seen = sh.causal ? i + 1 : sh.keys;
      const std::size_t from = sh.first_key(b, i);
      const float* qt = in.q + (b * sh.T + t) * sh.q_stride + h * hs;
      float maxv = -INFINITY;
      for (std::size_t s = from; s < seen; ++s) {
        const float* ks = in.k + (b * sh.Tkv + s) * sh.kv_stride + kvh * hs;
        float dot = 0;
        for (std::size_t e = 0; e < hs; ++e) dot += qt[e] * ks[e];
        p[s] = dot * scale;
        maxv = std::max(maxv, p[s]);
      }
      float sum = 0;
      for (std::size_t s = from; s < seen; ++s) {
        p[s] = std::exp(p[s] - maxv);
        sum += p[s];
      }
      lse[bh * sh.T + t] = maxv + std::log(sum);
      float* o = out + (b * sh.T + t) * C + h * hs;
      std::fill(o, o + hs, 0.0f);
      for (std::size_t s = from; s < seen; ++s) {
        const float* vs = in.v + (b * sh.Tkv + s) * sh.kv_stride + kvh * hs;
        for (std::size_t e = 0; e < hs; ++e) o[e] += p[s] / sum * vs[e];
      }
    }
  });
}

// Parallel over (batch, key/value head): the query heads of one group all
// write the same dk, dv rows, so they run in one task, in order. Per row:
// p = exp(s - lse); dp = dout . v; ds = p (dp - dout . out) * scale.
void ReferenceKernels::attention_block_backward(AttentionGrads g, const float* dout,
                                                const float* out, AttentionInputs in,
                                                const float* lse, AttentionBlock sh) const {
  const std::size_t NH = sh.NH, NKV = sh.NKV, hs = sh.hs, C = sh.C();
  const std::size_t group = sh.group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  parallel_rows(sh.B * NKV, 1, [&](std::size_t bk) {
    const std::size_t b = bk / NKV, kvh = bk % NKV;
    std::vector<float> p(sh.keys);
    for (std::size_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      const std::size_t bh = b * NH + h;
      for (std::size_t i = 0; i < sh.rows; ++i) {
        const std::size_t t = sh.first + i, seen = sh.causal ? i + 1 : sh.keys;
        const std::size_t from = sh.first_key(b, i);
        const std::size_t row = b * sh.T + t;
        const float* qt = in.q + row * sh.q_stride + h * hs;
        float* dqt = g.dq + row * sh.q_stride + h * hs;
        const float* dot = dout + row * C + h * hs;
        const float* ot = out + row * C + h * hs;
        float d = 0;
        for (std::size_t e = 0; e < hs; ++e) d += dot[e] * ot[e];
        for (std::size_t s = from; s < seen; ++s) {
          const float* ks = in.k + (b * sh.Tkv + s) * sh.kv_stride + kvh * hs;
          float sc = 0;
          for (std::size_t e = 0; e < hs; ++e) sc += qt[e] * ks[e];
          p[s] = std::exp(sc * scale - lse[bh * sh.T + t]);
        }
        for (std::size_t s = from; s < seen; ++s) {
          const std::size_t kv_row = (b * sh.Tkv + s) * sh.kv_stride + kvh * hs;
          const float* vs = in.v + kv_row;
          float* dvs = g.dv + kv_row;
          float dp = 0;
          for (std::size_t e = 0; e < hs; ++e) {
            dp += dot[e] * vs[e];
            dvs[e] += p[s] * dot[e];
          }
          const float ds = p[s] * (dp - d) * scale;
          const float* ks = in.k + kv_row;
          float* dks = g.dk + kv_row;
          for (std::size_t e = 0; e < hs; ++e) {
            dqt[e] += ds * ks[e];
            dks[e] += ds * qt[e];
          }
        }
      }
    }
  });
}

// Per (batch, head) row: the two log-sum-exps combined around their
// maximum (neither is -inf: every row of a block sees a key), then the
// outputs weighted by their shares of the combined sum.
void ReferenceKernels::attention_merge(float* out, float* lse, const float* block_out,
                                       const float* block_lse, AttentionBlock s) const {
  const std::size_t NH = s.NH, hs = s.hs, C = s.C();
  parallel_rows(s.B * NH, 1, [&](std::size_t bh) {
    const std::size_t b = bh / NH, h = bh % NH;
    for (std::size_t t = s.first; t < s.first + s.rows; ++t) {
      const std::size_t at = bh * s.T + t;
      const float a = lse[at], c = block_lse[at], m = std::max(a, c);
      const float merged = m + std::log(std::exp(a - m) + std::exp(c - m));
      const float wa = std::exp(a - merged), wc = std::exp(c - merged);
      float* o = out + (b * s.T + t) * C + h * hs;
      const float* x = block_out + (b * s.T + t) * C + h * hs;
      for (std::size_t e = 0; e < hs; ++e) o[e] = wa * o[e] + wc * x[e];
      lse[at] = merged;
    }
  });
}

void ReferenceKernels::add(float* out, const float* a, const float* b, std::size_t n) const {
  parallel_chunks(n, 8192, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

void ReferenceKernels::scale(float* x, float alpha, std::size_t n) const {
  parallel_chunks(n, 8192, [&](std::size_t i0, std::size_t i1) {
    for (std::size_t i = i0; i < i1; ++i) x[i] *= alpha;
  });
}

// logits: (N,V) -> probs in place; losses: (N)
void ReferenceKernels::softmax_crossentropy_forward(float* losses, float* logits,
                                                    const std::int32_t* targets, RowShape s) const {
  const std::size_t V = s.C;
  parallel_rows(s.N, 4, [&](std::size_t n) {
    float* x = logits + n * V;
    if (targets[n] == kIgnoreTarget) {
      losses[n] = 0.0f;
      return;
    }
    float maxv = -INFINITY;
    for (std::size_t i = 0; i < V; ++i) maxv = std::max(maxv, x[i]);
    const float target_logit = x[targets[n]];
    float sum = 0;
    for (std::size_t i = 0; i < V; ++i) {
      x[i] = std::exp(x[i] - maxv);
      sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (std::size_t i = 0; i < V; ++i) x[i] *= inv;
    losses[n] = std::log(sum) + maxv - target_logit;
  });
}

void ReferenceKernels::softmax_crossentropy_backward(float* probs, const std::int32_t* targets,
                                                     float dloss, RowShape s) const {
  parallel_rows(s.N, 4, [&](std::size_t n) {
    float* p = probs + n * s.C;
    if (targets[n] == kIgnoreTarget) return std::fill(p, p + s.C, 0.0f);
    p[targets[n]] -= 1.0f;
    for (std::size_t i = 0; i < s.C; ++i) p[i] *= dloss;
  });
}

// logits: (N,V) over vocabulary ids [first, first + V); row_max: (N)
void ReferenceKernels::crossentropy_slice_max(float* row_max, const float* logits,
                                              VocabShape s) const {
  parallel_rows(s.N, 4, [&](std::size_t n) {
    const float* x = logits + n * s.V;
    row_max[n] = *std::max_element(x, x + s.V);
  });
}

// sums: (2,N), the exp sums then the target logits; logits -> exps in place
void ReferenceKernels::crossentropy_slice_sums(float* sums, float* logits, const float* row_max,
                                               const std::int32_t* targets, VocabShape s) const {
  parallel_rows(s.N, 4, [&](std::size_t n) {
    float* x = logits + n * s.V;
    sums[s.N + n] = s.holds(targets[n]) ? x[static_cast<std::size_t>(targets[n]) - s.first] : 0.0f;
    float sum = 0;
    for (std::size_t i = 0; i < s.V; ++i) {
      x[i] = std::exp(x[i] - row_max[n]);
      sum += x[i];
    }
    sums[n] = sum;
  });
}

void ReferenceKernels::crossentropy_slice_loss(float* losses, const float* row_max,
                                               const float* sums, const std::int32_t* targets,
                                               std::size_t N) const {
  for (std::size_t n = 0; n < N; ++n)
    losses[n] = targets[n] == kIgnoreTarget ? 0.0f : std::log(sums[n]) + row_max[n] - sums[N + n];
}

void ReferenceKernels::crossentropy_slice_backward(float* exps, const float* sums,
                                                   const std::int32_t* targets, float dloss,
                                                   VocabShape s) const {
  parallel_rows(s.N, 4, [&](std::size_t n) {
    float* p = exps + n * s.V;
    if (targets[n] == kIgnoreTarget) return std::fill(p, p + s.V, 0.0f);
    const float inv = 1.0f / sums[n];
    for (std::size_t i = 0; i < s.V; ++i) p[i] *= inv;
    if (s.holds(targets[n])) p[static_cast<std::size_t>(targets[n]) - s.first] -= 1.0f;
    for (std::size_t i = 0; i < s.V; ++i) p[i] *= dloss;
  });
}

// Fixed 64K-element chunks (each widened on its own) summed in double, then
// combined in order: the result does not depend on the thread count at all.
void ReferenceKernels::sum_squares_add(StepScalars* s, ConstTypedPtr x_in, std::size_t n) const {
  constexpr std::size_t kChunk = 65536;
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
  parallel_rows(chunks, 1, [&](std::size_t c) {
    const std::size_t k = std::min(n, (c + 1) * kChunk) - c * kChunk;
    const Widened x_f(x_in.at(c * kChunk), k);
    const float* x = x_f.get();
    double sum = 0;
    for (std::size_t i = 0; i < k; ++i) sum += static_cast<double>(x[i]) * x[i];
    partial[c] = sum;
  });
  double total = 0;
  for (double sum : partial) total += sum;
  s->sum_squares += total;
}

void ReferenceKernels::grad_norm_unscale(StepScalars* s, double loss_scale) const {
  s->sum_squares /= loss_scale * loss_scale;
  s->reduced = static_cast<float>(s->sum_squares);
}

void ReferenceKernels::grad_norm_finish(StepScalars* s, bool across_ranks, double loss_scale,
                                        double grad_clip) const {
  const double norm = std::sqrt(across_ranks ? static_cast<double>(s->reduced) : s->sum_squares);
  s->grad_norm = norm;
  s->skip = std::isfinite(norm) ? 0 : 1;
  float clip = 1.0f;  // DeepSpeed's 1 / max(1, norm / max_norm)
  if (grad_clip > 0 && std::isfinite(norm) && norm / grad_clip > 1.0)
    clip = static_cast<float>(1.0 / (norm / grad_clip));
  s->grad_mult = static_cast<float>(1.0 / loss_scale) * clip;
}

// A 16-bit gradient is read through an fp32 copy (and then zeroed if
// asked); the working copy is the updated master rounded to its type.
// Chunk by chunk, so that a 16-bit gradient shard (this is also the
// fallback without AVX2) never gets a whole fp32 twin.
void ReferenceKernels::adamw(float* p, TypedPtr g_in, float* m, float* v, TypedPtr working,
                             const AdamWRun* runs, std::size_t run_count, const AdamWHyper& h,
                             const StepScalars* s, GradAfter grad_after) const {
  if (s->skip) return zero_runs(g_in, runs, run_count);
  const float grad_mult = s->grad_mult;
  const std::vector<AdamWChunk> chunks = adamw_chunks(runs, run_count, 16384);
  parallel_rows(chunks.size(), 1, [&](std::size_t c) {
    const std::size_t i0 = chunks[c].begin, k = chunks[c].end - i0;
    const float wd = chunks[c].decay ? h.weight_decay : 0.0f;
    const float l2 = chunks[c].decay ? h.l2 : 0.0f;
    const Widened g_f(g_in.at(i0), k);
    const float* g = g_f.get();
    for (std::size_t i = 0; i < k; ++i) {
      float& pi = p[i0 + i];
      const float gi = g[i] * grad_mult + l2 * pi;
      float& mi = m[i0 + i];
      float& vi = v[i0 + i];
      mi = h.beta1 * mi + (1.0f - h.beta1) * gi;
      vi = h.beta2 * vi + (1.0f - h.beta2) * gi * gi;
      const float mhat = mi / h.bc1;
      const float vhat = vi / h.bc2;
      pi -= h.lr * (wd * pi + mhat / (std::sqrt(vhat) + h.eps));
    }
    if (grad_after == GradAfter::zeroed)
      std::memset(g_in.at(i0).data, 0, k * dtype_size(g_in.dtype));
    if (working) convert(p + i0, DType::f32, working.at(i0).data, working.dtype, k);
  });
}

void ReferenceKernels::mean_add(double* acc, const float* x, std::size_t n) const {
  if (n == 0) return;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += x[i];
  *acc += static_cast<float>(sum / static_cast<double>(n));
}

std::unique_ptr<Kernels> make_reference_cpu_kernels() {
  return std::make_unique<ReferenceKernels>();
}

}  // namespace ztrain
