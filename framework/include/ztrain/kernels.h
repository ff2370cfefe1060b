// The math a model runs, one forward/backward pair per op.
//
// A Kernels object is the device's implementation of every op a model
// needs: the cpu device's (kernels/cpu) and the cuda backend's share this
// interface. Activations are fp32; parameters and their gradients are typed
// operands (f32, bf16 or f16), the working copies a strategy holds in the
// run's precision. A kernel reads a 16-bit operand in fp32 (converting it
// in registers or cache-sized tiles, never as a whole-tensor copy), computes in fp32, and rounds a
// 16-bit gradient once per op when it adds its contribution. Tensors are row-major, contiguous
// unless a stride is given. Shapes are in the comments: B batch, T time, C channels, OC output
// channels, N = B*T rows, V vocabulary, NH query heads, NKV key/value heads, hs head size; an op
// takes its dimensions as one small shape struct of std::size_t (RowShape, MatmulShape,
// TokenShape, HeadShape, AttentionShape below), so that a dimension is never a narrower
// integer on its way in and the next one (attention's segments, a rank's shard) is a field.
//
// Backward convention (as llm.c): every backward op ADDS into its d-outputs,
// both parameter gradients (so micro-steps accumulate) and activation
// gradients (so a tensor read by two ops gets the sum). Callers zero the
// activation-gradient buffers they reuse. The exceptions say so.
//
// Determinism: for a given thread count, every op gives bit-identical
// results run to run.
// Thread safety: const methods, callable from one thread at a time per
// device (they use the device's worker threads internally).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ztrain/dtype.h"
#include "ztrain/export.h"
#include "ztrain/tensor.h"

namespace ztrain {

// A target the loss skips (Hugging Face's ignore_index): a prompt token
// of a fine-tuning example, padding. Its row's loss is 0 and its logits
// get no gradient.
inline constexpr std::int32_t kIgnoreTarget = -100;

// What adamw leaves in the gradient it consumed: zeros, for a buffer that
// accumulates the next step's gradients (ddp, zero1), or the values, for a
// shard the next step's reduction overwrites (zero2, zero3, offload).
enum class GradAfter : std::uint8_t { zeroed, kept };

// The scalars of one optimizer step (Kernels::sum_squares_add and the
// norm ops write them, adamw reads them). Plain data, so it can live in
// device memory.
struct StepScalars {
  double sum_squares = 0;  // of this rank's gradient pieces
  float reduced = 0;       // sum_squares in fp32, summed across ranks by the caller
  float grad_mult = 1;     // unscale times clip, applied by adamw
  double grad_norm = 0;    // of the unscaled gradients, before clipping
  std::int32_t skip = 0;   // 1: the norm is not finite, adamw skips the step
};

// Adam's hyper-parameters for one step (bias corrections included).
// weight_decay is decoupled (AdamW: p shrinks by lr * weight_decay * p);
// l2 is added to the gradient (torch.optim.Adam's weight_decay, DeepSpeed's
// adam_w_mode false) and so passes through the moments. A run uses one or
// the other; both apply only to the runs that decay.
struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2;
  float l2 = 0;
};

// Elements [begin, end) of a shard that take one weight-decay setting.
struct AdamWRun {
  std::uint64_t begin, end;
  bool decay;
};

// Shapes: every dimension a std::size_t, named as in the comments above.
//
// N rows of C elements: activations (N = B*T tokens of C channels), an
// MLP's hidden units (C = H) or a row of logits (C = V).
struct RowShape {
  std::size_t N, C;
};
// A linear layer over N rows: C input features to OC output features.
struct MatmulShape {
  std::size_t N, C, OC;
};
// B sequences of T tokens, C channels each. Under a vocabulary-parallel
// table (tensor parallelism) the table holds rows [vocab_first,
// vocab_first + vocab_rows) of the vocabulary: a token outside them reads
// zeros and adds no gradient. By default the table holds every row.
struct TokenShape {
  std::size_t B, T, C;
  std::size_t vocab_first = 0;
  std::size_t vocab_rows = SIZE_MAX;
  bool holds(std::int32_t token) const {
    const auto t = static_cast<std::size_t>(token);
    return t >= vocab_first && t - vocab_first < vocab_rows;
  }
};
// N rows of logits over a slice of the vocabulary, ids [first, first + V):
// one rank's columns under a vocabulary-parallel head (first = 0 and V the
// whole vocabulary without one).
struct VocabShape {
  std::size_t N, V, first = 0;
  // Whether the slice holds `target` (never kIgnoreTarget).
  bool holds(std::int32_t target) const {
    return target != kIgnoreTarget && static_cast<std::size_t>(target) - first < V;
  }
};
// H heads of hs elements at the start of each (b,t) row, rows `stride`
// floats apart: q, k or v inside the fused qkv activation. positions:
// (B,T), in the memory the kernels read (the device's, as the tensors),
// token (b,t)'s position in its example, where rows pack several examples
// (each starts at 0); null: t.
struct HeadShape {
  std::size_t B, T, H, hs, stride;
  const std::int32_t* positions = nullptr;
};
// Causal attention of NH query heads over NKV key/value heads (NH a
// multiple of NKV; group() query heads share one), each hs wide; q's
// (b,t) rows are q_stride floats apart, k's and v's kv_stride; out is
// (B,T,NH*hs) contiguous. positions: as HeadShape's; where given, rows
// pack several examples and attention never crosses from one into
// another (block-diagonal causal, flash-attention's varlen): query t sees
// keys [t - positions[t], t].
struct AttentionShape {
  std::size_t B, T, NH, NKV, hs;
  std::size_t q_stride, kv_stride;
  const std::int32_t* positions = nullptr;
  std::size_t C() const { return NH * hs; }
  std::size_t group() const { return NH / NKV; }
};
// What attention reads: q (B,T,NH,hs), k and v (B,T,NKV,hs).
struct AttentionInputs {
  const float* q;
  const float* k;
  const float* v;
};
// Their gradients, added to: dq laid out as q, dk and dv as k and v.
struct AttentionGrads {
  float* dq;
  float* dk;
  float* dv;
};
// One block of a sequence's attention, as ring attention (context
// parallelism) computes it, a rank's queries meeting one rank's keys at a
// time: query rows [first, first + rows) of each of B rows of T (q, dq
// rows of q_stride; out, dout (B,T,NH*hs); lse (B,NH,T)) against
// key/value rows [0, keys) of each of B rows of Tkv (k, v, dk, dv rows of
// kv_stride). causal: a block on the diagonal, its query i and key i at
// one position (rows == keys), query i seeing keys j <= i; otherwise a
// block wholly in the queries' past, every key seen. keys >= 1.
// positions: AttentionShape's, on a whole causal block only (first 0,
// rows = keys = T = Tkv).
struct AttentionBlock {
  std::size_t B, NH, NKV, hs;
  std::size_t q_stride, kv_stride;
  std::size_t T, first, rows;
  std::size_t Tkv, keys;
  bool causal;
  const std::int32_t* positions = nullptr;
  std::size_t C() const { return NH * hs; }
  std::size_t group() const { return NH / NKV; }
  // The first key query row i of batch row b sees: its example's first
  // token where rows pack examples, else 0.
  std::size_t first_key(std::size_t b, std::size_t i) const {
    return positions ? i - static_cast<std::size_t>(positions[b * T + i]) : 0;
  }
};
// The whole causal attention of s as one block.
inline AttentionBlock whole_block(AttentionShape s) {
  return {s.B, s.NH, s.NKV, s.hs, s.q_stride, s.kv_stride, s.T,
          0,   s.T,  s.T,   s.T,  true,       s.positions};
}

class ZTRAIN_API Kernels {
 public:
  virtual ~Kernels();

  // out: (B,T,C) = wte[tokens] + wpe[t]; wpe may be null (no learned positions).
  virtual void embedding_forward(float* out, const std::int32_t* tokens, ConstTypedPtr wte,
                                 ConstTypedPtr wpe, TokenShape s) const = 0;
  // dwte: (V,C) or null (a frozen table), dwpe: (T,C) or null, dout: (B,T,C)
  virtual void embedding_backward(TypedPtr dwte, TypedPtr dwpe, const float* dout,
                                  const std::int32_t* tokens, TokenShape s) const = 0;

  // out: (N,C) normalised; mean, rstd: (N) saved for backward; w, b: (C).
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 ConstTypedPtr w, ConstTypedPtr b, RowShape s, float eps) const = 0;
  // dw, db may be null (a frozen norm): no gradient for them.
  virtual void layernorm_backward(float* dinp, TypedPtr dw, TypedPtr db, const float* dout,
                                  const float* inp, ConstTypedPtr w, const float* mean,
                                  const float* rstd, RowShape s) const = 0;

  // res: (N,C) = a + b, the residual stream; then out, mean, rstd as
  // layernorm_forward of res: the add and the norm that reads it in one pass
  // over memory. res may alias a or b.
  virtual void add_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                     const float* a, const float* b, ConstTypedPtr w,
                                     ConstTypedPtr bias, RowShape s, float eps) const = 0;
  // out: (N,C) = inp / rms(inp) * w; rstd: (N).
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, ConstTypedPtr w,
                               RowShape s, float eps) const = 0;
  // dw may be null (a frozen norm).
  virtual void rmsnorm_backward(float* dinp, TypedPtr dw, const float* dout, const float* inp,
                                ConstTypedPtr w, const float* rstd, RowShape s) const = 0;
  // res = a + b, then out, rstd as rmsnorm_forward of res. res may alias a or b.
  virtual void add_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                   const float* b, ConstTypedPtr w, RowShape s,
                                   float eps) const = 0;

  // out: (N,OC) = inp (N,C) @ w^T + bias; w: (OC,C) (PyTorch Linear layout); bias: (OC) or null.
  virtual void matmul_forward(float* out, const float* inp, ConstTypedPtr w, ConstTypedPtr bias,
                              MatmulShape s) const = 0;
  // dinp may be null (no gradient wanted); dbias may be null.
  virtual void matmul_backward(float* dinp, TypedPtr dw, TypedPtr dbias, const float* dout,
                               const float* inp, ConstTypedPtr w, MatmulShape s) const = 0;

  // GELU, tanh approximation (GPT-2's "gelu_new"), of an MLP's pre-activation
  // with its bias added on the way in: out (N,H) = gelu(pre + bias), where
  // pre (N,H) is the fc matmul's output without its bias (matmul_forward with
  // a null bias) and bias (H) may be null; s is (N, H). pre is left as it
  // is and backward adds the bias again, so the bias's (N,H) broadcast never
  // goes through memory.
  virtual void gelu_forward(float* out, const float* pre, ConstTypedPtr bias, RowShape s) const = 0;
  // dpre (N,H) = gelu'(pre + bias) * dout, WRITTEN, not added (its one
  // reader is the fc matmul's backward, so nobody zeroes it first); dbias
  // (H) += the column sums of dpre (the cpu kernels sum them in the pass
  // that writes dpre). dbias may be null.
  virtual void gelu_backward(float* dpre, TypedPtr dbias, const float* pre, ConstTypedPtr bias,
                             const float* dout, RowShape s) const = 0;

  // out = silu(gate) * up; all (n)
  virtual void swiglu_forward(float* out, const float* gate, const float* up,
                              std::size_t n) const = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                               const float* up, std::size_t n) const = 0;

  // Rotary embedding in place, Hugging Face's rotate_half layout: within each
  // head, element i pairs with i + hs/2. x: (B,T,H,hs) as s lays it out;
  // cos, sin: (T, hs/2).
  virtual void rope_forward(float* x, const float* cos, const float* sin, HeadShape s) const = 0;
  // The inverse rotation applied in place to a gradient (it OVERWRITES dx).
  virtual void rope_backward(float* dx, const float* cos, const float* sin, HeadShape s) const = 0;

  // Causal scaled dot-product attention with grouped key/value heads,
  // keeping O(T) per head for backward instead of the T x T probabilities.
  // out: (B,T,NH*hs); lse: (B,NH,T) the log-sum-exp of each row of scaled
  // scores, saved for backward.
  virtual void attention_forward(float* out, float* lse, AttentionInputs in,
                                 AttentionShape s) const = 0;
  // Recomputes the probabilities from q, k and lse. out: the forward's output.
  virtual void attention_backward(AttentionGrads d, const float* dout, const float* out,
                                  AttentionInputs in, const float* lse, AttentionShape s) const = 0;

  // Attention over one block of keys (AttentionBlock): the block's rows of
  // out and lse, written as attention_forward writes them for those keys
  // alone.
  virtual void attention_block_forward(float* out, float* lse, AttentionInputs in,
                                       AttentionBlock s) const = 0;
  // The block's share of the gradients, added to dq's rows of the block and
  // dk's and dv's rows [0, keys). out and lse: the rows' attention over
  // every key they see (the blocks merged), so that the probabilities
  // recomputed for the block are the rows' own.
  virtual void attention_block_backward(AttentionGrads d, const float* dout, const float* out,
                                        AttentionInputs in, const float* lse,
                                        AttentionBlock s) const = 0;
  // A block's attention merged into the rows' so far, for the block's rows:
  // lse' = log(e^lse + e^block_lse), out' = e^(lse - lse') out +
  // e^(block_lse - lse') block_out; block_out and block_lse laid out as
  // out and lse.
  virtual void attention_merge(float* out, float* lse, const float* block_out,
                               const float* block_lse, AttentionBlock s) const = 0;

  // out = a + b; all (n). out may alias a or b.
  virtual void add(float* out, const float* a, const float* b, std::size_t n) const = 0;
  // x (n) *= alpha, in place (LoRA's alpha / rank).
  virtual void scale(float* x, float alpha, std::size_t n) const = 0;

  // logits: (N,V) turned into probabilities in place; losses: (N) = -log
  // p[target]; s is (N, V). A row whose target is kIgnoreTarget gets a
  // loss of 0 (its logits are left undefined).
  virtual void softmax_crossentropy_forward(float* losses, float* logits,
                                            const std::int32_t* targets, RowShape s) const = 0;
  // probs: (N,V) from forward, OVERWRITTEN with dlogits = (probs - onehot) * dloss;
  // zeros in a row whose target is kIgnoreTarget.
  virtual void softmax_crossentropy_backward(float* probs, const std::int32_t* targets, float dloss,
                                             RowShape s) const = 0;

  // The same loss over a vocabulary split by columns across ranks (Megatron's
  // vocabulary-parallel cross-entropy), in four ops with two all-reduces of
  // the caller's between them, so that no rank ever holds a whole row:
  //   row_max: (N) = max over this slice's logits: (N,V)  -> all-reduce max
  //   sums: (2,N) = sum over the slice of exp(logit - row_max), then the
  //     target's logit where this slice holds it, else 0; logits: (N,V)
  //     OVERWRITTEN with exp(logit - row_max)               -> all-reduce sum
  //   losses: (N) = log(sums[0]) + row_max - sums[1] (every rank the same)
  //   exps: (N,V) OVERWRITTEN with dlogits = (exps / sums[0] - onehot) * dloss
  // A row whose target is kIgnoreTarget gets a loss of 0 and zero dlogits.
  virtual void crossentropy_slice_max(float* row_max, const float* logits, VocabShape s) const = 0;
  virtual void crossentropy_slice_sums(float* sums, float* logits, const float* row_max,
                                       const std::int32_t* targets, VocabShape s) const = 0;
  virtual void crossentropy_slice_loss(float* losses, const float* row_max, const float* sums,
                                       const std::int32_t* targets, std::size_t N) const = 0;
  virtual void crossentropy_slice_backward(float* exps, const float* sums,
                                           const std::int32_t* targets, float dloss,
                                           VocabShape s) const = 0;

  // The global gradient norm, in three ops on a StepScalars in memory these
  // kernels reach, so that a GPU never waits for the host between the last
  // gradient and the update: sum_squares_add per gradient piece, then
  // grad_norm_unscale, then (after the caller's all-reduce of `reduced`
  // when ranks hold different pieces) grad_norm_finish; adamw reads the
  // result where it lies.
  //
  // s->sum_squares += the sum of squares of x (n), in double, in a fixed
  // order (independent of the thread count).
  virtual void sum_squares_add(StepScalars* s, ConstTypedPtr x, std::size_t n) const = 0;
  // s->sum_squares /= loss_scale^2 (the gradients carried the loss scale);
  // s->reduced = it, rounded to fp32, for the all-reduce.
  virtual void grad_norm_unscale(StepScalars* s, double loss_scale) const = 0;
  // grad_norm = sqrt(reduced if across_ranks, else sum_squares); a
  // non-finite norm sets skip; grad_mult = 1/loss_scale times DeepSpeed's
  // clip multiplier 1 / max(1, norm / grad_clip) (1 when grad_clip is 0 or
  // the norm is not finite).
  virtual void grad_norm_finish(StepScalars* s, bool across_ranks, double loss_scale,
                                double grad_clip) const = 0;

  // Adam (bias-corrected, decoupled and/or L2 weight decay) over the runs
  // of a shard: p, m, v (fp32 master weights and moments), g and working
  // are at element 0 of the shard; each run [begin, end) decays or not,
  // elements between runs are not touched; one call for the whole shard
  // (a GPU launches once per batch of runs, not once per tensor).
  // Per element, with g' = g * s->grad_mult + l2 * p (wd and l2: the
  // hyper-parameters in a decayed run, 0 in the others):
  // m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
  // p -= lr * (wd * p + (m / bc1) / (sqrt(v / bc2) + eps)); then, with
  // GradAfter::zeroed, g = 0, ready for the next step's accumulation
  // (GradAfter::kept leaves g alone, for gradients the next step overwrites:
  // 4 bytes per element less to move), and, unless `working` is null,
  // working = p rounded to its type: one pass over memory, not two.
  // When s->skip is set, only g is written: zeroed, whatever grad_after.
  // s: in memory these kernels reach, read by the kernels themselves.
  virtual void adamw(float* p, TypedPtr g, float* m, float* v, TypedPtr working,
                     const AdamWRun* runs, std::size_t run_count, const AdamWHyper& h,
                     const StepScalars* s, GradAfter grad_after) const = 0;

  // *acc += the mean of x (n), summed in double in a fixed order (the cpu's:
  // index order) and rounded to fp32: a micro-batch's mean loss added to
  // the step's total where the kernels run. Nothing for n = 0.
  virtual void mean_add(double* acc, const float* x, std::size_t n) const = 0;
};

// The cpu implementation (oneTBB loops, OpenBLAS GEMMs) on the threads the
// cpu device configured.
ZTRAIN_API std::unique_ptr<Kernels> make_cpu_kernels();

}  // namespace ztrain
