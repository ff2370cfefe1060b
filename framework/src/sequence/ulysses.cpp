// Ulysses attention (ztrain/sequence/ulysses.h).
//
// Layouts, with S shards, Tl = T/S tokens per shard, h = NH/S query heads
// and kv key/value heads per rank, Bq = B*Tl*h*hs and Bk = B*Tl*kv*hs:
// - a qkv exchange block (one per destination rank, Bq + 2 Bk floats):
//   [q (B,Tl,h,hs) | k (B,Tl,kv,hs) | v (B,Tl,kv,hs)], the sender's tokens
//   of the receiver's heads;
// - an output exchange block (Bq floats): (B,Tl,h,hs); backward's first
//   exchange sends the output's gradient and the output itself, 2 Bq;
// - saved: [q (B,T,h,hs) | k (B,T,kv,hs) | v (B,T,kv,hs)];
// - scratch: [send | recv | per key/value head sums (NKV, B*Tl*hs), only
//   when heads are shared], send and recv each the larger exchange. While
//   they are free, forward computes the whole output in recv, and
//   backward puts the whole output and its gradient in send and q's, k's
//   and v's whole gradients in recv.
// The whole output is not kept from forward to backward: the layer keeps
// its token shard (the output projection's input), and backward fetches
// the heads' rows with the output's gradient, one exchange for both; a
// layer then holds 1/S of the unsharded activations, where keeping it
// would hold the output twice.
// Every move is a Device::copy_rows, so the same code runs where the
// device's memory is not the host's.
#include "ztrain/sequence/ulysses.h"

#include <algorithm>

#include "ztrain/error.h"

namespace ztrain::sequence {
namespace {

constexpr std::size_t kF = sizeof(float);

}  // namespace

std::size_t UlyssesShape::saved_floats() const {
  return local.B * T() * (heads() + 2 * kv_heads()) * local.hs;
}

std::size_t UlyssesShape::exchange_floats() const {
  return std::max(saved_floats(), 2 * local.B * T() * heads() * local.hs);
}

std::size_t UlyssesShape::scratch_floats() const {
  const std::size_t shared_kv = local.NKV < shards ? local.NKV * local.B * local.T * local.hs : 0;
  return 2 * exchange_floats() + shared_kv;
}

std::string ulysses_refusal(std::size_t NH, std::size_t NKV, std::size_t T, std::size_t shards) {
  const std::string S = std::to_string(shards);
  if (NH % shards != 0)
    return "Ulysses gives each of the " + S + " ranks of a sequence group an equal share of the " +
           std::to_string(NH) + " attention heads, which " + S + " does not divide";
  if (NKV >= shards && NKV % shards != 0)
    return "the " + std::to_string(NKV) + " key/value heads do not split evenly over " + S +
           " ranks";
  if (NKV < shards && shards % NKV != 0)
    return "the " + std::to_string(NKV) + " key/value heads, fewer than the " + S +
           " ranks, are copied to the ranks that share one, which needs " + S +
           " to be a multiple of " + std::to_string(NKV);
  if (T % shards != 0)
    return "each rank holds an equal share of the " + std::to_string(T) +
           "-token sequences, which " + S + " does not divide";
  return {};
}

UlyssesAttention::UlyssesAttention(Communicator& group, const Kernels& kernels, Device& device,
                                   const UlyssesShape& shape, float* scratch,
                                   const RingAttention* ring)
    : group_(group),
      kernels_(kernels),
      device_(device),
      shape_(shape),
      scratch_(scratch),
      ring_(ring) {
  if (static_cast<std::size_t>(group.size()) != shape.shards)
    throw InternalError("Ulysses attention over " + std::to_string(shape.shards) +
                        " shards given a group of " + std::to_string(group.size()) + " ranks");
  const AttentionShape& a = shape.local;
  if (const std::string why = ulysses_refusal(a.NH, a.NKV, shape.T(), shape.shards); !why.empty())
    throw InternalError("Ulysses attention: " + why);
}

UlyssesAttention::Whole UlyssesAttention::whole(const UlyssesSaved& saved) const {
  const std::size_t BT = shape_.local.B * shape_.T(), hs = shape_.local.hs;
  float* q = saved.base;
  float* k = q + BT * shape_.heads() * hs;
  return {q, k, k + BT * shape_.kv_heads() * hs};
}

UlyssesAttention::Widths UlyssesAttention::widths() const {
  const AttentionShape& a = shape_.local;
  const std::size_t hs = a.hs, h = shape_.heads() * hs, kv = shape_.kv_heads() * hs;
  const std::size_t Bq = a.B * a.T * h, Bk = a.B * a.T * kv;
  return {shape_.shards, hs, h, kv, Bq, Bk, Bq + 2 * Bk};
}

std::size_t UlyssesAttention::first_kv_head(std::size_t rank) const {
  const AttentionShape& a = shape_.local;
  if (a.NKV >= shape_.shards) return rank * shape_.kv_heads();
  return rank * shape_.heads() / a.group();
}

float* UlyssesAttention::exchange(std::size_t block) const {
  float* recv = scratch_ + shape_.exchange_floats();
  group_.all_to_all(scratch_, recv, block, DType::f32);
  return recv;
}

void UlyssesAttention::tokens_to_whole(float* whole_rows, const float* shard, std::size_t width,
                                       std::size_t shard_index) const {
  const std::size_t Tl = shape_.local.T;
  device_.copy_rows({whole_rows + shard_index * Tl * width, shape_.T() * width * kF, shard,
                     Tl * width * kF, Tl * width * kF, shape_.local.B});
}

void UlyssesAttention::whole_to_tokens(float* shard, const float* whole_rows, std::size_t width,
                                       std::size_t shard_index) const {
  const std::size_t Tl = shape_.local.T;
  device_.copy_rows({shard, Tl * width * kF, whole_rows + shard_index * Tl * width,
                     shape_.T() * width * kF, Tl * width * kF, shape_.local.B});
}

void UlyssesAttention::columns_out(float* block, const float* rows, std::size_t pitch,
                                   std::size_t first, std::size_t width) const {
  device_.copy_rows(
      {block, width * kF, rows + first, pitch * kF, width * kF, shape_.local.B * shape_.local.T});
}

void UlyssesAttention::columns_in(float* rows, std::size_t pitch, std::size_t first,
                                  const float* block, std::size_t width) const {
  device_.copy_rows(
      {rows + first, pitch * kF, block, width * kF, width * kF, shape_.local.B * shape_.local.T});
}

void UlyssesAttention::forward(float* out, AttentionInputs local, const UlyssesSaved& saved) const {
  const AttentionShape& a = shape_.local;
  const auto [S, hs, h, kv, Bq, Bk, block] = widths();
  float* send = scratch_;
  for (std::size_t d = 0; d < S; ++d) {
    float* to = send + d * block;
    columns_out(to, local.q, a.q_stride, d * h, h);
    columns_out(to + Bq, local.k, a.kv_stride, first_kv_head(d) * hs, kv);
    columns_out(to + Bq + Bk, local.v, a.kv_stride, first_kv_head(d) * hs, kv);
  }
  float* recv = exchange(block);
  const Whole w = whole(saved);
  for (std::size_t s = 0; s < S; ++s) {
    const float* from = recv + s * block;
    tokens_to_whole(w.q, from, h, s);
    tokens_to_whole(w.k, from + Bq, kv, s);
    tokens_to_whole(w.v, from + Bq + Bk, kv, s);
  }
  float* whole_out = recv;  // its blocks are unpacked
  if (ring_)
    ring_->forward(whole_out, saved.lse, {w.q, w.k, w.v});
  else
    kernels_.attention_forward(whole_out, saved.lse, {w.q, w.k, w.v}, shape_.whole());
  for (std::size_t s = 0; s < S; ++s) whole_to_tokens(send + s * Bq, whole_out, h, s);
  recv = exchange(Bq);
  for (std::size_t r = 0; r < S; ++r) columns_in(out, a.C(), r * h, recv + r * Bq, h);
}

void UlyssesAttention::backward(AttentionGrads d, const float* dout, const float* out,
                                const UlyssesSaved& saved) const {
  const AttentionShape& a = shape_.local;
  const auto [S, hs, h, kv, Bq, Bk, block] = widths();
  float* send = scratch_;
  for (std::size_t r = 0; r < S; ++r) {
    columns_out(send + 2 * r * Bq, dout, a.C(), r * h, h);
    columns_out(send + (2 * r + 1) * Bq, out, a.C(), r * h, h);
  }
  float* recv = exchange(2 * Bq);
  float* whole_dout = send;  // the sent blocks are consumed
  float* whole_out = send + S * Bq;
  for (std::size_t s = 0; s < S; ++s) {
    tokens_to_whole(whole_dout, recv + 2 * s * Bq, h, s);
    tokens_to_whole(whole_out, recv + (2 * s + 1) * Bq, h, s);
  }
  float* dq = recv;  // its blocks are unpacked
  float* dk = dq + S * Bq;
  float* dv = dk + S * Bk;
  device_.fill_zero(dq, S * block * kF);
  const Whole w = whole(saved);
  if (ring_)
    ring_->backward({dq, dk, dv}, whole_dout, whole_out, {w.q, w.k, w.v}, saved.lse);
  else
    kernels_.attention_backward({dq, dk, dv}, whole_dout, whole_out, {w.q, w.k, w.v}, saved.lse,
                                shape_.whole());
  for (std::size_t s = 0; s < S; ++s) {
    float* to = send + s * block;
    whole_to_tokens(to, dq, h, s);
    whole_to_tokens(to + Bq, dk, kv, s);
    whole_to_tokens(to + Bq + Bk, dv, kv, s);
  }
  recv = exchange(block);
  for (std::size_t r = 0; r < S; ++r) columns_in(d.dq, a.q_stride, r * h, recv + r * block, h);
  kv_gradients_in(d.dk, recv, Bq);
  kv_gradients_in(d.dv, recv, Bq + Bk);
}

// With a key/value head per rank or more, rank r's part is its heads'
// gradients. With fewer, the ranks sharing a head each return a part of
// its gradient: summed in rank order into one block per head, then put
// in place.
void UlyssesAttention::kv_gradients_in(float* rows, const float* recv, std::size_t part) const {
  const AttentionShape& a = shape_.local;
  const auto [S, hs, h, kv, Bq, Bk, block] = widths();
  if (a.NKV >= S) {
    for (std::size_t r = 0; r < S; ++r)
      columns_in(rows, a.kv_stride, first_kv_head(r) * hs, recv + r * block + part, kv);
    return;
  }
  const std::size_t n = a.B * a.T * hs;
  float* sums = scratch_ + 2 * shape_.exchange_floats();
  for (std::size_t r = 0; r < S; ++r) {
    float* sum = sums + first_kv_head(r) * n;
    const float* piece = recv + r * block + part;
    if (r == 0 || first_kv_head(r) != first_kv_head(r - 1))
      device_.copy(sum, piece, n * kF);
    else
      device_.accumulate(sum, piece, n);
  }
  for (std::size_t head = 0; head < a.NKV; ++head)
    columns_in(rows, a.kv_stride, head * hs, sums + head * n, hs);
}

}  // namespace ztrain::sequence
