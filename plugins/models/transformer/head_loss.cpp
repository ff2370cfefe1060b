// The head's loss over one chunk of logits. Whole, each row's softmax
// cross-entropy is one kernel. Under tensor parallelism the head's rows,
// the vocabulary, are split over the tensor group (Megatron's
// vocabulary-parallel cross-entropy), so a rank holds the logits (n, V/T)
// of its slice only and the whole row's softmax is assembled from the
// slices: the row maxima all-reduced by max (a common shift, so that no
// slice's exponentials overflow and every rank subtracts the same one),
// then each slice's sum of exponentials and the target's logit (held by
// exactly one slice, 0 elsewhere) all-reduced by sum, in one call. Every
// rank then has every row's loss, and turns its slice's exponentials into
// its slice of dlogits; d(lnf) = dlogits W sums over the group afterwards
// (head_forward_backward). The bytes: 3 floats a row per chunk, against
// the (n, V) logits a whole head would hold on every rank.
#include "transformer.h"

namespace ztrain::transformer {

VocabShape Transformer::vocab_shape(std::size_t n) const {
  return {n, static_cast<std::size_t>(cfg_.local_vocab()),
          static_cast<std::size_t>(cfg_.vocab_first(cfg_.tensor_rank))};
}

void Transformer::chunk_loss(StepContext& ctx, Acts& a, std::size_t r0, std::size_t n) const {
  const Kernels& k = ctx.kernels();
  const std::int32_t* targets = a.targets + r0;
  const VocabShape s = vocab_shape(n);
  if (cfg_.tensor <= 1)
    return k.softmax_crossentropy_forward(a.losses + r0, a.logits, targets, {n, s.V});
  Communicator& group = tensor_comm(ctx);
  k.crossentropy_slice_max(a.row_max, a.logits, s);
  group.all_reduce(a.row_max, n, DType::f32, ReduceOp::max);
  k.crossentropy_slice_sums(a.sums, a.logits, a.row_max, targets, s);
  group.all_reduce(a.sums, 2 * n, DType::f32, ReduceOp::sum);
  k.crossentropy_slice_loss(a.losses + r0, a.row_max, a.sums, targets, n);
}

void Transformer::chunk_dlogits(StepContext& ctx, Acts& a, std::size_t r0, std::size_t n,
                                float dloss) const {
  const Kernels& k = ctx.kernels();
  const VocabShape s = vocab_shape(n);
  if (cfg_.tensor <= 1)
    return k.softmax_crossentropy_backward(a.logits, a.targets + r0, dloss, {n, s.V});
  k.crossentropy_slice_backward(a.logits, a.sums, a.targets + r0, dloss, s);
}

}  // namespace ztrain::transformer
