// Every cpu kernel's backward against central finite differences of its
// forward, on awkward sizes. The scalar checked is L = sum(w * out) in
// double with a fixed random w, so the analytic gradient is backward(dout=w).
#include <doctest/doctest.h>

#include <oneapi/tbb/global_control.h>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/reference_kernels.h"
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

}  // namespace

TEST_CASE("matmul backward matches finite differences, with and without bias") {
  const int N = 7, C = 13, OC = 11;
  for (bool with_bias : {true, false}) {
    Vec x = randn(N * C, 1), w = randn(OC * C, 2, 0.5f), b = randn(OC, 3), out(N * OC);
    const Vec dout = randn(N * OC, 4);
    Vec dx(N * C), dw(OC * C), db(OC);
    K().matmul_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                        x.data(), w.data(), N, C, OC);
    auto loss = [&] {
      K().matmul_forward(out.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
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
  K().matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
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
  K().matmul_backward(dx0.data(), dw0.data(), db0.data(), dout.data(), x.data(), w.data(), N, C,
                      OC);
  Vec dx(N * C, 1.5f), dw(OC * C, -2.0f), db(OC, 0.25f);
  K().matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
  for (std::size_t i = 0; i < dx.size(); ++i) CHECK(dx[i] == doctest::Approx(dx0[i] + 1.5f));
  for (std::size_t i = 0; i < dw.size(); ++i) CHECK(dw[i] == doctest::Approx(dw0[i] - 2.0f));
  for (std::size_t i = 0; i < db.size(); ++i) CHECK(db[i] == doctest::Approx(db0[i] + 0.25f));
}

TEST_CASE("layernorm backward matches finite differences") {
  const int N = 5, C = 19;
  Vec x = randn(N * C, 31, 2.0f), w = randn(C, 32), b = randn(C, 33), out(N * C), mean(N), rstd(N);
  const Vec dout = randn(N * C, 34);
  K().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                        1e-5f);
  Vec dx(N * C), dw(C), db(C);
  K().layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
  auto loss = [&] {
    K().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                          1e-5f);
    return dot(out, dout);
  };
  check_gradients(loss, {{&x, &dx, "inp"}, {&w, &dw, "w"}, {&b, &db, "b"}});
}

TEST_CASE("layernorm forward normalises each row") {
  const int N = 3, C = 10;
  const Vec x = randn(N * C, 35, 3.0f), w(C, 1.0f), b(C, 0.0f);
  Vec out(N * C), mean(N), rstd(N);
  K().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
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
  K().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  Vec dx(N * C), dw(C);
  K().rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  auto loss = [&] {
    K().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    return dot(out, dout);
  };
  check_gradients(loss, {{&x, &dx, "inp"}, {&w, &dw, "w"}});
}

TEST_CASE("gelu (tanh approximation) forward and backward") {
  const std::size_t n = 37;
  Vec x = randn(n, 51, 2.0f), out(n);
  const Vec dout = randn(n, 52);
  K().gelu_forward(out.data(), x.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    CHECK(out[i] == doctest::Approx(ref).epsilon(1e-5));
  }
  Vec dx(n);
  K().gelu_backward(dx.data(), x.data(), dout.data(), n);
  auto loss = [&] {
    K().gelu_forward(out.data(), x.data(), n);
    return dot(out, dout);
  };
  check_gradients(loss, {{&x, &dx, "inp"}}, n);
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
  K().rope_forward(x.data(), cos.data(), sin.data(), B, T, H, hs, stride);
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
  K().rope_backward(rty.data(), cos.data(), sin.data(), B, T, H, hs, stride);
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
    K().attention_forward(out.data(), lse.data(), qp, kp, vp, c.B, c.T, c.NH, c.NKV, c.hs,
                          q_stride, kv_stride);
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
            CHECK(out[(b * c.T + t) * C + h * c.hs + i] == doctest::Approx(o).epsilon(1e-5).scale(1));
          }
        }
    Vec dq(q.size()), dk(k.size()), dv(v.size());
    auto [dqp, dkp, dvp] = ptrs(dq, dk, dv);
    K().attention_backward(dqp, dkp, dvp, dout.data(), out.data(), qp, kp, vp, lse.data(), c.B,
                           c.T, c.NH, c.NKV, c.hs, q_stride, kv_stride);
    Vec lse2(lse.size());
    auto loss = [&] {
      auto [a, b2, d] = ptrs(q, k, v);
      K().attention_forward(out.data(), lse2.data(), a, b2, d, c.B, c.T, c.NH, c.NKV, c.hs,
                            q_stride, kv_stride);
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
  K().embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c)
      CHECK(out[bt * C + c] == wte[tokens[bt] * C + c] + wpe[(bt % T) * C + c]);
  Vec dwte(wte.size()), dwpe(wpe.size());
  K().embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  auto loss = [&] {
    K().embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
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
  K().softmax_crossentropy_forward(losses.data(), probs.data(), targets.data(), N, V);
  for (int n = 0; n < N; ++n) {
    double mx = -1e30, s = 0;
    for (int i = 0; i < V; ++i) mx = std::max(mx, static_cast<double>(logits[n * V + i]));
    for (int i = 0; i < V; ++i) s += std::exp(logits[n * V + i] - mx);
    CHECK(losses[n] ==
          doctest::Approx(std::log(s) + mx - logits[n * V + targets[n]]).epsilon(1e-5));
  }
  const float dloss = 0.37f;
  Vec grad = probs;
  K().softmax_crossentropy_backward(grad.data(), targets.data(), dloss, N, V);
  auto loss = [&] {
    Vec p = logits;
    K().softmax_crossentropy_forward(losses.data(), p.data(), targets.data(), N, V);
    double s = 0;
    for (float l : losses) s += static_cast<double>(l) * dloss;
    return s;
  };
  check_gradients(loss, {{&logits, &grad, "logits"}}, 92);
}

TEST_CASE("sum_squares is exact to double rounding and independent of the thread count") {
  const Vec x = randn(300001, 111);
  double ref = 0;
  for (float v : x) ref += static_cast<double>(v) * v;
  CHECK(K().sum_squares(x.data(), x.size()) == doctest::Approx(ref).epsilon(1e-12));
  CHECK(K().sum_squares(x.data(), 0) == 0.0);
  const double two = K().sum_squares(x.data(), x.size());
  oneapi::tbb::global_control one_thread(oneapi::tbb::global_control::max_allowed_parallelism, 1);
  CHECK(K().sum_squares(x.data(), x.size()) == two);  // bit-identical
}

TEST_CASE("fast kernels match their reference on awkward sizes") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  struct Case {
    int B, T, NH, NKV, hs;
    bool packed;
  };
  for (const Case c : {Case{2, 7, 3, 3, 5, true}, Case{1, 13, 4, 2, 9, false},
                       Case{3, 1, 2, 1, 6, false}, Case{1, 33, 6, 3, 17, false},
                       Case{1, 150, 2, 1, 8, false}, Case{1, 129, 2, 2, 4, true}}) {
    INFO("B " << c.B << " T " << c.T << " NH " << c.NH << " NKV " << c.NKV << " hs " << c.hs);
    const int C = c.NH * c.hs, KV = c.NKV * c.hs, N = c.B * c.T;
    const int q_stride = c.packed ? 3 * C : C, kv_stride = c.packed ? 3 * C : KV;
    const Vec qkv = randn(static_cast<std::size_t>(N) * (c.packed ? 3 * C : C + 2 * KV), 121);
    const float* q = qkv.data();
    const float* k = c.packed ? q + C : q + static_cast<std::size_t>(N) * C;
    const float* v = c.packed ? q + 2 * C : k + static_cast<std::size_t>(N) * KV;
    const std::size_t rows = static_cast<std::size_t>(c.B) * c.NH * c.T;
    Vec out_f(static_cast<std::size_t>(N) * C), out_r(out_f.size()), l_f(rows), l_r(rows);
    K().attention_forward(out_f.data(), l_f.data(), q, k, v, c.B, c.T, c.NH, c.NKV, c.hs, q_stride,
                          kv_stride);
    ref->attention_forward(out_r.data(), l_r.data(), q, k, v, c.B, c.T, c.NH, c.NKV, c.hs, q_stride,
                           kv_stride);
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
    K().attention_backward(fq, fk, fv, dout.data(), out_r.data(), q, k, v, l_r.data(), c.B, c.T,
                           c.NH, c.NKV, c.hs, q_stride, kv_stride);
    ref->attention_backward(rq, rk, rv, dout.data(), out_r.data(), q, k, v, l_r.data(), c.B, c.T,
                            c.NH, c.NKV, c.hs, q_stride, kv_stride);
    for (std::size_t i = 0; i < d_f.size(); ++i)
      CHECK(d_f[i] == doctest::Approx(d_r[i]).epsilon(1e-4).scale(1));
  }
}

TEST_CASE("adamw zeroes the gradients it consumed") {
  Vec p = randn(100, 131), g = randn(100, 132), m(100), v(100);
  K().adamw(p.data(), g.data(), m.data(), v.data(), 100, 0.1f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0.1f,
            0.05f);
  for (float x : g) CHECK(x == 0.0f);
  for (float x : m) CHECK(x != 0.0f);
}

TEST_CASE("fast elementwise kernels and softmax match their reference, tails included") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  for (std::size_t n : {std::size_t{1}, std::size_t{37}, std::size_t{8}, std::size_t{100003}}) {
    INFO("n " << n);
    Vec x = randn(n, 141, 3.0f), y = randn(n, 142), d = randn(n, 143);
    x[0] = -30.0f;  // saturated tails of tanh and sigmoid
    if (n > 1) x[1] = 30.0f;
    Vec a(n), b(n);
    K().gelu_forward(a.data(), x.data(), n);
    ref->gelu_forward(b.data(), x.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      CHECK(a[i] == doctest::Approx(b[i]).epsilon(2e-6).scale(1e-6));
    a.assign(n, 0.5f);
    b.assign(n, 0.5f);
    K().gelu_backward(a.data(), x.data(), d.data(), n);
    ref->gelu_backward(b.data(), x.data(), d.data(), n);
    // Backward adds into 0.5: compare on the scale of the terms.
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
  K().softmax_crossentropy_forward(la.data(), pa.data(), targets.data(), N, V);
  ref->softmax_crossentropy_forward(lb.data(), pb.data(), targets.data(), N, V);
  for (int n = 0; n < N; ++n) CHECK(la[n] == doctest::Approx(lb[n]).epsilon(1e-5).scale(1e-5));
  for (std::size_t i = 0; i < pa.size(); ++i)
    CHECK(pa[i] == doctest::Approx(pb[i]).epsilon(1e-5).scale(1e-7));
}

TEST_CASE("fast adamw and sum_squares match their reference") {
  const auto ref = ztrain::make_reference_cpu_kernels();
  const std::size_t n = 70001;
  Vec p1 = randn(n, 151), g1 = randn(n, 152), m1 = randn(n, 153, 0.1f), v1 = randn(n, 154, 0.1f);
  for (auto& x : v1) x = x * x;
  Vec p2 = p1, g2 = g1, m2 = m1, v2 = v1;
  K().adamw(p1.data(), g1.data(), m1.data(), v1.data(), n, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f,
            0.19f, 0.0975f);
  ref->adamw(p2.data(), g2.data(), m2.data(), v2.data(), n, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f,
             0.19f, 0.0975f);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(p1[i] == doctest::Approx(p2[i]).epsilon(1e-6));
    CHECK(m1[i] == doctest::Approx(m2[i]).epsilon(1e-6));
    CHECK(v1[i] == doctest::Approx(v2[i]).epsilon(1e-6));
    CHECK(g1[i] == 0.0f);
  }
  const Vec x = randn(200003, 155);
  CHECK(K().sum_squares(x.data(), x.size()) ==
        doctest::Approx(ref->sum_squares(x.data(), x.size())).epsilon(1e-12));
}
