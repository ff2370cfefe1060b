#include "config/hf_model_import.h"

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ztrain/error.h"

namespace ztrain {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// config.json's keys, each read once; those left at the end are refused.
class HfConfig {
 public:
  HfConfig(json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {}
  std::string where(const std::string& key) const { return file_ + ": " + key; }
  const json* get(const std::string& key) {
    read_.insert(key);
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::int64_t integer(const std::string& key) {
    const json* v = get(key);
    if (!v || !v->is_number_integer())
      throw ConfigError(where(key) +
                        (v ? " is " + v->dump() + "; expected an integer" : " is missing"));
    return v->get<std::int64_t>();
  }
  std::optional<std::int64_t> maybe_integer(const std::string& key) {
    return get(key) ? std::optional(integer(key)) : std::nullopt;
  }
  double number(const std::string& key, double fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number()) throw ConfigError(where(key) + " is " + v->dump() + "; expected a number");
    return v->get<double>();
  }
  // A key that must hold `allowed` (or be absent, when that means the same).
  void require(const std::string& key, const json& allowed, bool absent_ok,
               const std::string& why) {
    const json* v = get(key);
    if ((!v && absent_ok) || (v && *v == allowed)) return;
    throw ConfigError(where(key) + " is " + (v ? v->dump() : "absent") + ": " + why);
  }
  void ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys) read_.insert(k);
  }
  // Every key nobody read is refused: a new kind of model is never run as
  // an old one.
  void finish() const {
    for (const auto& [key, v] : j_.items())
      if (!read_.contains(key))
        throw ConfigError(where(key) + " is " + v.dump() +
                          ": a key ztrain does not know for this model; it may change the "
                          "computation, so the model is refused");
  }

 private:
  json j_;
  std::string file_;
  std::set<std::string> read_;
};

// Keys of every model type that change nothing here.
void ignore_common(HfConfig& c) {
  c.ignore({"architectures",
            "model_type",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "torch_dtype",
            "dtype",
            "transformers_version",
            "use_cache",
            "initializer_range",
            "_name_or_path",
            "tokenizer_class",
            "output_attentions",
            "output_hidden_states",
            "return_dict",
            "is_encoder_decoder",
            "task_specific_params",
            "id2label",
            "label2id",
            "problem_type",
            "sep_token_id",
            "decoder_start_token_id"});
}

struct Imported {
  toml::table model;
  std::vector<std::string> notes;
};

void map_gpt2(HfConfig& c, Imported& out) {
  auto& m = out.model;
  m.insert("arch", "gpt2");
  m.insert("vocab_size", c.integer("vocab_size"));
  m.insert("n_layer", c.integer("n_layer"));
  m.insert("n_head", c.integer("n_head"));
  const std::int64_t C = c.integer("n_embd");
  m.insert("n_embd", C);
  // GPT-2's learned positions: the weights hold n_positions rows.
  m.insert("seq_len", c.integer("n_positions"));
  c.ignore({"n_ctx"});
  m.insert("intermediate_size", c.maybe_integer("n_inner").value_or(4 * C));
  m.insert("norm_eps", c.number("layer_norm_epsilon", 1e-5));
  const json* act = c.get("activation_function");
  if (act && *act != "gelu_new" && *act != "gelu_pytorch_tanh")
    throw ConfigError(c.where("activation_function") + " is " + act->dump() +
                      ": ztrain's GPT-2 uses the tanh GELU (gelu_new)");
  c.require("tie_word_embeddings", true, true, "ztrain's GPT-2 ties its head to wte");
  c.require("scale_attn_weights", true, true, "ztrain scales attention by 1/sqrt(head size)");
  c.require("scale_attn_by_inverse_layer_idx", false, true, "not built in ztrain's attention");
  c.require("add_cross_attention", false, true, "ztrain's GPT-2 is a decoder only");
  c.ignore({"reorder_and_upcast_attn"});  // attention is computed in fp32 here anyway
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"})
    if (const double p = c.number(key, 0.1); p != 0)
      out.notes.push_back(c.where(key) + " is " + toml_number_text(p) +
                          ": ztrain trains without dropout (as llm.c and nanoGPT's pretraining)");
  c.ignore({"summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
            "summary_first_dropout"});  // the sequence-classification head
}

// RoPE's base and scaling: rope_theta and rope_scaling (transformers 4),
// or rope_parameters (transformers 5). The plain rotation, linear scaling
// and Llama 3.1's "llama3" are built; every other type, and every key of
// the scaling a built type does not read, is refused by name.
void map_rope(HfConfig& c, toml::table& m) {
  m.insert("rope_theta", c.number("rope_theta", 10000.0));
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* r = c.get(key);
    if (!r) continue;
    if (!r->is_object())
      throw ConfigError(c.where(key) + " is " + r->dump() + "; expected an object");
    const std::string type = r->value("rope_type", r->value("type", "default"));
    std::set<std::string> known = {"rope_type", "type", "rope_theta"};
    if (type == "linear")
      known.insert("factor");
    else if (type == "llama3")
      known.insert(
          {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
    else if (type != "default")
      throw ConfigError(c.where(key) + " is " + r->dump() + ": RoPE scaling \"" + type +
                        "\" is not built in ztrain (default, linear and llama3 are)");
    for (const auto& [k, v] : r->items()) {
      if (k == "partial_rotary_factor" && v == 1.0) continue;
      if (!known.contains(k))
        throw ConfigError(c.where(key + std::string(".") + k) + " is " + v.dump() +
                          ": not built for RoPE type \"" + type + "\"");
      if (k != "rope_type" && k != "type" && !v.is_number())
        throw ConfigError(c.where(key + std::string(".") + k) + " is " + v.dump() +
                          "; expected a number");
    }
    if (r->contains("rope_theta"))
      m.insert_or_assign("rope_theta", (*r)["rope_theta"].get<double>());
    if (type == "default") continue;
    m.insert_or_assign("rope_scaling", type);
    const auto need = [&](const char* k) {
      if (!r->contains(k))
        throw ConfigError(c.where(key) + " is " + r->dump() + ": RoPE type \"" + type +
                          "\" needs " + k);
      return (*r)[k].get<double>();
    };
    m.insert_or_assign("rope_factor", need("factor"));
    if (type == "llama3") {
      m.insert_or_assign("rope_low_freq_factor", need("low_freq_factor"));
      m.insert_or_assign("rope_high_freq_factor", need("high_freq_factor"));
      m.insert_or_assign("rope_original_max_positions", need("original_max_position_embeddings"));
    }
  }
}

// Sliding-window attention is not built: a window shorter than the run's
// sequences changes the computation and is refused; one at least as long
// masks nothing.
void check_window(HfConfig& c, const std::string& type, std::int64_t seq) {
  bool sliding = true;
  if (type == "qwen2") {
    const json* use = c.get("use_sliding_window");
    sliding = use && *use == true;
    c.ignore({"max_window_layers"});
  }
  const json* w = c.get("sliding_window");
  const bool short_window = sliding && w && w->is_number_integer() && w->get<std::int64_t>() < seq;
  if (short_window)
    throw ConfigError(c.where("sliding_window") + " is " + w->dump() + ", shorter than seq_len " +
                      std::to_string(seq) +
                      ": sliding-window attention is not built; set model.seq_len to at most "
                      "the window");
  if (const json* layers = c.get("layer_types"); layers && layers->is_array())
    for (const auto& l : *layers)
      if (l != "full_attention" && !(l == "sliding_attention" && !short_window))
        throw ConfigError(c.where("layer_types") + " holds " + l.dump() +
                          ": only full attention is built");
}

void map_llama(HfConfig& c, const std::string& type, Imported& out) {
  auto& m = out.model;
  m.insert("arch", "llama");
  m.insert("vocab_size", c.integer("vocab_size"));
  m.insert("n_layer", c.integer("num_hidden_layers"));
  const std::int64_t H = c.integer("num_attention_heads"), C = c.integer("hidden_size");
  m.insert("n_head", H);
  m.insert("n_kv_head", c.maybe_integer("num_key_value_heads").value_or(H));
  m.insert("n_embd", C);
  if (const auto head_dim = c.maybe_integer("head_dim"); head_dim && *head_dim * H != C)
    throw ConfigError(c.where("head_dim") + " is " + std::to_string(*head_dim) +
                      ", not hidden_size / num_attention_heads (" + std::to_string(C / H) +
                      "): not built in ztrain's attention");
  m.insert("intermediate_size", c.integer("intermediate_size"));
  m.insert("norm_eps", c.number("rms_norm_eps", 1e-6));
  map_rope(c, m);
  const std::int64_t positions = c.integer("max_position_embeddings");
  const std::int64_t seq = std::min<std::int64_t>(positions, 2048);
  m.insert("seq_len", seq);
  m.insert("max_positions", positions);  // what an export says again, whatever seq_len trains
  if (seq < positions)
    out.notes.push_back(c.where("max_position_embeddings") + " is " + std::to_string(positions) +
                        ": seq_len " + std::to_string(seq) +
                        " (rotary positions need no more; set model.seq_len for longer sequences)");
  const json* act = c.get("hidden_act");
  if (act && *act != "silu")
    throw ConfigError(c.where("hidden_act") + " is " + act->dump() +
                      ": ztrain's Llama MLP is SwiGLU (silu)");
  // Qwen2 biases q, k and v always; Llama's attention_bias adds o_proj's.
  if (type == "qwen2") {
    m.insert("attention_bias", "qkv");
  } else {
    const json* bias = c.get("attention_bias");
    if (bias && !bias->is_boolean())
      throw ConfigError(c.where("attention_bias") + " is " + bias->dump() + "; expected a boolean");
    m.insert("attention_bias", bias && *bias == true ? "all" : "none");
    const json* mlp = c.get("mlp_bias");
    if (mlp && !mlp->is_boolean())
      throw ConfigError(c.where("mlp_bias") + " is " + mlp->dump() + "; expected a boolean");
    m.insert("mlp_bias", mlp && *mlp == true);
  }
  // transformers ties by default only where the class says so; every class
  // of this family defaults to an untied head.
  const json* tie = c.get("tie_word_embeddings");
  if (tie && !tie->is_boolean())
    throw ConfigError(c.where("tie_word_embeddings") + " is " + tie->dump() +
                      "; expected a boolean");
  m.insert("tie_embeddings", tie && *tie == true);
  c.require("pretraining_tp", 1, true, "tensor-parallel slicing of the projections is not built");
  c.ignore({"attention_dropout"});
  if (type != "llama") check_window(c, type, seq);
}

Imported import_dir(const fs::path& dir) {
  const fs::path file = dir / "config.json";
  std::ifstream in(file);
  if (!in) throw ConfigError("model directory '" + dir.string() + "' has no readable config.json");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw ConfigError(file.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw ConfigError(file.string() + ": not a JSON object");
  HfConfig c(j, file.string());
  ignore_common(c);
  const std::string type = j.value("model_type", "");
  Imported out;
  if (type == "gpt2")
    map_gpt2(c, out);
  else if (type == "llama" || type == "mistral" || type == "qwen2")
    map_llama(c, type, out);
  else
    throw ConfigError(c.where("model_type") + " is \"" + type +
                      "\": ztrain builds gpt2 and the Llama family (llama, mistral, qwen2)");
  c.finish();
  out.model.insert("init_from", dir.string());
  return out;
}

}  // namespace

void resolve_model_dir(RunConfig& config) {
  const toml::node* from = config.table().at_path("model.from").node();
  if (!from) return;
  if (!from->is_string())
    throw ConfigError(config.where("model.from") + ": [model] from names a directory (a string)");
  const fs::path dir = from->value_or(std::string());
  const std::string origin = config.where("model.from");
  Imported imported = import_dir(dir);
  // The run's own keys beside `from` win, each that differs said.
  const toml::table* given = config.table().at_path("model").as_table();
  toml::table merged = imported.model;
  std::map<std::string, std::string> origins;
  for (const auto& [key, node] : merged)
    origins["model." + std::string(key.str())] = (dir / "config.json").string();
  origins["model.init_from"] = origin;
  for (const auto& [key, node] : *given) {
    const std::string k(key.str());
    if (k == "from") continue;
    if (const toml::node* was = merged.get(k);
        was && toml_value_text(*was) != toml_value_text(node))
      imported.notes.push_back(config.where("model." + k) + ": model." + k + " = " +
                               toml_value_text(node) + " in place of " + toml_value_text(*was) +
                               " from " + (dir / "config.json").string());
    merged.insert_or_assign(k, node);
    origins["model." + k] = config.where("model." + k);
  }
  config.set_imported("model", merged, true, origins);
  for (const auto& n : imported.notes) config.add_note(n);
}

}  // namespace ztrain
