// Ulysses attention and ring attention across ranks
// (ztrain/sequence/ulysses.h, ring.h), run by CTest under mpirun and gloo
// at 2 and 4 ranks: every rank holds a shard of the same random
// sequences, and the shard's attention output and q, k, v gradients are
// compared element by element with the unsharded kernel's rows for those
// tokens (so every shard boundary of the causal mask is checked), for as
// many key/value heads as query heads, fewer, and fewer than the ranks;
// the all-to-alls and the ring's passes are counted. Only CHECK (never
// REQUIRE): a rank leaving early would desynchronise the next test.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "world.h"
#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/kernels.h"
#include "ztrain/sequence/ring.h"
#include "ztrain/sequence/split.h"
#include "ztrain/sequence/ulysses.h"

using namespace ztrain;
using test::world;

namespace {

using Vec = std::vector<float>;

Vec random(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Heads as a model lays them out: q, k and v side by side in each token's
// row of `pitch` floats (a fused qkv projection, with 3 floats of padding
// so that no stride is the packed one).
struct Fused {
  std::size_t B, T, NH, NKV, hs;
  std::size_t q_width() const { return NH * hs; }
  std::size_t kv_width() const { return NKV * hs; }
  std::size_t pitch() const { return q_width() + 2 * kv_width() + 3; }
  AttentionShape shape() const { return {B, T, NH, NKV, hs, pitch(), pitch()}; }
  AttentionInputs inputs(const float* rows) const {
    return {rows, rows + q_width(), rows + q_width() + kv_width()};
  }
  AttentionGrads grads(float* rows) const {
    return {rows, rows + q_width(), rows + q_width() + kv_width()};
  }
};

// Rows [first, first + n) of each of B sequences of T rows of `width`.
Vec shard_rows(const Vec& all, std::size_t B, std::size_t T, std::size_t width, std::size_t first,
               std::size_t n) {
  Vec out;
  for (std::size_t b = 0; b < B; ++b) {
    const auto from = all.begin() + static_cast<std::ptrdiff_t>((b * T + first) * width);
    out.insert(out.end(), from, from + static_cast<std::ptrdiff_t>(n * width));
  }
  return out;
}

// The largest |got - want| relative to the largest |want|.
double worst(const Vec& got, const Vec& want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// One layer's attention over whole sequences as the unsharded kernel
// computes it: the inputs every rank draws alike (from `seed`), and the
// output, log-sum-exp and gradients the shards are checked against.
struct Unsharded {
  Vec qkv, dout, out, lse, d;
};
Unsharded unsharded(const Kernels& kernels, const Fused& whole, std::uint32_t seed) {
  const std::size_t rows = whole.B * whole.T;
  Unsharded u{random(rows * whole.pitch(), seed), random(rows * whole.q_width(), seed + 1),
              Vec(rows * whole.q_width()), Vec(whole.B * whole.NH * whole.T),
              Vec(rows * whole.pitch(), 0.0f)};
  kernels.attention_forward(u.out.data(), u.lse.data(), whole.inputs(u.qkv.data()), whole.shape());
  kernels.attention_backward(whole.grads(u.d.data()), u.dout.data(), u.out.data(),
                             whole.inputs(u.qkv.data()), u.lse.data(), whole.shape());
  return u;
}

// Runs one layer's Ulysses attention on `group` and checks it against the
// whole-sequence kernel. Every rank draws the same whole tensors.
void check_ulysses(Communicator& group, std::size_t NH, std::size_t NKV) {
  const std::size_t S = static_cast<std::size_t>(group.size()),
                    r = static_cast<std::size_t>(group.rank());
  const std::size_t B = 2, hs = 8, T = 12 * S, Tl = T / S;
  auto device = make_cpu_device(1);
  auto kernels = make_cpu_kernels();
  const Fused whole{B, T, NH, NKV, hs}, local{B, Tl, NH, NKV, hs};
  const auto [qkv, dout, out, lse, d] = unsharded(*kernels, whole, 7);
  // This rank's shard through Ulysses.
  const sequence::UlyssesShape shape{local.shape(), S};
  Vec saved(shape.saved_floats()), scratch(shape.scratch_floats()), my_lse(B * NH * Tl);
  const sequence::UlyssesAttention ulysses(group, *kernels, *device, shape, scratch.data());
  const Vec my_qkv = shard_rows(qkv, B, T, whole.pitch(), r * Tl, Tl);
  const Vec my_dout = shard_rows(dout, B, T, NH * hs, r * Tl, Tl);
  Vec my_out(B * Tl * NH * hs, -1.0f), my_d(my_qkv.size(), -7.0f);
  const CommCounters before = group.counters();
  ulysses.forward(my_out.data(), local.inputs(my_qkv.data()), {saved.data(), my_lse.data()});
  ulysses.backward(local.grads(my_d.data()), my_dout.data(), my_out.data(),
                   {saved.data(), my_lse.data()});
  const CommCounters moved = group.counters().since(before);

  INFO("group of " << S << ", rank " << r << ", " << NH << " heads, " << NKV << " kv heads");
  // The output: the same kernel on the same rows of each head, so the
  // same bits.
  CHECK(my_out == shard_rows(out, B, T, NH * hs, r * Tl, Tl));
  // Gradients, a row's q/k/v block at a time (the padding is not written).
  const Vec want_d = shard_rows(d, B, T, whole.pitch(), r * Tl, Tl);
  Vec got_q, want_q, got_kv, want_kv;
  for (std::size_t row = 0; row < B * Tl; ++row) {
    const auto at = [&](const Vec& v, std::size_t off) {
      return v.begin() + static_cast<std::ptrdiff_t>(row * whole.pitch() + off);
    };
    const auto qw = static_cast<std::ptrdiff_t>(whole.q_width()),
               kvw = static_cast<std::ptrdiff_t>(2 * whole.kv_width());
    got_q.insert(got_q.end(), at(my_d, 0), at(my_d, 0) + qw);
    want_q.insert(want_q.end(), at(want_d, 0), at(want_d, 0) + qw);
    got_kv.insert(got_kv.end(), at(my_d, whole.q_width()), at(my_d, whole.q_width()) + kvw);
    want_kv.insert(want_kv.end(), at(want_d, whole.q_width()), at(want_d, whole.q_width()) + kvw);
    CHECK(*(at(my_d, whole.pitch() - 1)) == -7.0f);  // padding untouched
  }
  CHECK(got_q == want_q);
  // A key/value head shared by query heads on several ranks sums their
  // parts in another order than the kernel: equal within fp32 rounding of
  // a sum of at most NH/NKV terms.
  if (NKV >= S)
    CHECK(got_kv == want_kv);
  else
    CHECK(worst(got_kv, want_kv) < 1e-6 * static_cast<double>(NH / NKV));
  // Four all-to-alls; each rank sends all but its own block of each: q,
  // k and v and the output forward, the output's gradient with the output
  // and q's, k's and v's gradients backward.
  const std::size_t kv = shape.kv_heads(), h = shape.heads();
  const std::size_t qkv_block = B * Tl * (h + 2 * kv) * hs, out_block = B * Tl * h * hs;
  const auto a2a = static_cast<std::size_t>(Collective::all_to_all);
  CHECK(moved.calls[a2a] == 4);
  CHECK(moved.bytes_sent[a2a] == (S - 1) * 4 * (2 * qkv_block + 3 * out_block));
  CHECK(moved.total_bytes() == moved.bytes_sent[a2a]);
}

// The rows of each of B sequences of T rows of `width` that `spans` name,
// in span order.
Vec span_rows(const Vec& all, std::size_t B, std::size_t T, std::size_t width,
              const std::vector<TokenSpan>& spans) {
  Vec out;
  for (std::size_t b = 0; b < B; ++b)
    for (const TokenSpan& s : spans) {
      const auto from = all.begin() + static_cast<std::ptrdiff_t>((b * T + s.position) * width);
      out.insert(out.end(), from, from + static_cast<std::ptrdiff_t>(s.length * width));
    }
  return out;
}

// A shard's output and q, k, v gradients (`got_d`, rows of whole.pitch()
// whose padding was -7 before) against the unsharded rows `spans` name,
// within rel relative.
void check_shard(const Vec& got_out, const Vec& got_d, const Unsharded& u, const Fused& whole,
                 const std::vector<TokenSpan>& spans, double rel);

// Columns [first, first + n) of every row of `width`.
Vec columns(const Vec& rows, std::size_t width, std::size_t first, std::size_t n) {
  Vec out;
  for (std::size_t at = 0; at < rows.size(); at += width)
    out.insert(out.end(), rows.begin() + static_cast<std::ptrdiff_t>(at + first),
               rows.begin() + static_cast<std::ptrdiff_t>(at + first + n));
  return out;
}

// Runs one layer's ring attention on `group`, each rank holding the
// mirrored chunks of sequences of 2 x ranks x c tokens, and checks it
// against the whole-sequence kernel. The ring sums each row's softmax
// over blocks and each key's gradient over ranks in other orders than the
// kernel: equal within fp32 rounding of sums of at most T terms.
void check_ring(Communicator& group, std::size_t NH, std::size_t NKV, std::size_t c) {
  const std::size_t R = static_cast<std::size_t>(group.size()),
                    r = static_cast<std::size_t>(group.rank());
  const std::size_t B = 2, hs = 8, T = 2 * R * c, Tl = 2 * c;
  auto device = make_cpu_device(1);
  auto kernels = make_cpu_kernels();
  const Fused whole{B, T, NH, NKV, hs}, local{B, Tl, NH, NKV, hs};
  const Unsharded u = unsharded(*kernels, whole, 17);
  const std::vector<TokenSpan> spans =
      shard_spans({1, static_cast<int>(R)}, Tl, {0, static_cast<int>(r)});
  const sequence::RingShape shape{local.shape(), R};
  Vec scratch(shape.scratch_floats());
  const sequence::RingAttention ring(group, *kernels, *device, shape, scratch.data());
  const Vec my_qkv = span_rows(u.qkv, B, T, whole.pitch(), spans);
  const Vec my_dout = span_rows(u.dout, B, T, NH * hs, spans);
  Vec my_out(B * Tl * NH * hs, -1.0f), my_lse(B * NH * Tl, -1.0f), my_d(my_qkv.size(), 0.0f);
  for (std::size_t at = whole.pitch() - 1; at < my_d.size(); at += whole.pitch()) my_d[at] = -7.0f;
  const CommCounters before = group.counters();
  ring.forward(my_out.data(), my_lse.data(), local.inputs(my_qkv.data()));
  ring.backward(local.grads(my_d.data()), my_dout.data(), my_out.data(),
                local.inputs(my_qkv.data()), my_lse.data());
  const CommCounters moved = group.counters().since(before);

  INFO("ring of " << R << ", rank " << r << ", " << NH << " heads, " << NKV
                  << " kv heads, chunks of " << c);
  const double tol = static_cast<double>(T) * 0x1p-23;
  check_shard(my_out, my_d, u, whole, spans, tol);
  // lse (B,NH,T): each (b, h) a row of T positions.
  CHECK(worst(my_lse, span_rows(u.lse, B * NH, T, 1, spans)) < tol);
  // R - 1 key/value passes forward; R - 1 again and R gradient passes
  // backward, each a (B, 2c, 2 NKV hs) block to another rank.
  const auto permute = static_cast<std::size_t>(Collective::permute);
  CHECK(moved.calls[permute] == 3 * R - 2);
  CHECK(moved.bytes_sent[permute] == (3 * R - 2) * shape.kv_floats() * sizeof(float));
  CHECK(moved.total_bytes() == moved.bytes_sent[permute]);
}

// Ulysses inside the ring on 4 ranks: Ulysses pairs (0,1 and 2,3) each a
// rank of a ring of two (0,2 and 1,3); each rank holds its slice of its
// ring rank's pair of chunks, and its output and gradients are the
// whole kernel's rows within the ring's rounding.
void check_ulysses_in_ring(std::size_t NH, std::size_t NKV) {
  const int w = world().rank();
  auto ulysses_group = world().split(w / 2, w);
  auto ring_group = world().split(w % 2, w);
  const std::size_t S = 2, R = 2, B = 2, hs = 8, c = 6, T = 2 * R * c, L = T / (S * R);
  auto device = make_cpu_device(1);
  auto kernels = make_cpu_kernels();
  const Fused whole{B, T, NH, NKV, hs}, local{B, L, NH, NKV, hs};
  const Unsharded u = unsharded(*kernels, whole, 27);
  const std::vector<TokenSpan> spans =
      shard_spans({2, 2}, L, {ulysses_group->rank(), ring_group->rank()});
  const sequence::UlyssesShape u_shape{local.shape(), S};
  const sequence::RingShape r_shape{u_shape.whole(), R};
  Vec saved(u_shape.saved_floats()), u_scratch(u_shape.scratch_floats()),
      r_scratch(r_shape.scratch_floats()), whole_lse(B * u_shape.heads() * u_shape.T());
  const sequence::RingAttention ring(*ring_group, *kernels, *device, r_shape, r_scratch.data());
  const sequence::UlyssesAttention ulysses(*ulysses_group, *kernels, *device, u_shape,
                                           u_scratch.data(), &ring);
  const Vec my_qkv = span_rows(u.qkv, B, T, whole.pitch(), spans);
  const Vec my_dout = span_rows(u.dout, B, T, NH * hs, spans);
  Vec my_out(B * L * NH * hs, -1.0f), my_d(my_qkv.size(), -7.0f);
  ulysses.forward(my_out.data(), local.inputs(my_qkv.data()), {saved.data(), whole_lse.data()});
  ulysses.backward(local.grads(my_d.data()), my_dout.data(), my_out.data(),
                   {saved.data(), whole_lse.data()});

  INFO("rank " << w << ", " << NH << " heads, " << NKV << " kv heads");
  check_shard(my_out, my_d, u, whole, spans, static_cast<double>(T) * 0x1p-23);
}

void check_shard(const Vec& got_out, const Vec& got_d, const Unsharded& u, const Fused& whole,
                 const std::vector<TokenSpan>& spans, double rel) {
  const std::size_t B = whole.B, T = whole.T, pitch = whole.pitch();
  const std::size_t qw = whole.q_width(), kvw = 2 * whole.kv_width();
  CHECK(worst(got_out, span_rows(u.out, B, T, qw, spans)) < rel);
  const Vec want_d = span_rows(u.d, B, T, pitch, spans);
  CHECK(worst(columns(got_d, pitch, 0, qw), columns(want_d, pitch, 0, qw)) < rel);
  CHECK(worst(columns(got_d, pitch, qw, kvw), columns(want_d, pitch, qw, kvw)) < rel);
  CHECK(columns(got_d, pitch, pitch - 1, 1) == Vec(got_d.size() / pitch, -7.0f));  // padding
}

}  // namespace

TEST_CASE(
    "Ulysses inside ring attention (a 2-D group of 4): each rank's slice is the kernel's "
    "rows") {
  if (world().size() != 4) return;
  check_ulysses_in_ring(4, 4);
  check_ulysses_in_ring(4, 2);
  check_ulysses_in_ring(2, 1);  // a key/value head shared by the Ulysses pair
}

TEST_CASE("ring attention over the world: each rank's mirrored chunks are the kernel's rows") {
  const std::size_t R = static_cast<std::size_t>(world().size());
  check_ring(world(), 4, 4, 5);           // MHA, chunks of 5 tokens
  check_ring(world(), 4, 2, 3);           // grouped
  check_ring(world(), 2, 1, 1);           // one token per chunk
  check_ring(world(), 2 * R + 1, 1, 70);  // more heads than ranks need not divide; chunks past 64
}

TEST_CASE("ring attention over groups of two ranks beside each other") {
  const int r = world().rank();
  auto pair = world().split(r / 2, r);
  if (pair->size() == 2) check_ring(*pair, 3, 3, 4);
}

TEST_CASE("ring attention refuses sequences that do not cut into a pair of chunks per rank") {
  CHECK(sequence::ring_refusal(64, 4).empty());
  CHECK(sequence::ring_refusal(24, 3).empty());
  CHECK(sequence::ring_refusal(60, 4).find("2 x 4 = 8 chunks") != std::string::npos);
  CHECK(sequence::ring_refusal(60, 4).find("60-token sequences") != std::string::npos);
}

TEST_CASE("Ulysses over the world: each shard's attention and gradients are the kernel's rows") {
  const std::size_t S = static_cast<std::size_t>(world().size());
  check_ulysses(world(), 2 * S, 2 * S);      // two key/value heads per rank
  check_ulysses(world(), 2 * S, S);          // grouped: one per rank
  check_ulysses(world(), S, 1);              // one head shared by every rank
  if (S == 4) check_ulysses(world(), 4, 2);  // shared by two ranks each
}

TEST_CASE("Ulysses over groups of two ranks beside each other") {
  const int r = world().rank();
  auto pair = world().split(r / 2, r);
  if (pair->size() == 2) {
    check_ulysses(*pair, 4, 2);
    check_ulysses(*pair, 6, 1);
  }
}

TEST_CASE("Ulysses refuses degrees that do not split the heads or the sequence") {
  CHECK(sequence::ulysses_refusal(8, 2, 64, 4).empty());
  CHECK(sequence::ulysses_refusal(8, 8, 64, 4).empty());
  CHECK(sequence::ulysses_refusal(6, 3, 64, 4).find("attention heads, which 4 does not divide") !=
        std::string::npos);
  CHECK(sequence::ulysses_refusal(12, 6, 64, 4).find("do not split evenly over 4") !=
        std::string::npos);
  CHECK(sequence::ulysses_refusal(12, 3, 66, 6).empty());
  CHECK(sequence::ulysses_refusal(8, 3, 64, 4).find("multiple of 3") != std::string::npos);
  CHECK(sequence::ulysses_refusal(8, 8, 66, 4).find("66-token sequences, which 4") !=
        std::string::npos);
}
