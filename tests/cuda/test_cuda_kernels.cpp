// Every cuda kernel against the cpu reference kernels on awkward sizes
// (tails of every tile, block and warp), in fp32 and with 16-bit
// parameters and gradients; and the determinism the Kernels contract
// promises (two runs, the same bits).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>

#include "gpu_support.h"
#include "kernels/cpu/reference_kernels.h"

namespace {

using gpu::Array;
using gpu::check_close;
using gpu::randn;
using gpu::Vec;
using ztrain::DType;

const ztrain::Kernels& G() {
  return gpu::kernels();
}
const ztrain::Kernels& R() {
  static const auto k = ztrain::make_reference_cpu_kernels();
  return *k;
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::int32_t> tokens_of(std::size_t n, int V, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(n);
  // Few distinct tokens, so many positions share one.
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % static_cast<unsigned>(std::min(V, 7)));
  t[0] = V - 1;
  return t;
}

}  // namespace

TEST_CASE("elementwise ops match the reference, tails included") {
  const std::size_t n = 1000003;
  const Vec x = randn(n, 1, 2.0f), y = randn(n, 2), d = randn(n, 3);
  Array gx(x), gy(y), gd(d), out(n), din(x.size()), din2(n);
  Vec want(n), want2(n);

  // GELU over (N,H) rows with a bias (fp32, then bf16) and its column sums.
  const std::size_t H = 1003, N = n / H;
  const auto nh = static_cast<std::ptrdiff_t>(N * H);
  const auto head = [nh](const Vec& v) { return Vec(v.begin(), v.begin() + nh); };
  const Vec bias = randn(H, 4), db0 = randn(H, 5);
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(ztrain::dtype_name(t));
    Array gb(bias, t), gdb(db0, t);
    const Vec b_vals = gb.get();
    G().gelu_forward(out.f(), gx.f(), gb.typed(), {N, H});
    R().gelu_forward(want.data(), x.data(), b_vals.data(), {N, H});
    check_close(head(out.get()), head(want), 1e-6, 1e-7, "gelu_forward");
    Vec db_want = gdb.get();
    G().gelu_backward(din.f(), gdb.typed(), gx.f(), gb.typed(), gd.f(), {N, H});
    R().gelu_backward(want.data(), db_want.data(), x.data(), b_vals.data(), d.data(), {N, H});
    check_close(head(din.get()), head(want), 1e-5, 1e-6, "gelu_backward");
    check_close(gdb.get(), gpu::rounded(db_want, t), 1e-2, 1e-3, "gelu_backward dbias");
  }

  G().swiglu_forward(out.f(), gx.f(), gy.f(), n);
  R().swiglu_forward(want.data(), x.data(), y.data(), n);
  check_close(out.get(), want, 1e-6, 1e-7, "swiglu_forward");

  Array dg(d), du(x);
  G().swiglu_backward(dg.f(), du.f(), gd.f(), gx.f(), gy.f(), n);
  want = d;
  want2 = x;
  R().swiglu_backward(want.data(), want2.data(), d.data(), x.data(), y.data(), n);
  check_close(dg.get(), want, 1e-5, 1e-6, "swiglu_backward dgate");
  check_close(du.get(), want2, 1e-5, 1e-6, "swiglu_backward dup");

  G().add(out.f(), gx.f(), gy.f(), n);
  R().add(want.data(), x.data(), y.data(), n);
  CHECK(same_bits(out.get(), want));
}

TEST_CASE("rope forward and backward match the reference on strided rows") {
  const std::size_t B = 3, T = 19, H = 5, hs = 12, stride = H * hs + 7;
  const Vec x = randn(B * T * stride, 4);
  Vec cos(T * hs / 2), sin(T * hs / 2);
  for (std::size_t i = 0; i < cos.size(); ++i) {
    cos[i] = std::cos(0.1f * static_cast<float>(i));
    sin[i] = std::sin(0.1f * static_cast<float>(i));
  }
  Array gx(x), gc(cos), gs(sin);
  Vec want = x;
  G().rope_forward(gx.f(), gc.f(), gs.f(), {B, T, H, hs, stride});
  R().rope_forward(want.data(), cos.data(), sin.data(), {B, T, H, hs, stride});
  check_close(gx.get(), want, 1e-6, 1e-6, "rope_forward");
  G().rope_backward(gx.f(), gc.f(), gs.f(), {B, T, H, hs, stride});
  R().rope_backward(want.data(), cos.data(), sin.data(), {B, T, H, hs, stride});
  check_close(gx.get(), want, 1e-6, 1e-6, "rope_backward");
  check_close(gx.get(), x, 1e-5, 1e-5, "rope backward undoes forward");
  // Packed rows: each token at its position in its example.
  std::vector<std::int32_t> positions(B * T);
  for (std::size_t i = 0; i < positions.size(); ++i)
    positions[i] = static_cast<std::int32_t>(i % T % 7);
  const Array gpositions(positions);
  Array px(x);
  Vec packed = x;
  G().rope_forward(px.f(), gc.f(), gs.f(), {B, T, H, hs, stride, gpositions.i32()});
  R().rope_forward(packed.data(), cos.data(), sin.data(), {B, T, H, hs, stride, positions.data()});
  check_close(px.get(), packed, 1e-6, 1e-6, "rope_forward at positions");
}

TEST_CASE("embedding forward and backward equal the reference bit for bit, each type") {
  const std::size_t B = 4, T = 37, C = 45;
  const int V = 50;
  const auto toks = tokens_of(B * T, V, 5);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    CAPTURE(ztrain::dtype_name(t));
    const Vec wte = gpu::rounded(randn(V * C, 6), t), wpe = gpu::rounded(randn(T * C, 7), t);
    const Vec dout = randn(B * T * C, 8);
    const Vec dwte0 = gpu::rounded(randn(V * C, 9), t), dwpe0 = gpu::rounded(randn(T * C, 10), t);
    Array gt(toks), gwte(wte, t), gwpe(wpe, t), gout(dout.size()), gdout(dout);
    Array gdwte(dwte0, t), gdwpe(dwpe0, t);
    G().embedding_forward(gout.f(), gt.i32(), gwte.typed(), gwpe.typed(), {B, T, C});
    std::vector<std::uint8_t> wte_t(wte.size() * ztrain::dtype_size(t)),
        wpe_t(wpe.size() * ztrain::dtype_size(t));
    ztrain::convert(wte.data(), DType::f32, wte_t.data(), t, wte.size());
    ztrain::convert(wpe.data(), DType::f32, wpe_t.data(), t, wpe.size());
    Vec want(dout.size());
    R().embedding_forward(want.data(), toks.data(), {wte_t.data(), t}, {wpe_t.data(), t},
                          {B, T, C});
    CHECK(same_bits(gout.get(), want));

    std::vector<std::uint8_t> dwte_t(dwte0.size() * ztrain::dtype_size(t)),
        dwpe_t(dwpe0.size() * ztrain::dtype_size(t));
    ztrain::convert(dwte0.data(), DType::f32, dwte_t.data(), t, dwte0.size());
    ztrain::convert(dwpe0.data(), DType::f32, dwpe_t.data(), t, dwpe0.size());
    G().embedding_backward(gdwte.typed(), gdwpe.typed(), gdout.f(), gt.i32(), {B, T, C});
    R().embedding_backward({dwte_t.data(), t}, {dwpe_t.data(), t}, dout.data(), toks.data(),
                           {B, T, C});
    Vec want_dwte(dwte0.size()), want_dwpe(dwpe0.size());
    ztrain::convert(dwte_t.data(), t, want_dwte.data(), DType::f32, dwte0.size());
    ztrain::convert(dwpe_t.data(), t, want_dwpe.data(), DType::f32, dwpe0.size());
    // Both sum each token's positions in position order, in fp32.
    CHECK(same_bits(gdwte.get(), want_dwte));
    CHECK(same_bits(gdwpe.get(), want_dwpe));
  }
}

TEST_CASE(
    "layernorm and rmsnorm, fused residual forms included, match the reference; 16-bit gradients "
    "within one rounding") {
  const std::size_t N = 523, C = 77;  // rows past a slice of 256, channels past a warp
  const Vec x = randn(N * C, 11, 2.0f), dout = randn(x.size(), 12);
  for (DType t : {DType::f32, DType::bf16}) {
    CAPTURE(ztrain::dtype_name(t));
    const double grad_rtol = t == DType::f32 ? 1e-4 : 1.0 / 128;
    const Vec w = gpu::rounded(randn(C, 13), t), b = gpu::rounded(randn(C, 14), t);
    const Vec dw0 = gpu::rounded(randn(C, 15), t), db0 = gpu::rounded(randn(C, 16), t);
    Array gx(x), gw(w, t), gb(b, t), gdout(dout), gout(x.size()), gmean(N), grstd(N);
    Array gdin(x.size()), gdw(dw0, t), gdb(db0, t);
    Vec wr = w, br = b;
    ztrain::ConstTypedPtr rw = wr.data(), rb = br.data();
    G().layernorm_forward(gout.f(), gmean.f(), grstd.f(), gx.f(), gw.typed(), gb.typed(), {N, C},
                          1e-5f);
    Vec out(x.size()), mean(N), rstd(N);
    R().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), rw, rb, {N, C}, 1e-5f);
    check_close(gout.get(), out, 1e-5, 1e-5, "layernorm_forward out");
    check_close(grstd.get(), rstd, 1e-5, 0, "layernorm_forward rstd");
    G().layernorm_backward(gdin.f(), gdw.typed(), gdb.typed(), gdout.f(), gx.f(), gw.typed(),
                           gmean.f(), grstd.f(), {N, C});
    Vec din(x.size()), dw = dw0, db = db0;
    R().layernorm_backward(din.data(), dw.data(), db.data(), dout.data(), x.data(), rw, mean.data(),
                           rstd.data(), {N, C});
    check_close(gdin.get(), din, 1e-4, 1e-5, "layernorm_backward dinp");
    check_close(gdw.get(), gpu::rounded(dw, t), grad_rtol, 1e-3, "layernorm_backward dw");
    check_close(gdb.get(), gpu::rounded(db, t), grad_rtol, 1e-3, "layernorm_backward db");

    Array gdin2(x.size()), gdw2(dw0, t);
    G().rmsnorm_forward(gout.f(), grstd.f(), gx.f(), gw.typed(), {N, C}, 1e-6f);
    R().rmsnorm_forward(out.data(), rstd.data(), x.data(), rw, {N, C}, 1e-6f);
    check_close(gout.get(), out, 1e-5, 1e-5, "rmsnorm_forward");
    G().rmsnorm_backward(gdin2.f(), gdw2.typed(), gdout.f(), gx.f(), gw.typed(), grstd.f(), {N, C});
    Vec din2(x.size()), dw2 = dw0;
    R().rmsnorm_backward(din2.data(), dw2.data(), dout.data(), x.data(), rw, rstd.data(), {N, C});
    check_close(gdin2.get(), din2, 1e-4, 1e-5, "rmsnorm_backward dinp");
    check_close(gdw2.get(), gpu::rounded(dw2, t), grad_rtol, 1e-3, "rmsnorm_backward dw");

    // The fused residual forms in place (res aliasing a), as the model
    // calls them, against the reference's add, then norm.
    const Vec addend = randn(x.size(), 17);
    Array gres(x), gadd(addend), gy(x.size()), gm(N), gr(N);
    Vec res(x.size()), y(x.size()), m(N), r(N);
    G().add_layernorm_forward(gres.f(), gy.f(), gm.f(), gr.f(), gres.f(), gadd.f(), gw.typed(),
                              gb.typed(), {N, C}, 1e-5f);
    R().add_layernorm_forward(res.data(), y.data(), m.data(), r.data(), x.data(), addend.data(), rw,
                              rb, {N, C}, 1e-5f);
    CHECK(same_bits(gres.get(), res));
    check_close(gy.get(), y, 1e-5, 1e-5, "add_layernorm_forward out");
    check_close(gr.get(), r, 1e-5, 0, "add_layernorm_forward rstd");
    Array gres2(x);
    G().add_rmsnorm_forward(gres2.f(), gy.f(), gr.f(), gres2.f(), gadd.f(), gw.typed(), {N, C},
                            1e-6f);
    R().add_rmsnorm_forward(res.data(), y.data(), r.data(), x.data(), addend.data(), rw, {N, C},
                            1e-6f);
    CHECK(same_bits(gres2.get(), res));
    check_close(gy.get(), y, 1e-5, 1e-5, "add_rmsnorm_forward out");
  }
}

TEST_CASE("fp32 matmul forward and backward match the reference, with and without bias") {
  const std::size_t N = 301, C = 67, OC = 129;
  const Vec x = randn(N * C, 21), w = randn(OC * C, 22, 0.3f), b = randn(OC, 23),
            dout = randn(N * OC, 24);
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    Array gx(x), gw(w), gb(b), gout(N * OC), gdout(dout);
    Array gdin(x), gdw(w), gdb(b);  // backward adds into non-zero values
    G().matmul_forward(gout.f(), gx.f(), gw.f(), with_bias ? gb.f() : nullptr, {N, C, OC});
    Vec out(gout.get().size());
    R().matmul_forward(out.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, {N, C, OC});
    check_close(gout.get(), out, 1e-5, 1e-5, "matmul_forward");
    G().matmul_backward(gdin.f(), gdw.f(), with_bias ? gdb.f() : nullptr, gdout.f(), gx.f(), gw.f(),
                        {N, C, OC});
    Vec din = x, dw = w, db = b;
    R().matmul_backward(din.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                        x.data(), w.data(), {N, C, OC});
    check_close(gdin.get(), din, 1e-5, 1e-4, "matmul_backward dinp");
    check_close(gdw.get(), dw, 1e-5, 1e-4, "matmul_backward dw");
    check_close(gdb.get(), db, 1e-5, 1e-4, "matmul_backward dbias");
  }
}

TEST_CASE("16-bit matmul: the reference on activations rounded to the weight's type") {
  const std::size_t N = 130, C = 72, OC = 40;  // even sizes: 16-bit rows stay 4-byte aligned
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(ztrain::dtype_name(t));
    const Vec x = randn(N * C, 31), dout = randn(N * OC, 32);
    const Vec w = gpu::rounded(randn(OC * C, 33, 0.3f), t), b = gpu::rounded(randn(OC, 34), t);
    const Vec dw0 = gpu::rounded(randn(OC * C, 35), t), db0 = gpu::rounded(randn(OC, 36), t);
    Array gx(x), gw(w, t), gb(b, t), gout(N * OC), gdout(dout), gdin(N * C), gdw(dw0, t),
        gdb(db0, t);
    G().matmul_forward(gout.f(), gx.f(), gw.typed(), gb.typed(), {N, C, OC});
    const Vec xr = gpu::rounded(x, t), doutr = gpu::rounded(dout, t);
    Vec out(N * OC);
    R().matmul_forward(out.data(), xr.data(), w.data(), b.data(), {N, C, OC});
    check_close(gout.get(), out, 1e-5, 1e-4, "16-bit matmul_forward");
    G().matmul_backward(gdin.f(), gdw.typed(), gdb.typed(), gdout.f(), gx.f(), gw.typed(),
                        {N, C, OC});
    Vec din(N * C), dw = dw0, db = db0;
    R().matmul_backward(din.data(), dw.data(), nullptr, doutr.data(), xr.data(), w.data(),
                        {N, C, OC});
    R().matmul_backward(nullptr, nullptr, db.data(), dout.data(), x.data(), w.data(), {N, C, OC});
    check_close(gdin.get(), din, 1e-5, 1e-4, "16-bit matmul_backward dinp");
    // One rounding of the sum: at most half a unit in the last place.
    const double ulp = t == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
    check_close(gdw.get(), gpu::rounded(dw, t), ulp, 1e-6, "16-bit matmul_backward dw");
    check_close(gdb.get(), gpu::rounded(db, t), ulp, 1e-6, "16-bit matmul_backward dbias");
  }
}

namespace {

struct AttentionCase {
  std::size_t B, T, NH, NKV, hs;
  // Packed rows: each row of T tokens holds examples of these lengths, in
  // turn, until the row is full (AttentionShape::positions); empty: none.
  std::vector<std::size_t> examples = {};
};

// The positions of c's packed rows, or none.
std::vector<std::int32_t> positions_of(const AttentionCase& c) {
  std::vector<std::int32_t> p;
  if (c.examples.empty()) return p;
  for (std::size_t b = 0; b < c.B; ++b)
    for (std::size_t t = 0, e = 0, at = 0; t < c.T; ++t, ++at) {
      if (at == c.examples[e % c.examples.size()]) {
        at = 0;
        ++e;
      }
      p.push_back(static_cast<std::int32_t>(at));
    }
  return p;
}
struct AttentionTolerance {
  double out_rtol, out_atol, lse, grad_rtol, grad_atol;
};

// k's attention forward and backward against the CPU reference on q, k, v
// and dout as the kernels' GEMMs read them (rounded to `operands`), with
// packed qkv rows as the model lays them out and dq, dk, dv adding into
// non-zero values.
void check_attention(const ztrain::Kernels& kern, const AttentionCase& c, DType operands,
                     const AttentionTolerance& tol) {
  CAPTURE(c.T);
  CAPTURE(c.hs);
  CAPTURE(c.NKV);
  const std::size_t q_stride = (c.NH + 2 * c.NKV) * c.hs, kv_stride = q_stride;
  const std::size_t k_at = c.NH * c.hs, v_at = (c.NH + c.NKV) * c.hs;
  const std::size_t rows = c.B * c.T;
  const std::vector<std::int32_t> positions = positions_of(c);
  const Array gpositions(positions.empty() ? std::vector<std::int32_t>{0} : positions);
  ztrain::AttentionShape shape{c.B, c.T, c.NH, c.NKV, c.hs, q_stride, kv_stride};
  ztrain::AttentionShape gshape = shape;
  if (!positions.empty()) {
    shape.positions = positions.data();
    gshape.positions = gpositions.i32();
  }
  const Vec qkv = randn(rows * q_stride, 41 + c.hs);
  const Vec dout = randn(rows * c.NH * c.hs, 42 + c.hs);
  Array gqkv(qkv), gout(rows * c.NH * c.hs), glse(c.B * c.NH * c.T), gdout(dout), gd(qkv);
  const float* q = gqkv.f();
  kern.attention_forward(gout.f(), glse.f(), {q, q + k_at, q + v_at}, gshape);
  const Vec rqkv = gpu::rounded(qkv, operands), rdout = gpu::rounded(dout, operands);
  const float* rq = rqkv.data();
  Vec out(rows * c.NH * c.hs), lse(glse.get().size());
  R().attention_forward(out.data(), lse.data(), {rq, rq + k_at, rq + v_at}, shape);
  check_close(gout.get(), out, tol.out_rtol, tol.out_atol, "attention_forward out");
  check_close(glse.get(), lse, tol.lse, tol.lse, "attention_forward lse");
  float* dq = gd.f();
  kern.attention_backward({dq, dq + k_at, dq + v_at}, gdout.f(), gout.f(), {q, q + k_at, q + v_at},
                          glse.f(), gshape);
  Vec d = qkv;
  R().attention_backward({d.data(), d.data() + k_at, d.data() + v_at}, rdout.data(), out.data(),
                         {rq, rq + k_at, rq + v_at}, lse.data(), shape);
  check_close(gd.get(), d, tol.grad_rtol, tol.grad_atol, "attention_backward dq, dk, dv");
}

}  // namespace

TEST_CASE("attention forward and backward match the reference (MHA, GQA, head sizes 8-136)") {
  for (const AttentionCase& c : {AttentionCase{2, 37, 4, 4, 24}, AttentionCase{1, 70, 6, 2, 64},
                                 AttentionCase{2, 33, 4, 1, 80}, AttentionCase{1, 9, 2, 2, 8},
                                 AttentionCase{1, 41, 2, 1, 136}})
    check_attention(G(), c, DType::f32, {1e-4, 1e-5, 1e-5, 1e-4, 1e-4});
}

// Packed rows: examples of 1 to 45 tokens, so that a warp block of queries
// and a tile of keys cross example boundaries; the reference (bit for bit
// each example alone on the cpu, test_kernels) on both attention paths.
TEST_CASE("attention over packed rows matches the reference, fp32 and 16-bit paths") {
  const auto bf16 = ztrain::cuda::make_cuda_kernels(gpu::device(), {false, DType::bf16});
  for (const AttentionCase& c : {AttentionCase{2, 70, 4, 2, 24, {5, 1, 33, 12}},
                                 AttentionCase{1, 130, 6, 3, 64, {45, 7, 31}}}) {
    check_attention(G(), c, DType::f32, {1e-4, 1e-5, 1e-5, 1e-4, 1e-4});
    check_attention(*bf16, c, DType::bf16, {2e-2, 5e-3, 1e-4, 3e-2, 3e-2});
  }
}

TEST_CASE("16-bit runs' attention (tensor-core GEMMs): the reference on bf16 operands") {
  const auto bf16 = ztrain::cuda::make_cuda_kernels(gpu::device(), {false, DType::bf16});
  // MHA, GQA, and enough heads of a long sequence that the scores come in
  // two chunks. The probabilities' rounding to bf16 is the difference left.
  for (const AttentionCase& c : {AttentionCase{2, 37, 4, 4, 24}, AttentionCase{1, 70, 6, 2, 64},
                                 AttentionCase{1, 1536, 12, 12, 64}})
    check_attention(*bf16, c, DType::bf16, {2e-2, 5e-3, 1e-4, 3e-2, 3e-2});
}

// Ring attention's block ops on the three kinds of block (a diagonal, a
// block wholly past with fewer keys than the rows hold, and queries from a
// middle row on), then the merge, against the reference on the same inputs.
TEST_CASE("attention blocks and their merge match the reference") {
  const std::size_t B = 2, T = 45, NH = 4, NKV = 2, hs = 40, split = 19;
  const std::size_t q_stride = (NH + 2 * NKV) * hs, k_at = NH * hs, v_at = (NH + NKV) * hs;
  const std::size_t C = NH * hs, rows = B * NH * T;
  const Vec qkv = randn(B * T * q_stride, 61), dout = randn(B * T * C, 62);
  const Vec lse_all = randn(rows, 63), out_all = randn(B * T * C, 64);
  ztrain::AttentionBlock early{B, NH, NKV, hs, q_stride, q_stride, T, 0, split, T, split, true};
  ztrain::AttentionBlock past = early, own = early;
  past.first = own.first = split;
  past.rows = own.rows = own.keys = T - split;
  past.causal = false;
  for (const ztrain::AttentionBlock& blk : {early, past, own}) {
    CAPTURE(blk.first);
    CAPTURE(blk.causal);
    Array gqkv(qkv), gout(out_all), glse(lse_all), gdout(dout), gd(qkv);
    const float* q = gqkv.f();
    G().attention_block_forward(gout.f(), glse.f(), {q, q + k_at, q + v_at}, blk);
    Vec out = out_all, lse = lse_all;
    const float* rq = qkv.data();
    R().attention_block_forward(out.data(), lse.data(), {rq, rq + k_at, rq + v_at}, blk);
    check_close(gout.get(), out, 1e-4, 1e-5, "attention_block_forward out");
    check_close(glse.get(), lse, 1e-5, 1e-5, "attention_block_forward lse");
    float* dq = gd.f();
    G().attention_block_backward({dq, dq + k_at, dq + v_at}, gdout.f(), gout.f(),
                                 {q, q + k_at, q + v_at}, glse.f(), blk);
    Vec d = qkv;
    R().attention_block_backward({d.data(), d.data() + k_at, d.data() + v_at}, dout.data(),
                                 out.data(), {rq, rq + k_at, rq + v_at}, lse.data(), blk);
    check_close(gd.get(), d, 1e-4, 1e-4, "attention_block_backward dq, dk, dv");
  }
  const Vec block_out = randn(B * T * C, 65), block_lse = randn(rows, 66);
  Array gout(out_all), glse(lse_all), gbo(block_out), gbl(block_lse);
  G().attention_merge(gout.f(), glse.f(), gbo.f(), gbl.f(), own);
  Vec out = out_all, lse = lse_all;
  R().attention_merge(out.data(), lse.data(), block_out.data(), block_lse.data(), own);
  check_close(gout.get(), out, 1e-5, 1e-6, "attention_merge out");
  check_close(glse.get(), lse, 1e-6, 1e-6, "attention_merge lse");
}

TEST_CASE("softmax cross-entropy matches the reference") {
  const std::size_t N = 13, V = 50257;
  const Vec logits = randn(N * V, 51, 3.0f);
  std::vector<std::int32_t> targets(N);
  // Every fifth row ignored (kIgnoreTarget): loss 0, zero dlogits, its
  // logits untouched by the forward on both sides.
  for (std::size_t n = 0; n < N; ++n)
    targets[n] = n % 5 == 4 ? ztrain::kIgnoreTarget : static_cast<std::int32_t>(n * 7919 % V);
  Array gl(logits), gt(targets), glosses(N);
  G().softmax_crossentropy_forward(glosses.f(), gl.f(), gt.i32(), {N, V});
  Vec probs = logits, losses(N);
  R().softmax_crossentropy_forward(losses.data(), probs.data(), targets.data(), {N, V});
  check_close(glosses.get(), losses, 1e-5, 1e-5, "losses");
  check_close(gl.get(), probs, 1e-4, 1e-9, "probabilities");
  G().softmax_crossentropy_backward(gl.f(), gt.i32(), 0.125f, {N, V});
  R().softmax_crossentropy_backward(probs.data(), targets.data(), 0.125f, {N, V});
  check_close(gl.get(), probs, 1e-4, 1e-9, "dlogits");
}

// One rank's slice of a vocabulary-parallel head: columns [25000, 50257)
// of GPT-2's vocabulary, targets inside and outside it, a row ignored.
TEST_CASE("vocabulary-parallel cross-entropy's four ops match the reference") {
  const std::size_t N = 13, V = 25257, first = 25000;
  const Vec logits = randn(N * V, 52, 3.0f);
  std::vector<std::int32_t> targets(N);
  for (std::size_t n = 0; n < N; ++n)
    targets[n] = n % 5 == 4 ? ztrain::kIgnoreTarget : static_cast<std::int32_t>(n * 7919 % 50257);
  const ztrain::VocabShape s{N, V, first};
  Array gl(logits), gt(targets), gmax(N), gsums(2 * N), glosses(N);
  Vec exps = logits, row_max(N), sums(2 * N), losses(N);
  G().crossentropy_slice_max(gmax.f(), gl.f(), s);
  R().crossentropy_slice_max(row_max.data(), exps.data(), s);
  CHECK(same_bits(gmax.get(), row_max));
  G().crossentropy_slice_sums(gsums.f(), gl.f(), gmax.f(), gt.i32(), s);
  R().crossentropy_slice_sums(sums.data(), exps.data(), row_max.data(), targets.data(), s);
  check_close(gsums.get(), sums, 1e-5, 1e-6, "sums");
  check_close(gl.get(), exps, 1e-5, 1e-9, "exps");
  G().crossentropy_slice_loss(glosses.f(), gmax.f(), gsums.f(), gt.i32(), N);
  R().crossentropy_slice_loss(losses.data(), row_max.data(), sums.data(), targets.data(), N);
  check_close(glosses.get(), losses, 1e-5, 1e-5, "losses");
  G().crossentropy_slice_backward(gl.f(), gsums.f(), gt.i32(), 0.125f, s);
  R().crossentropy_slice_backward(exps.data(), sums.data(), targets.data(), 0.125f, s);
  check_close(gl.get(), exps, 1e-4, 1e-9, "dlogits");
}

// A table holding rows [3, 43) of a vocabulary of 50: tokens below and
// above it read zeros and add nothing; the rest as the reference, bit for
// bit.
TEST_CASE("a vocabulary slice of the embedding equals the reference's, each type") {
  const std::size_t B = 4, T = 37, C = 45, first = 3, rows = 40;
  const auto toks = tokens_of(B * T, 50, 11);
  const ztrain::TokenShape s{B, T, C, first, rows};
  for (DType t : {DType::f32, DType::bf16}) {
    CAPTURE(ztrain::dtype_name(t));
    const Vec wte = gpu::rounded(randn(rows * C, 12), t),
              dwte0 = gpu::rounded(randn(rows * C, 13), t);
    const Vec dout = randn(B * T * C, 14);
    Array gt(toks), gwte(wte, t), gout(dout.size()), gdout(dout), gdwte(dwte0, t);
    G().embedding_forward(gout.f(), gt.i32(), gwte.typed(), nullptr, s);
    std::vector<std::uint8_t> wte_t(wte.size() * ztrain::dtype_size(t)),
        dwte_t(wte.size() * ztrain::dtype_size(t));
    ztrain::convert(wte.data(), DType::f32, wte_t.data(), t, wte.size());
    ztrain::convert(dwte0.data(), DType::f32, dwte_t.data(), t, wte.size());
    Vec want(dout.size()), want_dwte(wte.size());
    R().embedding_forward(want.data(), toks.data(), {wte_t.data(), t}, nullptr, s);
    CHECK(same_bits(gout.get(), want));
    G().embedding_backward(gdwte.typed(), nullptr, gdout.f(), gt.i32(), s);
    R().embedding_backward({dwte_t.data(), t}, nullptr, dout.data(), toks.data(), s);
    ztrain::convert(dwte_t.data(), t, want_dwte.data(), DType::f32, wte.size());
    CHECK(same_bits(gdwte.get(), want_dwte));
  }
}

TEST_CASE("adamw over runs matches the reference for each gradient and working-copy type") {
  // 150 runs (three launches of the run table), alternating weight decay,
  // with gaps the update must not touch, one run longer than the grid.
  std::vector<ztrain::AdamWRun> runs;
  std::uint64_t at = 3;
  for (int r = 0; r < 150; ++r) {
    const std::uint64_t len = r == 70 ? 5000000 : 1 + (static_cast<std::uint64_t>(r) * 7919) % 4000;
    runs.push_back({at, at + len, r % 2 == 0});
    at += len + (r % 3 == 0 ? 5 : 0);
  }
  const std::size_t n = at + 2;
  const Vec p = randn(n, 61), g = randn(n, 62, 0.1f), m = randn(n, 63, 0.01f);
  Vec v = randn(n, 64, 0.01f);
  for (auto& x : v) x = x * x;
  // Decoupled weight decay, then the same decay as L2 (on the gradient).
  for (const ztrain::AdamWHyper& h :
       {ztrain::AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f},
        ztrain::AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.19f, 0.0975f, 0.1f}})
    for (int skip = 0; skip < 2; ++skip) {
      ztrain::StepScalars s;
      s.grad_mult = 0.5f;
      s.skip = skip;
      const gpu::Scalar<ztrain::StepScalars> gs(s);
      for (DType gt : {DType::f32, DType::bf16}) {
        for (ztrain::GradAfter after : {ztrain::GradAfter::zeroed, ztrain::GradAfter::kept}) {
          CAPTURE(ztrain::dtype_name(gt));
          CAPTURE(skip);
          CAPTURE(h.l2);
          const Vec gr = gpu::rounded(g, gt);
          const Vec w0 = gpu::rounded(p, DType::bf16);
          Array gp(p), gg(gr, gt), gm(m), gv(v), gw(w0, DType::bf16);
          G().adamw(gp.f(), gg.typed(), gm.f(), gv.f(), gw.typed(), runs.data(), runs.size(), h,
                    gs.ptr(), after);
          Vec rp = p, rm = m, rv = v;
          std::vector<std::uint8_t> rg(n * ztrain::dtype_size(gt));
          ztrain::convert(gr.data(), DType::f32, rg.data(), gt, n);
          std::vector<std::uint16_t> rw(n);
          ztrain::convert(w0.data(), DType::f32, rw.data(), DType::bf16, n);
          R().adamw(rp.data(), {rg.data(), gt}, rm.data(), rv.data(), {rw.data(), DType::bf16},
                    runs.data(), runs.size(), h, &s, after);
          check_close(gp.get(), rp, 1e-6, 1e-7, "master");
          check_close(gm.get(), rm, 1e-6, 1e-9, "m");
          check_close(gv.get(), rv, 1e-6, 1e-12, "v");
          Vec rwf(n), rgf(n);
          ztrain::convert(rw.data(), DType::bf16, rwf.data(), DType::f32, n);
          check_close(gw.get(), rwf, 1.0 / 128, 1e-7, "bf16 working copy");
          ztrain::convert(rg.data(), gt, rgf.data(), DType::f32, n);
          CHECK(same_bits(gg.get(), rgf));  // zeroed, or kept as it was; gaps untouched
          const Vec gp_after = gp.get();
          for (std::size_t i : {std::size_t{0}, std::size_t{2}, n - 1})
            CHECK(gp_after[i] == p[i]);  // gaps
        }
      }
    }
}

TEST_CASE("the norm ops: the sum of squares of the widened values, the reference's scalars") {
  const std::size_t n = 1234567;
  const Vec x = randn(n, 71);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    CAPTURE(ztrain::dtype_name(t));
    Array gx(x, t);
    std::vector<std::uint8_t> xt(n * ztrain::dtype_size(t));
    ztrain::convert(x.data(), DType::f32, xt.data(), t, n);
    ztrain::StepScalars want;
    want.sum_squares = 2.5;  // the ops add to what is there
    const gpu::Scalar<ztrain::StepScalars> got(want);
    R().sum_squares_add(&want, {xt.data(), t}, n);
    G().sum_squares_add(got.ptr(), gx.typed(), n);
    CHECK(got.get().sum_squares == doctest::Approx(want.sum_squares).epsilon(1e-12));
  }
  // The finishing arithmetic: the same IEEE operations, the same bits.
  for (double sq : {4.0e6, 1.0e-3, static_cast<double>(INFINITY)}) {
    for (bool across : {false, true}) {
      ztrain::StepScalars want;
      want.sum_squares = sq;
      const gpu::Scalar<ztrain::StepScalars> got(want);
      R().grad_norm_unscale(&want, 1024.0);
      G().grad_norm_unscale(got.ptr(), 1024.0);
      R().grad_norm_finish(&want, across, 1024.0, 1.0);
      G().grad_norm_finish(got.ptr(), across, 1024.0, 1.0);
      const ztrain::StepScalars g = got.get();
      CHECK(g.reduced == want.reduced);
      CHECK((g.grad_norm == want.grad_norm ||
             (std::isinf(g.grad_norm) && std::isinf(want.grad_norm))));
      CHECK(g.grad_mult == want.grad_mult);
      CHECK(g.skip == want.skip);
    }
  }
}

TEST_CASE("backward kernels give the same bits on every run") {
  const std::size_t B = 2, T = 67, NH = 4, NKV = 2, hs = 32, C = NH * hs;
  const std::size_t stride = (NH + 2 * NKV) * hs;
  const std::size_t rows = B * T;
  const ztrain::AttentionShape shape{B, T, NH, NKV, hs, stride, stride};
  const Vec qkv = randn(rows * stride, 81), dout = randn(rows * C, 82);
  Array gqkv(qkv), gdout(dout), gout(rows * C), glse(B * NH * T);
  const float* q = gqkv.f();
  G().attention_forward(gout.f(), glse.f(), {q, q + C, q + C + NKV * hs}, shape);
  Vec first;
  for (int run = 0; run < 2; ++run) {
    Array d(rows * stride);
    float* dq = d.f();
    G().attention_backward({dq, dq + C, dq + C + NKV * hs}, gdout.f(), gout.f(),
                           {q, q + C, q + C + NKV * hs}, glse.f(), shape);
    if (run == 0)
      first = d.get();
    else
      CHECK(same_bits(d.get(), first));
  }
  const auto toks = tokens_of(rows, 97, 83);
  Array gt(toks), gdo(rows * C);
  Vec dwte_first;
  for (int run = 0; run < 2; ++run) {
    Array dwte(97 * C, DType::bf16);
    G().embedding_backward(dwte.typed(), nullptr, gdout.f(), gt.i32(), {B, T, C});
    if (run == 0)
      dwte_first = dwte.get();
    else
      CHECK(same_bits(dwte.get(), dwte_first));
  }
}

TEST_CASE("Device::convert and accumulate, and mean_add, match the reference for every type pair") {
  const std::size_t n = 70001;
  const Vec x = randn(n, 91, 3.0f), y = randn(n, 92);
  for (DType from : {DType::f32, DType::bf16, DType::f16}) {
    for (DType to : {DType::f32, DType::bf16, DType::f16}) {
      CAPTURE(ztrain::dtype_name(from));
      CAPTURE(ztrain::dtype_name(to));
      std::vector<std::uint8_t> s(n * ztrain::dtype_size(from)), d(n * ztrain::dtype_size(to));
      ztrain::convert(x.data(), DType::f32, s.data(), from, n);
      ztrain::convert(s.data(), from, d.data(), to, n);
      Vec want(n);
      ztrain::convert(d.data(), to, want.data(), DType::f32, n);
      // GPU to GPU, GPU to host, host to GPU: one rounding, to nearest even.
      Array src(x, from), dst(n, to);
      gpu::device().convert(dst.typed(), src.typed(), n);
      CHECK(same_bits(dst.get(), want));
      std::vector<std::uint8_t> host(n * ztrain::dtype_size(to));
      gpu::device().convert({host.data(), to}, src.typed(), n);
      CHECK(host == d);
      Array dst2(n, to);
      gpu::device().convert(dst2.typed(), {s.data(), from}, n);
      CHECK(same_bits(dst2.get(), want));
    }
    // GPU += GPU, and a GPU source landing in host memory.
    std::vector<std::uint8_t> a(n * ztrain::dtype_size(from)), b(n * ztrain::dtype_size(from));
    ztrain::convert(y.data(), DType::f32, a.data(), from, n);
    ztrain::convert(x.data(), DType::f32, b.data(), from, n);
    Array acc(y, from), add(x, from);
    gpu::device().accumulate(acc.typed(), add.typed(), n);
    std::vector<std::uint8_t> host_acc = a;
    gpu::device().accumulate({host_acc.data(), from}, add.typed(), n);
    ztrain::add_into(a.data(), b.data(), n, from);
    Vec want(n);
    ztrain::convert(a.data(), from, want.data(), DType::f32, n);
    CHECK(same_bits(acc.get(), want));
    CHECK(host_acc == a);
  }
  Array gx(x);
  double want = 0.5;
  const gpu::Scalar<double> got(0.5);
  R().mean_add(&want, x.data(), n);
  G().mean_add(got.ptr(), gx.f(), n);
  CHECK(got.get() == doctest::Approx(want).epsilon(1e-7));  // one fp32 rounding apart at most
}
