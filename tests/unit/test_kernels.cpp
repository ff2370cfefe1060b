// Every cpu kernel's backward against central finite differences of its
// forward, on awkward sizes. The scalar checked is L = sum(w * out) in
// double with a fixed random w, so the analytic gradient is backward(dout=w).
#include <doctest/doctest.h>

#include <oneapi/tbb/global_control.h>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu/block_gemm.h"
#include "kernels/cpu/reference_kernels.h"
#include "kernels/cpu/vector_math.h"
#include "ztrain/device.h"
#include "ztrain/kernels.h"

namespace {

using Vec = std::vector<float>;

Vec randn(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Tolerances pinned for fp32 kernels and eps = 1e-3: truncation error is
// O(eps^2) and the rounding of the few outputs a perturbation touches is
// ~1e-7 / eps.
constexpr float kEps = 1e-3f;
constexpr double kAtol = 2e-3, kRtol = 1e-2;

struct Checked {
  Vec* x;
  const Vec* grad;
  const char* name;
};

// loss() recomputes the forward from the current inputs.
void check_gradients(const std::function<double()>& loss, const std::vector<Checked>& inputs,
                     std::size_t samples = 24) {
  std::mt19937 rng(7);
  for (const auto& in : inputs) {
    const std::size_t n = in.x->size();
    for (std::size_t s = 0; s < std::min(samples, n); ++s) {
      const std::size_t j = samples >= n ? s : rng() % n;
      const float saved = (*in.x)[j];
      (*in.x)[j] = saved + kEps;
      const double lp = loss();
      (*in.x)[j] = saved - kEps;
      const double lm = loss();
      (*in.x)[j] = saved;
      const double fd = (lp - lm) / (2.0 * kEps);
      const double an = (*in.grad)[j];
      INFO(in.name << "[" << j << "]: analytic " << an << ", finite difference " << fd);
      CHECK(std::fabs(fd - an) <= kAtol + kRtol * std::fabs(fd));
    }
  }
}

const ztrain::Kernels& K() {
  static const auto k = ztrain::make_cpu_kernels();
  return *k;
}

// The sum of squares alone: sum_squares_add into a fresh record.
double sum_squares(const ztrain::Kernels& k, ztrain::ConstTypedPtr x, std::size_t n) {
  ztrain::StepScalars s;
  k.sum_squares_add(&s, x, n);
  return s.sum_squares;
}

// The hyper-parameters the adamw tests step with (lr 0.01, betas 0.9 and
// 0.95, eps 1e-8, weight decay 0.1, bias corrections of step 2).
constexpr ztrain::AdamWHyper kHyper{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f};
// The same with the decay as L2 (added to the gradient) instead.
constexpr ztrain::AdamWHyper kHyperL2{0.01f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.19f, 0.0975f, 0.1f};

// Adam over [0, n) as one decayed run, gradients times 0.7.
void adamw_all(const ztrain::Kernels& k, float* p, ztrain::TypedPtr g, float* m, float* v,
               ztrain::TypedPtr w, std::size_t n, ztrain::GradAfter after,
               const ztrain::AdamWHyper& h = kHyper) {
  ztrain::StepScalars s;
  s.grad_mult = 0.7f;
  const ztrain::AdamWRun run{0, n, true};
  k.adamw(p, g, m, v, w, &run, 1, h, &s, after);
}

// A test's int dimension as the kernels take it.
std::size_t z(int n) {
  return static_cast<std::size_t>(n);
}

// An attention case's shape as the kernels take it (the cases keep int
// dimensions for their index arithmetic).
template <class Case>
ztrain::AttentionShape attention_shape(const Case& c, int q_stride, int kv_stride) {
  return {z(c.B), z(c.T), z(c.NH), z(c.NKV), z(c.hs), z(q_stride), z(kv_stride)};
}

}  // namespace

TEST_CASE("matmul backward matches finite differences, with and without bias") {
  const int N = 7, C = 13, OC = 11;
  for (bool with_bias : {true, false}) {
    Vec x = randn(N * C, 1), w = randn(OC * C, 2, 0.5f), b = randn(OC, 3), out(N * OC);
    const Vec dout = randn(N * OC, 4);
    Vec dx(N * C), dw(OC * C), db(OC);
    K().matmul_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                        x.data(), w.data(), {N, C, OC});
    auto loss = [&] {
      K().matmul_forward(out.data(), x.data(), w.data(), with_bias ? b.data() : nullptr,
                         {N, C, OC});
      return dot(out, dout);
    };
    std::vector<Checked> in{{&x, &dx, "inp"}, {&w, &dw, "w"}};
    if (with_bias) in.push_back({&b, &db, "bias"});
    check_gradients(loss, in);
  }
}

TEST_CASE("matmul forward equals the plain triple loop") {
  const int N = 5, C = 17, OC = 9;
  const Vec x = randn(N * C, 11), w = randn(OC * C, 12), b = randn(OC, 13);
  Vec out(N * OC);
  K().matmul_forward(out.data(), x.data(), w.data(), b.data(), {N, C, OC});
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b[o];
      for (int c = 0; c < C; ++c) s += static_cast<double>(x[n * C + c]) * w[o * C + c];
      CHECK(out[n * OC + o] == doctest::Approx(s).epsilon(1e-5));
    }
}

TEST_CASE("backward ops add into their outputs") {
  const int N = 3, C = 5, OC = 4;
  const Vec x = randn(N * C, 21), w = randn(OC * C, 22), dout = randn(N * OC, 23);
  Vec dx0(N * C), dw0(OC * C), db0(OC);
  K().matmul_backward(dx0.data(), dw0.data(), db0.data(), dout.data(), x.data(), w.data(),
                      {N, C, OC});
  Vec dx(N * C, 1.5f), dw(OC * C, -2.0f), db(OC, 0.25f);
  K().matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), {N, C, OC});
  for (std::size_t i = 0; i < dx.size(); ++i) CHECK(dx[i] == doctest::Approx(dx0[i] + 1.5f));
  for (std::size_t i = 0; i < dw.size(); ++i) CHECK(dw[i] == doctest::Approx(dw0[i] - 2.0f));
  for (std::size_t i = 0; i < db.size(); ++i) CHECK(db[i] == doctest::Approx(db0[i] + 0.25f));
}

TEST_CASE("layernorm backward matches finite differences") {
  const int N = 5, C = 19;
  Vec x = randn(N * C, 31, 2.0f), w = randn(C, 32), b = randn(C, 33), out(N * C), mean(N), rstd(N);
  const Vec dout = randn(N * C, 34);
  K().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), {N, C},
                        1e-5f);
  Vec dx(N * C), dw(C), db(C);
  K().layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), {N, C});
  auto loss = [&] {
    K().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                          {N, C}, 1e-5f);
    return dot(out, dout);
  };
  check_gradients(loss, {{&x, &dx, "inp"}, {&w, &dw, "w"}, {&b, &db, "b"}});
}

TEST_CASE("layernorm forward normalises each row") {
  const int N = 3, C = 10;
  const Vec x = randn(N * C, 35, 3.0f), w(C, 1.0f), b(C, 0.0f);
  Vec out(N * C), mean(N), rstd(N);
  K().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), {N, C},
                        1e-5f);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += out[n * C + c];
    for (int c = 0; c < C; ++c) v += out[n * C + c] * out[n * C + c];
    CHECK(m / C == doctest::Approx(0).epsilon(1e-5).scale(1));
    CHECK(v / C == doctest::Approx(1).epsilon(1e-3));
  }
}

TEST_CASE("rmsnorm backward matches finite differences") {
  const int N = 6, C = 21;
  Vec x = randn(N * C, 41, 1.5f), w = randn(C, 42), out(N * C), rstd(N);
  const Vec dout = randn(N * C, 43);
  K().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), {N, C}, 1e-6f);
  Vec dx(N * C), dw(C);
  K().rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), {N, C});
  auto loss = [&] {
    K().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), {N, C}, 1e-6f);
    return dot(out, dout);
  };
  check_gradients(loss, {{&x, &dx, "inp"}, {&w, &dw, "w"}});
}

TEST_CASE("gelu (tanh approximation) of pre-activation plus bias: forward, backward, dbias") {
  const int N = 3, H = 37;
  const std::size_t n = static_cast<std::size_t>(N) * H;
  Vec x = randn(n, 51, 2.0f), bias = randn(H, 54), out(n);
  const Vec dout = randn(n, 52);
  K().gelu_forward(out.data(), x.data(), bias.data(), {N, H});
  auto gelu = [](double v) {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  };
  for (std::size_t i = 0; i < n; ++i)
    CHECK(out[i] == doctest::Approx(gelu(static_cast<double>(x[i]) + bias[i % H])).epsilon(1e-5));
  Vec plain(n);
  K().gelu_forward(plain.data(), x.data(), nullptr, {N, H});  // no bias
  for (std::size_t i = 0; i < n; ++i) CHECK(plain[i] == doctest::Approx(gelu(x[i])).epsilon(1e-5));
  // dpre is written over whatever it held; dbias is added into.
  Vec dx(n, NAN), db(H, 0.0f);
  K().gelu_backward(dx.data(), db.data(), x.data(), bias.data(), dout.data(), {N, H});
  auto loss = [&] {
    K().gelu_forward(out.data(), x.data(), bias.data(), {N, H});
    return dot(out, dout);
  };
  check_gradients(loss, {{&x, &dx, "pre"}, {&bias, &db, "bias"}}, n);
  Vec dx2(n, 7.0f), db2(H, 0.25f);
  K().gelu_backward(dx2.data(), db2.data(), x.data(), bias.data(), dout.data(), {N, H});
  CHECK(dx2 == dx);
  for (int h = 0; h < H; ++h) CHECK(db2[h] == doctest::Approx(db[h] + 0.25f));
  Vec dx3(n);
  K().gelu_backward(dx3.data(), nullptr, x.data(), bias.data(), dout.data(), {N, H});
  CHECK(dx3 == dx);  // no dbias wanted
}

TEST_CASE("swiglu forward and backward") {
  const std::size_t n = 29;
  Vec g = randn(n, 61, 2.0f), u = randn(n, 62), out(n);
  const Vec dout = randn(n, 63);
  K().swiglu_forward(out.data(), g.data(), u.data(), n);
  for (std::size_t i = 0; i < n; ++i)
    CHECK(out[i] ==
          doctest::Approx(g[i] / (1 + std::exp(-static_cast<double>(g[i]))) * u[i]).epsilon(1e-5));
  Vec dg(n), du(n);
  K().swiglu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), n);
  auto loss = [&] {
    K().swiglu_forward(out.data(), g.data(), u.data(), n);
    return dot(out, dout);
  };
  check_gradients(loss, {{&g, &dg, "gate"}, {&u, &du, "up"}}, n);
}

TEST_CASE("rope rotates pairs (i, i + hs/2) and its backward is the transpose") {
  const int B = 2, T = 5, H = 3, hs = 6, stride = H * hs + 2, half = hs / 2;
  Vec cos(T * half), sin(T * half);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const double a = t * std::pow(10000.0, -2.0 * i / hs);
      cos[t * half + i] = static_cast<float>(std::cos(a));
      sin[t * half + i] = static_cast<float>(std::sin(a));
    }
  Vec x = randn(B * T * stride, 71);
  const Vec x0 = x;
  K().rope_forward(x.data(), cos.data(), sin.data(), {B, T, H, hs, stride});
  for (int bt = 0; bt < B * T; ++bt) {
    const int t = bt % T;
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < half; ++i) {
        const int a = bt * stride + h * hs + i, b = a + half;
        CHECK(x[a] == doctest::Approx(x0[a] * cos[t * half + i] - x0[b] * sin[t * half + i]));
        CHECK(x[b] == doctest::Approx(x0[b] * cos[t * half + i] + x0[a] * sin[t * half + i]));
      }
    for (int pad = H * hs; pad < stride; ++pad)
      CHECK(x[bt * stride + pad] == x0[bt * stride + pad]);
  }
  // Backward: dx = R^T dy, so <R x, y> == <x, R^T y>.
  const Vec y = randn(B * T * stride, 72);
  Vec rty = y;
  K().rope_backward(rty.data(), cos.data(), sin.data(), {B, T, H, hs, stride});
  double lhs = 0, rhs = 0;
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < H * hs; ++c) {
      lhs += static_cast<double>(x[bt * stride + c]) * y[bt * stride + c];
      rhs += static_cast<double>(x0[bt * stride + c]) * rty[bt * stride + c];
    }
  CHECK(lhs == doctest::Approx(rhs).epsilon(1e-5));
}

TEST_CASE("attention backward matches finite differences (packed MHA and grouped KV)") {
  struct Case {
    int B, T, NH, NKV, hs;
    bool packed;
  };
  for (const Case c : {Case{2, 5, 3, 3, 4, true}, Case{1, 7, 4, 2, 3, false}}) {
    const int C = c.NH * c.hs, KV = c.NKV * c.hs;
    const int N = c.B * c.T;
    const int q_stride = c.packed ? 3 * C : C, kv_stride = c.packed ? 3 * C : KV;
    // Packed: one (N,3C) buffer holding q|k|v per row, as GPT-2's c_attn writes it.
    Vec q, k, v;
    if (c.packed) {
      q = randn(static_cast<std::size_t>(N) * 3 * C, 81);
    } else {
      q = randn(static_cast<std::size_t>(N) * C, 81);
      k = randn(static_cast<std::size_t>(N) * KV, 82);
      v = randn(static_cast<std::size_t>(N) * KV, 83);
    }
    auto ptrs = [&](Vec& qq, Vec& kk, Vec& vv) {
      float* qp = qq.data();
      float* kp = c.packed ? qq.data() + C : kk.data();
      float* vp = c.packed ? qq.data() + 2 * C : vv.data();
      return std::tuple{qp, kp, vp};
    };
    Vec out(static_cast<std::size_t>(N) * C), lse(static_cast<std::size_t>(c.B) * c.NH * c.T);
    const Vec dout = randn(out.size(), 84);
    auto [qp, kp, vp] = ptrs(q, k, v);
    K().attention_forward(out.data(), lse.data(), {qp, kp, vp},
                          attention_shape(c, q_stride, kv_stride));
    // Against causal attention written out in double.
    const int group = c.NH / c.NKV;
    for (int b = 0; b < c.B; ++b)
      for (int h = 0; h < c.NH; ++h)
        for (int t = 0; t < c.T; ++t) {
          std::vector<double> sc(static_cast<std::size_t>(t) + 1);
          double mx = -1e300, sum = 0;
          for (int j = 0; j <= t; ++j) {
            double d = 0;
            for (int i = 0; i < c.hs; ++i)
              d += static_cast<double>(qp[(b * c.T + t) * q_stride + h * c.hs + i]) *
                   kp[(b * c.T + j) * kv_stride + (h / group) * c.hs + i];
            sc[static_cast<std::size_t>(j)] = d / std::sqrt(static_cast<double>(c.hs));
            mx = std::max(mx, sc[static_cast<std::size_t>(j)]);
          }
          for (double x : sc) sum += std::exp(x - mx);
          CHECK(lse[(b * c.NH + h) * c.T + t] == doctest::Approx(mx + std::log(sum)).epsilon(1e-5));
          for (int i = 0; i < c.hs; ++i) {
            double o = 0;
            for (int j = 0; j <= t; ++j)
              o += std::exp(sc[static_cast<std::size_t>(j)] - mx) / sum *
                   vp[(b * c.T + j) * kv_stride + (h / group) * c.hs + i];
            CHECK(out[(b * c.T + t) * C + h * c.hs + i] ==
                  doctest::Approx(o).epsilon(1e-5).scale(1));
          }
        }
    Vec dq(q.size()), dk(k.size()), dv(v.size());
    auto [dqp, dkp, dvp] = ptrs(dq, dk, dv);
    K().attention_backward({dqp, dkp, dvp}, dout.data(), out.data(), {qp, kp, vp}, lse.data(),
                           attention_shape(c, q_stride, kv_stride));
    Vec lse2(lse.size());
    auto loss = [&] {
      auto [a, b2, d] = ptrs(q, k, v);
      K().attention_forward(out.data(), lse2.data(), {a, b2, d},
                            attention_shape(c, q_stride, kv_stride));
      return dot(out, dout);
    };
    if (c.packed)
      check_gradients(loss, {{&q, &dq, "qkv"}}, 64);
    else
      check_gradients(loss, {{&q, &dq, "q"}, {&k, &dk, "k"}, {&v, &dv, "v"}}, 32);
  }
}

TEST_CASE("embedding forward and backward with repeated tokens") {
  const int B = 2, T = 3, C = 5, V = 7;
  const std::vector<std::int32_t> tokens{1, 4, 1, 6, 0, 4};
  Vec wte = randn(V * C, 91), wpe = randn(T * C, 92), out(B * T * C);
  const Vec dout = randn(out.size(), 93);
  K().embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), {B, T, C});
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c)
      CHECK(out[bt * C + c] == wte[tokens[bt] * C + c] + wpe[(bt % T) * C + c]);
  Vec dwte(wte.size()), dwpe(wpe.size());
  K().embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), {B, T, C});
  auto loss = [&] {
    K().embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), {B, T, C});
    return dot(out, dout);
  };
  check_gradients(loss, {{&wte, &dwte, "wte"}, {&wpe, &dwpe, "wpe"}}, 64);
}

TEST_CASE("softmax cross-entropy: forward is -log softmax, backward matches finite differences") {
  const int N = 4, V = 23;
  Vec logits = randn(N * V, 101, 3.0f);
  const std::vector<std::int32_t> targets{0, 22, 7, 7};
  Vec losses(N);
  Vec probs = logits;
  K().softmax_crossentropy_forward(losses.data(), probs.data(), targets.data(), {N, V});
  for (int n = 0; n < N; ++n) {
    double mx = -1e30, s = 0;
    for (int i = 0; i < V; ++i) mx = std::max(mx, static_cast<double>(logits[n * V + i]));
    for (int i = 0; i < V; ++i) s += std::exp(logits[n * V + i] - mx);
    CHECK(losses[n] ==
          doctest::Approx(std::log(s) + mx - logits[n * V + targets[n]]).epsilon(1e-5));
  }
  const float dloss = 0.37f;
  Vec grad = probs;
  K().softmax_crossentropy_backward(grad.data(), targets.data(), dloss, {N, V});
  auto loss = [&] {
    Vec p = logits;
    K().softmax_crossentropy_forward(losses.data(), p.data(), targets.data(), {N, V});
    double s = 0;
    for (float l : losses) s += static_cast<double>(l) * dloss;
    return s;
  };
  check_gradients(loss, {{&logits, &grad, "logits"}}, 92);
}

// A row whose target is kIgnoreTarget has a loss of 0 and zero dlogits,
// whatever its logits hold (NaN too: a masked row may be garbage); the
// other rows are what they are without the masked ones, on the fast
// kernels and the reference.
TEST_CASE("softmax cross-entropy skips ignored targets") {
  const int N = 4, V = 37;
  const Vec logits = randn(N * V, 202, 3.0f);
  const std::vector<std::int32_t> all{3, 9, 5, 36},
      masked{3, ztrain::kIgnoreTarget, 5, ztrain::kIgnoreTarget};
  const auto reference = ztrain::make_reference_cpu_kernels();
  for (const ztrain::Kernels* k : {&K(), static_cast<const ztrain::Kernels*>(reference.get())}) {
    Vec pa = logits, pm = logits, la(N), lm(N, 7.0f);
    std::fill(pm.begin() + V, pm.begin() + 2 * V, NAN);
    k->softmax_crossentropy_forward(la.data(), pa.data(), all.data(), {N, V});
    k->softmax_crossentropy_forward(lm.data(), pm.data(), masked.data(), {N, V});
    k->softmax_crossentropy_backward(pa.data(), all.data(), 0.5f, {N, V});
    k->softmax_crossentropy_backward(pm.data(), masked.data(), 0.5f, {N, V});
    for (int n = 0; n < N; ++n) {
      const bool skipped = masked[static_cast<std::size_t>(n)] == ztrain::kIgnoreTarget;
      CHECK(lm[static_cast<std::size_t>(n)] == (skipped ? 0.0f : la[static_cast<std::size_t>(n)]));
      for (int i = 0; i < V; ++i) {
        const std::size_t at = static_cast<std::size_t>(n * V + i);
        CHECK(pm[at] == (skipped ? 0.0f : pa[at]));
      }
    }
  }
}

TEST_CASE("sum_squares is exact to double rounding and independent of the thread count") {
  const Vec x = randn(300001, 111);
  double ref = 0;
  for (float v : x) ref += static_cast<double>(v) * v;
  CHECK(sum_squares(K(), x.data(), x.size()) == doctest::Approx(ref).epsilon(1e-12));
  CHECK(sum_squares(K(), x.data(), 0) == 0.0);
  const double two = sum_squares(K(), x.data(), x.size());
  ztrain::StepScalars s;  // adds to what the record holds
  s.sum_squares = 0.25;
  K().sum_squares_add(&s, x.data(), x.size());
  CHECK(s.sum_squares == 0.25 + two);
  oneapi::tbb::global_control one_thread(oneapi::tbb::global_control::max_allowed_parallelism, 1);
  CHECK(sum_squares(K(), x.data(), x.size()) == two);  // bit-identical
}

TEST_CASE("the norm ops: unscale, the fp32 value to reduce, DeepSpeed's clip, skip on overflow") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  for (const ztrain::Kernels* k : {&K(), static_cast<const ztrain::Kernels*>(ref.get())}) {
    ztrain::StepScalars s;
    s.sum_squares = 16.0 * 1024 * 1024;  // gradients scaled by 1024: norm 4
    k->grad_norm_unscale(&s, 1024.0);
    CHECK(s.sum_squares == 16.0);
    CHECK(s.reduced == 16.0f);
    k->grad_norm_finish(&s, false, 1024.0, 1.0);  // clip to 1: multiplier 1/4
    CHECK(s.grad_norm == 4.0);
    CHECK(s.skip == 0);
    CHECK(s.grad_mult == static_cast<float>(1.0 / 1024) * 0.25f);
    k->grad_norm_finish(&s, false, 1024.0, 8.0);  // under the clip: unscale only
    CHECK(s.grad_mult == static_cast<float>(1.0 / 1024));
    k->grad_norm_finish(&s, false, 1024.0, 0.0);  // no clip
    CHECK(s.grad_mult == static_cast<float>(1.0 / 1024));
    s.reduced = 36.0f;  // what the ranks summed
    k->grad_norm_finish(&s, true, 1.0, 0.0);
    CHECK(s.grad_norm == 6.0);
    s.sum_squares = INFINITY;
    k->grad_norm_unscale(&s, 1.0);
    k->grad_norm_finish(&s, false, 1.0, 1.0);
    CHECK(s.skip == 1);
    CHECK(s.grad_mult == 1.0f);  // a skipped step is not clipped
    s.sum_squares = NAN;
    k->grad_norm_finish(&s, false, 1.0, 1.0);
    CHECK(s.skip == 1);
    s.sum_squares = 1.0;
    k->grad_norm_finish(&s, false, 1.0, 1.0);
    CHECK(s.skip == 0);  // finish writes the flag both ways
  }
}

TEST_CASE("mean_add adds the index-order mean, rounded to fp32") {
  const Vec x = randn(1001, 113, 3.0f);
  double sum = 0;
  for (float v : x) sum += v;
  const double mean = static_cast<float>(sum / 1001.0);
  const auto ref = ztrain::make_reference_cpu_kernels();
  for (const ztrain::Kernels* k : {&K(), static_cast<const ztrain::Kernels*>(ref.get())}) {
    double acc = 0.5;
    k->mean_add(&acc, x.data(), x.size());
    CHECK(acc == 0.5 + mean);
  }
}

TEST_CASE(
    "adamw over runs: each run its own weight decay, gaps untouched, one call = one per run") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  // Runs at odd offsets, one longer than a chunk, with gaps of padding.
  const std::vector<ztrain::AdamWRun> runs{
      {3, 770, false}, {770, 140001, true}, {140017, 140018, false}, {140100, 150003, true}};
  const std::size_t n = 150010;
  const Vec p0 = randn(n, 161), g0 = randn(n, 162), m0 = randn(n, 163, 0.1f);
  Vec v0 = randn(n, 164, 0.1f);
  for (auto& x : v0) x = x * x;
  ztrain::StepScalars s;
  s.grad_mult = 0.3f;
  for (const ztrain::Kernels* k : {&K(), static_cast<const ztrain::Kernels*>(ref.get())})
    for (const ztrain::AdamWHyper& hyper : {kHyper, kHyperL2}) {
      INFO("l2 " << hyper.l2);
      for (const auto after : {ztrain::GradAfter::zeroed, ztrain::GradAfter::kept}) {
        Vec p = p0, g = g0, m = m0, v = v0, w(n, 7.0f);
        k->adamw(p.data(), g.data(), m.data(), v.data(), w.data(), runs.data(), runs.size(), hyper,
                 &s, after);
        // The same as a call per run with its weight decay.
        Vec pr = p0, gr = g0, mr = m0, vr = v0, wr(n, 7.0f);
        for (const auto& r : runs) {
          ztrain::AdamWHyper h = hyper;
          if (!r.decay) h.weight_decay = h.l2 = 0;
          const ztrain::AdamWRun one{0, r.end - r.begin, true};
          k->adamw(pr.data() + r.begin, gr.data() + r.begin, mr.data() + r.begin,
                   vr.data() + r.begin, wr.data() + r.begin, &one, 1, h, &s, after);
        }
        CHECK(p == pr);
        CHECK(m == mr);
        CHECK(v == vr);
        CHECK(g == gr);
        CHECK(w == wr);
        for (std::size_t i : {std::size_t{0}, std::size_t{2}, std::size_t{140001},
                              std::size_t{140016}, std::size_t{140018}, std::size_t{150005}}) {
          CHECK(p[i] == p0[i]);  // in a gap
          CHECK(g[i] == g0[i]);
          CHECK(w[i] == 7.0f);
        }
        CHECK(p[5] != p0[5]);
        CHECK(w[5] == p[5]);
        // Decay or not: a run without it moves less toward zero.
        Vec pd = p0, gd = g0, md = m0, vd = v0;
        const ztrain::AdamWRun decayed{3, 770, true};
        k->adamw(pd.data(), gd.data(), md.data(), vd.data(), nullptr, &decayed, 1, hyper, &s,
                 after);
        CHECK(pd[5] != p[5]);
      }
    }
}

TEST_CASE("adamw skips a step whose norm overflowed: only the gradients, zeroed, in the runs") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const std::vector<ztrain::AdamWRun> runs{{1, 1000, true}, {1003, 70001, false}};
  const std::size_t n = 70005;
  const Vec p0 = randn(n, 171), g0 = randn(n, 172), m0 = randn(n, 173), v0(n, 0.5f);
  ztrain::StepScalars s;
  s.skip = 1;
  for (const ztrain::Kernels* k : {&K(), static_cast<const ztrain::Kernels*>(ref.get())}) {
    for (const auto after : {ztrain::GradAfter::zeroed, ztrain::GradAfter::kept}) {
      Vec p = p0, g = g0, m = m0, v = v0, w(n, 7.0f);
      k->adamw(p.data(), g.data(), m.data(), v.data(), w.data(), runs.data(), runs.size(), kHyper,
               &s, after);
      CHECK(p == p0);
      CHECK(m == m0);
      CHECK(v == v0);
      CHECK(w == Vec(n, 7.0f));
      for (std::size_t i = 0; i < n; ++i) {
        const bool in_run = (i >= 1 && i < 1000) || (i >= 1003 && i < 70001);
        if (g[i] != (in_run ? 0.0f : g0[i])) {
          FAIL_CHECK("gradient " << i << " is " << g[i]);
          break;
        }
      }
    }
  }
}

TEST_CASE("fast kernels match their reference on awkward sizes") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  struct Case {
    int B, T, NH, NKV, hs;
    bool packed;
  };
  for (const Case c :
       {Case{2, 7, 3, 3, 5, true}, Case{1, 13, 4, 2, 9, false}, Case{3, 1, 2, 1, 6, false},
        Case{1, 33, 6, 3, 17, false}, Case{1, 150, 2, 1, 8, false}, Case{1, 129, 2, 2, 4, true}}) {
    INFO("B " << c.B << " T " << c.T << " NH " << c.NH << " NKV " << c.NKV << " hs " << c.hs);
    const int C = c.NH * c.hs, KV = c.NKV * c.hs, N = c.B * c.T;
    const int q_stride = c.packed ? 3 * C : C, kv_stride = c.packed ? 3 * C : KV;
    const Vec qkv = randn(static_cast<std::size_t>(N) * (c.packed ? 3 * C : C + 2 * KV), 121);
    const float* q = qkv.data();
    const float* k = c.packed ? q + C : q + static_cast<std::size_t>(N) * C;
    const float* v = c.packed ? q + 2 * C : k + static_cast<std::size_t>(N) * KV;
    const std::size_t rows = static_cast<std::size_t>(c.B) * c.NH * c.T;
    Vec out_f(static_cast<std::size_t>(N) * C), out_r(out_f.size()), l_f(rows), l_r(rows);
    K().attention_forward(out_f.data(), l_f.data(), {q, k, v},
                          attention_shape(c, q_stride, kv_stride));
    ref->attention_forward(out_r.data(), l_r.data(), {q, k, v},
                           attention_shape(c, q_stride, kv_stride));
    for (std::size_t i = 0; i < out_f.size(); ++i)
      CHECK(out_f[i] == doctest::Approx(out_r[i]).epsilon(1e-5).scale(1));
    for (std::size_t i = 0; i < rows; ++i) CHECK(l_f[i] == doctest::Approx(l_r[i]).epsilon(1e-5));
    const Vec dout = randn(out_f.size(), 122);
    const Vec init = randn(qkv.size(), 123);  // backward adds into whatever is there
    Vec d_f = init, d_r = init;
    auto grads = [&](Vec& d) {
      float* dq = d.data();
      float* dk = c.packed ? dq + C : dq + static_cast<std::size_t>(N) * C;
      float* dv = c.packed ? dq + 2 * C : dk + static_cast<std::size_t>(N) * KV;
      return std::tuple{dq, dk, dv};
    };
    auto [fq, fk, fv] = grads(d_f);
    auto [rq, rk, rv] = grads(d_r);
    K().attention_backward({fq, fk, fv}, dout.data(), out_r.data(), {q, k, v}, l_r.data(),
                           attention_shape(c, q_stride, kv_stride));
    ref->attention_backward({rq, rk, rv}, dout.data(), out_r.data(), {q, k, v}, l_r.data(),
                            attention_shape(c, q_stride, kv_stride));
    for (std::size_t i = 0; i < d_f.size(); ++i)
      CHECK(d_f[i] == doctest::Approx(d_r[i]).epsilon(1e-4).scale(1));
  }
}

// Packed rows (AttentionShape::positions): two rows of 13 tokens, each
// packing examples of lengths 5, 3, 5 and 1, 7, 5 (an example of one
// token included), attention with grouped key/value heads. Every
// example's out, lse and gradients of q, k and v equal its attention run
// alone, as a row of its own: bit for bit on the reference kernels (the
// same sums in the same order), within the fast kernels' tolerance of them
// on the fast ones; and rotary positions restart with each example. A
// kernel that let a query see another example's keys, or cut its own,
// fails at once.
TEST_CASE("attention and rope over packed rows are each example's alone") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const std::size_t B = 2, T = 13, NH = 4, NKV = 2, hs = 8, C = NH * hs, KV = NKV * hs;
  const std::vector<std::vector<std::size_t>> lengths{{5, 3, 5}, {1, 7, 5}};
  std::vector<std::int32_t> positions;
  for (const auto& row : lengths)
    for (std::size_t n : row)
      for (std::size_t p = 0; p < n; ++p) positions.push_back(static_cast<std::int32_t>(p));
  const Vec q = randn(B * T * C, 131), k = randn(B * T * KV, 132), v = randn(B * T * KV, 133);
  const Vec dout = randn(B * T * C, 134);
  const ztrain::AttentionShape packed{B, T, NH, NKV, hs, C, KV, positions.data()};
  for (const ztrain::Kernels* kernels : {static_cast<const ztrain::Kernels*>(ref.get()), &K()}) {
    const bool exact = kernels == ref.get();
    INFO(std::string(exact ? "reference" : "fast") << " kernels");
    Vec out(B * T * C), lse(B * NH * T), dq(q.size()), dk(k.size()), dv(v.size());
    kernels->attention_forward(out.data(), lse.data(), {q.data(), k.data(), v.data()}, packed);
    kernels->attention_backward({dq.data(), dk.data(), dv.data()}, dout.data(), out.data(),
                                {q.data(), k.data(), v.data()}, lse.data(), packed);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t at = 0; std::size_t n : lengths[b]) {
        // The example alone: its rows of every tensor, a batch of one.
        const std::size_t row0 = b * T + at;
        auto rows = [&](const Vec& x, std::size_t width) {
          return Vec(x.begin() + static_cast<long>(row0 * width),
                     x.begin() + static_cast<long>((row0 + n) * width));
        };
        const Vec eq = rows(q, C), ek = rows(k, KV), ev = rows(v, KV), edo = rows(dout, C);
        Vec eo(n * C), el(NH * n), edq(n * C), edk(n * KV), edv(n * KV);
        const ztrain::AttentionShape alone{1, n, NH, NKV, hs, C, KV};
        ref->attention_forward(eo.data(), el.data(), {eq.data(), ek.data(), ev.data()}, alone);
        ref->attention_backward({edq.data(), edk.data(), edv.data()}, edo.data(), eo.data(),
                                {eq.data(), ek.data(), ev.data()}, el.data(), alone);
        const auto same = [&](float packed_value, float alone_value) {
          if (exact)
            CHECK(packed_value == alone_value);
          else
            CHECK(packed_value == doctest::Approx(alone_value).epsilon(1e-4).scale(1));
        };
        INFO("row " << b << ", example at " << at << " of " << n << " tokens");
        for (std::size_t i = 0; i < n * C; ++i) same(out[row0 * C + i], eo[i]);
        for (std::size_t i = 0; i < n * C; ++i) same(dq[row0 * C + i], edq[i]);
        for (std::size_t i = 0; i < n * KV; ++i) same(dk[row0 * KV + i], edk[i]);
        for (std::size_t i = 0; i < n * KV; ++i) same(dv[row0 * KV + i], edv[i]);
        for (std::size_t h = 0; h < NH; ++h)
          for (std::size_t t = 0; t < n; ++t) same(lse[(b * NH + h) * T + at + t], el[h * n + t]);
        at += n;
      }
  }
  // Rope: token (b,t) rotated by the angle of its position in its example.
  const std::size_t half = hs / 2;
  Vec cos(T * half), sin(T * half);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(t) * std::pow(10000.0, -2.0 * i / hs);
      cos[t * half + i] = static_cast<float>(std::cos(a));
      sin[t * half + i] = static_cast<float>(std::sin(a));
    }
  Vec x = q, alone = q;
  K().rope_forward(x.data(), cos.data(), sin.data(), {B, T, NH, hs, C, positions.data()});
  for (std::size_t bt = 0; bt < B * T; ++bt)  // each token as a row of one at its position
    K().rope_forward(alone.data() + bt * C, cos.data() + half * positions[bt],
                     sin.data() + half * positions[bt], {1, 1, NH, hs, C});
  CHECK(x == alone);
  K().rope_backward(x.data(), cos.data(), sin.data(), {B, T, NH, hs, C, positions.data()});
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(x[i] == doctest::Approx(q[i]).epsilon(1e-5));
}

// Ring attention's pieces: a sequence split at c is three blocks (queries
// [0, c) on their diagonal; queries [c, T) on keys [0, c), wholly past,
// merged with their own diagonal), whose forward merged and whose
// backwards summed are the whole causal attention's, on both kernels.
TEST_CASE(
    "attention in blocks: a sequence split anywhere is its blocks merged, and their "
    "gradients summed") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  struct Case {
    int B, T, NH, NKV, hs, c;
    bool packed;
  };
  for (const ztrain::Kernels* k : std::initializer_list<const ztrain::Kernels*>{&K(), ref.get()})
    for (const Case c : {Case{2, 7, 3, 3, 5, 3, true}, Case{1, 13, 4, 2, 9, 1, false},
                         Case{1, 150, 2, 1, 8, 70, false}, Case{2, 129, 4, 2, 4, 128, true}}) {
      INFO("B " << c.B << " T " << c.T << " NH " << c.NH << " NKV " << c.NKV << " split at " << c.c
                << (k == ref.get() ? " (reference)" : " (fast)"));
      const int C = c.NH * c.hs, KV = c.NKV * c.hs, N = c.B * c.T;
      const int q_stride = c.packed ? 3 * C : C, kv_stride = c.packed ? 3 * C : KV;
      const Vec qkv = randn(static_cast<std::size_t>(N) * (c.packed ? 3 * C : C + 2 * KV), 141);
      auto parts = [&](auto* base) {
        auto* q = base;
        auto* kk = c.packed ? q + C : q + static_cast<std::size_t>(N) * C;
        auto* v = c.packed ? q + 2 * C : kk + static_cast<std::size_t>(N) * KV;
        return std::tuple{q, kk, v};
      };
      const auto [q, kp, vp] = parts(qkv.data());
      const std::size_t rows = static_cast<std::size_t>(c.B) * c.NH * c.T;
      Vec out(static_cast<std::size_t>(N) * C), lse(rows);
      k->attention_forward(out.data(), lse.data(), {q, kp, vp},
                           attention_shape(c, q_stride, kv_stride));
      // The blocks, as AttentionBlock lays them out.
      const std::size_t T = z(c.T), split = z(c.c), later = T - split;
      const std::size_t kv_off = split * z(kv_stride);
      const ztrain::AttentionBlock early{z(c.B),       z(c.NH), z(c.NKV), z(c.hs), z(q_stride),
                                         z(kv_stride), T,       0,        split,   T,
                                         split,        true};
      ztrain::AttentionBlock past = early, own = early;
      past.first = own.first = split;
      past.rows = own.rows = own.keys = later;
      past.causal = false;
      const ztrain::AttentionInputs shifted{q, kp + kv_off, vp + kv_off};
      Vec out_b(out.size()), lse_b(rows), out_own(out.size()), lse_own(rows);
      k->attention_block_forward(out_b.data(), lse_b.data(), {q, kp, vp}, early);
      k->attention_block_forward(out_b.data(), lse_b.data(), {q, kp, vp}, past);
      k->attention_block_forward(out_own.data(), lse_own.data(), shifted, own);
      k->attention_merge(out_b.data(), lse_b.data(), out_own.data(), lse_own.data(), own);
      for (std::size_t i = 0; i < out.size(); ++i)
        CHECK(out_b[i] == doctest::Approx(out[i]).epsilon(1e-5).scale(1));
      for (std::size_t i = 0; i < rows; ++i)
        CHECK(lse_b[i] == doctest::Approx(lse[i]).epsilon(1e-5));

      const Vec dout = randn(out.size(), 142);
      Vec d_whole(qkv.size()), d_blocks(qkv.size());
      const auto [wq, wk, wv] = parts(d_whole.data());
      k->attention_backward({wq, wk, wv}, dout.data(), out.data(), {q, kp, vp}, lse.data(),
                            attention_shape(c, q_stride, kv_stride));
      const auto [bq, bk, bv] = parts(d_blocks.data());
      for (const ztrain::AttentionBlock& blk : {early, past})
        k->attention_block_backward({bq, bk, bv}, dout.data(), out.data(), {q, kp, vp}, lse.data(),
                                    blk);
      k->attention_block_backward({bq, bk + kv_off, bv + kv_off}, dout.data(), out.data(), shifted,
                                  lse.data(), own);
      for (std::size_t i = 0; i < d_whole.size(); ++i)
        CHECK(d_blocks[i] == doctest::Approx(d_whole[i]).epsilon(1e-4).scale(1));
    }
}

TEST_CASE("adamw zeroes the gradients it consumed, or keeps them, and steps the same either way") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  for (const ztrain::Kernels* k : std::initializer_list<const ztrain::Kernels*>{&K(), ref.get()}) {
    const std::size_t n = 100;
    const Vec p0 = randn(n, 131), g0 = randn(n, 132);
    Vec p_z = p0, g_z = g0, m_z(n), v_z(n), p_k = p0, g_k = g0, m_k(n), v_k(n);
    adamw_all(*k, p_z.data(), g_z.data(), m_z.data(), v_z.data(), nullptr, n,
              ztrain::GradAfter::zeroed);
    adamw_all(*k, p_k.data(), g_k.data(), m_k.data(), v_k.data(), nullptr, n,
              ztrain::GradAfter::kept);
    CHECK(g_z == Vec(n, 0.0f));
    CHECK(g_k == g0);
    CHECK(p_k == p_z);
    CHECK(m_k == m_z);
    CHECK(v_k == v_z);
    for (float x : m_z) CHECK(x != 0.0f);
  }
}

TEST_CASE("fast elementwise kernels and softmax match their reference, tails included") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  for (std::size_t n : {std::size_t{1}, std::size_t{37}, std::size_t{8}, std::size_t{100003}}) {
    INFO("n " << n);
    Vec x = randn(n, 141, 3.0f), y = randn(n, 142), d = randn(n, 143);
    x[0] = -30.0f;  // saturated tails of tanh and sigmoid
    if (n > 1) x[1] = 30.0f;
    Vec a(n), b(n);
    K().gelu_forward(a.data(), x.data(), nullptr, {1, n});
    ref->gelu_forward(b.data(), x.data(), nullptr, {1, n});
    for (std::size_t i = 0; i < n; ++i)
      CHECK(a[i] == doctest::Approx(b[i]).epsilon(2e-6).scale(1e-6));
    K().gelu_backward(a.data(), nullptr, x.data(), nullptr, d.data(), {1, n});
    ref->gelu_backward(b.data(), nullptr, x.data(), nullptr, d.data(), {1, n});
    // Gradients within 2e-6 of the terms' scale (the exp's 2 ulp, times dout).
    for (std::size_t i = 0; i < n; ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(2e-6).scale(1));
    K().swiglu_forward(a.data(), x.data(), y.data(), n);
    ref->swiglu_forward(b.data(), x.data(), y.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      CHECK(a[i] == doctest::Approx(b[i]).epsilon(2e-6).scale(1e-6));
    Vec a2(n, 0.25f), b2(n, 0.25f);
    a.assign(n, 0.5f);
    b.assign(n, 0.5f);
    K().swiglu_backward(a.data(), a2.data(), d.data(), x.data(), y.data(), n);
    ref->swiglu_backward(b.data(), b2.data(), d.data(), x.data(), y.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(a[i] == doctest::Approx(b[i]).epsilon(2e-6).scale(1));
      CHECK(a2[i] == doctest::Approx(b2[i]).epsilon(2e-6).scale(1));
    }
  }
  const int N = 5, V = 1031;
  Vec logits = randn(static_cast<std::size_t>(N) * V, 144, 4.0f);
  logits[7] = 80.0f;  // one dominant logit
  const std::vector<std::int32_t> targets{0, 7, 1030, 512, 3};
  Vec pa = logits, pb = logits, la(N), lb(N);
  K().softmax_crossentropy_forward(la.data(), pa.data(), targets.data(), {N, V});
  ref->softmax_crossentropy_forward(lb.data(), pb.data(), targets.data(), {N, V});
  for (int n = 0; n < N; ++n) CHECK(la[n] == doctest::Approx(lb[n]).epsilon(1e-5).scale(1e-5));
  for (std::size_t i = 0; i < pa.size(); ++i)
    CHECK(pa[i] == doctest::Approx(pb[i]).epsilon(1e-5).scale(1e-7));
}

// The norms over rows that span several blocks of 64 (the backward's
// partial sums) and widths with vector tails; the fused residual forms,
// into their own res and in place (res aliasing a, as the model calls
// them), against the reference's add-then-norm, which is that composition
// exactly.
TEST_CASE(
    "fast norms and their fused residual add match the reference, whatever the thread count") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  for (const int C : {83, 64, 5}) {
    const int N = 150;
    INFO("C " << C);
    const std::size_t nc = static_cast<std::size_t>(N) * C;
    const Vec a = randn(nc, 231, 2.0f), b = randn(nc, 232), dout = randn(nc, 233);
    const Vec w = randn(C, 234), bias = randn(C, 235);
    auto close = [](const Vec& x, const Vec& y) {
      for (std::size_t i = 0; i < x.size(); ++i)
        CHECK(x[i] == doctest::Approx(y[i]).epsilon(1e-5).scale(1));
    };
    // LayerNorm: the fused form against add, then norm; in place, the same.
    Vec res_f(nc), out_f(nc), mean_f(N), rstd_f(N);
    Vec res_r(nc), out_r(nc), mean_r(N), rstd_r(N);
    K().add_layernorm_forward(res_f.data(), out_f.data(), mean_f.data(), rstd_f.data(), a.data(),
                              b.data(), w.data(), bias.data(), {N, z(C)}, 1e-5f);
    Vec in_place = a, out_in_place(nc);
    K().add_layernorm_forward(in_place.data(), out_in_place.data(), mean_r.data(), rstd_r.data(),
                              in_place.data(), b.data(), w.data(), bias.data(), {N, z(C)}, 1e-5f);
    CHECK(in_place == res_f);
    CHECK(out_in_place == out_f);
    ref->add(res_r.data(), a.data(), b.data(), nc);
    ref->layernorm_forward(out_r.data(), mean_r.data(), rstd_r.data(), res_r.data(), w.data(),
                           bias.data(), {N, z(C)}, 1e-5f);
    CHECK(res_f == res_r);  // the add is exact
    close(out_f, out_r);
    close(mean_f, mean_r);
    close(rstd_f, rstd_r);
    Vec plain(nc), pm(N), pr(N);
    K().layernorm_forward(plain.data(), pm.data(), pr.data(), res_r.data(), w.data(), bias.data(),
                          {N, z(C)}, 1e-5f);
    CHECK(plain == out_f);
    auto ln_backward = [&](const ztrain::Kernels& k) {
      Vec dx(nc, 0.5f), dw(w.size(), 0.25f), db(w.size(), -0.25f);
      k.layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), res_r.data(), w.data(),
                           mean_r.data(), rstd_r.data(), {N, z(C)});
      return std::tuple{dx, dw, db};
    };
    const auto [dx_f, dw_f, db_f] = ln_backward(K());
    const auto [dx_r, dw_r, db_r] = ln_backward(*ref);
    close(dx_f, dx_r);
    close(dw_f, dw_r);
    close(db_f, db_r);

    // RMSNorm, the same way.
    Vec rms_f(nc), rms_r(nc), rrstd_f(N), rrstd_r(N);
    K().add_rmsnorm_forward(res_f.data(), rms_f.data(), rrstd_f.data(), a.data(), b.data(),
                            w.data(), {N, z(C)}, 1e-6f);
    in_place = a;
    K().add_rmsnorm_forward(in_place.data(), out_in_place.data(), rrstd_r.data(), in_place.data(),
                            b.data(), w.data(), {N, z(C)}, 1e-6f);
    CHECK(in_place == res_f);
    CHECK(out_in_place == rms_f);
    ref->rmsnorm_forward(rms_r.data(), rrstd_r.data(), res_r.data(), w.data(), {N, z(C)}, 1e-6f);
    CHECK(res_f == res_r);
    close(rms_f, rms_r);
    close(rrstd_f, rrstd_r);
    auto rms_backward = [&](const ztrain::Kernels& k) {
      Vec dx(nc, 0.5f), dw(w.size(), 0.25f);
      k.rmsnorm_backward(dx.data(), dw.data(), dout.data(), res_r.data(), w.data(), rrstd_r.data(),
                         {N, z(C)});
      return std::tuple{dx, dw};
    };
    const auto [rdx_f, rdw_f] = rms_backward(K());
    const auto [rdx_r, rdw_r] = rms_backward(*ref);
    close(rdx_f, rdx_r);
    close(rdw_f, rdw_r);

    oneapi::tbb::global_control one(oneapi::tbb::global_control::max_allowed_parallelism, 1);
    CHECK(ln_backward(K()) == std::tuple{dx_f, dw_f, db_f});  // bit-identical
    CHECK(rms_backward(K()) == std::tuple{rdx_f, rdw_f});
  }
}

TEST_CASE("fast gelu with its bias matches the reference, blocks of rows, any thread count") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  for (const int H : {83, 64, 5}) {
    const int N = 150;  // two whole blocks of 64 rows and a tail
    INFO("H " << H);
    const std::size_t nh = static_cast<std::size_t>(N) * H;
    const Vec x = randn(nh, 241, 2.0f), dout = randn(nh, 242), bias = randn(H, 243);
    Vec out_f(nh), out_r(nh);
    K().gelu_forward(out_f.data(), x.data(), bias.data(), {N, z(H)});
    ref->gelu_forward(out_r.data(), x.data(), bias.data(), {N, z(H)});
    for (std::size_t i = 0; i < nh; ++i)
      CHECK(out_f[i] == doctest::Approx(out_r[i]).epsilon(2e-6).scale(1e-6));
    auto backward = [&](const ztrain::Kernels& k) {
      Vec dx(nh), db(H, 0.5f);
      k.gelu_backward(dx.data(), db.data(), x.data(), bias.data(), dout.data(), {N, z(H)});
      return std::tuple{dx, db};
    };
    const auto [dx_f, db_f] = backward(K());
    const auto [dx_r, db_r] = backward(*ref);
    for (std::size_t i = 0; i < nh; ++i)
      CHECK(dx_f[i] == doctest::Approx(dx_r[i]).epsilon(2e-6).scale(1));
    // dbias: the same rows of dpre, summed in another order (blocks of 64).
    for (int h = 0; h < H; ++h) CHECK(db_f[h] == doctest::Approx(db_r[h]).epsilon(1e-5).scale(1));
    oneapi::tbb::global_control one(oneapi::tbb::global_control::max_allowed_parallelism, 1);
    CHECK(backward(K()) == std::tuple{dx_f, db_f});  // bit-identical
  }
}

TEST_CASE("fast adamw and sum_squares match their reference") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const std::size_t n = 70001;
  Vec p1 = randn(n, 151), g1 = randn(n, 152), m1 = randn(n, 153, 0.1f), v1 = randn(n, 154, 0.1f);
  for (auto& x : v1) x = x * x;
  for (const ztrain::AdamWHyper& h : {kHyper, kHyperL2}) {
    INFO("l2 " << h.l2);
    Vec pf = p1, gf = g1, mf = m1, vf = v1, pr = p1, gr = g1, mr = m1, vr = v1;
    adamw_all(K(), pf.data(), gf.data(), mf.data(), vf.data(), nullptr, n,
              ztrain::GradAfter::zeroed, h);
    adamw_all(*ref, pr.data(), gr.data(), mr.data(), vr.data(), nullptr, n,
              ztrain::GradAfter::zeroed, h);
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(pf[i] == doctest::Approx(pr[i]).epsilon(1e-6));
      CHECK(mf[i] == doctest::Approx(mr[i]).epsilon(1e-6));
      CHECK(vf[i] == doctest::Approx(vr[i]).epsilon(1e-6));
      CHECK(gf[i] == 0.0f);
    }
  }
  const Vec x = randn(200003, 155);
  CHECK(sum_squares(K(), x.data(), x.size()) ==
        doctest::Approx(sum_squares(*ref, x.data(), x.size())).epsilon(1e-12));
}

namespace {

using ztrain::DType;
using Half = std::vector<std::uint16_t>;

// A parameter or gradient held in its type, its values rounded to it.
struct Operand {
  DType type;
  Vec full;   // f32 storage
  Half half;  // 16-bit storage
  Operand(const Vec& v, DType t) : type(t) {
    if (t == DType::f32) {
      full = v;
      return;
    }
    half.resize(v.size());
    ztrain::convert(v.data(), DType::f32, half.data(), t, v.size());
  }
  ztrain::TypedPtr ptr() {
    return type == DType::f32 ? ztrain::TypedPtr(full.data()) : ztrain::TypedPtr(half.data(), type);
  }
  Vec values() const {
    if (type == DType::f32) return full;
    Vec v(half.size());
    ztrain::convert(half.data(), type, v.data(), DType::f32, half.size());
    return v;
  }
};

// The distance from |x| to the next value of type t above it.
double spacing(float x, DType t) {
  if (t == DType::f32) return std::nextafter(std::fabs(x), INFINITY) - std::fabs(x);
  std::uint16_t h = 0;
  ztrain::convert(&x, DType::f32, &h, t, 1);
  h &= 0x7fffu;
  const std::uint16_t up = h + 1;
  float a = 0, b = 0;
  ztrain::convert(&h, t, &a, DType::f32, 1);
  ztrain::convert(&up, t, &b, DType::f32, 1);
  return static_cast<double>(b) - a;
}

// Sums that the fast and the reference kernels add in different orders
// (different GEMM blockings): the fp32 results differ by a few fp32 ulps of
// a bound on the sum of the terms' magnitudes, scale[i]; kSumTol is 4 ulps
// (these sizes need 2). A 16-bit result is such an fp32 sum rounded once,
// so the two may also land on neighbouring values of the type: one spacing
// more, no further.
constexpr double kSumTol = 4 * 0x1p-23;

void check_close(const Operand& a, const Operand& b, const std::vector<double>& scale) {
  const Vec x = a.values(), y = b.values();
  REQUIRE(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO(ztrain::dtype_name(a.type) << " [" << i << "]: " << x[i] << " vs " << y[i]);
    const double rounding =
        a.type == DType::f32 ? 0.0 : spacing(std::max(std::fabs(x[i]), std::fabs(y[i])), a.type);
    CHECK(std::fabs(static_cast<double>(x[i]) - y[i]) <= rounding + kSumTol * scale[i]);
  }
}

// A bound on sum_k |a[i,k] b[j,k]| (Cauchy-Schwarz) for every (i, j), plus
// |c[i,j]|: the scale of (a b^T + c)[i,j]. a: (I,K), b: (J,K) with row
// strides lda and ldb and column strides cola and colb (1 or a row length).
std::vector<double> sum_scale(const Vec& a, int I, std::size_t lda, std::size_t cola, const Vec& b,
                              int J, std::size_t ldb, std::size_t colb, int K, const Vec& c) {
  auto norms = [K](const Vec& m, int rows, std::size_t ld, std::size_t col) {
    std::vector<double> r(static_cast<std::size_t>(rows));
    for (int i = 0; i < rows; ++i) {
      double s = 0;
      for (int k = 0; k < K; ++k) {
        const double v = m[static_cast<std::size_t>(i) * ld + static_cast<std::size_t>(k) * col];
        s += v * v;
      }
      r[static_cast<std::size_t>(i)] = std::sqrt(s);
    }
    return r;
  };
  const auto na = norms(a, I, lda, cola), nb = norms(b, J, ldb, colb);
  std::vector<double> s(static_cast<std::size_t>(I) * J);
  for (int i = 0; i < I; ++i)
    for (int j = 0; j < J; ++j) {
      const std::size_t ij = static_cast<std::size_t>(i) * J + j;
      s[ij] = na[static_cast<std::size_t>(i)] * nb[static_cast<std::size_t>(j)] +
              (c.empty() ? 0.0 : std::fabs(c[ij]));
    }
  return s;
}

// Gradients summed in the same order by both: identical bits.
void check_same(const Operand& a, const Operand& b) {
  CHECK(a.full == b.full);
  CHECK(a.half == b.half);
}

std::uint32_t bits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}

}  // namespace

TEST_CASE("row conversions match dtype.h's scalar ones bit for bit") {
  if (!ztrain::vec::have_avx2_fma())
    MESSAGE("no AVX2/FMA/F16C here: only the scalar fallback is compared");
  // Every 16-bit pattern, widened; split so that the scalar tail runs too.
  Half all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  for (DType t : {DType::bf16, DType::f16}) {
    INFO(ztrain::dtype_name(t));
    Vec wide(all.size());
    ztrain::vec::to_f32({all.data(), t}, wide.data(), 65531);
    ztrain::vec::to_f32({all.data() + 65531, t}, wide.data() + 65531, 5);
    for (std::size_t i = 0; i < all.size(); ++i) {
      const float ref =
          t == DType::bf16 ? ztrain::bf16_to_float(all[i]) : ztrain::f16_to_float(all[i]);
      INFO("pattern " << i);
      CHECK(bits(wide[i]) == bits(ref));
    }
  }
  // Floats: every bf16 value with the low half at the rounding edges (ties,
  // either side of them, NaN payloads), every f16 midpoint and its
  // neighbours (ties, subnormals, the overflow edge), specials, and random
  // bit patterns.
  std::vector<std::uint32_t> in;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      in.push_back(hi << 16 | lo);
  for (std::uint16_t h = 0; h < 0x7c00; ++h) {
    const float mid = (ztrain::f16_to_float(h) + ztrain::f16_to_float(h + 1)) / 2;
    for (std::uint32_t sign : {0u, 0x80000000u})
      for (std::uint32_t u : {bits(mid) - 1, bits(mid), bits(mid) + 1}) in.push_back(sign | u);
  }
  for (std::uint32_t u :
       {0x00000001u, 0x007fffffu, 0x00800000u, 0x33000000u, 0x33000001u, 0x7f7fffffu, 0x7f800000u,
        0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0xff800000u, 0xff800001u, 0x477ff000u, 0x477fefffu})
    in.push_back(u);
  std::mt19937 rng(2024);
  for (int i = 0; i < 1000000; ++i) in.push_back(static_cast<std::uint32_t>(rng()));
  Vec f(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) f[i] = std::bit_cast<float>(in[i]);
  for (DType t : {DType::bf16, DType::f16}) {
    INFO(ztrain::dtype_name(t));
    Half narrow(f.size());
    ztrain::vec::from_f32(f.data(), {narrow.data(), t}, f.size() - 3);
    ztrain::vec::from_f32(f.data() + f.size() - 3, {narrow.data() + f.size() - 3, t}, 3);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < f.size(); ++i) {
      const std::uint16_t ref =
          t == DType::bf16 ? ztrain::float_to_bf16(f[i]) : ztrain::float_to_f16(f[i]);
      if (narrow[i] != ref && mismatches++ < 8)
        FAIL_CHECK("float bits " << in[i] << ": " << narrow[i] << " vs " << ref);
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("16-bit matmul: fast matches reference on awkward sizes, each operand by its own type") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  struct Case {
    int N, C, OC;
  };
  struct Types {
    DType w, dw, db;
  };
  // N = 300 spans two dinp row blocks (the second partial); C = 1000 makes
  // 128-row weight tiles, so OC = 530 takes five, the last partial, in
  // forward, dinp and dw alike.
  for (const Case c : {Case{7, 13, 11}, Case{300, 1000, 530}, Case{1, 8, 1}, Case{33, 129, 70}}) {
    for (const Types ty :
         {Types{DType::bf16, DType::bf16, DType::bf16}, Types{DType::f16, DType::f16, DType::f16},
          Types{DType::f32, DType::bf16, DType::f16}, Types{DType::bf16, DType::f32, DType::f32},
          Types{DType::f16, DType::bf16, DType::f32}}) {
      for (bool with_bias : {true, false}) {
        INFO("N " << c.N << " C " << c.C << " OC " << c.OC << " w " << ztrain::dtype_name(ty.w)
                  << " dw " << ztrain::dtype_name(ty.dw) << " db " << ztrain::dtype_name(ty.db)
                  << " bias " << with_bias);
        const std::size_t nc = static_cast<std::size_t>(c.N) * c.C,
                          no = static_cast<std::size_t>(c.N) * c.OC,
                          wn = static_cast<std::size_t>(c.OC) * c.C;
        const Vec x = randn(nc, 161), dout = randn(no, 162);
        Operand w(randn(wn, 163, 0.5f), ty.w), b(randn(c.OC, 164), ty.w);
        Vec out_f(no), out_r(no);
        K().matmul_forward(out_f.data(), x.data(), w.ptr(), with_bias ? b.ptr() : nullptr,
                           {z(c.N), z(c.C), z(c.OC)});
        ref->matmul_forward(out_r.data(), x.data(), w.ptr(), with_bias ? b.ptr() : nullptr,
                            {z(c.N), z(c.C), z(c.OC)});
        const std::size_t C = static_cast<std::size_t>(c.C), OC = static_cast<std::size_t>(c.OC);
        Vec bias_rows;
        if (with_bias)
          for (int n = 0; n < c.N; ++n) {
            const Vec bv = b.values();
            bias_rows.insert(bias_rows.end(), bv.begin(), bv.end());
          }
        const Vec w32 = w.values();
        check_close(Operand(out_f, DType::f32), Operand(out_r, DType::f32),
                    sum_scale(x, c.N, C, 1, w32, c.OC, C, 1, c.C, bias_rows));
        // Backward adds into what is there.
        const Vec dx0 = randn(nc, 165);
        Operand dw_f(randn(wn, 166), ty.dw), db_f(randn(c.OC, 167), ty.db);
        Operand dw_r = dw_f, db_r = db_f;
        Vec dx_f = dx0, dx_r = dx0;
        K().matmul_backward(dx_f.data(), dw_f.ptr(), with_bias ? db_f.ptr() : nullptr, dout.data(),
                            x.data(), w.ptr(), {z(c.N), z(c.C), z(c.OC)});
        ref->matmul_backward(dx_r.data(), dw_r.ptr(), with_bias ? db_r.ptr() : nullptr, dout.data(),
                             x.data(), w.ptr(), {z(c.N), z(c.C), z(c.OC)});
        check_close(Operand(dx_f, DType::f32), Operand(dx_r, DType::f32),
                    sum_scale(dout, c.N, OC, 1, w32, c.C, 1, C, c.OC, dx0));
        const auto dw_scale = sum_scale(dout, c.OC, 1, OC, x, c.C, 1, C, c.N, dw_r.values());
        check_close(dw_f, dw_r, dw_scale);
        check_same(db_f, db_r);  // both add the rows in order
        // No input gradient wanted (from equal starting points again).
        dw_r = dw_f;
        K().matmul_backward(nullptr, dw_f.ptr(), nullptr, dout.data(), x.data(), w.ptr(),
                            {z(c.N), z(c.C), z(c.OC)});
        ref->matmul_backward(nullptr, dw_r.ptr(), nullptr, dout.data(), x.data(), w.ptr(),
                             {z(c.N), z(c.C), z(c.OC)});
        check_close(dw_f, dw_r, dw_scale);
      }
    }
  }
}

TEST_CASE("16-bit matmul_forward computes the fp32 one on the rounded weights") {
  const int N = 65, C = 300, OC = 517;
  const Vec x = randn(static_cast<std::size_t>(N) * C, 171);
  for (DType t : {DType::bf16, DType::f16}) {
    INFO(ztrain::dtype_name(t));
    Operand w(randn(static_cast<std::size_t>(OC) * C, 172, 0.5f), t), b(randn(OC, 173), t);
    const Vec w32 = w.values(), b32 = b.values();
    Vec out16(static_cast<std::size_t>(N) * OC), out32(out16.size());
    K().matmul_forward(out16.data(), x.data(), w.ptr(), b.ptr(), {N, C, OC});
    K().matmul_forward(out32.data(), x.data(), w32.data(), b32.data(), {N, C, OC});
    // Only the GEMMs' blocking differs (per weight tile or whole).
    Vec bias_rows;
    for (int n = 0; n < N; ++n) bias_rows.insert(bias_rows.end(), b32.begin(), b32.end());
    check_close(Operand(out16, DType::f32), Operand(out32, DType::f32),
                sum_scale(x, N, C, 1, w32, OC, C, 1, C, bias_rows));
  }
}

TEST_CASE("16-bit embedding: fast matches reference bit for bit, repeated tokens included") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const int B = 3, T = 7, C = 37, V = 11;
  std::vector<std::int32_t> tokens(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = (i * 7 + i / 5) % V;
  tokens[4] = tokens[9] = tokens[20] = 10;  // the last row, three times
  const Vec dout = randn(static_cast<std::size_t>(B) * T * C, 181);
  for (DType t : {DType::bf16, DType::f16}) {
    for (DType tp : {t, DType::f32}) {
      for (bool with_pos : {true, false}) {
        INFO(ztrain::dtype_name(t) << " wpe " << ztrain::dtype_name(tp) << " " << with_pos);
        Operand wte(randn(static_cast<std::size_t>(V) * C, 182), t);
        Operand wpe(randn(static_cast<std::size_t>(T) * C, 183), tp);
        const auto pos = with_pos ? ztrain::ConstTypedPtr(wpe.ptr()) : nullptr;
        Vec out_f(dout.size()), out_r(dout.size());
        K().embedding_forward(out_f.data(), tokens.data(), wte.ptr(), pos, {B, T, C});
        ref->embedding_forward(out_r.data(), tokens.data(), wte.ptr(), pos, {B, T, C});
        CHECK(out_f == out_r);
        Operand dwte_f(randn(wte.values().size(), 184), t),
            dwpe_f(randn(wpe.values().size(), 185), tp);
        Operand dwte_r = dwte_f, dwpe_r = dwpe_f;
        K().embedding_backward(dwte_f.ptr(), with_pos ? dwpe_f.ptr() : nullptr, dout.data(),
                               tokens.data(), {B, T, C});
        ref->embedding_backward(dwte_r.ptr(), with_pos ? dwpe_r.ptr() : nullptr, dout.data(),
                                tokens.data(), {B, T, C});
        check_same(dwte_f, dwte_r);
        check_same(dwpe_f, dwpe_r);
      }
    }
  }
}

// Part p of P of a vocabulary of V rows: [V p / P, V (p + 1) / P), as the
// transformer splits it (unequal parts where P does not divide V).
std::size_t part_first(std::size_t V, std::size_t P, std::size_t p) {
  return V * p / P;
}

// A table split by vocabulary rows over 3 ranks (11 rows: 3, 4 and 4): each
// part looks up the tokens it holds (zeros for the others) and the first
// adds the positions; their sum is the whole table's output, bit for bit
// (one part's row and zeros), and each part's gradient is the whole's rows
// (the same additions in the same order). Fast and reference, fp32 and
// 16-bit tables.
TEST_CASE("a vocabulary-parallel embedding: the parts' sum is the whole table's") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const std::size_t B = 3, T = 7, C = 37, V = 11, P = 3;
  std::vector<std::int32_t> tokens(B * T);
  for (std::size_t i = 0; i < B * T; ++i)
    tokens[i] = static_cast<std::int32_t>((i * 7 + i / 5) % V);
  const Vec table = randn(V * C, 191), positions = randn(T * C, 192), grad0 = randn(V * C, 193);
  const Vec dout = randn(B * T * C, 194);
  for (const ztrain::Kernels* k : {&K(), static_cast<const ztrain::Kernels*>(ref.get())})
    for (DType t : {DType::f32, DType::bf16}) {
      INFO(ztrain::dtype_name(t));
      Operand wte(table, t), wpe(positions, t), dwte(grad0, t), dwpe(Vec(T * C, 0.0f), t);
      Vec whole(B * T * C), sum(B * T * C, 0.0f);
      k->embedding_forward(whole.data(), tokens.data(), wte.ptr(), wpe.ptr(), {B, T, C});
      k->embedding_backward(dwte.ptr(), dwpe.ptr(), dout.data(), tokens.data(), {B, T, C});
      const Vec dwte_whole = dwte.values();
      for (std::size_t p = 0; p < P; ++p) {
        const std::size_t first = part_first(V, P, p), rows = part_first(V, P, p + 1) - first;
        const auto at = [&](const Vec& v) {
          return Vec(v.begin() + static_cast<std::ptrdiff_t>(first * C),
                     v.begin() + static_cast<std::ptrdiff_t>((first + rows) * C));
        };
        const ztrain::TokenShape s{B, T, C, first, rows};
        Operand part(at(table), t), dpart(at(grad0), t);
        Vec out(B * T * C);
        k->embedding_forward(out.data(), tokens.data(), part.ptr(),
                             p == 0 ? ztrain::ConstTypedPtr(wpe.ptr()) : nullptr, s);
        for (std::size_t i = 0; i < out.size(); ++i) sum[i] += out[i];
        k->embedding_backward(dpart.ptr(), nullptr, dout.data(), tokens.data(), s);
        CHECK(dpart.values() == at(dwte_whole));
      }
      CHECK(sum == whole);
    }
}

// The loss over a vocabulary split into 3 slices (37 logits: 12, 12, 13),
// the all-reduces done by hand between the ops (the maxima's max, the sums'
// sum), against the whole row's softmax cross-entropy (itself checked by
// finite differences above): every loss and every dlogit, targets in each
// slice and an ignored row included, on the fast kernels and the reference.
TEST_CASE("vocabulary-parallel cross-entropy: the slices' loss and gradient are the whole row's") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const std::size_t N = 5, V = 37, P = 3;
  const Vec logits = randn(N * V, 195, 3.0f);
  const std::vector<std::int32_t> targets{0, 13, ztrain::kIgnoreTarget, 36, 24};
  const float dloss = 0.37f;
  for (const ztrain::Kernels* k : {&K(), static_cast<const ztrain::Kernels*>(ref.get())}) {
    Vec probs = logits, losses(N);
    k->softmax_crossentropy_forward(losses.data(), probs.data(), targets.data(), {N, V});
    k->softmax_crossentropy_backward(probs.data(), targets.data(), dloss, {N, V});
    std::vector<Vec> slices(P);
    Vec row_max(N, -INFINITY), sums(2 * N, 0.0f);
    for (std::size_t p = 0; p < P; ++p) {
      const std::size_t first = part_first(V, P, p), cols = part_first(V, P, p + 1) - first;
      for (std::size_t n = 0; n < N; ++n)
        slices[p].insert(slices[p].end(),
                         logits.begin() + static_cast<std::ptrdiff_t>(n * V + first),
                         logits.begin() + static_cast<std::ptrdiff_t>(n * V + first + cols));
      Vec m(N);
      k->crossentropy_slice_max(m.data(), slices[p].data(), {N, cols, first});
      for (std::size_t n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], m[n]);
    }
    for (std::size_t p = 0; p < P; ++p) {
      const std::size_t first = part_first(V, P, p), cols = part_first(V, P, p + 1) - first;
      Vec part(2 * N);
      k->crossentropy_slice_sums(part.data(), slices[p].data(), row_max.data(), targets.data(),
                                 {N, cols, first});
      for (std::size_t i = 0; i < 2 * N; ++i) sums[i] += part[i];
    }
    Vec slice_losses(N, 7.0f);
    k->crossentropy_slice_loss(slice_losses.data(), row_max.data(), sums.data(), targets.data(), N);
    for (std::size_t n = 0; n < N; ++n)
      CHECK(slice_losses[n] == doctest::Approx(losses[n]).epsilon(1e-6).scale(1e-6));
    for (std::size_t p = 0; p < P; ++p) {
      const std::size_t first = part_first(V, P, p), cols = part_first(V, P, p + 1) - first;
      k->crossentropy_slice_backward(slices[p].data(), sums.data(), targets.data(), dloss,
                                     {N, cols, first});
      for (std::size_t n = 0; n < N; ++n)
        for (std::size_t c = 0; c < cols; ++c) {
          INFO("slice " << p << " row " << n << " column " << first + c);
          CHECK(slices[p][n * cols + c] ==
                doctest::Approx(probs[n * V + first + c]).epsilon(1e-5).scale(1e-7));
        }
    }
  }
}

// Fast against reference: the same math in another order (vector sums,
// gradients per block of rows), so within fp32 rounding for dinp and one
// 16-bit rounding for the parameter gradients.
void check_close(const Vec& a, const Vec& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5).scale(1));
}
void check_close(const Operand& a, const Operand& b) {
  const Vec x = a.values(), y = b.values();
  for (std::size_t i = 0; i < x.size(); ++i)
    CHECK(x[i] == doctest::Approx(y[i]).epsilon(1.0 / 128).scale(1e-2));
}

TEST_CASE("16-bit layernorm and rmsnorm: fp32 math on the widened values, gradients rounded once") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const int N = 37, C = 83;
  const std::size_t nc = static_cast<std::size_t>(N) * C;
  const Vec x = randn(nc, 191, 2.0f), dout = randn(nc, 192);
  for (DType t : {DType::bf16, DType::f16}) {
    INFO(ztrain::dtype_name(t));
    Operand w(randn(C, 193), t), b(randn(C, 194), t);
    const Vec w32 = w.values(), b32 = b.values();
    Vec out(nc), out32(nc), mean(N), rstd(N), mean32(N), rstd32(N);
    K().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.ptr(), b.ptr(), {N, C},
                          1e-5f);
    K().layernorm_forward(out32.data(), mean32.data(), rstd32.data(), x.data(), w32.data(),
                          b32.data(), {N, C}, 1e-5f);
    CHECK(out == out32);
    const Vec dx0 = randn(nc, 195);
    Operand dw_f(randn(C, 196), t), db_f(randn(C, 197), t);
    Operand dw_r = dw_f, db_r = db_f;
    Vec dx_f = dx0, dx_r = dx0;
    K().layernorm_backward(dx_f.data(), dw_f.ptr(), db_f.ptr(), dout.data(), x.data(), w.ptr(),
                           mean.data(), rstd.data(), {N, C});
    ref->layernorm_backward(dx_r.data(), dw_r.ptr(), db_r.ptr(), dout.data(), x.data(), w.ptr(),
                            mean.data(), rstd.data(), {N, C});
    check_close(dx_f, dx_r);
    check_close(dw_f, dw_r);
    check_close(db_f, db_r);
    // Rounded once: the fp32 gradient added to the widened value, then rounded.
    Vec dw32 = Operand(randn(C, 196), t).values(), db32 = Operand(randn(C, 197), t).values();
    Vec dx32 = dx0;
    K().layernorm_backward(dx32.data(), dw32.data(), db32.data(), dout.data(), x.data(), w32.data(),
                           mean.data(), rstd.data(), {N, C});
    CHECK(dx32 == dx_f);
    CHECK(Operand(dw32, t).half == dw_f.half);
    CHECK(Operand(db32, t).half == db_f.half);

    K().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.ptr(), {N, C}, 1e-6f);
    K().rmsnorm_forward(out32.data(), rstd32.data(), x.data(), w32.data(), {N, C}, 1e-6f);
    CHECK(out == out32);
    dx_f = dx_r = dx0;
    dw_r = dw_f;
    dw32 = dw_f.values();
    K().rmsnorm_backward(dx_f.data(), dw_f.ptr(), dout.data(), x.data(), w.ptr(), rstd.data(),
                         {N, C});
    ref->rmsnorm_backward(dx_r.data(), dw_r.ptr(), dout.data(), x.data(), w.ptr(), rstd.data(),
                          {N, C});
    check_close(dx_f, dx_r);
    check_close(dw_f, dw_r);
    dx32 = dx0;
    K().rmsnorm_backward(dx32.data(), dw32.data(), dout.data(), x.data(), w32.data(), rstd.data(),
                         {N, C});
    CHECK(dx32 == dx_f);
    CHECK(Operand(dw32, t).half == dw_f.half);
  }
}

TEST_CASE(
    "16-bit adamw: fp32 update of the widened gradient, g zeroed or kept, working = rounded p") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const std::size_t n = 70001;  // two chunks and a scalar tail
  const Vec p0 = randn(n, 201), g0 = randn(n, 202), m0 = randn(n, 203, 0.1f);
  Vec v0 = randn(n, 204, 0.1f);
  for (auto& x : v0) x = x * x;
  for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
    for (int wk = 0; wk < 8; ++wk) {
      const DType wt = wk % 4 == 0 ? DType::f32 : static_cast<DType>(wk % 4 - 1);
      const auto after = wk < 4 ? ztrain::GradAfter::zeroed : ztrain::GradAfter::kept;
      INFO("g " << ztrain::dtype_name(gt) << " working "
                << (wk % 4 ? ztrain::dtype_name(wt) : "none") << (wk < 4 ? ", zeroed" : ", kept"));
      Operand g_f(g0, gt), w_f(Vec(n, 7.0f), wt);
      Operand g_r = g_f, w_r = w_f;
      const Vec g32 = g_f.values();
      Vec p_f = p0, m_f = m0, v_f = v0, p_r = p0, m_r = m0, v_r = v0;
      auto step = [&](const ztrain::Kernels& k, float* p, ztrain::TypedPtr g, float* m, float* v,
                      ztrain::TypedPtr w) { adamw_all(k, p, g, m, v, w, n, after); };
      step(K(), p_f.data(), g_f.ptr(), m_f.data(), v_f.data(), wk % 4 ? w_f.ptr() : nullptr);
      step(*ref, p_r.data(), g_r.ptr(), m_r.data(), v_r.data(), wk % 4 ? w_r.ptr() : nullptr);
      // The same per-element operations as the fp32 update on g's values.
      Vec p32 = p0, g_copy = g32, m32 = m0, v32 = v0;
      step(K(), p32.data(), g_copy.data(), m32.data(), v32.data(), nullptr);
      CHECK(p_f == p32);
      CHECK(m_f == m32);
      CHECK(v_f == v32);
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(p_f[i] == doctest::Approx(p_r[i]).epsilon(1e-6));
        CHECK(m_f[i] == doctest::Approx(m_r[i]).epsilon(1e-6));
      }
      const Vec g_after = wk < 4 ? Vec(n, 0.0f) : g32;
      CHECK(g_f.values() == g_after);
      CHECK(g_r.values() == g_after);
      if (wk % 4) {
        CHECK(w_f.full == Operand(p_f, wt).full);
        CHECK(w_f.half == Operand(p_f, wt).half);
        CHECK(w_r.full == Operand(p_r, wt).full);
        CHECK(w_r.half == Operand(p_r, wt).half);
      }
    }
  }
}

TEST_CASE("16-bit gelu bias: fp32 math on the widened bias, dbias rounded once") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const int N = 37, H = 83;
  const std::size_t nh = static_cast<std::size_t>(N) * H;
  const Vec x = randn(nh, 251, 2.0f), dout = randn(nh, 252);
  for (DType t : {DType::bf16, DType::f16}) {
    INFO(ztrain::dtype_name(t));
    Operand b(randn(H, 253), t);
    const Vec b32 = b.values();
    Vec out(nh), out32(nh);
    K().gelu_forward(out.data(), x.data(), b.ptr(), {N, H});
    K().gelu_forward(out32.data(), x.data(), b32.data(), {N, H});
    CHECK(out == out32);
    Operand db_f(randn(H, 254), t);
    Operand db_r = db_f;
    Vec db32 = db_f.values();
    Vec dx_f(nh), dx_r(nh), dx32(nh);
    K().gelu_backward(dx_f.data(), db_f.ptr(), x.data(), b.ptr(), dout.data(), {N, H});
    ref->gelu_backward(dx_r.data(), db_r.ptr(), x.data(), b.ptr(), dout.data(), {N, H});
    check_close(dx_f, dx_r);
    check_close(db_f, db_r);
    K().gelu_backward(dx32.data(), db32.data(), x.data(), b32.data(), dout.data(), {N, H});
    CHECK(dx32 == dx_f);
    CHECK(Operand(db32, t).half == db_f.half);  // the fp32 sum, rounded once
  }
}

TEST_CASE("adamw on AVX-512 gives the AVX2 loop's bits on every element, tail included") {
  if (!ztrain::vec::have_avx512() || !ztrain::vec::have_avx2_fma()) {
    MESSAGE("skipped: this processor has no AVX-512 (F, BW, VL)");
    return;
  }
  const auto same_bits = [](const Vec& a, const Vec& b) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return i;
    return a.size();
  };
  // Lengths around the 16- and 8-lane boundaries, and a long odd one.
  for (std::size_t n : {std::size_t{5}, std::size_t{8}, std::size_t{15}, std::size_t{16},
                        std::size_t{29}, std::size_t{70013}}) {
    const Vec p0 = randn(n, 221), g0 = randn(n, 222), m0 = randn(n, 223, 0.1f);
    Vec v0 = randn(n, 224, 0.1f);
    for (auto& x : v0) x = x * x;
    // A NaN and an infinity among the gradients, as an overflowed step has.
    Vec g_special = g0;
    g_special[n / 2] = NAN;
    g_special[n - 1] = INFINITY;
    // Decoupled decay, then L2 (the gradient's term) with the other 0.
    for (const ztrain::vec::AdamScalars a :
         {ztrain::vec::AdamScalars{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.0f, 0.7f, 0.19f, 0.0975f},
          ztrain::vec::AdamScalars{0.01f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 0.7f, 0.19f, 0.0975f}})
      for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
        for (int wk = 0; wk < 4; ++wk) {
          const DType wt = wk == 0 ? DType::f32 : static_cast<DType>(wk - 1);
          INFO("n " << n << " g " << ztrain::dtype_name(gt) << " working "
                    << (wk ? ztrain::dtype_name(wt) : "none") << " l2 " << a.l2);
          Operand g512(g_special, gt), g256 = g512, w512(Vec(n, 7.0f), wt), w256 = w512;
          Vec p512 = p0, m512 = m0, v512 = v0, p256 = p0, m256 = m0, v256 = v0;
          ztrain::vec::adamw_avx512(p512.data(), g512.ptr(), m512.data(), v512.data(),
                                    wk ? w512.ptr() : nullptr, n, a, true);
          ztrain::vec::adamw_avx2(p256.data(), g256.ptr(), m256.data(), v256.data(),
                                  wk ? w256.ptr() : nullptr, n, a, true);
          CHECK(same_bits(p512, p256) == n);
          CHECK(same_bits(m512, m256) == n);
          CHECK(same_bits(v512, v256) == n);
          CHECK(std::isnan(p512[n / 2]));
          CHECK(g512.values() == Vec(n, 0.0f));
          if (wk) {
            CHECK(w512.half == w256.half);
            if (wt == DType::f32) CHECK(same_bits(w512.full, w256.full) == n);
          }
        }
      }
  }
}

TEST_CASE("the exp loops on AVX-512 give the AVX2 loops' bits, sums and tails included") {
  namespace vec = ztrain::vec;
  if (!vec::have_avx512() || !vec::have_avx2_fma()) {
    MESSAGE("skipped: this processor lacks AVX-512 F/BW/VL or AVX2");
    return;
  }
  CHECK(&vec::exp_loops() == &vec::exp_loops_avx512());
  const vec::ExpLoops &v512 = vec::exp_loops_avx512(), &v256 = vec::exp_loops_avx2();
  const auto same_bits = [](const Vec& a, const Vec& b) {
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return i;
    return a.size();
  };
  const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  // Lengths around the 16- and 8-lane boundaries, a row of attention and a
  // vocabulary; inputs wide enough to reach exp's clamps (|x| > 87).
  for (std::size_t n :
       {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{15}, std::size_t{16},
        std::size_t{24}, std::size_t{31}, std::size_t{256}, std::size_t{4099}}) {
    INFO("n " << n);
    const Vec x = randn(n, 301, 4.0f), b = randn(n, 302), d = randn(n, 303);
    const Vec wide = randn(n, 304, 60.0f);
    Vec y512(n), y256(n);
    for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
      v512.gelu_forward(y512.data(), x.data(), bias, n);
      v256.gelu_forward(y256.data(), x.data(), bias, n);
      CHECK(same_bits(y512, y256) == n);
      Vec db512 = d, db256 = d;
      v512.gelu_backward(y512.data(), db512.data(), x.data(), bias, d.data(), n);
      v256.gelu_backward(y256.data(), db256.data(), x.data(), bias, d.data(), n);
      CHECK(same_bits(y512, y256) == n);
      CHECK(same_bits(db512, db256) == n);
    }
    v512.swiglu_forward(y512.data(), wide.data(), x.data(), n);
    v256.swiglu_forward(y256.data(), wide.data(), x.data(), n);
    CHECK(same_bits(y512, y256) == n);
    Vec dg512 = b, dg256 = b, du512 = d, du256 = d;
    v512.swiglu_backward(dg512.data(), du512.data(), d.data(), wide.data(), x.data(), n);
    v256.swiglu_backward(dg256.data(), du256.data(), d.data(), wide.data(), x.data(), n);
    CHECK(same_bits(dg512, dg256) == n);
    CHECK(same_bits(du512, du256) == n);

    // Sums of many terms of one size, where their order shows in the bits.
    Vec e512 = randn(n, 308, 2.0f), e256 = e512;
    CHECK(bits(v512.exp_shifted_sum(e512.data(), n, 3.0f)) ==
          bits(v256.exp_shifted_sum(e256.data(), n, 3.0f)));
    CHECK(same_bits(e512, e256) == n);
    // A row of n scores in a row of n + 5, the rest zeroed.
    Vec r512 = randn(n + 5, 305, 2.0f), r256 = r512;
    CHECK(bits(v512.softmax_row(r512.data(), n, n + 5)) ==
          bits(v256.softmax_row(r256.data(), n, n + 5)));
    CHECK(same_bits(r512, r256) == n + 5);
    Vec p512 = randn(n + 5, 306, 3.0f), p256 = p512, q512 = randn(n + 5, 307), q256 = q512;
    v512.softmax_backward_row(p512.data(), q512.data(), n, n + 5, 2.5f, 0.3f, 0.125f);
    v256.softmax_backward_row(p256.data(), q256.data(), n, n + 5, 2.5f, 0.3f, 0.125f);
    CHECK(same_bits(p512, p256) == n + 5);
    CHECK(same_bits(q512, q256) == n + 5);
    CHECK(p512[n] == 0.0f);
  }
}

// Attention's block products, on every shape of operand the attention
// kernels give them (A as stored and transposed, B's rows strided, C
// written or added to), sizes around the kernel's 8-row and 16- and 32-
// column edges. The AVX-512 kernel gives the plain reference's bits (the
// same chain of fused multiply-adds per element) and leaves C's other
// columns alone; OpenBLAS, in its own order, stays within the rounding
// any order of the sum allows, (k + 2) u (|alpha| sum |a||b| + |c|).
TEST_CASE("block products: the AVX-512 kernel gives the reference's bits, OpenBLAS its bound") {
  namespace vec = ztrain::vec;
  CHECK(
      (vec::block_gemm() == (vec::have_avx512() ? vec::block_gemm_avx512 : vec::block_gemm_blas)));
  const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  constexpr double kUnit = 0x1p-24;
  for (std::size_t m : {1, 7, 8, 9, 23, 64})
    for (std::size_t n : {1, 15, 16, 17, 32, 33, 70})
      for (std::size_t k : {1, 5, 64, 130})
        for (const bool a_turned : {false, true})
          for (const bool accumulate : {false, true}) {
            INFO("m " << m << " n " << n << " k " << k << (a_turned ? " A^T" : "")
                      << (accumulate ? " added" : ""));
            const std::size_t lda = (a_turned ? m : k) + 3, ldb = n + 5, ldc = n + 7;
            const Vec a = randn((a_turned ? k : m) * lda, 311), b = randn(k * ldb, 312);
            const Vec c0 = randn(m * ldc, 313);
            const float alpha = accumulate ? 0.125f : 1.0f;
            const vec::MatrixView av =
                a_turned ? vec::MatrixView{a.data(), 1, lda} : vec::MatrixView{a.data(), lda, 1};
            Vec ref = c0, blas = c0;
            vec::BlockGemm g{m, n, k, av, {b.data(), ldb, 1}, ref.data(), ldc, alpha, accumulate};
            vec::block_gemm_reference(g);
            g.c = blas.data();
            vec::block_gemm_blas(g);
            std::size_t off = 0;
            for (std::size_t i = 0; i < m; ++i)
              for (std::size_t j = 0; j < ldc; ++j) {
                const std::size_t at = i * ldc + j;
                if (j >= n) {  // past the product's columns: untouched
                  off += ref[at] != c0[at] || blas[at] != c0[at];
                  continue;
                }
                double mag = accumulate ? std::abs(c0[at]) : 0.0;
                for (std::size_t p = 0; p < k; ++p)
                  mag += alpha * std::abs(a[a_turned ? p * lda + i : i * lda + p] * b[p * ldb + j]);
                off += std::abs(double{blas[at]} - ref[at]) > 2 * (k + 2) * kUnit * mag;
              }
            CHECK(off == 0);
            if (!vec::have_avx512()) continue;
            Vec fast = c0;
            g.c = fast.data();
            vec::block_gemm_avx512(g);
            std::size_t differ = 0;
            for (std::size_t i = 0; i < fast.size(); ++i) differ += bits(fast[i]) != bits(ref[i]);
            CHECK(differ == 0);
          }
}

// Attention's causal blocks, as the AVX-512 kernel skips them: a block of m
// query rows whose row r sees keys up to r + last. Scores past that are
// not wanted; probabilities (and their gradients) are zero there, and
// their transposes before it. Where the band holds, the kernel's wanted
// elements are the reference's bits (it skips only exact zeros).
TEST_CASE("block products in a causal band: only zeros and unwanted scores are skipped") {
  namespace vec = ztrain::vec;
  if (!vec::have_avx512()) {
    MESSAGE("skipped: this processor lacks AVX-512 F/BW/VL");
    return;
  }
  constexpr std::size_t none = vec::CausalBand::kNone;
  const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  for (std::size_t m : {1, 7, 8, 13, 64})
    for (std::size_t last : {0, 5, 64})
      for (std::size_t hs : {5, 64}) {
        INFO("rows " << m << " last " << last << " hs " << hs);
        const std::size_t n = m + last;  // the keys the block meets
        const auto seen = [&](std::size_t r, std::size_t j) { return j <= r + last; };
        const auto all = [](std::size_t, std::size_t) { return true; };
        std::size_t differ = 0;
        const auto compare = [&](vec::BlockGemm g, const Vec& c0, auto wanted) {
          Vec ref = c0, fast = c0;
          g.c = ref.data();
          vec::block_gemm_reference(g);
          g.c = fast.data();
          vec::block_gemm_avx512(g);
          for (std::size_t i = 0; i < g.m; ++i)
            for (std::size_t j = 0; j < g.n; ++j)
              if (wanted(i, j)) differ += bits(fast[i * g.ldc + j]) != bits(ref[i * g.ldc + j]);
        };
        // P (m x n), zero past each row's last key.
        Vec p = randn(m * n, 333);
        for (std::size_t r = 0; r < m; ++r)
          for (std::size_t j = 0; j < n; ++j)
            if (!seen(r, j)) p[r * n + j] = 0.0f;
        const Vec q = randn(m * hs, 331), kt = randn(hs * n, 332), v = randn(n * hs, 334),
                  dout = randn(m * hs, 335);
        const vec::MatrixView qv{q.data(), hs, 1}, ktv{kt.data(), n, 1}, pv{p.data(), n, 1},
            ptv{p.data(), 1, n}, vv{v.data(), hs, 1}, dov{dout.data(), hs, 1};
        // S = Q K^T (m x n): wanted where the row sees the key.
        compare({m, n, hs, qv, ktv, nullptr, n, 0.125f, false, {none, none, last}}, Vec(m * n),
                seen);
        // O = P V (m x hs), and dQ += dS K's form.
        compare({m, hs, n, pv, vv, nullptr, hs, 1.0f, true, {last, none, none}}, randn(m * hs, 336),
                all);
        // dV += P^T dO (n x hs): P^T's row j is zero before query j - last.
        compare({n, hs, m, ptv, dov, nullptr, hs, 1.0f, true, {none, last, none}},
                randn(n * hs, 337), all);
        CHECK(differ == 0);
      }
}

TEST_CASE("transpose turns a strided block whole") {
  for (std::size_t rows : {1, 15, 16, 17, 40})
    for (std::size_t cols : {1, 16, 33}) {
      const std::size_t ld = cols + 4;
      const Vec src = randn(rows * ld, 321);
      Vec dst(rows * cols, -1.0f);
      ztrain::vec::transpose(dst.data(), src.data(), rows, cols, ld);
      std::size_t wrong = 0;
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) wrong += dst[c * rows + r] != src[r * ld + c];
      CHECK(wrong == 0);
    }
}

TEST_CASE("16-bit sum_squares: the double sum of the widened values, thread-count independent") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const Vec x0 = randn(200003, 211, 3.0f);
  for (DType t : {DType::bf16, DType::f16}) {
    INFO(ztrain::dtype_name(t));
    Operand x(x0, t);
    const Vec wide = x.values();
    double sum = 0;
    for (float v : wide) sum += static_cast<double>(v) * v;
    const double fast = sum_squares(K(), x.ptr(), wide.size());
    CHECK(fast == doctest::Approx(sum).epsilon(1e-12));
    CHECK(sum_squares(*ref, x.ptr(), wide.size()) == doctest::Approx(sum).epsilon(1e-12));
    CHECK(fast == sum_squares(K(), wide.data(), wide.size()));  // same order as fp32
    oneapi::tbb::global_control one_thread(oneapi::tbb::global_control::max_allowed_parallelism, 1);
    CHECK(sum_squares(K(), x.ptr(), wide.size()) == fast);
  }
}

TEST_CASE("16-bit matmul and embedding backward do not depend on the thread count") {
  const int N = 300, C = 200, OC = 1500, B = 3, T = 100, V = 50;
  const Vec x = randn(static_cast<std::size_t>(N) * C, 221),
            dout = randn(static_cast<std::size_t>(N) * OC, 222);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i * i % V);
  Operand w(randn(static_cast<std::size_t>(OC) * C, 223, 0.5f), DType::bf16),
      b(randn(OC, 224), DType::f16);
  auto run = [&] {
    Vec out(dout.size()), dx(x.size());
    Operand dw(Vec(w.half.size()), DType::bf16), db(Vec(OC), DType::f16),
        dwte(Vec(static_cast<std::size_t>(V) * OC), DType::bf16);
    K().matmul_forward(out.data(), x.data(), w.ptr(), b.ptr(), {N, C, OC});
    K().matmul_backward(dx.data(), dw.ptr(), db.ptr(), dout.data(), x.data(), w.ptr(), {N, C, OC});
    K().embedding_backward(dwte.ptr(), nullptr, dout.data(), tokens.data(), {B, T, OC});
    return std::tuple{out, dx, dw.half, db.half, dwte.half};
  };
  const auto many = run();
  oneapi::tbb::global_control one_thread(oneapi::tbb::global_control::max_allowed_parallelism, 1);
  CHECK(run() == many);  // bit-identical
}

TEST_CASE("Device::convert and accumulate: dtype.h's conversions and sums") {
  const auto dev = ztrain::make_cpu_device(1);
  const Vec x = randn(1001, 131, 3.0f), y = randn(1001, 132);
  std::vector<std::uint16_t> b(1001), want_b(1001);
  dev->convert({b.data(), ztrain::DType::bf16}, x.data(), x.size());
  ztrain::convert(x.data(), ztrain::DType::f32, want_b.data(), ztrain::DType::bf16, x.size());
  CHECK(b == want_b);
  Vec back(1001);
  dev->convert(back.data(), ztrain::ConstTypedPtr{b.data(), ztrain::DType::bf16}, back.size());
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(back[i] == ztrain::bf16_to_float(want_b[i]));
  Vec acc = y;
  dev->accumulate(acc.data(), x.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(acc[i] == y[i] + x[i]);
  CHECK_THROWS_AS(
      dev->accumulate(acc.data(), ztrain::ConstTypedPtr{b.data(), ztrain::DType::bf16}, x.size()),
      ztrain::InternalError);
}
