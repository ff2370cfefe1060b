// Ring attention (context parallelism, Megatron-Core's name): causal
// attention over sequences split across the ranks of a context group, the
// keys and values passed around the group while each block of attention
// computes.
//
// Layout (SequenceSplit::mirrored, ztrain/sequence/split.h): each
// sequence is cut into 2R chunks of c tokens for R ranks, and rank r holds
// chunks r and 2R-1-r, in that order, as B rows of Tl = 2c tokens. A
// causal mask gives the early chunks little work and the late ones much;
// pairing the r-th from the start with the r-th from the end gives every
// rank the same work (Megatron's load balancing). A rank's rows are in
// position order, so the causal mask over them is the sequence's.
//
// Forward, in R steps, step i on the keys and values of rank s = r - i
// (mod R), which arrived from the previous rank while step i - 1 computed
// and go on to the next rank while step i computes (Communicator::permute,
// to r + 1 from r - 1):
// - step 0, the rank's own: the causal block over its 2c rows;
// - s < r: s's first chunk precedes both of r's and its second follows
//   both: all 2c queries see chunk s, a block with no mask;
// - s > r: s's two chunks both follow r's first and precede r's second:
//   r's second chunk's queries see all 2c keys, a block with no mask.
// Each block's output and log-sum-exp are merged into the rows' so far
// (Kernels::attention_merge), so the result is the attention over every
// key the row sees. Backward takes the same steps with the final output
// and log-sum-exp: each block adds its share to q's gradient in place;
// the key/value gradients travel with the keys: a rank adds its block's
// share to the sum received from the previous rank and passes it on, so
// after the last step one pass hands each rank the gradient of its own
// keys and values, summed over every rank in ring order. The sums' passes
// overlap the next step's block, as the keys' pass does.
//
// Every rank moves R - 1 key/value blocks forward, and R - 1 key/value
// blocks plus R gradient blocks backward, each B*2c*2*NKV*hs floats: per
// layer 2(R-1) + R blocks, against Ulysses' four all-to-alls of the whole
// q, k, v and output; in exchange any R dividing the sequence works,
// beyond the head count.
//
// Memory: nothing beyond what the layer keeps for the unsharded kernel
// (its q, k, v, output and lse rows, 1/R of the unsharded ones), and one
// scratch buffer all layers share (RingShape::scratch_floats).
//
// Ownership: borrows the group, kernels and device; the caller's buffers
// stay the caller's. Thread safety: one thread, the one that issues the
// group's collectives. Errors: CommError from the group; every rank of the
// group runs the same layers in the same order.
#pragma once

#include <cstddef>
#include <string>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"

namespace ztrain::sequence {

// One layer's attention as this rank sees it: `local` describes its two
// chunks (B rows of Tl = 2c tokens; q's, k's and v's rows as they lie),
// `ranks` the group's size R.
struct ZTRAIN_API RingShape {
  AttentionShape local;
  std::size_t ranks = 1;

  std::size_t chunk() const { return local.T / 2; }
  // Floats of one key/value block as it travels: (B, Tl, 2*NKV*hs), a
  // row's k then its v.
  std::size_t kv_floats() const { return local.B * local.T * 2 * local.NKV * local.hs; }
  // Floats of the scratch every layer shares: two key/value blocks, and
  // forward's block output and lse or backward's three gradient blocks.
  std::size_t scratch_floats() const;
};

// Why R ranks cannot split these sequences (T tokens) into mirrored
// chunks, for a message that says where the degree was set; empty when
// they can.
ZTRAIN_API std::string ring_refusal(std::size_t T, std::size_t ranks);

class ZTRAIN_API RingAttention {
 public:
  // group: the context group, of shape.ranks ranks; scratch:
  // shape.scratch_floats() floats on `device`.
  RingAttention(Communicator& group, const Kernels& kernels, Device& device, const RingShape& shape,
                float* scratch);

  // out (B,Tl,NH*hs) contiguous and lse (B,NH,Tl): the attention of this
  // rank's tokens over every token before them in the sequence, as
  // Kernels::attention_forward of the whole sequence gives those rows.
  void forward(float* out, float* lse, AttentionInputs local) const;
  // dout: the output's gradient; out and lse: what forward wrote. d's q,
  // k and v rows are zero on entry (the caller zeroes the buffer it
  // reuses); q's get the blocks' sums, k's and v's the ring's.
  void backward(AttentionGrads d, const float* dout, const float* out, AttentionInputs local,
                const float* lse) const;

 private:
  // The block step `step` computes: the keys of rank (r - step) mod R
  // against this rank's queries (see the file comment).
  AttentionBlock block(std::size_t step) const;
  // A travelling key/value block's k and v (q left null); q's gradient
  // rows with a gradient block's k and v.
  AttentionInputs travelling(const float* kv) const;
  AttentionGrads gradients(float* dq, float* dkv) const;
  // This rank's k and v rows into a travelling block; a gradient block's
  // into d's k and v rows.
  void pack(float* kv, AttentionInputs local) const;
  void unpack(AttentionGrads d, const float* dkv) const;
  // Passes `send` to the next rank and receives the previous rank's into
  // `recv` (kv_floats() each), while the caller computes.
  CommWork pass(const float* send, float* recv) const;

  Communicator& group_;
  const Kernels& kernels_;
  Device& device_;
  RingShape shape_;
  float* scratch_;
};

}  // namespace ztrain::sequence
