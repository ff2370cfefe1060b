// Declarations of the transformer: options, parameters, modules and the
// activation plan. The math is in forward_backward.cpp, fine-tuning
// (LoRA, freeze) in fine_tuning.cpp.
#include "transformer.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "ztrain/error.h"

namespace ztrain::transformer {
void Transformer::declare_options(OptionList& o) {
  o.string("arch", "llama", "architecture").one_of({"gpt2", "llama"});
  // Every block is declared one by one (names, parameter specs, activation
  // plans), so n_layer is bounded where that bookkeeping stays small: 1e5
  // blocks is hundreds of times the deepest model trained.
  o.integer("n_layer", 4, "transformer blocks").at_least(1).at_most(100000);
  o.integer("n_head", 4, "attention (query) heads").at_least(1).as_int();
  o.integer("n_kv_head", 0, "key/value heads (Llama grouped-query attention); 0 = n_head")
      .at_least(0)
      .as_int();
  // At most INT_MAX / 8, so that the widths derived from it (3 C for GPT-2's
  // fused qkv, 4 C or 8 C / 3 for the MLP) stay ints.
  o.integer("n_embd", 256, "model width C").at_least(1).at_most(INT_MAX / 8);
  o.integer("vocab_size", 512, "vocabulary size").at_least(1).as_int();
  o.integer("seq_len", 256, "context length T (and GPT-2's number of learned positions)")
      .at_least(1)
      .as_int();
  o.integer("intermediate_size", 0,
            "MLP width; 0 = 4*n_embd (GPT-2) or 8*n_embd/3 rounded up to 256 (Llama)")
      .at_least(0)
      .as_int();
  o.number("norm_eps", 1e-5, "LayerNorm / RMSNorm epsilon").at_least(0);
  o.number("rope_theta", 10000.0, "RoPE base (Llama)").at_least(1);
  o.string("rope_scaling", "none",
           "RoPE frequency scaling (Llama): none, linear (positions / rope_factor) or "
           "llama3 (Llama 3.1's smooth per-frequency scaling)")
      .one_of({"none", "linear", "llama3"});
  o.number("rope_factor", 8.0, "RoPE scaling factor (linear, llama3)").at_least(1);
  o.number("rope_low_freq_factor", 1.0, "llama3 RoPE scaling: low_freq_factor").at_least(0);
  o.number("rope_high_freq_factor", 4.0, "llama3 RoPE scaling: high_freq_factor").at_least(0);
  o.number("rope_original_max_positions", 8192,
           "llama3 RoPE scaling: original_max_position_embeddings")
      .at_least(1);
  o.integer("max_positions", 0,
            "the context the model is made for (Llama: config.json's max_position_embeddings, "
            "which an export keeps); 0: seq_len")
      .at_least(0);
  o.string("attention_bias", "none",
           "biases of Llama's attention projections: none, qkv (Qwen2) or all (q, k, v and o, "
           "Llama's attention_bias)")
      .one_of({"none", "qkv", "all"});
  o.flag("mlp_bias", false, "biases on Llama's gate, up and down projections");
  o.flag("tie_embeddings", false,
         "Llama: the output head is the token embedding (Llama 3.2, small Qwen2); GPT-2 always "
         "ties");
  o.flag("activation_checkpointing", false,
         "keep only each block's input and recompute the block in backward");
  o.flag("offload_checkpoints", false,
         "with activation_checkpointing: keep the blocks' inputs in host memory, copied there "
         "after each block's forward and back before its backward, beside the compute "
         "(DeepSpeed's cpu_checkpointing, ALST's checkpoint offload)");
  // The default, 1024: see head_rows for its measurement.
  o.integer("loss_chunk_tokens", 1024,
            "tokens whose logits the output head computes at a time (the loss and its "
            "gradient follow chunk by chunk, so the (tokens x vocabulary) logits never exist "
            "whole)")
      .at_least(1)
      .as_int();
  o.number("init_std", 0.02,
           "std of the normal initialisation (residual projections are "
           "scaled by 1/sqrt(2*n_layer))")
      .at_least(0);
  // Fine-tuning, with LLaMA-Factory's keys and meanings.
  o.string("finetuning_type", "full",
           "full (every parameter trains), lora (adapters beside the frozen base: "
           "lora_rank, lora_alpha, lora_target) or freeze (only the blocks and modules "
           "freeze_trainable_layers, freeze_trainable_modules and freeze_extra_modules name)")
      .one_of({"full", "lora", "freeze"});
  o.integer("lora_rank", 8, "LoRA: the adapters' rank r").at_least(1).at_most(65536).as_int();
  o.number("lora_alpha", 0,
           "LoRA: the adapters' output is scaled by lora_alpha / lora_rank; 0 = "
           "2 * lora_rank (LLaMA-Factory's default)")
      .at_least(0);
  o.number("lora_dropout", 0, "LoRA: dropout on the adapters' input; only 0").at_least(0);
  o.flag("use_rslora", false,
         "LoRA: rank-stabilised scaling, lora_alpha / sqrt(lora_rank) (PEFT's and "
         "LLaMA-Factory's use_rslora)");
  o.names("lora_target",
          "LoRA: the projections that get adapters, by module name (Llama: q_proj, k_proj, "
          "v_proj, o_proj, gate_proj, up_proj, down_proj; GPT-2: c_attn, c_proj, c_fc), a "
          "list or one comma-separated string; all = every one (the default)");
  o.integer("freeze_trainable_layers", 2,
            "freeze: the last n blocks train (n > 0) or the first -n (n < 0)")
      .as_int();
  o.names("freeze_trainable_modules",
          "freeze: the modules of those blocks that train (self_attn, mlp, q_proj, ... as "
          "the parameter names say); all = every one (the default)");
  o.names("freeze_extra_modules",
          "freeze: modules outside the blocks that train as well (embed_tokens, norm, lm_head; "
          "GPT-2: wte, wpe, ln_f)");
}

Transformer::Transformer(const Options& o) : options_(o) {
  cfg_.llama = o.get_string("arch") == "llama";
  cfg_.n_layer = static_cast<int>(o.get_int("n_layer"));
  cfg_.n_head = static_cast<int>(o.get_int("n_head"));
  cfg_.n_kv_head = o.get_int("n_kv_head") ? static_cast<int>(o.get_int("n_kv_head")) : cfg_.n_head;
  cfg_.n_embd = static_cast<int>(o.get_int("n_embd"));
  cfg_.vocab_size = static_cast<int>(o.get_int("vocab_size"));
  cfg_.seq_len = static_cast<int>(o.get_int("seq_len"));
  cfg_.norm_eps = static_cast<float>(o.get_number("norm_eps"));
  cfg_.tied = !cfg_.llama;
  read_llama_options(o);
  cfg_.checkpointing = o.get_bool("activation_checkpointing");
  cfg_.offload_checkpoints = o.get_bool("offload_checkpoints");
  if (cfg_.offload_checkpoints && !cfg_.checkpointing)
    throw ConfigError(o.where("offload_checkpoints") +
                      ": [model] offload_checkpoints moves the checkpoints of activation "
                      "checkpointing to host memory, which is off; set "
                      "activation_checkpointing = true as well, or remove offload_checkpoints");
  cfg_.loss_chunk_tokens = static_cast<int>(o.get_int("loss_chunk_tokens"));
  cfg_.init_std = o.get_number("init_std");
  const int C = cfg_.n_embd;
  if (C % cfg_.n_head != 0)
    throw ConfigError(o.where("n_embd") + ": [model] n_embd (" + std::to_string(C) +
                      ") must be divisible by n_head (" + std::to_string(cfg_.n_head) + ")");
  if (cfg_.n_head % cfg_.n_kv_head != 0)
    throw ConfigError(o.where("n_kv_head") + ": [model] n_head (" + std::to_string(cfg_.n_head) +
                      ") must be a multiple of n_kv_head (" + std::to_string(cfg_.n_kv_head) + ")");
  if (!cfg_.llama && cfg_.n_kv_head != cfg_.n_head)
    throw ConfigError(o.where("n_kv_head") +
                      ": [model] GPT-2 has no grouped key/value heads; leave n_kv_head at 0");
  if (cfg_.llama && cfg_.head_size() % 2 != 0)
    throw ConfigError(o.where("n_embd") +
                      ": [model] Llama's rotary embedding needs an even head "
                      "size, but n_embd / n_head = " +
                      std::to_string(cfg_.head_size()));
  const auto inter = o.get_int("intermediate_size");
  if (inter > 0)
    cfg_.hidden = static_cast<int>(inter);
  else if (cfg_.llama)
    cfg_.hidden = (8 * C / 3 + 255) / 256 * 256;
  else
    cfg_.hidden = 4 * C;
  read_fine_tuning(o);
  declare_params();
  declare_adapters(o);
  freeze_params(o);
  check_sizes(o);
}

// The Llama family's variants; each is refused on GPT-2 (whose biases and
// tied head are fixed) rather than ignored.
void Transformer::read_llama_options(const Options& o) {
  for (const char* key : {"rope_theta", "rope_scaling", "attention_bias", "mlp_bias",
                          "tie_embeddings", "rope_factor", "rope_low_freq_factor",
                          "rope_high_freq_factor", "rope_original_max_positions", "max_positions"})
    if (!cfg_.llama && o.given(key))
      throw ConfigError(o.where(key) + ": [model] " + key +
                        " is a Llama option; GPT-2 has learned positions, biases everywhere "
                        "and a tied head. Remove it or set arch = \"llama\"");
  if (!cfg_.llama) return;
  cfg_.rope_theta = o.get_number("rope_theta");
  cfg_.max_positions = o.get_int("max_positions");
  const std::string bias = o.get_string("attention_bias"), rope = o.get_string("rope_scaling");
  cfg_.attention_bias = bias == "qkv"   ? AttentionBias::qkv
                        : bias == "all" ? AttentionBias::all
                                        : AttentionBias::none;
  cfg_.mlp_bias = o.get_bool("mlp_bias");
  cfg_.tied = o.get_bool("tie_embeddings");
  // Qwen2 (q/k/v biases) has no MLP biases and Llama's attention_bias also
  // covers o_proj: this pair is no Hugging Face model, so nothing could load
  // its export.
  if (cfg_.attention_bias == AttentionBias::qkv && cfg_.mlp_bias)
    throw ConfigError(o.where("mlp_bias") +
                      ": [model] mlp_bias with attention_bias = \"qkv\" is no Hugging Face "
                      "model (Qwen2 has no MLP biases; Llama's attention_bias also biases "
                      "o_proj): use attention_bias = \"all\" or drop mlp_bias");
  auto& r = cfg_.rope_scaling;
  r.type = rope == "linear"   ? RopeScaling::Type::linear
           : rope == "llama3" ? RopeScaling::Type::llama3
                              : RopeScaling::Type::none;
  r.factor = o.get_number("rope_factor");
  r.low_freq_factor = o.get_number("rope_low_freq_factor");
  r.high_freq_factor = o.get_number("rope_high_freq_factor");
  r.original_max_positions = o.get_number("rope_original_max_positions");
  if (r.type == RopeScaling::Type::llama3 && !(r.high_freq_factor > r.low_freq_factor))
    throw ConfigError(o.where("rope_high_freq_factor") +
                      ": [model] llama3 RoPE scaling needs rope_high_freq_factor > "
                      "rope_low_freq_factor (it divides by their difference)");
}

// Each parameter has at most two int dimensions, so its size fits 64 bits;
// their sum over the blocks may not.
void Transformer::check_sizes(const Options& o) const {
  std::int64_t total = 0;
  bool wraps = false;
  for (const auto& p : params_)
    wraps = wraps || __builtin_add_overflow(total, p.shape.numel(), &total);
  if (wraps)
    throw ConfigError(o.where("n_layer") + ": [model] n_layer = " + std::to_string(cfg_.n_layer) +
                      " blocks of n_embd = " + std::to_string(cfg_.n_embd) + " (vocab_size " +
                      std::to_string(cfg_.vocab_size) +
                      ") make more parameters than 64 bits count; lower them");
}

// Llama 3.1's scaling (transformers' _compute_llama3_parameters): wavelengths
// shorter than original / high_freq_factor keep their frequency, those longer
// than original / low_freq_factor are divided by the factor, and those
// between are interpolated on original / wavelength. Each step is in fp32
// as torch computes it, so the tables match transformers' to the ulp.
float Transformer::rope_inv_freq(int i) const {
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(cfg_.head_size());
  const float inv = 1.0f / std::pow(static_cast<float>(cfg_.rope_theta), exponent);
  const RopeScaling& r = cfg_.rope_scaling;
  const auto factor = static_cast<float>(r.factor);
  switch (r.type) {
    case RopeScaling::Type::none:
      return inv;
    case RopeScaling::Type::linear:
      return inv / factor;
    case RopeScaling::Type::llama3:
      break;
  }
  const auto old_len = static_cast<float>(r.original_max_positions),
             low = static_cast<float>(r.low_freq_factor),
             high = static_cast<float>(r.high_freq_factor);
  const float low_freq_wavelen = old_len / low, high_freq_wavelen = old_len / high;
  const float wavelen = static_cast<float>(2 * M_PI) / inv;
  if (wavelen < high_freq_wavelen) return inv;
  if (wavelen > low_freq_wavelen) return inv / factor;
  const float smooth = (old_len / wavelen - low) / (high - low);
  return (1 - smooth) * inv / factor + smooth * inv;
}

void Transformer::rope_tables(float* cos, float* sin, std::size_t T, std::size_t first) const {
  const int half = cfg_.head_size() / 2;
  const auto h = static_cast<std::size_t>(half);
  for (int i = 0; i < half; ++i) {
    const float inv_freq = rope_inv_freq(i);
    for (std::size_t t = 0; t < T; ++t) {
      const float angle = static_cast<float>(first + t) * inv_freq;
      cos[t * h + static_cast<std::size_t>(i)] = std::cos(angle);
      sin[t * h + static_cast<std::size_t>(i)] = std::sin(angle);
    }
  }
}

ParamId Transformer::add(const std::string& name, Shape shape, Init init,
                         std::vector<ModuleId> used_by, TensorSplit split) {
  const bool decay = shape.rank() >= 2;
  ParamSpec spec{name, std::move(shape), init, decay, std::move(used_by), {}, false};
  spec.split = cfg_.tensor > 1 ? split : TensorSplit{};
  if (!cfg_.llama) {
    // GPT2LMHeadModel keeps the body under "transformer." and its Conv1D
    // layers store weights as (in, out).
    spec.hf_name = "transformer." + name;
    spec.hf_transposed = spec.shape.rank() == 2 &&
                         (name.ends_with("c_attn.weight") || name.ends_with("c_proj.weight") ||
                          name.ends_with("c_fc.weight"));
  }
  return params_.push_back(std::move(spec));
}

// Under tensor parallelism (Megatron's split) each block's first
// projections are cut by output (q, k, v and the MLP's first layer: their
// rows, with their biases), the projections back to the width by input
// (the attention's output and the MLP's last layer: their columns; their
// biases whole); the embedding and the head by vocabulary rows (unequal
// parts where the degree does not divide the vocabulary); norms and
// GPT-2's positions stay whole.
void Transformer::declare_params() {
  const int C = cfg_.n_embd, V = cfg_.local_vocab(), L = cfg_.n_layer, H = cfg_.local_hidden(),
            A = cfg_.attention_width();
  const TensorSplit rows{0, cfg_.tensor, cfg_.tensor_rank, 1},
      cols{1, cfg_.tensor, cfg_.tensor_rank, 1}, qkv_rows{0, cfg_.tensor, cfg_.tensor_rank, 3};
  // Key/value heads fewer than the ranks: each a part that kv_copies hold.
  const int copies = cfg_.kv_copies();
  const TensorSplit kv_rows{0, cfg_.tensor / copies, cfg_.tensor_rank / copies, 1, copies};
  const TensorSplit vocab_rows{0, cfg_.tensor, cfg_.tensor_rank, 1, 1, cfg_.vocab_size};
  const ModuleId embed = kEmbed, head = head_module();
  const Init normal{Init::Kind::normal, static_cast<float>(cfg_.init_std)};
  const Init scaled{Init::Kind::normal,
                    static_cast<float>(cfg_.init_std / std::sqrt(2.0 * cfg_.n_layer))};
  const Init ones{Init::Kind::ones, 0}, zeros{Init::Kind::zeros, 0};
  blocks_.resize(static_cast<std::size_t>(L));
  if (!cfg_.llama) {
    wte_ = add("wte.weight", {V, C}, normal, {embed, head}, vocab_rows);
    wpe_ = add("wpe.weight", {cfg_.seq_len, C}, normal, {embed});
    for (int l = 0; l < L; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      const ModuleId m = block_module(l);
      auto& b = blocks_[static_cast<std::size_t>(l)];
      b.ln1_w = add(p + "ln_1.weight", {C}, ones, {m});
      b.ln1_b = add(p + "ln_1.bias", {C}, zeros, {m});
      b.qkv_w = add(p + "attn.c_attn.weight", {3 * A, C}, normal, {m}, qkv_rows);
      b.qkv_b = add(p + "attn.c_attn.bias", {3 * A}, zeros, {m}, qkv_rows);
      b.proj_w = add(p + "attn.c_proj.weight", {C, A}, scaled, {m}, cols);
      b.proj_b = add(p + "attn.c_proj.bias", {C}, zeros, {m});
      b.ln2_w = add(p + "ln_2.weight", {C}, ones, {m});
      b.ln2_b = add(p + "ln_2.bias", {C}, zeros, {m});
      b.fc_w = add(p + "mlp.c_fc.weight", {H, C}, normal, {m}, rows);
      b.fc_b = add(p + "mlp.c_fc.bias", {H}, zeros, {m}, rows);
      b.fcproj_w = add(p + "mlp.c_proj.weight", {C, H}, scaled, {m}, cols);
      b.fcproj_b = add(p + "mlp.c_proj.bias", {C}, zeros, {m});
    }
    lnf_w_ = add("ln_f.weight", {C}, ones, {head});
    lnf_b_ = add("ln_f.bias", {C}, zeros, {head});
    head_w_ = wte_;
  } else {
    const int KV = cfg_.local_kv_dim();
    wte_ = add("model.embed_tokens.weight", {V, C}, normal, {embed}, vocab_rows);
    for (int l = 0; l < L; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const ModuleId m = block_module(l);
      auto& b = blocks_[static_cast<std::size_t>(l)];
      // Hugging Face's order: each projection's weight, then its bias
      // (cut with it where its rows are).
      auto linear = [&](const std::string& name, Shape shape, Init init, bool bias,
                        std::optional<ParamId>& w, std::optional<ParamId>& bias_id,
                        TensorSplit split) {
        const std::int64_t out = shape[0];
        w = add(p + name + ".weight", std::move(shape), init, {m}, split);
        if (bias)
          bias_id =
              add(p + name + ".bias", {out}, zeros, {m}, split.dim == 0 ? split : TensorSplit{});
      };
      const bool qkv_bias = cfg_.attention_bias != AttentionBias::none,
                 o_bias = cfg_.attention_bias == AttentionBias::all;
      b.ln1_w = add(p + "input_layernorm.weight", {C}, ones, {m});
      linear("self_attn.q_proj", {A, C}, normal, qkv_bias, b.q_w, b.q_b, rows);
      linear("self_attn.k_proj", {KV, C}, normal, qkv_bias, b.k_w, b.k_b, kv_rows);
      linear("self_attn.v_proj", {KV, C}, normal, qkv_bias, b.v_w, b.v_b, kv_rows);
      linear("self_attn.o_proj", {C, A}, scaled, o_bias, b.proj_w, b.proj_b, cols);
      b.ln2_w = add(p + "post_attention_layernorm.weight", {C}, ones, {m});
      linear("mlp.gate_proj", {H, C}, normal, cfg_.mlp_bias, b.fc_w, b.fc_b, rows);
      linear("mlp.up_proj", {H, C}, normal, cfg_.mlp_bias, b.up_w, b.up_b, rows);
      linear("mlp.down_proj", {C, H}, scaled, cfg_.mlp_bias, b.fcproj_w, b.fcproj_b, cols);
    }
    lnf_w_ = add("model.norm.weight", {C}, ones, {head});
    if (cfg_.tied) {
      params_[*wte_].used_by.push_back(head);
      head_w_ = wte_;
    } else {
      head_w_ = add("lm_head.weight", {V, C}, normal, {head}, vocab_rows);
    }
  }
}

std::string Transformer::hf_config_json() const {
  const std::string V = std::to_string(cfg_.vocab_size), T = std::to_string(cfg_.seq_len),
                    C = std::to_string(cfg_.n_embd), L = std::to_string(cfg_.n_layer),
                    NH = std::to_string(cfg_.n_head), H = std::to_string(cfg_.hidden);
  if (!cfg_.llama)
    return "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
           "  \"vocab_size\": " +
           V + ",\n  \"n_positions\": " + T + ",\n  \"n_ctx\": " + T + ",\n  \"n_embd\": " + C +
           ",\n  \"n_layer\": " + L + ",\n  \"n_head\": " + NH + ",\n  \"n_inner\": " + H +
           ",\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": " +
           json_number(cfg_.norm_eps) +
           ",\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
           "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": true,\n"
           "  \"torch_dtype\": \"float32\"\n}\n";
  return llama_config_json();
}

// The Llama family's config.json: Qwen2's class where only q/k/v carry
// biases (LlamaConfig cannot say that), LlamaForCausalLM otherwise; RoPE
// scaling in the rope_scaling form both transformers 4 and 5 read.
std::string Transformer::llama_config_json() const {
  const bool qwen2 = cfg_.attention_bias == AttentionBias::qkv;
  std::string j =
      qwen2 ? "{\n  \"architectures\": [\"Qwen2ForCausalLM\"],\n  \"model_type\": \"qwen2\",\n"
            : "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n";
  j += "  \"vocab_size\": " + std::to_string(cfg_.vocab_size) +
       ",\n  \"hidden_size\": " + std::to_string(cfg_.n_embd) +
       ",\n  \"intermediate_size\": " + std::to_string(cfg_.hidden) +
       ",\n  \"num_hidden_layers\": " + std::to_string(cfg_.n_layer) +
       ",\n  \"num_attention_heads\": " + std::to_string(cfg_.n_head) +
       ",\n  \"num_key_value_heads\": " + std::to_string(cfg_.n_kv_head) +
       ",\n  \"max_position_embeddings\": " +
       std::to_string(std::max<std::int64_t>(cfg_.max_positions, cfg_.seq_len)) +
       ",\n  \"rms_norm_eps\": " + json_number(cfg_.norm_eps) +
       ",\n  \"rope_theta\": " + json_number(cfg_.rope_theta) + ",\n  \"hidden_act\": \"silu\",\n";
  const RopeScaling& r = cfg_.rope_scaling;
  if (r.type == RopeScaling::Type::linear)
    j += "  \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": " + json_number(r.factor) +
         "},\n";
  else if (r.type == RopeScaling::Type::llama3)
    j += "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": " + json_number(r.factor) +
         ", \"low_freq_factor\": " + json_number(r.low_freq_factor) +
         ", \"high_freq_factor\": " + json_number(r.high_freq_factor) +
         ", \"original_max_position_embeddings\": " + json_number(r.original_max_positions) +
         "},\n";
  if (qwen2)
    j += "  \"use_sliding_window\": false,\n";
  else
    j += std::string("  \"attention_bias\": ") +
         (cfg_.attention_bias == AttentionBias::all ? "true" : "false") +
         ",\n  \"mlp_bias\": " + (cfg_.mlp_bias ? "true" : "false") + ",\n";
  j += std::string("  \"tie_word_embeddings\": ") + (cfg_.tied ? "true" : "false") +
       ",\n  \"torch_dtype\": \"float32\"\n}\n";
  return j;
}

bool Transformer::ignorable_tensor(const std::string& name) const {
  if (cfg_.llama)
    return name.ends_with("rotary_emb.inv_freq") || (cfg_.tied && name == "lm_head.weight");
  // Tied copy of wte, and the causal-mask buffers older GPT-2 files carry.
  return name == "lm_head.weight" || name.ends_with(".attn.bias") ||
         name.ends_with(".attn.masked_bias");
}

ModuleSpecs Transformer::modules() const {
  ModuleSpecs m{{"embed"}};
  for (int l = 0; l < cfg_.n_layer; ++l) m.push_back({"block." + std::to_string(l)});
  m.push_back({"head"});
  return m;
}

ModelInfo Transformer::info() const {
  ModelInfo i;
  i.arch = cfg_.llama ? "llama" : "gpt2";
  i.vocab_size = cfg_.vocab_size;
  i.seq_len = cfg_.seq_len;
  double frozen = 0;
  // The whole model's: a tensor-parallel part counts as the whole it is
  // one of.
  for (const auto& p : params_) {
    const std::int64_t whole = whole_numel(p);
    i.n_params += whole;
    if (!p.trainable) frozen += static_cast<double>(whole);
  }
  // 6N for the matmuls over parameters (4N over frozen ones, which get no
  // weight gradient) plus 12*L*C*T for attention scores and weighted sums
  // (PaLM's accounting, forward and backward).
  i.train_flops_per_token = 6.0 * (static_cast<double>(i.n_params) - frozen) + 4.0 * frozen +
                            12.0 * cfg_.n_layer * cfg_.n_embd * static_cast<double>(cfg_.seq_len);
  return i;
}

// [model] loss_chunk_tokens' default, 1024 tokens. Each chunk reads the
// head's weight twice and its gradient once, (V, C) each, beside 6 R V C
// FLOPs for R rows: the re-reads cost about 16 F / (6 R B) of the GEMMs'
// time (F the GEMM rate, B the memory's bandwidth; the vocabulary cancels
// out), 1.6 % at R = 1024 on this machine (190 GFLOP/s, 30 GB/s). Measured
// on gpt2-124m's head at 8192 tokens (bench_head_rows, alternated rounds):
// 320-row chunks 9 % slower than one chunk, 640 to 2560 rows -2 to +2 %,
// 1024 rows 5.8 % in a run of its own: about 1.5 % of that step, for
// 1.2 GiB less memory.
std::size_t Transformer::head_rows(std::size_t N) const {
  return std::min(N, static_cast<std::size_t>(cfg_.loss_chunk_tokens));
}

Transformer::Dims Transformer::dims(int B, int T) const {
  auto z = [](int n) { return static_cast<std::size_t>(n); };
  const std::size_t NH = z(cfg_.local_heads()), NKV = z(cfg_.local_kv_heads()),
                    hs = z(cfg_.head_size());
  const std::size_t N = z(B) * z(T), NL = cfg_.tensor_sequence ? N / z(cfg_.tensor) : N;
  return {z(B),    z(T), N,  z(cfg_.n_embd), z(cfg_.local_hidden()),
          NH,      NKV,  hs, NKV * hs,       z(cfg_.local_vocab()),
          NH * hs, NL};
}

// 16-bit activations: each block's fp32 tensors are one working set, shared,
// beside its own kept copies (and its own statistics: small, fp32); with
// checkpointing the one block's copies are a scratch, for the rounding:
// the backward's d_h1, which no forward (nor a backward's recompute, nor
// the head) uses while it rounds, where it is large enough. The streams
// are rounded and restored at once, so two fp32 slots serve them; the
// host copies of offloading go through three 16-bit ones (stream L, which
// stays, is rounded in the scratch).
void Transformer::plan(const BatchShape& shape,
                       const std::function<float*(std::size_t, Where)>& alloc_where,
                       Acts& a) const {
  const auto alloc = [&](std::size_t n) { return alloc_where(n, Where::kept); };
  const auto work = [&](std::size_t n) { return alloc_where(n, Where::working); };
  const int B = shape.batch, T = shape.seq_len;
  // H, KV and the attention's width A: this rank's share of them.
  const std::size_t N = static_cast<std::size_t>(B) * T, C = cfg_.n_embd,
                    H = static_cast<std::size_t>(cfg_.local_hidden()),
                    KV = static_cast<std::size_t>(cfg_.local_kv_dim()),
                    A = static_cast<std::size_t>(cfg_.attention_width()),
                    V = static_cast<std::size_t>(cfg_.local_vocab());
  const std::size_t lse_rows = static_cast<std::size_t>(B) * cfg_.local_heads() * T;
  // The rows this rank holds between the split regions (N, or N / tensor
  // under sequence parallelism): the streams, the norms, their gradient.
  const std::size_t NL = dims(B, T).NL;
  a.B = B;
  a.T = T;
  a.split = shape.split;
  a.kept = shape.activations;
  // n elements of the kept type, from alloc_where's floats.
  const auto kept_alloc = [&](std::size_t n, Where where) -> void* {
    return alloc_where((n * dtype_size(a.kept) + sizeof(float) - 1) / sizeof(float), where);
  };
  const auto L = static_cast<std::size_t>(planned_blocks());
  a.resid.resize(a.rounds() ? 2 : cfg_.offload_checkpoints ? 4 : L + 1);
  for (auto& r : a.resid) r = alloc(NL * C);
  a.host_resid.resize(cfg_.offload_checkpoints ? L : 0);
  for (auto& r : a.host_resid) r = kept_alloc(NL * C, Where::host);
  a.kept_resid.resize(a.rounds() ? (cfg_.offload_checkpoints ? 3 : L + 1) : 0);
  for (auto& r : a.kept_resid) r = kept_alloc(NL * C, Where::kept);
  // The rotary tables live with the activations: the device accounts them,
  // and a model that is only declared (estimate) builds none. planned()
  // writes them for every call.
  const std::size_t rope = cfg_.llama ? static_cast<std::size_t>(T) * (cfg_.head_size() / 2) : 0;
  a.rope_cos = rope ? work(rope) : nullptr;
  a.rope_sin = rope ? work(rope) : nullptr;
  a.blocks.resize(cfg_.checkpointing ? 1 : L);
  // Under Ulysses a block's backward reads the head shards it saved, not
  // its own q, k and v: one buffer serves every block. The ring's reads
  // the block's own.
  const std::size_t qkv_floats = cfg_.llama ? N * (A + 2 * KV) : N * 3 * A;
  float* const shared_qkv = a.ulysses() ? alloc(qkv_floats) : nullptr;
  const auto at = [](float* p, std::size_t offset) { return p ? p + offset : nullptr; };
  const std::size_t saved = a.ulysses() ? ulysses_shape(a.blocks[0], a).saved_floats() : 0;
  a.d_res = work(NL * C);
  a.d_c = work(N * C);
  if (cfg_.tensor_sequence) {
    a.gathered = work(N * C);
    a.d_own = work(NL * C);
    a.norm_dw = work(2 * C);
    a.norm_tmp = work(C);
  }
  a.d_att = work(N * A);
  a.d_qkv = work(N * (A + 2 * KV));
  a.d_h1 = work(N * H);
  a.d_h2 = work(N * H);
  a.d_h3 = cfg_.llama ? work(N * H) : nullptr;
  const bool lora = cfg_.tuning.method == FineTuning::Method::lora;
  const std::size_t rank = lora ? static_cast<std::size_t>(cfg_.tuning.lora_rank) : 0;
  if (lora) {
    a.lora_out = work(N * std::max({cfg_.llama ? C : 3 * C, H, C}));
    a.lora_du = work(N * rank);
  }
  const std::size_t rounded = std::max({qkv_floats, N * H, N * C, saved});
  void* scratch = nullptr;
  if (a.rounds())
    scratch = rounded * dtype_size(a.kept) <= N * H * sizeof(float)
                  ? a.d_h1
                  : kept_alloc(rounded, Where::working);
  a.kept_scratch = scratch;
  for (std::size_t i = 0; i < a.blocks.size(); ++i) {
    BlockActs& b = a.blocks[i];
    b.rope_cos = a.rope_cos;
    b.rope_sin = a.rope_sin;
    b.ln1_mean = cfg_.llama ? nullptr : alloc(NL);
    b.ln1_rstd = alloc(NL);
    b.lse = alloc(lse_rows);
    b.ln2_mean = cfg_.llama ? nullptr : alloc(NL);
    b.ln2_rstd = alloc(NL);
    for (std::size_t j = 0; j < kProjCount; ++j)  // every block its own: fp32, never kept
      b.lora_u[j] = blocks_.front().lora[j] ? alloc(N * rank) : nullptr;
    const bool own_copies = a.rounds() && !cfg_.checkpointing;
    const auto copy = [&](std::size_t n) {
      return own_copies ? kept_alloc(n, Where::kept) : scratch;
    };
    b.kept = {copy(NL * C),
              a.ulysses() ? scratch : copy(qkv_floats),
              copy(N * A),
              copy(NL * C),
              copy(NL * C),
              copy(N * H),
              copy(N * H),
              cfg_.llama ? copy(N * H) : nullptr,
              a.ulysses() ? copy(saved) : nullptr};
    if (a.rounds() && i > 0) {  // the working set of block 0
      const BlockActs& w = a.blocks[0];
      for (float* BlockActs::*m :
           {&BlockActs::ln1, &BlockActs::q, &BlockActs::k, &BlockActs::v, &BlockActs::atty,
            &BlockActs::res1, &BlockActs::ln2, &BlockActs::h1, &BlockActs::h2, &BlockActs::h3,
            &BlockActs::ulysses})
        b.*m = w.*m;
      b.q_stride = w.q_stride;
      b.kv_stride = w.kv_stride;
      continue;
    }
    // Kept in a 16-bit type, the fp32 working set is rebuilt from the
    // blocks' copies before each backward (restore_block) or recomputed
    // (checkpointing): working memory, not kept.
    const auto set = [&](std::size_t n) { return a.rounds() ? work(n) : alloc(n); };
    b.ln1 = set(NL * C);
    b.q = a.ulysses() ? shared_qkv : set(qkv_floats);
    if (cfg_.llama) {  // q (N,A), k (N,KV), v (N,KV)
      b.k = at(b.q, N * A);
      b.v = at(b.k, N * KV);
      b.q_stride = A;
      b.kv_stride = KV;
    } else {  // (N,3A): each row's q, k, v
      b.k = at(b.q, A);
      b.v = at(b.q, 2 * A);
      b.q_stride = b.kv_stride = 3 * A;
    }
    b.atty = set(N * A);
    b.res1 = set(NL * C);
    b.ln2 = set(NL * C);
    b.h1 = set(N * H);
    b.h2 = set(N * H);
    b.h3 = cfg_.llama ? set(N * H) : nullptr;
    b.ulysses = a.ulysses() ? set(saved) : nullptr;
  }
  if (a.ulysses()) a.ulysses_scratch = work(ulysses_shape(a.blocks[0], a).scratch_floats());
  if (a.ring()) a.ring_scratch = work(ring_shape(a.blocks[0], a).scratch_floats());
  a.lnf = work(NL * C);
  a.lnf_mean = cfg_.llama ? nullptr : work(NL);
  a.lnf_rstd = work(NL);
  const std::size_t rows = head_rows(N);
  a.logits = work(rows * V);
  a.head_dw = rows < N && params_[*head_w_].trainable ? work(V * C) : nullptr;
  a.losses = work(N);
  if (cfg_.tensor > 1) {
    a.row_max = work(rows);
    a.sums = work(2 * rows);
  }
}

std::uint64_t Transformer::activation_bytes(const BatchShape& shape) const {
  const PlannedBytes b = planned_bytes(shape);
  return b.kept + b.working;
}

std::uint64_t Transformer::host_activation_bytes(const BatchShape& shape) const {
  return planned_bytes(shape).host;
}

std::uint64_t Transformer::kept_activation_bytes(const BatchShape& shape) const {
  return planned_bytes(shape).kept;
}

Transformer::PlannedBytes Transformer::planned_bytes(const BatchShape& shape) const {
  // A bound on the plan's largest sums, in floating point, before it
  // multiplies in 64 bits: each block holds a few (N, C), (N, H) and (N, 3C)
  // arrays, the head (N, V).
  const long double N = static_cast<long double>(shape.batch) * shape.seq_len;
  const long double bound =
      N * 4 *
      ((cfg_.n_layer + 2) * (16.0L * cfg_.n_embd + 3.0L * cfg_.hidden) + 4.0L * cfg_.vocab_size);
  if (bound > 0x1p62L)
    throw ConfigError("[model] seq_len = " + std::to_string(shape.seq_len) +
                      " with [train] micro_batch_size = " + std::to_string(shape.batch) +
                      " makes activations of more than 2^62 bytes; lower them");
  PlannedBytes bytes;
  Acts a;
  plan(
      shape,
      [&](std::size_t n, Where where) -> float* {
        const std::uint64_t b = Arena::aligned(n * sizeof(float));
        (where == Where::kept   ? bytes.kept
         : where == Where::host ? bytes.host
                                : bytes.working) += b;
        return nullptr;
      },
      a);
  return bytes;
}

// The heads and the MLP's width must each divide into the parts, the
// key/value heads too or into copies of one a rank; the fine-tuning
// methods keep whole weights. The parameters are declared again as parts.
std::string Transformer::split_tensors(const TensorParallel& t) {
  const int degree = t.degree, part = t.part;
  if (degree <= 1) return {};
  const std::pair<int, const char*> counts[] = {{cfg_.n_head, "n_head (attention heads)"},
                                                {cfg_.hidden, "the MLP's width"}};
  for (const auto& [n, what] : counts)
    if (n % degree != 0)
      return std::string("[model] ") + what + " = " + std::to_string(n) + " does not divide into " +
             std::to_string(degree) + " equal parts; choose a degree that divides it";
  if (cfg_.vocab_size < degree)
    return "[model] vocab_size = " + std::to_string(cfg_.vocab_size) +
           " is smaller than the tensor degree " + std::to_string(degree) +
           ", which splits the vocabulary's rows; choose a smaller degree";
  // Fewer key/value heads than ranks: each copied to the ranks whose query
  // heads read it.
  if (const int kv = cfg_.n_kv_head; kv % degree != 0 && degree % kv != 0)
    return "[model] n_kv_head (key/value heads) = " + std::to_string(kv) +
           " neither divides into " + std::to_string(degree) +
           " equal parts nor into copies for them; choose a degree that divides it or that it "
           "divides";
  if (std::string why = lora_split_refusal(degree); !why.empty()) return why;
  cfg_.tensor = degree;
  cfg_.tensor_rank = part;
  cfg_.tensor_sequence = t.sequence;
  params_ = ParamSpecs{};
  blocks_.clear();
  declare_params();
  declare_adapters(options_);
  freeze_params(options_);
  return {};
}

// Rotary positions restart with each example (the tables are indexed by
// position); GPT-2's learned table would too, but its kernels read it by
// row position.
std::string Transformer::segments_refusal() const {
  if (wpe_)
    return "GPT-2's learned position embeddings (wpe) are read by row position, not by the "
           "example's; rows that pack examples train on rotary-position models (Llama, Qwen2, "
           "Mistral)";
  return {};
}

// The ring cuts the sequence into pairs of chunks; Ulysses splits the
// heads (a tensor part's) and what the ring leaves each rank (the whole
// sequence alone).
std::string Transformer::sequence_shards_refusal(SequenceSplit split) const {
  const auto z = [](int n) { return static_cast<std::size_t>(n); };
  const std::size_t T = z(cfg_.seq_len), R = z(split.context);
  if (R > 1)
    if (std::string why = sequence::ring_refusal(T, R); !why.empty()) return why;
  if (split.sequence <= 1) return {};
  std::string why = sequence::ulysses_refusal(z(cfg_.local_heads()), z(cfg_.local_kv_heads()),
                                              T / R, z(split.sequence));
  if (!why.empty() && R > 1)
    why = "within each ring rank's " + std::to_string(T / R) + " tokens: " + why;
  if (!why.empty() && cfg_.tensor > 1)
    why = "at tensor = " + std::to_string(cfg_.tensor) + " each part computes " +
          std::to_string(cfg_.local_heads()) + " of the " + std::to_string(cfg_.n_head) +
          " heads: " + why;
  return why;
}

}  // namespace ztrain::transformer

ZTRAIN_PLUGIN("model", "transformer", "0.1.0",
              "GPT-2 and Llama decoder-only transformers (Hugging Face compatible)",
              ztrain::transformer::Transformer)
