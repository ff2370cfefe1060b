// Every op of Kernels, in one list: each op's parameters, named as
// kernels.h names them (ZTRAIN_KERNEL_PARAMS_<op>), and the list of ops
// with their argument names (ZTRAIN_KERNEL_OPS, X(op, (arguments))), so
// that a backend's class declares its overrides from here instead of
// copying the signatures (ZTRAIN_KERNEL_DECLARE_ALL for a backend with
// every op, ZTRAIN_KERNEL_OVERRIDE(op) for one op), and each decorator
// that wraps every op the same way (bench's TimedKernels, the guarded
// device's kernels) expands the list: a new op, or a changed one, reaches
// every backend and decorator from this file and kernels.h. The compiler
// holds the two to each other (every declaration here overrides).
#pragma once

#include "ztrain/kernels.h"

// clang-format off
#define ZTRAIN_KERNEL_PARAMS_embedding_forward (float* out, const std::int32_t* tokens, ::ztrain::ConstTypedPtr wte, ::ztrain::ConstTypedPtr wpe, ::ztrain::TokenShape s)
#define ZTRAIN_KERNEL_PARAMS_embedding_backward (::ztrain::TypedPtr dwte, ::ztrain::TypedPtr dwpe, const float* dout, const std::int32_t* tokens, ::ztrain::TokenShape s)
#define ZTRAIN_KERNEL_PARAMS_layernorm_forward (float* out, float* mean, float* rstd, const float* inp, ::ztrain::ConstTypedPtr w, ::ztrain::ConstTypedPtr b, ::ztrain::RowShape s, float eps)
#define ZTRAIN_KERNEL_PARAMS_layernorm_backward (float* dinp, ::ztrain::TypedPtr dw, ::ztrain::TypedPtr db, const float* dout, const float* inp, ::ztrain::ConstTypedPtr w, const float* mean, const float* rstd, ::ztrain::RowShape s)
#define ZTRAIN_KERNEL_PARAMS_add_layernorm_forward (float* res, float* out, float* mean, float* rstd, const float* a, const float* b, ::ztrain::ConstTypedPtr w, ::ztrain::ConstTypedPtr bias, ::ztrain::RowShape s, float eps)
#define ZTRAIN_KERNEL_PARAMS_rmsnorm_forward (float* out, float* rstd, const float* inp, ::ztrain::ConstTypedPtr w, ::ztrain::RowShape s, float eps)
#define ZTRAIN_KERNEL_PARAMS_rmsnorm_backward (float* dinp, ::ztrain::TypedPtr dw, const float* dout, const float* inp, ::ztrain::ConstTypedPtr w, const float* rstd, ::ztrain::RowShape s)
#define ZTRAIN_KERNEL_PARAMS_add_rmsnorm_forward (float* res, float* out, float* rstd, const float* a, const float* b, ::ztrain::ConstTypedPtr w, ::ztrain::RowShape s, float eps)
#define ZTRAIN_KERNEL_PARAMS_matmul_forward (float* out, const float* inp, ::ztrain::ConstTypedPtr w, ::ztrain::ConstTypedPtr bias, ::ztrain::MatmulShape s)
#define ZTRAIN_KERNEL_PARAMS_matmul_backward (float* dinp, ::ztrain::TypedPtr dw, ::ztrain::TypedPtr dbias, const float* dout, const float* inp, ::ztrain::ConstTypedPtr w, ::ztrain::MatmulShape s)
#define ZTRAIN_KERNEL_PARAMS_gelu_forward (float* out, const float* pre, ::ztrain::ConstTypedPtr bias, ::ztrain::RowShape s)
#define ZTRAIN_KERNEL_PARAMS_gelu_backward (float* dpre, ::ztrain::TypedPtr dbias, const float* pre, ::ztrain::ConstTypedPtr bias, const float* dout, ::ztrain::RowShape s)
#define ZTRAIN_KERNEL_PARAMS_swiglu_forward (float* out, const float* gate, const float* up, std::size_t n)
#define ZTRAIN_KERNEL_PARAMS_swiglu_backward (float* dgate, float* dup, const float* dout, const float* gate, const float* up, std::size_t n)
#define ZTRAIN_KERNEL_PARAMS_rope_forward (float* x, const float* cos, const float* sin, ::ztrain::HeadShape s)
#define ZTRAIN_KERNEL_PARAMS_rope_backward (float* dx, const float* cos, const float* sin, ::ztrain::HeadShape s)
#define ZTRAIN_KERNEL_PARAMS_attention_forward (float* out, float* lse, ::ztrain::AttentionInputs in, ::ztrain::AttentionShape s)
#define ZTRAIN_KERNEL_PARAMS_attention_backward (::ztrain::AttentionGrads d, const float* dout, const float* out, ::ztrain::AttentionInputs in, const float* lse, ::ztrain::AttentionShape s)
#define ZTRAIN_KERNEL_PARAMS_attention_block_forward (float* out, float* lse, ::ztrain::AttentionInputs in, ::ztrain::AttentionBlock s)
#define ZTRAIN_KERNEL_PARAMS_attention_block_backward (::ztrain::AttentionGrads d, const float* dout, const float* out, ::ztrain::AttentionInputs in, const float* lse, ::ztrain::AttentionBlock s)
#define ZTRAIN_KERNEL_PARAMS_attention_merge (float* out, float* lse, const float* block_out, const float* block_lse, ::ztrain::AttentionBlock s)
#define ZTRAIN_KERNEL_PARAMS_add (float* out, const float* a, const float* b, std::size_t n)
#define ZTRAIN_KERNEL_PARAMS_scale (float* x, float alpha, std::size_t n)
#define ZTRAIN_KERNEL_PARAMS_softmax_crossentropy_forward (float* losses, float* logits, const std::int32_t* targets, ::ztrain::RowShape s)
#define ZTRAIN_KERNEL_PARAMS_softmax_crossentropy_backward (float* probs, const std::int32_t* targets, float dloss, ::ztrain::RowShape s)
#define ZTRAIN_KERNEL_PARAMS_crossentropy_slice_max (float* row_max, const float* logits, ::ztrain::VocabShape s)
#define ZTRAIN_KERNEL_PARAMS_crossentropy_slice_sums (float* sums, float* logits, const float* row_max, const std::int32_t* targets, ::ztrain::VocabShape s)
#define ZTRAIN_KERNEL_PARAMS_crossentropy_slice_loss (float* losses, const float* row_max, const float* sums, const std::int32_t* targets, std::size_t N)
#define ZTRAIN_KERNEL_PARAMS_crossentropy_slice_backward (float* exps, const float* sums, const std::int32_t* targets, float dloss, ::ztrain::VocabShape s)
#define ZTRAIN_KERNEL_PARAMS_sum_squares_add (::ztrain::StepScalars* s, ::ztrain::ConstTypedPtr x, std::size_t n)
#define ZTRAIN_KERNEL_PARAMS_grad_norm_unscale (::ztrain::StepScalars* s, double loss_scale)
#define ZTRAIN_KERNEL_PARAMS_grad_norm_finish (::ztrain::StepScalars* s, bool across_ranks, double loss_scale, double grad_clip)
#define ZTRAIN_KERNEL_PARAMS_adamw (float* p, ::ztrain::TypedPtr g, float* m, float* v, ::ztrain::TypedPtr working, const ::ztrain::AdamWRun* runs, std::size_t run_count, const ::ztrain::AdamWHyper& h, const ::ztrain::StepScalars* s, ::ztrain::GradAfter grad_after)
#define ZTRAIN_KERNEL_PARAMS_mean_add (double* acc, const float* x, std::size_t n)

#define ZTRAIN_KERNEL_OPS(X) \
  X(embedding_forward, (out, tokens, wte, wpe, s)) \
  X(embedding_backward, (dwte, dwpe, dout, tokens, s)) \
  X(layernorm_forward, (out, mean, rstd, inp, w, b, s, eps)) \
  X(layernorm_backward, (dinp, dw, db, dout, inp, w, mean, rstd, s)) \
  X(add_layernorm_forward, (res, out, mean, rstd, a, b, w, bias, s, eps)) \
  X(rmsnorm_forward, (out, rstd, inp, w, s, eps)) \
  X(rmsnorm_backward, (dinp, dw, dout, inp, w, rstd, s)) \
  X(add_rmsnorm_forward, (res, out, rstd, a, b, w, s, eps)) \
  X(matmul_forward, (out, inp, w, bias, s)) \
  X(matmul_backward, (dinp, dw, dbias, dout, inp, w, s)) \
  X(gelu_forward, (out, pre, bias, s)) \
  X(gelu_backward, (dpre, dbias, pre, bias, dout, s)) \
  X(swiglu_forward, (out, gate, up, n)) \
  X(swiglu_backward, (dgate, dup, dout, gate, up, n)) \
  X(rope_forward, (x, cos, sin, s)) \
  X(rope_backward, (dx, cos, sin, s)) \
  X(attention_forward, (out, lse, in, s)) \
  X(attention_backward, (d, dout, out, in, lse, s)) \
  X(attention_block_forward, (out, lse, in, s)) \
  X(attention_block_backward, (d, dout, out, in, lse, s)) \
  X(attention_merge, (out, lse, block_out, block_lse, s)) \
  X(add, (out, a, b, n)) \
  X(scale, (x, alpha, n)) \
  X(softmax_crossentropy_forward, (losses, logits, targets, s)) \
  X(softmax_crossentropy_backward, (probs, targets, dloss, s)) \
  X(crossentropy_slice_max, (row_max, logits, s)) \
  X(crossentropy_slice_sums, (sums, logits, row_max, targets, s)) \
  X(crossentropy_slice_loss, (losses, row_max, sums, targets, N)) \
  X(crossentropy_slice_backward, (exps, sums, targets, dloss, s)) \
  X(sum_squares_add, (s, x, n)) \
  X(grad_norm_unscale, (s, loss_scale)) \
  X(grad_norm_finish, (s, across_ranks, loss_scale, grad_clip)) \
  X(adamw, (p, g, m, v, working, runs, run_count, h, s, grad_after)) \
  X(mean_add, (acc, x, n))
// clang-format on

// Inside a backend's class: op `name` declared as an override.
#define ZTRAIN_KERNEL_OVERRIDE(name) void name ZTRAIN_KERNEL_PARAMS_##name const override
#define ZTRAIN_KERNEL_DECLARE_ONE(name, args) ZTRAIN_KERNEL_OVERRIDE(name);
// Inside a backend's class: every op declared as an override.
#define ZTRAIN_KERNEL_DECLARE_ALL ZTRAIN_KERNEL_OPS(ZTRAIN_KERNEL_DECLARE_ONE)
