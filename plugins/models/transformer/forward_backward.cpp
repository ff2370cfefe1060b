// The transformer's forward and backward, module by module, through the
// strategy's views. Shapes: B batch, T time, C width, N = B*T, H MLP width,
// KV key/value width, V vocabulary.
#include <algorithm>
#include <vector>

#include "transformer.h"
#include "ztrain/error.h"

namespace ztrain::transformer {
namespace {

// Activation gradients the backward ops add into start at zero.
void zero(StepContext& ctx, float* p, std::size_t n) {
  ctx.activations().device().fill_zero(p, n * sizeof(float));
}

// The group of `degree` ranks the step context carries for one split of
// the sequence, or null at degree 1.
Communicator* group_of(Communicator* group, int degree, const char* what) {
  if (degree <= 1) return nullptr;
  if (!group || group->size() != degree)
    throw InternalError("a batch split over " + std::to_string(degree) + " " + what +
                        " ranks without a group of that size");
  return group;
}

}  // namespace

void Transformer::check_tokens(const Batch& batch) const {
  const int B = batch.shape.batch, T = batch.shape.seq_len, shards = batch.shape.split.shards();
  if (B < 1 || T < 1 || shards < 1 || T > cfg_.seq_len / shards)
    throw DataError("batch of shape (" + std::to_string(B) + ", " + std::to_string(T) + ") in " +
                    std::to_string(shards) + " shard(s) does not fit the model's seq_len " +
                    std::to_string(cfg_.seq_len));
  const std::size_t n = static_cast<std::size_t>(B) * T;
  // A target may be kIgnoreTarget: the loss skips it.
  for (std::size_t i = 0; i < n; ++i) {
    for (const std::int32_t* ids : {batch.inputs, batch.targets}) {
      if (ids == batch.targets && ids[i] == kIgnoreTarget) continue;
      if (ids[i] < 0 || ids[i] >= cfg_.vocab_size)
        throw DataError("token id " + std::to_string(ids[i]) + " at batch row " +
                        std::to_string(i / static_cast<std::size_t>(T)) + ", position " +
                        std::to_string(i % static_cast<std::size_t>(T)) +
                        " is outside the model's vocabulary (vocab_size " +
                        std::to_string(cfg_.vocab_size) +
                        "); raise [model] vocab_size or fix the data");
    }
  }
}

Communicator& Transformer::tensor_comm(StepContext& ctx) const {
  Communicator* group = group_of(ctx.tensor_group(), cfg_.tensor, "tensor");
  if (!group) throw InternalError("the tensor group of a model that is not split");
  return *group;
}

void Transformer::tensor_sum(StepContext& ctx, float* x, std::size_t n) const {
  if (cfg_.tensor > 1) tensor_comm(ctx).all_reduce(x, n, DType::f32, ReduceOp::sum);
}

Communicator& Transformer::kv_group(StepContext& ctx) const {
  if (!kv_group_)
    kv_group_ = tensor_comm(ctx).split(cfg_.tensor_rank / cfg_.kv_copies(), cfg_.tensor_rank);
  return *kv_group_;
}

// a.d_c gets dk, dv of this rank's query heads through the weights (the
// tensor group's sum then adds every rank's); the weights' gradients get
// those of every holder's query heads, summed first, so each holder has
// the whole gradient, as its own copy of the weights needs.
void Transformer::copied_kv_backward(const BlockParams& p, const float* ln1, const Acts& a,
                                     float* dk, float* dv, StepContext& ctx) const {
  const Kernels& k = ctx.kernels();
  const auto P = param_views(ctx);
  const auto G = grad_views(ctx);
  const Dims d = dims(a.B, a.T);
  for (const auto& [dx, w] : {std::pair{dk, p.k_w}, {dv, p.v_w}})
    k.matmul_backward(a.d_c, nullptr, nullptr, dx, ln1, P(w), d.linear(d.C, d.KV));
  Communicator& holders = kv_group(ctx);
  for (float* dx : {dk, dv}) holders.all_reduce(dx, d.N * d.KV, DType::f32, ReduceOp::sum);
  k.matmul_backward(nullptr, G(p.k_w), G(p.k_b), dk, ln1, P(p.k_w), d.linear(d.C, d.KV));
  k.matmul_backward(nullptr, G(p.v_w), G(p.v_b), dv, ln1, P(p.v_w), d.linear(d.C, d.KV));
}

ConstTypedPtr Transformer::row_bias(StepContext& ctx, std::optional<ParamId> bias) const {
  if (!bias || cfg_.tensor_rank != 0) return {};
  return param(ctx, *bias);
}

Transformer::Acts Transformer::planned(const Batch& batch, StepContext& ctx, Planning how) const {
  check_tokens(batch);
  Arena& arena = ctx.activations();
  if (how.rewound)
    arena.rewind();
  else
    arena.reset();
  Acts a;
  plan(
      batch.shape,
      [&](std::size_t n, Where where) -> float* {
        if (where == Where::kept) return arena.alloc_f32(n);
        if (where == Where::working) return arena.alloc_working_f32(n);
        return how.training ? arena.alloc_host_f32(n) : nullptr;
      },
      a);
  a.ulysses_group = group_of(ctx.sequence_group(), a.split.sequence, "sequence (Ulysses)");
  a.ring_group = group_of(ctx.context_group(), a.split.context, "context (ring)");
  const SequenceShard shard{a.ulysses_group ? a.ulysses_group->rank() : 0,
                            a.ring_group ? a.ring_group->rank() : 0};
  a.spans = shard_spans(a.split, static_cast<std::size_t>(a.T), shard);
  const std::size_t n = static_cast<std::size_t>(batch.shape.batch) * batch.shape.seq_len;
  a.inputs = arena.on_device(batch.inputs, n);
  a.targets = arena.on_device(batch.targets, n);
  if (cfg_.tensor_sequence && n % static_cast<std::size_t>(cfg_.tensor) != 0)
    throw DataError(
        "a batch of " + std::to_string(batch.shape.batch) + " x " +
        std::to_string(batch.shape.seq_len) +
        " tokens does not split into [parallel] tensor = " + std::to_string(cfg_.tensor) +
        " equal shares of rows ([parallel] tensor_sequence); choose a micro-batch "
        "and seq_len whose product the degree divides");
  if (batch.positions) {
    if (!segments_refusal().empty() || a.split.shards() > 1)
      throw InternalError("a batch of packed rows reached a model or split that refuses them");
    a.positions = arena.on_device(batch.positions, n);
  }
  if (a.rope_cos) {
    const std::size_t entries =
        static_cast<std::size_t>(batch.shape.seq_len) * (cfg_.head_size() / 2);
    const std::size_t half = cfg_.head_size() / 2;
    std::vector<float> cos(entries), sin(entries);
    for (const TokenSpan& s : a.spans)
      rope_tables(cos.data() + s.row * half, sin.data() + s.row * half, s.length, s.position);
    arena.device().copy(a.rope_cos, cos.data(), entries * sizeof(float));
    arena.device().copy(a.rope_sin, sin.data(), entries * sizeof(float));
  }
  return a;
}

sequence::RingAttention Transformer::ring_of(const BlockActs& b, const Acts& a,
                                             StepContext& ctx) const {
  return {*a.ring_group, ctx.kernels(), ctx.activations().device(), ring_shape(b, a),
          a.ring_scratch};
}

std::optional<sequence::RingAttention> Transformer::inner_ring(const BlockActs& b, const Acts& a,
                                                               StepContext& ctx) const {
  if (!a.ring()) return std::nullopt;
  return ring_of(b, a, ctx);
}

sequence::UlyssesAttention Transformer::ulysses_of(
    const BlockActs& b, const Acts& a, StepContext& ctx,
    const std::optional<sequence::RingAttention>& ring) const {
  return {*a.ulysses_group,    ctx.kernels(),     ctx.activations().device(),
          ulysses_shape(b, a), a.ulysses_scratch, ring ? &*ring : nullptr};
}

void Transformer::attention_forward(const BlockActs& b, const Acts& a, StepContext& ctx) const {
  if (a.ulysses()) {
    const std::optional<sequence::RingAttention> ring = inner_ring(b, a, ctx);
    return ulysses_of(b, a, ctx, ring).forward(b.atty, {b.q, b.k, b.v}, {b.ulysses, b.lse});
  }
  if (a.ring()) return ring_of(b, a, ctx).forward(b.atty, b.lse, {b.q, b.k, b.v});
  AttentionShape s = dims(a.B, a.T).attention(b);
  s.positions = a.positions;
  ctx.kernels().attention_forward(b.atty, b.lse, {b.q, b.k, b.v}, s);
}

// d's buffers are zero on entry: the kernel and the ring add into them,
// Ulysses writes.
void Transformer::attention_backward(AttentionGrads d, const BlockActs& b, const Acts& a,
                                     StepContext& ctx) const {
  if (a.ulysses()) {
    const std::optional<sequence::RingAttention> ring = inner_ring(b, a, ctx);
    return ulysses_of(b, a, ctx, ring).backward(d, a.d_att, b.atty, {b.ulysses, b.lse});
  }
  if (a.ring()) return ring_of(b, a, ctx).backward(d, a.d_att, b.atty, {b.q, b.k, b.v}, b.lse);
  AttentionShape s = dims(a.B, a.T).attention(b);
  s.positions = a.positions;
  ctx.kernels().attention_backward(d, a.d_att, b.atty, {b.q, b.k, b.v}, b.lse, s);
}

// One call for rows whose positions run on (whole sequences, Ulysses'
// slices); a call per row and span where they jump (the ring's chunks)
// and the model has a table of positions.
TokenShape Transformer::token_shape(std::size_t B, std::size_t T) const {
  TokenShape s{B, T, static_cast<std::size_t>(cfg_.n_embd)};
  if (cfg_.tensor > 1) {
    s.vocab_first = static_cast<std::size_t>(cfg_.vocab_first(cfg_.tensor_rank));
    s.vocab_rows = static_cast<std::size_t>(cfg_.local_vocab());
  }
  return s;
}

// Under tensor parallelism each rank looks up the tokens its rows of the
// table hold (zeros for the others) and the group's first rank adds the
// positions (the sum adds them once, as row_bias); the sum over the group
// is the whole embedding.
void Transformer::embed_forward(StepContext& ctx, const Acts& a) const {
  const Dims d = dims(a.B, a.T);
  const auto P = param_views(ctx);
  const ConstTypedPtr wte = P(wte_);
  const auto wpe_at = [&](std::size_t position) {
    return wpe_ && cfg_.tensor_rank == 0 ? P(wpe_).at(position * d.C) : ConstTypedPtr{};
  };
  float* out = partial_rows(a, a.resid[0]);  // (N,C)
  if (a.spans.size() == 1 || !wpe_) {
    ctx.kernels().embedding_forward(out, a.inputs, wte, wpe_at(a.spans[0].position),
                                    token_shape(d.B, d.T));
  } else {
    for (std::size_t b = 0; b < d.B; ++b)
      for (const TokenSpan& s : a.spans) {
        const std::size_t row = b * d.T + s.row;
        ctx.kernels().embedding_forward(out + row * d.C, a.inputs + row, wte, wpe_at(s.position),
                                        token_shape(1, s.length));
      }
  }
  sum_rows(ctx, a, out, a.resid[0]);
}

void Transformer::embed_backward(StepContext& ctx, const Acts& a) const {
  const Dims d = dims(a.B, a.T);
  const auto G = grad_views(ctx);
  const TypedPtr dwte = G(wte_);
  if (!dwte && !(wpe_ && G(wpe_))) return;  // a frozen embedding
  const float* dout = all_rows(ctx, a, a.d_res);
  if (a.spans.size() == 1 || !wpe_) {
    const TypedPtr dwpe = wpe_ ? G(wpe_).at(a.spans[0].position * d.C) : TypedPtr{};
    return ctx.kernels().embedding_backward(dwte, dwpe, dout, a.inputs, token_shape(d.B, d.T));
  }
  for (std::size_t b = 0; b < d.B; ++b)
    for (const TokenSpan& s : a.spans) {
      const std::size_t row = b * d.T + s.row;
      ctx.kernels().embedding_backward(dwte, G(wpe_).at(s.position * d.C), dout + row * d.C,
                                       a.inputs + row, token_shape(1, s.length));
    }
}

// x: (N,C) block input; out: (N,C) block output (under sequence
// parallelism this rank's NL rows of each: the norms run on them, and the
// split regions read their rows gathered and return partial sums
// reduce-scattered).
void Transformer::block_forward(int l, const float* x, float* out, BlockActs& b, const Acts& a,
                                StepContext& ctx) const {
  const Kernels& k = ctx.kernels();
  const BlockParams& p = blocks_[static_cast<std::size_t>(l)];
  const auto P = param_views(ctx);
  const Dims d = dims(a.B, a.T);
  const std::size_t C = d.C, H = d.H, KV = d.KV, A = d.A;
  const RowShape own = d.own(C);
  const std::size_t NH_ = d.N * H;
  if (!cfg_.llama)
    k.layernorm_forward(b.ln1, b.ln1_mean, b.ln1_rstd, x, P(p.ln1_w), P(p.ln1_b), own,
                        cfg_.norm_eps);
  else
    k.rmsnorm_forward(b.ln1, b.ln1_rstd, x, P(p.ln1_w), own, cfg_.norm_eps);
  keep(ctx, a, b.ln1, d.own_floats(), b.kept.ln1);
  const float* ln1 = all_rows(ctx, a, b.ln1);  // (N,C)
  if (!cfg_.llama) {
    k.matmul_forward(b.q, ln1, P(p.qkv_w), P(p.qkv_b), d.linear(C, 3 * A));  // qkv: (N,3A)
    lora_forward(l, {Proj::qkv, ln1, d.linear(C, 3 * A)}, b.q, b, a, ctx);
  } else {
    k.matmul_forward(b.q, ln1, P(p.q_w), P(p.q_b), d.linear(C, A));   // q: (N,A)
    k.matmul_forward(b.k, ln1, P(p.k_w), P(p.k_b), d.linear(C, KV));  // k: (N,KV)
    k.matmul_forward(b.v, ln1, P(p.v_w), P(p.v_b), d.linear(C, KV));  // v: (N,KV)
    lora_forward(l, {Proj::q, ln1, d.linear(C, A)}, b.q, b, a, ctx);
    lora_forward(l, {Proj::k, ln1, d.linear(C, KV)}, b.k, b, a, ctx);
    lora_forward(l, {Proj::v, ln1, d.linear(C, KV)}, b.v, b, a, ctx);
    k.rope_forward(b.q, b.rope_cos, b.rope_sin, {d.B, d.T, d.NH, d.hs, A, a.positions});
    k.rope_forward(b.k, b.rope_cos, b.rope_sin, {d.B, d.T, d.NKV, d.hs, KV, a.positions});
  }
  keep(ctx, a, b.q, d.qkv(), b.kept.qkv);
  attention_forward(b, a, ctx);
  keep(ctx, a, b.atty, d.N * A, b.kept.atty);
  if (a.ulysses()) keep(ctx, a, b.ulysses, ulysses_shape(b, a).saved_floats(), b.kept.ulysses);
  float* proj = partial_rows(a, b.res1);  // (N,C)
  k.matmul_forward(proj, b.atty, P(p.proj_w), row_bias(ctx, p.proj_b), d.linear(A, C));
  lora_forward(l, {Proj::o, b.atty, d.linear(A, C)}, proj, b, a, ctx);
  sum_rows(ctx, a, proj, b.res1);
  norm2_forward(l, x, b, a, ctx);
  const float* ln2 = all_rows(ctx, a, b.ln2);  // (N,C)
  float* mlp = nullptr;
  if (!cfg_.llama) {
    // fc: (N,H) without its bias, which GELU adds as it reads h1.
    k.matmul_forward(b.h1, ln2, P(p.fc_w), nullptr, d.linear(C, H));
    lora_forward(l, {Proj::fc, ln2, d.linear(C, H)}, b.h1, b, a, ctx);
    keep(ctx, a, b.h1, NH_, b.kept.h1);
    k.gelu_forward(b.h2, b.h1, P(p.fc_b), d.rows(H));
    keep(ctx, a, b.h2, NH_, b.kept.h2);
    mlp = partial_rows(a, out);  // ln2's gathered rows are read by now
    k.matmul_forward(mlp, b.h2, P(p.fcproj_w), row_bias(ctx, p.fcproj_b), d.linear(H, C));
    lora_forward(l, {Proj::down, b.h2, d.linear(H, C)}, mlp, b, a, ctx);
  } else {
    k.matmul_forward(b.h1, ln2, P(p.fc_w), P(p.fc_b), d.linear(C, H));  // gate: (N,H)
    lora_forward(l, {Proj::fc, ln2, d.linear(C, H)}, b.h1, b, a, ctx);
    keep(ctx, a, b.h1, NH_, b.kept.h1);
    k.matmul_forward(b.h2, ln2, P(p.up_w), P(p.up_b), d.linear(C, H));  // up: (N,H)
    lora_forward(l, {Proj::up, ln2, d.linear(C, H)}, b.h2, b, a, ctx);
    keep(ctx, a, b.h2, NH_, b.kept.h2);
    k.swiglu_forward(b.h3, b.h1, b.h2, NH_);
    keep(ctx, a, b.h3, NH_, b.kept.h3);
    mlp = partial_rows(a, out);
    k.matmul_forward(mlp, b.h3, P(p.fcproj_w), row_bias(ctx, p.fcproj_b), d.linear(H, C));
    lora_forward(l, {Proj::down, b.h3, d.linear(H, C)}, mlp, b, a, ctx);
  }
  sum_rows(ctx, a, mlp, out);
  k.add(out, out, b.res1, d.own_floats());
}

// res1 = x + attention's output (in b.res1 on entry), and its norm: in one
// pass in fp32; keeping 16-bit activations, res1 rounded before the norm
// reads it, as everything the backward reads.
void Transformer::norm2_forward(int l, const float* x, BlockActs& b, const Acts& a,
                                StepContext& ctx) const {
  const Kernels& k = ctx.kernels();
  const BlockParams& p = blocks_[static_cast<std::size_t>(l)];
  const auto P = param_views(ctx);
  const Dims d = dims(a.B, a.T);
  const RowShape rows = d.own(d.C);
  const std::size_t NC = d.own_floats();
  if (!a.rounds() && !cfg_.llama)
    k.add_layernorm_forward(b.res1, b.ln2, b.ln2_mean, b.ln2_rstd, b.res1, x, P(p.ln2_w),
                            P(p.ln2_b), rows, cfg_.norm_eps);
  if (!a.rounds() && cfg_.llama)
    k.add_rmsnorm_forward(b.res1, b.ln2, b.ln2_rstd, b.res1, x, P(p.ln2_w), rows, cfg_.norm_eps);
  if (a.rounds()) {
    k.add(b.res1, b.res1, x, NC);
    keep(ctx, a, b.res1, NC, b.kept.res1);
    if (!cfg_.llama)
      k.layernorm_forward(b.ln2, b.ln2_mean, b.ln2_rstd, b.res1, P(p.ln2_w), P(p.ln2_b), rows,
                          cfg_.norm_eps);
    else
      k.rmsnorm_forward(b.ln2, b.ln2_rstd, b.res1, P(p.ln2_w), rows, cfg_.norm_eps);
  }
  keep(ctx, a, b.ln2, NC, b.kept.ln2);
}

// On entry a.d_res holds dL/d(block output); on exit dL/d(block input)
// (this rank's rows of each under sequence parallelism: gathered where a
// split region's backward reads them, as the norms' outputs are again).
void Transformer::block_backward(int l, Acts& a, StepContext& ctx) const {
  const Kernels& k = ctx.kernels();
  const BlockParams& p = blocks_[static_cast<std::size_t>(l)];
  BlockActs& b = block_acts(a, l);
  const float* x = stream(a, l);
  if (cfg_.checkpointing) block_forward(l, x, stream(a, l + 1), b, a, ctx);
  restore_block(l, a, ctx);
  const auto P = param_views(ctx);
  const auto G = grad_views(ctx);
  const Dims d = dims(a.B, a.T);
  const std::size_t C = d.C, H = d.H, KV = d.KV, A = d.A, NC = d.N * C, NH_ = d.N * H;

  // MLP
  const float* dout = all_rows(ctx, a, a.d_res);  // (N,C)
  const float* h_last = cfg_.llama ? b.h3 : b.h2;
  float* d_last = cfg_.llama ? a.d_h3 : a.d_h2;
  zero(ctx, d_last, NH_);
  k.matmul_backward(d_last, G(p.fcproj_w), G(p.fcproj_b), dout, h_last, P(p.fcproj_w),
                    d.linear(H, C));
  lora_backward(l, {Proj::down, h_last, d.linear(H, C)}, d_last, dout, b, a, ctx);
  zero(ctx, a.d_c, NC);
  if (!cfg_.llama) {
    k.gelu_backward(a.d_h1, G(p.fc_b), b.h1, P(p.fc_b), a.d_h2, d.rows(H));  // writes d_h1
    const float* ln2 = all_rows(ctx, a, b.ln2);
    k.matmul_backward(a.d_c, G(p.fc_w), nullptr, a.d_h1, ln2, P(p.fc_w), d.linear(C, H));
    lora_backward(l, {Proj::fc, ln2, d.linear(C, H)}, a.d_c, a.d_h1, b, a, ctx);
  } else {
    zero(ctx, a.d_h1, NH_);
    zero(ctx, a.d_h2, NH_);
    k.swiglu_backward(a.d_h1, a.d_h2, a.d_h3, b.h1, b.h2, NH_);
    const float* ln2 = all_rows(ctx, a, b.ln2);
    k.matmul_backward(a.d_c, G(p.fc_w), G(p.fc_b), a.d_h1, ln2, P(p.fc_w), d.linear(C, H));
    lora_backward(l, {Proj::fc, ln2, d.linear(C, H)}, a.d_c, a.d_h1, b, a, ctx);
    k.matmul_backward(a.d_c, G(p.up_w), G(p.up_b), a.d_h2, ln2, P(p.up_w), d.linear(C, H));
    lora_backward(l, {Proj::up, ln2, d.linear(C, H)}, a.d_c, a.d_h2, b, a, ctx);
  }
  norm_backward(
      ctx, a, {a.d_res, p.ln2_w, p.ln2_b, own_sum(ctx, a, a.d_c), b.res1, b.ln2_mean, b.ln2_rstd});
  // a.d_res is now dL/d(res1). Attention:
  dout = all_rows(ctx, a, a.d_res);
  zero(ctx, a.d_att, d.N * A);
  k.matmul_backward(a.d_att, G(p.proj_w), G(p.proj_b), dout, b.atty, P(p.proj_w), d.linear(A, C));
  lora_backward(l, {Proj::o, b.atty, d.linear(A, C)}, a.d_att, dout, b, a, ctx);
  if (!cfg_.llama) {
    zero(ctx, a.d_qkv, d.N * A * 3);
    float* dq = a.d_qkv;
    attention_backward({dq, dq + A, dq + 2 * A}, b, a, ctx);
    zero(ctx, a.d_c, NC);
    const float* ln1 = all_rows(ctx, a, b.ln1);
    k.matmul_backward(a.d_c, G(p.qkv_w), G(p.qkv_b), a.d_qkv, ln1, P(p.qkv_w), d.linear(C, 3 * A));
    lora_backward(l, {Proj::qkv, ln1, d.linear(C, 3 * A)}, a.d_c, a.d_qkv, b, a, ctx);
  } else {
    const std::size_t NKVs = d.N * KV, NA = d.N * A;
    float* dq = a.d_qkv;
    float* dk = dq + NA;
    float* dv = dk + NKVs;
    zero(ctx, a.d_qkv, NA + 2 * NKVs);
    attention_backward({dq, dk, dv}, b, a, ctx);
    k.rope_backward(dq, b.rope_cos, b.rope_sin, {d.B, d.T, d.NH, d.hs, A, a.positions});
    k.rope_backward(dk, b.rope_cos, b.rope_sin, {d.B, d.T, d.NKV, d.hs, KV, a.positions});
    zero(ctx, a.d_c, NC);
    const float* ln1 = all_rows(ctx, a, b.ln1);
    k.matmul_backward(a.d_c, G(p.q_w), G(p.q_b), dq, ln1, P(p.q_w), d.linear(C, A));
    if (cfg_.kv_copies() > 1) {
      copied_kv_backward(p, ln1, a, dk, dv, ctx);
    } else {
      k.matmul_backward(a.d_c, G(p.k_w), G(p.k_b), dk, ln1, P(p.k_w), d.linear(C, KV));
      k.matmul_backward(a.d_c, G(p.v_w), G(p.v_b), dv, ln1, P(p.v_w), d.linear(C, KV));
    }
    lora_backward(l, {Proj::q, ln1, d.linear(C, A)}, a.d_c, dq, b, a, ctx);
    lora_backward(l, {Proj::k, ln1, d.linear(C, KV)}, a.d_c, dk, b, a, ctx);
    lora_backward(l, {Proj::v, ln1, d.linear(C, KV)}, a.d_c, dv, b, a, ctx);
  }
  norm_backward(ctx, a,
                {a.d_res, p.ln1_w, p.ln1_b, own_sum(ctx, a, a.d_c), x, b.ln1_mean, b.ln1_rstd});
}

// Two slots alternate; of four, three rotate and stream L has the last;
// L + 1 hold a stream each.
std::size_t Transformer::slot(const Acts& a, int l) const {
  if (a.resid.size() == 2) return static_cast<std::size_t>(l % 2);
  if (l == cfg_.n_layer) return a.resid.size() - 1;
  return static_cast<std::size_t>(a.resid.size() == 4 ? l % 3 : l - a.first_block);
}

void* Transformer::stream_kept(const Acts& a, int l) const {
  if (!a.rounds()) return nullptr;
  if (!cfg_.offload_checkpoints) return a.kept_resid[static_cast<std::size_t>(l - a.first_block)];
  return l == cfg_.n_layer ? a.kept_scratch : a.kept_resid[static_cast<std::size_t>(l % 3)];
}

// The copies move the kept type: 16-bit activations halve the bytes.
CopyWork Transformer::save_checkpoint(Acts& a, int l, StepContext& ctx) const {
  const std::size_t n = dims(a.B, a.T).own_floats();
  const void* from = a.rounds() ? stream_kept(a, l) : stream(a, l);
  return ctx.activations().device().copy_async(a.host_resid[static_cast<std::size_t>(l)], from,
                                               n * dtype_size(a.kept));
}

CopyWork Transformer::fetch_checkpoint(Acts& a, int l, StepContext& ctx) const {
  const std::size_t n = dims(a.B, a.T).own_floats();
  void* to = a.rounds() ? stream_kept(a, l) : stream(a, l);
  return ctx.activations().device().copy_async(to, a.host_resid[static_cast<std::size_t>(l)],
                                               n * dtype_size(a.kept));
}

void Transformer::keep(StepContext& ctx, const Acts& a, float* x, std::size_t n, void* kept) const {
  if (!a.rounds()) return;
  Device& device = ctx.activations().device();
  device.convert({kept, a.kept}, x, n);
  device.convert(x, {kept, a.kept}, n);
}

void Transformer::restore(StepContext& ctx, const Acts& a, float* x, std::size_t n,
                          const void* kept) const {
  if (a.rounds()) ctx.activations().device().convert(x, {kept, a.kept}, n);
}

// With checkpointing the recompute has just rounded them again instead.
void Transformer::restore_block(int l, Acts& a, StepContext& ctx) const {
  if (!a.rounds() || cfg_.checkpointing) return;
  const Dims d = dims(a.B, a.T);
  const std::size_t NC = d.own_floats(), NH_ = d.N * d.H;
  BlockActs& b = block_acts(a, l);
  restore(ctx, a, b.ln1, NC, b.kept.ln1);
  if (a.ulysses())
    restore(ctx, a, b.ulysses, ulysses_shape(b, a).saved_floats(), b.kept.ulysses);
  else
    restore(ctx, a, b.q, d.qkv(), b.kept.qkv);
  restore(ctx, a, b.atty, d.N * d.A, b.kept.atty);
  for (const auto& [x, kept] : {std::pair{b.res1, b.kept.res1}, {b.ln2, b.kept.ln2}})
    restore(ctx, a, x, NC, kept);
  for (const auto& [x, kept] : {std::pair{b.h1, b.kept.h1}, {b.h2, b.kept.h2}, {b.h3, b.kept.h3}})
    if (x) restore(ctx, a, x, NH_, kept);
}

// Offloading, block l's output overwrites the stream of block l - 2's
// input (three rotate), whose copy to the host must be done by then: each
// copy has one block's compute to run beside.
void Transformer::trunk_forward(StepContext& ctx, Acts& a, bool training) const {
  const int L = cfg_.n_layer;
  const bool offload = training && !a.host_resid.empty();
  const std::size_t NC = dims(a.B, a.T).own_floats();
  ctx.enter_forward(kEmbed);
  embed_forward(ctx, a);
  keep(ctx, a, stream(a, 0), NC, stream_kept(a, 0));
  ctx.exit_forward(kEmbed);
  std::vector<CopyWork> saving(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l) {
    if (offload && l >= 2) saving[static_cast<std::size_t>(l - 2)].wait();
    ctx.enter_forward(block_module(l));
    block_forward(l, stream(a, l), stream(a, l + 1), block_acts(a, l), a, ctx);
    keep(ctx, a, stream(a, l + 1), NC, stream_kept(a, l + 1));
    ctx.exit_forward(block_module(l));
    if (offload) saving[static_cast<std::size_t>(l)] = save_checkpoint(a, l, ctx);
  }
}

// Inside the head module: a.lnf = the final norm of the last block's output.
void Transformer::final_norm_forward(StepContext& ctx, Acts& a) const {
  const Kernels& k = ctx.kernels();
  const RowShape rows = dims(a.B, a.T).own(static_cast<std::size_t>(cfg_.n_embd));
  const auto P = param_views(ctx);
  const float* xL = stream(a, cfg_.n_layer);
  if (!cfg_.llama)
    k.layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, xL, P(lnf_w_), P(lnf_b_), rows,
                        cfg_.norm_eps);
  else
    k.rmsnorm_forward(a.lnf, a.lnf_rstd, xL, P(lnf_w_), rows, cfg_.norm_eps);
  keep(ctx, a, a.lnf, rows.N * rows.C, a.kept_scratch);
}

void Transformer::forward(StepContext& ctx, Acts& a, float* logits_out) const {
  trunk_forward(ctx, a, false);
  head_forward(ctx, a, logits_out);
}

void Transformer::head_forward(StepContext& ctx, Acts& a, float* logits_out) const {
  const Kernels& k = ctx.kernels();
  const Dims d = dims(a.B, a.T);
  const std::size_t N = d.N, C = d.C, V = d.V;
  ctx.enter_forward(head_module());
  final_norm_forward(ctx, a);
  const ConstTypedPtr head_w = param_views(ctx)(head_w_);
  const std::size_t rows = head_rows(N);
  if (logits_out && cfg_.tensor > 1)
    throw InternalError("the logits of a tensor-parallel part asked for; a rank holds a slice");
  const float* lnf = all_rows(ctx, a, a.lnf);  // (N,C)
  for (std::size_t r0 = 0; r0 < N; r0 += rows) {
    const std::size_t n = std::min(N, r0 + rows) - r0;
    k.matmul_forward(a.logits, lnf + r0 * C, head_w, nullptr, {n, C, V});  // (n,V)
    if (logits_out)
      ctx.activations().device().copy(logits_out + r0 * V, a.logits, n * V * sizeof(float));
    chunk_loss(ctx, a, r0, n);
  }
  ctx.exit_forward(head_module());
  ctx.add_loss(a.losses, N);
}

// The head's forward and backward in one pass over chunks of head_rows(N)
// tokens, so that only one chunk's logits exist at a time: the gradient of
// the loss reaches the logits as soon as they are computed (d(mean loss) /
// d(loss_i) = 1/N times the host's scale is known before the forward), so
// each chunk's logits become its dlogits in place, and its rows of d(lnf)
// and its share of the head's weight gradient follow at once. With more
// than one chunk, the weight gradient is summed in fp32 (a.head_dw: the
// gradient widened, every chunk added, rounded once), so a 16-bit gradient
// is rounded once per micro-batch, as with one chunk.
void Transformer::head_forward_backward(StepContext& ctx, Acts& a) const {
  const Kernels& k = ctx.kernels();
  Device& device = ctx.activations().device();
  const Dims d = dims(a.B, a.T);
  const std::size_t N = d.N, C = d.C, V = d.V, rows = head_rows(N);
  const auto P = param_views(ctx);
  const auto G = grad_views(ctx);
  ctx.enter_forward(head_module());
  final_norm_forward(ctx, a);
  ctx.exit_forward(head_module());

  ctx.enter_backward(head_module());
  const TypedPtr head_dw = G(head_w_);
  const std::size_t dw_n = V * C;
  const TypedPtr dw = a.head_dw ? TypedPtr(a.head_dw) : head_dw;
  if (a.head_dw) device.convert(dw, head_dw, dw_n);
  zero(ctx, a.d_c, N * C);
  const float dloss = ctx.token_scale();
  const ConstTypedPtr head_w = P(head_w_);
  const float* lnf_rows = all_rows(ctx, a, a.lnf);  // (N,C)
  for (std::size_t r0 = 0; r0 < N; r0 += rows) {
    const std::size_t n = std::min(N, r0 + rows) - r0;
    const float* lnf = lnf_rows + r0 * C;
    k.matmul_forward(a.logits, lnf, head_w, nullptr, {n, C, V});  // (n,V)
    chunk_loss(ctx, a, r0, n);
    chunk_dlogits(ctx, a, r0, n, dloss);
    k.matmul_backward(a.d_c + r0 * C, dw, nullptr, a.logits, lnf, head_w, {n, C, V});
  }
  if (a.head_dw) device.convert(head_dw, dw, dw_n);
  ctx.add_loss(a.losses, N);
  const float* dlnf = own_sum(ctx, a, a.d_c);  // each slice's share of d(lnf), summed
  zero(ctx, a.d_res, d.own_floats());
  norm_backward(ctx, a,
                {a.d_res, lnf_w_, lnf_b_, dlnf, stream(a, cfg_.n_layer), a.lnf_mean, a.lnf_rstd});
  ctx.exit_backward(head_module());
}

void Transformer::evaluate(const Batch& batch, StepContext& ctx) {
  Acts a = planned(batch, ctx, {});
  forward(ctx, a);
}

void Transformer::forward_logits(const Batch& batch, StepContext& ctx, float* logits) {
  Acts a = planned(batch, ctx, {});
  forward(ctx, a, logits);
}

void Transformer::forward_backward(const Batch& batch, StepContext& ctx) {
  Acts a = planned(batch, ctx, {.training = true});
  trunk_forward(ctx, a, true);
  head_forward_backward(ctx, a);
  // Offloading, block l - 1's input comes back while block l computes
  // (into the stream block l neither reads nor writes).
  const bool offload = !a.host_resid.empty();
  const int L = cfg_.n_layer;
  CopyWork fetched = offload ? fetch_checkpoint(a, L - 1, ctx) : CopyWork{};
  const std::size_t NC = dims(a.B, a.T).own_floats();
  for (int l = L - 1; l >= 0; --l) {
    fetched.wait();
    restore(ctx, a, stream(a, l), NC, stream_kept(a, l));
    CopyWork next = offload && l > 0 ? fetch_checkpoint(a, l - 1, ctx) : CopyWork{};
    ctx.enter_backward(block_module(l));
    block_backward(l, a, ctx);
    ctx.exit_backward(block_module(l));
    fetched = std::move(next);
  }
  ctx.enter_backward(kEmbed);
  embed_backward(ctx, a);
  ctx.exit_backward(kEmbed);
}

}  // namespace ztrain::transformer
