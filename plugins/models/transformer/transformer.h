// The built-in transformer: GPT-2 (LayerNorm, tanh-GELU MLP, learned
// positions, tied embeddings, biases everywhere) and Llama (RMSNorm, SwiGLU,
// rotary positions, grouped key/value heads) from one implementation,
// computing exactly Hugging Face's GPT2LMHeadModel and LlamaForCausalLM for
// the same weights. The Llama family's variants are options, not copies:
// q/k/v biases (Qwen2), biases on every attention or MLP projection
// (Llama's attention_bias, mlp_bias), a head tied to the embedding
// (Llama 3.2, small Qwen2) and Llama 3.1's "llama3" or linear RoPE scaling.
//
// Modules: 0 = "embed", 1..L = "block.i", L+1 = "head" (final norm and the
// output projection). Parameter names are Hugging Face's (GPT-2 without the
// "transformer." prefix); matrices are stored (out, in) as torch.nn.Linear
// does, which for GPT-2's Conv1D weights is the transpose of the file layout.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/model.h"
#include "ztrain/options.h"
#include "ztrain/sequence/ring.h"
#include "ztrain/sequence/ulysses.h"

namespace ztrain::transformer {

// A JSON number (config.json, adapter_config.json): the shortest decimal
// that reads back as v, in v's own precision (norm_eps is a float: 1e-05,
// not 9.99999975e-06).
template <class F>
std::string json_number(F v) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (static_cast<F>(std::strtod(buf, nullptr)) == v) break;
  }
  return std::string(buf);
}

// Which of a Llama block's attention projections carry a bias.
enum class AttentionBias { none, qkv, all };

// A block's linear projections, as LoRA targets them: GPT-2's c_attn,
// c_proj (attention), c_fc, c_proj (MLP); Llama's q, k, v, o, gate, up and
// down projections.
enum class Proj : std::uint8_t { qkv, q, k, v, o, fc, up, down };
inline constexpr std::size_t kProjCount = 8;

// Fine-tuning (LLaMA-Factory's finetuning_type): full, LoRA adapters
// beside a frozen base, or freeze (only some layers train).
struct FineTuning {
  enum class Method : std::uint8_t { full, lora, freeze } method = Method::full;
  int lora_rank = 0;
  double lora_alpha = 0;                 // the adapters' output is scaled by alpha / rank
  std::vector<std::string> lora_target;  // module names ("q_proj", "c_attn"); all of them
  int freeze_trainable_layers = 0;       // > 0: the last n blocks train; < 0: the first -n
  std::vector<std::string> freeze_trainable_modules;  // within those blocks; "all"
  std::vector<std::string> freeze_extra_modules;      // outside the blocks ("embed_tokens")
  bool use_rslora = false;                            // rank-stabilised: alpha / sqrt(rank)
  float lora_scale() const {
    return static_cast<float>(
        lora_alpha / (use_rslora ? std::sqrt(double(lora_rank)) : static_cast<double>(lora_rank)));
  }
};

// RoPE frequency scaling, as transformers' rope_type names it.
struct RopeScaling {
  enum class Type { none, linear, llama3 } type = Type::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3 only
  double original_max_positions = 8192.0;                // llama3 only
};

struct Config {
  bool llama = false;
  AttentionBias attention_bias = AttentionBias::none;  // Llama only
  bool mlp_bias = false;                               // Llama only
  bool tied = false;  // the head's weight is the embedding's (always for GPT-2)
  RopeScaling rope_scaling;
  int n_layer = 0, n_head = 0, n_kv_head = 0, n_embd = 0, vocab_size = 0, seq_len = 0;
  int hidden = 0;  // MLP width: 4C for GPT-2, intermediate_size for Llama
  float norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  // Llama's max_position_embeddings as imported (an export keeps it, or
  // seq_len where that is longer); 0: seq_len.
  std::int64_t max_positions = 0;
  bool checkpointing = false;
  bool offload_checkpoints = false;  // the blocks' inputs kept in host memory (with checkpointing)
  int loss_chunk_tokens = 1024;      // tokens whose logits exist at once
  double init_std = 0.02;
  FineTuning tuning;
  // Tensor parallelism: this rank holds part `tensor_rank` of `tensor`;
  // with tensor_sequence (Megatron's sequence parallelism) 1/tensor of the
  // rows of the residual stream, the norms and the embedding's output.
  int tensor = 1, tensor_rank = 0;
  bool tensor_sequence = false;
  int head_size() const { return n_embd / n_head; }
  // This rank's share of the heads, key/value heads and MLP width, and the
  // width of its attention (C at tensor 1). With fewer key/value heads
  // than ranks, kv_copies consecutive ranks hold each (one a rank).
  int local_heads() const { return n_head / tensor; }
  int kv_copies() const { return n_kv_head >= tensor ? 1 : tensor / n_kv_head; }
  int local_kv_heads() const { return n_kv_head * kv_copies() / tensor; }
  int local_hidden() const { return hidden / tensor; }
  int attention_width() const { return local_heads() * head_size(); }
  int local_kv_dim() const { return local_kv_heads() * head_size(); }
  // The embedding's and the head's rows part p holds begin at vocab_first(p)
  // (Megatron's vocabulary-parallel split; where the degree does not divide
  // the vocabulary, parts differ by a row).
  std::int64_t vocab_first(int part) const { return std::int64_t{vocab_size} * part / tensor; }
  int local_vocab() const {
    return static_cast<int>(vocab_first(tensor_rank + 1) - vocab_first(tensor_rank));
  }
};

// Parameter ids of one block, in declaration order (each architecture
// declares only its own).
struct BlockParams {
  std::optional<ParamId> ln1_w, ln1_b;
  std::optional<ParamId> qkv_w, qkv_b;    // GPT-2 c_attn
  std::optional<ParamId> q_w, k_w, v_w;   // Llama projections
  std::optional<ParamId> q_b, k_b, v_b;   // Llama attention_bias / Qwen2
  std::optional<ParamId> proj_w, proj_b;  // attention output
  std::optional<ParamId> ln2_w, ln2_b;
  std::optional<ParamId> fc_w, fc_b;          // GPT-2 c_fc / Llama gate_proj
  std::optional<ParamId> up_w, up_b;          // Llama up_proj
  std::optional<ParamId> fcproj_w, fcproj_b;  // GPT-2 mlp.c_proj / Llama down_proj
  // LoRA's A (rank, in) and B (out, rank) beside a projection it targets.
  struct Adapter {
    ParamId a, b;
  };
  std::array<std::optional<Adapter>, kProjCount> lora;
  std::optional<Adapter> adapter(Proj j) const { return lora[static_cast<std::size_t>(j)]; }
  // Each projection's weight, in Proj order (none where the architecture
  // has no such projection).
  std::array<std::optional<ParamId>, kProjCount> projections() const {
    return {qkv_w, q_w, k_w, v_w, proj_w, fc_w, up_w, fcproj_w};
  }
};

// Activation pointers of one block for one micro-batch.
struct BlockActs {
  float *ln1, *ln1_mean, *ln1_rstd;
  float *q, *k, *v;                 // GPT-2: views into one (N,3C) qkv buffer
  std::size_t q_stride, kv_stride;  // floats between (b,t) rows of q, of k and v
  float *lse, *atty, *res1;         // lse: (B,NH,T) attention row log-sum-exp
  float *ln2, *ln2_mean, *ln2_rstd;
  float *h1, *h2, *h3;  // GPT-2: fc (without its bias), gelu; Llama: gate, up, act
  float* out;
  const float *rope_cos, *rope_sin;  // Llama: (T, hs/2), the same for every block
  float* ulysses;  // sequence shards: what Ulysses keeps for backward; null for whole sequences
  // LoRA: (N, rank) of each adapted projection, its input times A^T times
  // the scale, kept for backward in fp32 (small); null where none.
  std::array<float*, kProjCount> lora_u;
  // Activations kept in a 16-bit type: where each tensor above that the
  // backward reads is held in it (this block's own copies; with
  // checkpointing, all one scratch, for the rounding alone); null in fp32.
  struct Kept {
    void *ln1, *qkv, *atty, *res1, *ln2, *h1, *h2, *h3, *ulysses;
  } kept;
};

class Transformer final : public Model {
 public:
  explicit Transformer(const Options& options);
  static void declare_options(OptionList& out);

  ModelInfo info() const override;
  ParamSpecs params() const override { return stage_chunks_.empty() ? params_ : stage_params_; }
  ModuleSpecs modules() const override;
  std::uint64_t activation_bytes(const BatchShape& shape) const override;
  std::uint64_t host_activation_bytes(const BatchShape& shape) const override;
  std::uint64_t kept_activation_bytes(const BatchShape& shape) const override;
  void forward_backward(const Batch& batch, StepContext& ctx) override;
  void evaluate(const Batch& batch, StepContext& ctx) override;
  void forward_logits(const Batch& batch, StepContext& ctx, float* logits) override;
  std::string sequence_shards_refusal(SequenceSplit split) const override;
  std::string segments_refusal() const override;
  std::string split_tensors(const TensorParallel& t) override;
  std::string split_stages(const std::vector<ModuleRange>& chunks) override;
  std::uint64_t stage_floats(const BatchShape& shape) const override;
  void stage_forward(const Batch& batch, const StageRun& run, StepContext& ctx) override;
  void stage_backward(const Batch& batch, const StageRun& run, StepContext& ctx) override;
  std::string hf_config_json() const override;
  bool ignorable_tensor(const std::string& name) const override;
  std::vector<AdapterOf> adapters() const override;
  std::string adapter_config_json() const override;

 private:
  // Every buffer of one micro-batch. plan() lays them out in one fixed order,
  // either counting bytes (activation_bytes) or taking them from the arena.
  struct Acts {
    int B = 0, T = 0;  // T: the tokens of each row this rank holds
    // A pipeline stage's chunk: its first block, from which the blocks'
    // activations and the streams are indexed (0 for the whole model).
    int first_block = 0;
    // The type the activations backward reads are kept in (BatchShape::
    // activations). In a 16-bit type the blocks share one fp32 working
    // set and keep their own 16-bit copies (BlockActs::kept), and the
    // residual streams alternate over two fp32 slots, each kept in
    // kept_resid.
    DType kept = DType::f32;
    bool rounds() const { return kept != DType::f32; }
    // Sequence shards: the ranks of the Ulysses group and the ring hold a
    // row each, split as `split` says, this rank's rows at the positions
    // of `spans`; Ulysses' and the ring's scratch, shared by the blocks.
    SequenceSplit split;
    Communicator* ulysses_group = nullptr;
    Communicator* ring_group = nullptr;
    std::vector<TokenSpan> spans;
    float* ulysses_scratch = nullptr;
    float* ring_scratch = nullptr;
    bool ulysses() const { return split.sequence > 1; }
    bool ring() const { return split.context > 1; }
    // L+1 residual streams (N,C): embedding out, block outs. Offloading
    // checkpoints, four on the device instead (streams l < L rotate over
    // three, stream L the fourth), the L block inputs in host memory, in
    // the kept type. Keeping 16-bit activations, two slots alternate and
    // the streams are kept on the device in 16 bits (kept_resid): the L+1
    // of them, or (offloading) the three the host copies of the block
    // inputs rotate through.
    std::vector<float*> resid;
    std::vector<void*> host_resid;
    std::vector<void*> kept_resid;
    // Where tensors that keep no copy are rounded: the final norm's
    // output, stream L when offloading, a block's with checkpointing.
    void* kept_scratch = nullptr;
    std::vector<BlockActs> blocks;  // one per block, or one reused when checkpointing
    float *lnf, *lnf_mean, *lnf_rstd, *losses;
    float* logits;  // (head_rows(N), V): one chunk of the head's logits
    // A vocabulary split over the tensor group: one chunk's row maxima
    // (head_rows(N)) and sums (2, head_rows(N)) (kernels.h); null when whole.
    float *row_max = nullptr, *sums = nullptr;
    // Sequence parallelism: a whole (N,C) of gathered rows or partial sums,
    // a reduce-scattered (NL,C) input gradient, and a norm's weight and
    // bias gradients (2C) with their widening scratch (C); null without.
    float *gathered = nullptr, *d_own = nullptr, *norm_dw = nullptr, *norm_tmp = nullptr;
    float* head_dw;  // (V, C) fp32 sum of the head's weight gradient; null with one chunk
    float *d_res, *d_c, *d_att, *d_qkv, *d_h1, *d_h2, *d_h3;  // backward scratch
    float *rope_cos, *rope_sin;  // Llama: (T, hs/2) rotary angles' cos and sin
    // LoRA's scratch: an adapter's (N, out) output before it is added, and
    // the (N, rank) gradient of its u; null without adapters.
    float *lora_out = nullptr, *lora_du = nullptr;
    // The batch's (B,T) token ids where the kernels read them (arena.on_device).
    const std::int32_t *inputs = nullptr, *targets = nullptr;
    // Rows packing several examples: each token's position in its example
    // (Batch::positions), on the device; null otherwise.
    const std::int32_t* positions = nullptr;
  };
  // Where plan() takes a buffer: the device's memory for what forward
  // leaves for backward, the host's, or the device's for what one call
  // uses only while it runs (the backward's gradients, the head's chunk,
  // the split attention's scratch, the blocks' fp32 working set kept in
  // 16 bits; Arena::alloc_working_f32).
  enum class Where : std::uint8_t { kept, host, working };
  // alloc(n, where): n floats.
  void plan(const BatchShape& shape, const std::function<float*(std::size_t, Where)>& alloc,
            Acts& acts) const;
  // The bytes of plan()'s buffers in each place.
  struct PlannedBytes {
    std::uint64_t kept = 0, host = 0, working = 0;
  };
  PlannedBytes planned_bytes(const BatchShape& shape) const;
  // Which of a.resid holds residual stream l (0..L) now.
  std::size_t slot(const Acts& a, int l) const;
  float* stream(const Acts& a, int l) const { return a.resid[slot(a, l)]; }
  // Stream l in the kept type: where it is rounded, and what the host
  // copies of offloading move; null in fp32.
  void* stream_kept(const Acts& a, int l) const;
  // Offloading checkpoints: block l's input to host memory after its
  // forward; back to the device before its backward.
  CopyWork save_checkpoint(Acts& a, int l, StepContext& ctx) const;
  CopyWork fetch_checkpoint(Acts& a, int l, StepContext& ctx) const;
  // 16-bit activations (no-ops in fp32): x (n) rounded to the kept type
  // in place, through `kept`, which then holds it; x back from `kept`.
  void keep(StepContext& ctx, const Acts& a, float* x, std::size_t n, void* kept) const;
  void restore(StepContext& ctx, const Acts& a, float* x, std::size_t n, const void* kept) const;
  // Without checkpointing, block l's kept tensors back in the fp32
  // working set before its backward.
  void restore_block(int l, Acts& a, StepContext& ctx) const;
  // The step context's view of parameter p, named by its id in the whole
  // model (a pipeline stage's parameters have ids of their own).
  TensorView param(StepContext& ctx, ParamId p) const { return ctx.param(stage_id(p)); }
  TensorView grad(StepContext& ctx, ParamId p) const { return ctx.grad(stage_id(p)); }
  ParamId stage_id(ParamId p) const;
  // The views a module's ops take, as callables of an optional id: a
  // parameter (or its gradient) in the run's precision, null for one the
  // architecture does not have.
  auto param_views(StepContext& ctx) const {
    return [&ctx, this](std::optional<ParamId> id) {
      return id ? ConstTypedPtr(param(ctx, *id)) : ConstTypedPtr{};
    };
  }
  auto grad_views(StepContext& ctx) const {
    return [&ctx, this](std::optional<ParamId> id) {
      return id ? TypedPtr(grad(ctx, *id)) : TypedPtr{};
    };
  }
  // A micro-batch's dimensions as the kernels take them: B, T, N = B*T, the
  // width C, the MLP's H, heads NH and NKV of hs, KV = NKV*hs, V; under
  // tensor parallelism H, NH, NKV and KV are this rank's share, and A =
  // NH*hs is its attention's width (C when whole).
  struct Dims {
    std::size_t B, T, N, C, H, NH, NKV, hs, KV, V, A;
    // The rows this rank holds between the split regions: N, or N / tensor
    // under sequence parallelism.
    std::size_t NL;
    RowShape rows(std::size_t width) const { return {N, width}; }
    RowShape own(std::size_t width) const { return {NL, width}; }
    std::size_t own_floats() const { return NL * C; }
    MatmulShape linear(std::size_t in, std::size_t out) const { return {N, in, out}; }
    // Floats of a block's q, k and v together (GPT-2's KV is A: its (N,3A)).
    std::size_t qkv() const { return N * (A + 2 * KV); }
    AttentionShape attention(const BlockActs& b) const {
      return {B, T, NH, NKV, hs, b.q_stride, b.kv_stride};
    }
  };
  // One block's attention as Ulysses runs it on this rank's shard.
  sequence::UlyssesShape ulysses_shape(const BlockActs& b, const Acts& a) const {
    return {dims(a.B, a.T).attention(b), static_cast<std::size_t>(a.split.sequence)};
  }
  // One block's attention as the ring runs it: on this rank's chunks, or
  // under Ulysses on the whole of the Ulysses group's chunks for the heads
  // Ulysses gave this rank.
  sequence::RingShape ring_shape(const BlockActs& b, const Acts& a) const {
    const AttentionShape local =
        a.ulysses() ? ulysses_shape(b, a).whole() : dims(a.B, a.T).attention(b);
    return {local, static_cast<std::size_t>(a.split.context)};
  }
  sequence::RingAttention ring_of(const BlockActs& b, const Acts& a, StepContext& ctx) const;
  // The ring inside Ulysses where both split the sequence; none otherwise.
  std::optional<sequence::RingAttention> inner_ring(const BlockActs& b, const Acts& a,
                                                    StepContext& ctx) const;
  // Ulysses over the sequence group for block b, around the kernel or
  // `ring`, which must outlive it.
  sequence::UlyssesAttention ulysses_of(const BlockActs& b, const Acts& a, StepContext& ctx,
                                        const std::optional<sequence::RingAttention>& ring) const;
  // The attention of one block: the kernel's on whole sequences, Ulysses'
  // (around the kernel or the ring) or the ring's on shards.
  void attention_forward(const BlockActs& b, const Acts& a, StepContext& ctx) const;
  void attention_backward(AttentionGrads d, const BlockActs& b, const Acts& a,
                          StepContext& ctx) const;
  Dims dims(int B, int T) const;
  BlockActs& block_acts(Acts& a, int l) const {
    return a.blocks[cfg_.checkpointing ? 0 : static_cast<std::size_t>(l - a.first_block)];
  }
  // Pipeline parallelism (pipeline_stage.cpp). The blocks [first, end) a
  // chunk of modules runs; the most blocks one of this stage's chunks has
  // (L when whole), which plan() lays out.
  struct BlockSpan {
    int first = 0, end = 0;
  };
  BlockSpan blocks_of(ModuleRange r) const;
  int planned_blocks() const;
  // A chunk's buffers for one micro-batch, its first stream holding its
  // input: the embedding's output (computed, in its module) or `input`;
  // rewound, the buffers its forward filled.
  Acts stage_planned(const Batch& batch, const StageRun& run, StepContext& ctx, bool rewound) const;
  // Blocks [span.first, span.end) forward from their first stream, each in
  // its module.
  void blocks_forward(StepContext& ctx, Acts& a, BlockSpan span) const;

  // Modules in execution order: the embedding, one per block, the head.
  static constexpr ModuleId kEmbed{};
  static ModuleId block_module(int l) { return id_at<ModuleId>(static_cast<std::size_t>(l) + 1); }
  ModuleId head_module() const { return block_module(cfg_.n_layer); }

  void declare_params();
  // Fine-tuning's keys (finetuning_type and its lora_* / freeze_* keys).
  void read_fine_tuning(const Options& o);
  // LoRA: an adapter beside each targeted projection, the base frozen;
  // freeze: every parameter outside the trainable blocks and modules frozen.
  void declare_adapters(const Options& o);
  void freeze_params(const Options& o);
  // Why LoRA's adapters cannot be split over `degree` tensor ranks (key/
  // value heads copied over ranks that hold adapters on them), or "".
  std::string lora_split_refusal(int degree) const;
  // The name LoRA and freeze match a projection by ("q_proj", "c_attn").
  static std::string module_name(const std::string& param);
  // One adapted projection of block l: which, its input (N, in) and shape.
  struct Linear {
    Proj proj;
    const float* x;
    MatmulShape shape;
  };
  // out (N, out) += scale * (x A^T) B^T where the projection has an
  // adapter (keeping u = scale * x A^T), else nothing.
  void lora_forward(int l, Linear lin, float* out, BlockActs& b, const Acts& a,
                    StepContext& ctx) const;
  // dx (N, in) += the adapter's part of the input gradient for dout (N,
  // out); A's and B's gradients added.
  void lora_backward(int l, Linear lin, float* dx, const float* dout, const BlockActs& b,
                     const Acts& a, StepContext& ctx) const;
  // ConfigError when the parameter count does not fit 64 bits.
  void check_sizes(const Options& o) const;
  // A parameter; under tensor parallelism `split` says which part of the
  // whole `shape` is (ignored when whole).
  ParamId add(const std::string& name, Shape shape, Init init, std::vector<ModuleId> used_by,
              TensorSplit split = {});
  // The batch's buffers from the arena; without a backward to come the
  // offloaded checkpoints get no host memory (their pointers null: the
  // forward does not save them). A pipeline stage's backward (rewound)
  // gets the buffers its forward left in its arena.
  struct Planning {
    bool training = false;
    bool rewound = false;
  };
  Acts planned(const Batch& batch, StepContext& ctx, Planning how) const;
  // The rotary inverse frequency of pair i (of hs/2), scaled, in fp32 as
  // transformers computes it.
  float rope_inv_freq(int i) const;
  // cos, sin: (T, hs/2) of the rotary angles of positions [first, first +
  // T), as Hugging Face computes them (fp32 inverse frequencies and
  // angles), into host memory.
  void rope_tables(float* cos, float* sin, std::size_t T, std::size_t first) const;
  // The embedding of this rank's tokens, each at its position (a.spans).
  void embed_forward(StepContext& ctx, const Acts& a) const;
  void embed_backward(StepContext& ctx, const Acts& a) const;
  void read_llama_options(const Options& o);
  std::string llama_config_json() const;
  // Tokens whose logits the head computes at a time, for N in the batch:
  // [model] loss_chunk_tokens, at most N.
  std::size_t head_rows(std::size_t N) const;
  // Embedding and blocks, each in its module: a.resid filled (and, for
  // a backward to come, the checkpoints offloaded when they are).
  void trunk_forward(StepContext& ctx, Acts& a, bool training) const;
  void final_norm_forward(StepContext& ctx, Acts& a) const;
  // Reports the losses to ctx; logits_out (when given) receives the (N,V)
  // logits before the softmax.
  void forward(StepContext& ctx, Acts& a, float* logits_out = nullptr) const;
  // The head's part of forward, from the last block's output.
  void head_forward(StepContext& ctx, Acts& a, float* logits_out = nullptr) const;
  // The head's forward and backward, chunk by chunk: losses reported,
  // a.d_res = dL/d(last block's output), the head's gradients added.
  void head_forward_backward(StepContext& ctx, Acts& a) const;
  // The losses of one chunk of n rows from r0 from its logits in a.logits
  // (head_loss.cpp): the whole row's softmax, or, with the vocabulary
  // split over the tensor group, the slice's, the row maxima and sums
  // all-reduced between the steps. The logits are left as chunk_dlogits
  // reads them, which turns them into their gradient for d(loss) = dloss.
  void chunk_loss(StepContext& ctx, Acts& a, std::size_t r0, std::size_t n) const;
  void chunk_dlogits(StepContext& ctx, Acts& a, std::size_t r0, std::size_t n, float dloss) const;
  // The kernels' shape of n rows of this rank's logits: its slice of the
  // vocabulary (the whole at tensor 1).
  VocabShape vocab_shape(std::size_t n) const;
  // The embedding kernels' shape of B x T tokens: the rows of the
  // vocabulary this rank's table holds where the tensor group splits it.
  TokenShape token_shape(std::size_t B, std::size_t T) const;
  void block_forward(int l, const float* x, float* out, BlockActs& b, const Acts& a,
                     StepContext& ctx) const;
  // Inside block_forward: the attention's residual sum and the norm of it.
  void norm2_forward(int l, const float* x, BlockActs& b, const Acts& a, StepContext& ctx) const;
  void block_backward(int l, Acts& a, StepContext& ctx) const;
  void check_tokens(const Batch& batch) const;
  // Tensor parallelism: x (n, on every rank of the group its part's
  // contribution) becomes their sum on every rank; nothing when whole.
  void tensor_sum(StepContext& ctx, float* x, std::size_t n) const;
  // The step context's tensor group (tensor > 1), checked to be its size.
  Communicator& tensor_comm(StepContext& ctx) const;
  // A row-parallel layer's bias, added by the group's first rank alone (the
  // sum adds it once): the bias there, none elsewhere.
  ConstTypedPtr row_bias(StepContext& ctx, std::optional<ParamId> bias) const;
  // Grouped key/value heads fewer than the tensor degree: the key/value
  // projections' backward, whose input gradient takes this rank's share of
  // dk, dv (the group sums it) and whose weight gradient takes the sum over
  // the ranks holding the same head (every holder gets the whole). ln1:
  // the (N,C) input of the projections.
  void copied_kv_backward(const BlockParams& p, const float* ln1, const Acts& a, float* dk,
                          float* dv, StepContext& ctx) const;
  // Megatron's sequence parallelism (tensor_rows.cpp). The rows between the
  // split regions are this rank's NL = N / tensor of them: all_rows gives
  // the whole (N,C) of `own` (gathered over the group into a.gathered; own
  // itself without the split); partial_rows is where a split region writes
  // the (N,C) partial sums that sum_rows adds over the group into own's
  // rows (reduce-scattered; without the split, all-reduced in place, own
  // being the partial); own_sum does that for a backward's partial input
  // gradient, into a.d_own (or in place), and returns where it is.
  const float* all_rows(StepContext& ctx, const Acts& a, const float* own) const;
  float* partial_rows(const Acts& a, float* own) const;
  void sum_rows(StepContext& ctx, const Acts& a, float* partial, float* own) const;
  const float* own_sum(StepContext& ctx, const Acts& a, float* partial) const;
  // A norm's backward on this rank's rows: dinp += its input gradient, its
  // weight's (and bias's) gradients added, summed over the tensor group
  // first where each rank saw a share of the rows.
  struct NormGrad {
    float* dinp;
    std::optional<ParamId> w, b;  // b: LayerNorm's bias; none for RMSNorm
    const float *dout, *x, *mean, *rstd;
  };
  void norm_backward(StepContext& ctx, const Acts& a, const NormGrad& n) const;
  // grad (n) += src (n, fp32), rounded once into a 16-bit gradient.
  void add_to_grad(StepContext& ctx, const Acts& a, TypedPtr grad, const float* src,
                   std::size_t n) const;
  // The ranks of the tensor group holding this rank's key/value head, split
  // from it on first use (every rank of the group reaches it in the same
  // backward).
  Communicator& kv_group(StepContext& ctx) const;

  Config cfg_;
  // Pipeline parallelism: the chunks this stage runs (empty: the whole
  // model), the parameters they use, and each whole-model parameter's id
  // among them.
  std::vector<ModuleRange> stage_chunks_;
  ParamSpecs stage_params_;
  std::vector<std::optional<ParamId>> stage_ids_;
  // The model's options, kept to declare the adapters and the frozen set
  // again when split_tensors declares the parameters as parts.
  Options options_;
  mutable std::unique_ptr<Communicator> kv_group_;
  ParamSpecs params_;
  std::optional<ParamId> wte_, wpe_, lnf_w_, lnf_b_, head_w_;
  std::vector<BlockParams> blocks_;
};

}  // namespace ztrain::transformer
