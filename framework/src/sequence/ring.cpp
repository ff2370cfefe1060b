// Ring attention (ztrain/sequence/ring.h).
//
// Scratch, with n = kv_floats(): [kv | kv' | the rest], kv and kv' the
// travelling key/value block and the one arriving; the rest holds
// forward's block output (B,Tl,NH*hs) and lse (B,NH,Tl), or backward's
// three gradient blocks (this step's share, the sum on its way to the next
// rank, the sum arriving from the previous one), whose roles rotate by
// pointer so nothing is copied.
// The rank's own keys travel packed as well (one copy per layer), so every
// step reads its keys in one layout.
#include "ztrain/sequence/ring.h"

#include <algorithm>
#include <utility>

#include "ztrain/error.h"

namespace ztrain::sequence {
namespace {

constexpr std::size_t kF = sizeof(float);

}  // namespace

std::size_t RingShape::scratch_floats() const {
  const std::size_t block_out = local.B * local.T * local.C() + local.B * local.NH * local.T;
  return 2 * kv_floats() + std::max(block_out, 3 * kv_floats());
}

std::string ring_refusal(std::size_t T, std::size_t ranks) {
  if (T % (2 * ranks) == 0) return {};
  return "ring attention cuts each sequence into 2 x " + std::to_string(ranks) + " = " +
         std::to_string(2 * ranks) +
         " chunks of equal length, a pair per rank (the first and last chunks together, for "
         "equal causal work), which the " +
         std::to_string(T) + "-token sequences do not divide";
}

RingAttention::RingAttention(Communicator& group, const Kernels& kernels, Device& device,
                             const RingShape& shape, float* scratch)
    : group_(group), kernels_(kernels), device_(device), shape_(shape), scratch_(scratch) {
  if (static_cast<std::size_t>(group.size()) != shape.ranks)
    throw InternalError("ring attention over " + std::to_string(shape.ranks) +
                        " ranks given a group of " + std::to_string(group.size()) + " ranks");
  if (shape.local.T % 2 != 0)
    throw InternalError("ring attention: a rank's " + std::to_string(shape.local.T) +
                        " tokens are not two equal chunks");
}

AttentionBlock RingAttention::block(std::size_t step) const {
  const AttentionShape& a = shape_.local;
  const std::size_t c = shape_.chunk();
  AttentionBlock b{a.B, a.NH, a.NKV, a.hs, a.q_stride, 2 * a.NKV * a.hs,
                   a.T, 0,    a.T,   a.T,  a.T,        true};
  if (step == 0) return b;
  const std::size_t R = shape_.ranks, r = static_cast<std::size_t>(group_.rank());
  const std::size_t s = (r + R - step) % R;
  b.causal = false;
  if (s < r) {
    b.keys = c;  // s's first chunk, before both of r's
  } else {
    b.first = c;  // r's second chunk, after both of s's
    b.rows = c;
  }
  return b;
}

AttentionInputs RingAttention::travelling(const float* kv) const {
  const std::size_t width = shape_.local.NKV * shape_.local.hs;
  return {nullptr, kv, kv + width};
}

AttentionGrads RingAttention::gradients(float* dq, float* dkv) const {
  const std::size_t width = shape_.local.NKV * shape_.local.hs;
  return {dq, dkv, dkv + width};
}

void RingAttention::pack(float* kv, AttentionInputs local) const {
  const AttentionShape& a = shape_.local;
  const std::size_t width = a.NKV * a.hs, rows = a.B * a.T;
  device_.copy_rows({kv, 2 * width * kF, local.k, a.kv_stride * kF, width * kF, rows});
  device_.copy_rows({kv + width, 2 * width * kF, local.v, a.kv_stride * kF, width * kF, rows});
}

void RingAttention::unpack(AttentionGrads d, const float* dkv) const {
  const AttentionShape& a = shape_.local;
  const std::size_t width = a.NKV * a.hs, rows = a.B * a.T;
  device_.copy_rows({d.dk, a.kv_stride * kF, dkv, 2 * width * kF, width * kF, rows});
  device_.copy_rows({d.dv, a.kv_stride * kF, dkv + width, 2 * width * kF, width * kF, rows});
}

CommWork RingAttention::pass(const float* send, float* recv) const {
  const int R = group_.size(), r = group_.rank();
  return group_.permute_async(send, recv, shape_.kv_floats(), DType::f32,
                              Peers{(r + 1) % R, (r + R - 1) % R});
}

void RingAttention::forward(float* out, float* lse, AttentionInputs local) const {
  const std::size_t R = shape_.ranks, n = shape_.kv_floats();
  const AttentionShape& a = shape_.local;
  float* kv = scratch_;
  float* arriving = kv + n;
  float* block_out = arriving + n;
  float* block_lse = block_out + a.B * a.T * a.C();
  pack(kv, local);
  for (std::size_t step = 0; step < R; ++step) {
    CommWork moving = step + 1 < R ? pass(kv, arriving) : CommWork{};
    const AttentionBlock b = block(step);
    const AttentionInputs keys = travelling(kv);
    if (step == 0) {
      kernels_.attention_block_forward(out, lse, {local.q, keys.k, keys.v}, b);
    } else {
      kernels_.attention_block_forward(block_out, block_lse, {local.q, keys.k, keys.v}, b);
      kernels_.attention_merge(out, lse, block_out, block_lse, b);
    }
    moving.wait();
    std::swap(kv, arriving);
  }
}

void RingAttention::backward(AttentionGrads d, const float* dout, const float* out,
                             AttentionInputs local, const float* lse) const {
  const std::size_t R = shape_.ranks, n = shape_.kv_floats();
  float* kv = scratch_;
  float* arriving = kv + n;
  float* share = arriving + n;
  float* sum = share + n;
  float* received = sum + n;
  pack(kv, local);
  CommWork summed;  // the previous step's sum on its way out, the previous rank's on its way in
  for (std::size_t step = 0; step < R; ++step) {
    CommWork moving = step + 1 < R ? pass(kv, arriving) : CommWork{};
    const AttentionInputs keys = travelling(kv);
    device_.fill_zero(share, n * kF);
    kernels_.attention_block_backward(gradients(d.dq, share), dout, out, {local.q, keys.k, keys.v},
                                      lse, block(step));
    summed.wait();
    if (step > 0) device_.accumulate(TypedPtr(received), ConstTypedPtr(share), n);
    std::swap(sum, step > 0 ? received : share);
    summed = pass(sum, received);
    moving.wait();
    std::swap(kv, arriving);
  }
  summed.wait();
  unpack(d, received);
}

}  // namespace ztrain::sequence
