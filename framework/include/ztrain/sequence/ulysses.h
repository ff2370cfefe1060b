// Ulysses attention (DeepSpeed-Ulysses): causal attention over sequences
// split across the ranks of a sequence group, by trading sequence shards
// for head shards.
//
// Each of the S ranks of the group holds T/S consecutive tokens of every
// row (rank r tokens [r T/S, (r+1) T/S)) and all NH query heads of them.
// Forward, one all-to-all gives each rank every token of NH/S heads (rank
// r heads [r NH/S, (r+1) NH/S)) with their key/value heads; the ordinary
// attention kernel runs on them over the whole sequence (so the causal
// mask is the unsharded one by construction); a second all-to-all returns
// the output to the token shards. Backward mirrors it: the output's
// gradient goes to the head shards (with the output, which forward does
// not keep in the heads' layout), the attention's backward runs there, and
// one all-to-all returns q's, k's and v's gradients. Four all-to-alls per
// layer, each moving (S-1)/S of its buffer from every rank.
//
// Ulysses x ring (a 2-D sequence group): when the whole sequence of the
// group is itself one rank's share of a ring (ztrain/sequence/split.h),
// the attention over it is the ring's (RingAttention over the context
// group, on the heads this rank received) instead of the kernel's; the
// exchanges around it are the same.
//
// Grouped key/value heads: with NKV >= S each rank takes NKV/S of them
// (NKV a multiple of S); with fewer (S a multiple of NKV) a rank's NH/S
// query heads share one key/value head, which is sent to every rank that
// needs it, and the gradients those ranks return for it are summed in
// rank order. Other degrees are refused (ulysses_refusal).
//
// Memory: the caller gives each layer's saved buffers (the head-sharded
// q, k and v over the whole sequence: what its backward reads besides the
// layer's own output) and one scratch buffer all layers share, sized by
// UlyssesShape. A layer then holds 1/S of what the unsharded one holds.
//
// Ownership: borrows the group, kernels and device; the caller's buffers
// stay the caller's. Thread safety: one thread, the one that issues the
// group's collectives. Errors: CommError from the group; the collectives
// are those of every rank of the group, which must run the same layers in
// the same order.
#pragma once

#include <cstddef>
#include <string>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/sequence/ring.h"

namespace ztrain::sequence {

// One layer's attention as this rank sees it: `local` describes its
// token shard (B rows of T/S tokens; q's, k's and v's rows as they lie),
// `shards` the group's size S.
struct ZTRAIN_API UlyssesShape {
  AttentionShape local;
  std::size_t shards = 1;

  std::size_t T() const { return local.T * shards; }  // the whole sequence
  std::size_t heads() const { return local.NH / shards; }
  std::size_t kv_heads() const { return local.NKV >= shards ? local.NKV / shards : 1; }
  // The attention each rank runs: every token, its heads, contiguous rows.
  AttentionShape whole() const {
    return {local.B, T(), heads(), kv_heads(), local.hs, heads() * local.hs, kv_heads() * local.hs};
  }
  // Floats of one layer's saved q, k and v (see UlyssesSaved).
  std::size_t saved_floats() const;
  // Floats of the larger exchange's buffers: q, k and v, or backward's
  // output and its gradient.
  std::size_t exchange_floats() const;
  // Floats of the scratch every layer shares.
  std::size_t scratch_floats() const;
};

// What a layer's forward leaves for its backward, over the whole
// sequence for this rank's heads: q (B,T,NH/S,hs), k and v (B,T,kv,hs)
// in saved_floats() floats from `base`, and lse (B,NH/S,T), the caller's
// (B*NH*T/S floats, the size of the unsharded kernel's).
struct UlyssesSaved {
  float* base;
  float* lse;
};

// Why S shards cannot run these heads and sequence, for a message that
// says where the degree was set; empty when they can.
ZTRAIN_API std::string ulysses_refusal(std::size_t NH, std::size_t NKV, std::size_t T,
                                       std::size_t shards);

class ZTRAIN_API UlyssesAttention {
 public:
  // group: the sequence group, of shape.shards ranks; scratch:
  // shape.scratch_floats() floats on `device`; ring: the attention over
  // the whole sequence when a ring splits it further (its RingShape's
  // local is shape.whole()), null for the kernel's.
  UlyssesAttention(Communicator& group, const Kernels& kernels, Device& device,
                   const UlyssesShape& shape, float* scratch, const RingAttention* ring = nullptr);

  // out (B,T/S,NH*hs) contiguous: the attention of this rank's tokens, as
  // Kernels::attention_forward of the whole sequence gives them.
  void forward(float* out, AttentionInputs local, const UlyssesSaved& saved) const;
  // dout (B,T/S,NH*hs): the output's gradient; out: what forward wrote.
  // WRITES d's q, k and v rows as `local` lays them out (every element of
  // this rank's tokens).
  void backward(AttentionGrads d, const float* dout, const float* out,
                const UlyssesSaved& saved) const;

 private:
  // The exchanges' widths in floats: S shards; a head's hs; h and kv, a
  // rank's query and key/value heads' row widths; Bq and Bk, their blocks
  // of this rank's tokens; block, a q, k and v exchange block (Bq + 2 Bk).
  struct Widths {
    std::size_t S, hs, h, kv, Bq, Bk, block;
  };
  Widths widths() const;
  // A layer's saved tensors inside its block of floats.
  struct Whole {
    float *q, *k, *v;
  };
  Whole whole(const UlyssesSaved& saved) const;
  // The key/value head a destination rank gets first.
  std::size_t first_kv_head(std::size_t rank) const;
  // Sends block i of `send` to rank i, each `block` floats; returns recv.
  float* exchange(std::size_t block) const;
  // Copies n-float runs of each of B rows between a token shard's layout
  // and the whole sequence's.
  void tokens_to_whole(float* whole_rows, const float* shard, std::size_t width,
                       std::size_t shard_index) const;
  void whole_to_tokens(float* shard, const float* whole_rows, std::size_t width,
                       std::size_t shard_index) const;
  // Columns [first, first + width) of rows `pitch` floats apart, to or
  // from a contiguous (B*T/S, width) block.
  void columns_out(float* block, const float* rows, std::size_t pitch, std::size_t first,
                   std::size_t width) const;
  void columns_in(float* rows, std::size_t pitch, std::size_t first, const float* block,
                  std::size_t width) const;
  // The key/value gradients rank r returned (recv's dk or dv part of each
  // block, at `part` floats into it) into d's rows.
  void kv_gradients_in(float* rows, const float* recv, std::size_t part) const;

  Communicator& group_;
  const Kernels& kernels_;
  Device& device_;
  UlyssesShape shape_;
  float* scratch_;
  const RingAttention* ring_;
};

}  // namespace ztrain::sequence
