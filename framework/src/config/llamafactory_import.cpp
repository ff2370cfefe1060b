#include "config/llamafactory_import.h"

#include <algorithm>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/yaml_mapping.h"
#include "ztrain/error.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

// The run's tables being filled, each value with its origin: the YAML
// key's place, or the default LLaMA-Factory or transformers gives it.
class Builder {
 public:
  Builder(ImportedConfig& c, YamlMapping& y, std::string file)
      : c_(c), y_(y), file_(std::move(file)) {}
  template <class T>
  void put(const std::string& section, const std::string& key, T value, const std::string& yaml) {
    table(section).insert_or_assign(key, std::move(value));
    c_.origins[section + "." + key] =
        y_.get(yaml) ? y_.where(yaml) : file_ + ": " + yaml + " absent (LLaMA-Factory's default)";
  }
  void note(const std::string& yaml, const std::string& why) {
    if (y_.get(yaml)) c_.notes.push_back(y_.where(yaml) + ": " + why);
  }
  // Refused: a key ztrain does not build, set to anything but `unset`.
  void refuse_unless(const std::string& yaml, const std::string& unset, const std::string& why) {
    if (const YAML::Node v = y_.get(yaml); v && v.Scalar() != unset)
      throw ConfigError(y_.where(yaml) + " is " + YAML::Dump(v) + ": " + why);
  }
  YamlMapping& yaml() { return y_; }

 private:
  toml::table& table(const std::string& section) {
    if (section == "model") return c_.model;
    if (section == "data") return c_.data;
    if (section == "comm") return c_.comm;
    return c_.train;
  }
  ImportedConfig& c_;
  YamlMapping& y_;
  std::string file_;
};

// "a,b" or a YAML list: the names (empty pieces dropped, as
// LLaMA-Factory's split drops them).
std::vector<std::string> names(YamlMapping& y, const std::string& key) {
  const YAML::Node v = y.get(key);
  std::vector<std::string> out;
  const auto add = [&](const std::string& text) {
    for (std::string& n : comma_names(text))
      if (!n.empty()) out.push_back(std::move(n));
  };
  if (v && v.IsSequence())
    for (const auto& item : v) add(item.as<std::string>());
  else if (v)
    add(v.as<std::string>());
  return out;
}

toml::array toml_names(const std::vector<std::string>& v) {
  toml::array a;
  for (const auto& s : v) a.push_back(s);
  return a;
}

// What LLaMA-Factory builds and ztrain does not, refused with what it would
// take here rather than as unknown keys.
void unbuilt_keys(Builder& b) {
  b.refuse_unless("quantization_bit", "",
                  "QLoRA's quantized base is not built: ztrain holds the frozen base in the "
                  "run's precision; remove it (and quantization_method) to train LoRA on the "
                  "unquantized model");
  for (const char* key : {"quantization_method", "double_quantization", "quantization_type"})
    b.note(key, "no effect: ztrain does not quantize the base");
  for (const char* key : {"image_max_pixels", "image_min_pixels", "image_do_pan_and_scan",
                          "video_max_pixels", "video_min_pixels", "video_fps", "video_maxlen",
                          "use_audio_in_video", "audio_sampling_rate"})
    b.refuse_unless(key, "", "multimodal models are not built in ztrain (text models only)");
  for (const char* key : {"ray_num_workers", "ray_init_kwargs", "ray_run_name", "ray_storage_path",
                          "resources_per_worker", "placement_strategy"})
    b.refuse_unless(key, "",
                    "Ray is not built: ztrain starts its ranks itself (--nproc N on one host, "
                    "--hostfile for several)");
}

void model_keys(Builder& b, LlamaFactoryImport& out) {
  YamlMapping& y = b.yaml();
  const std::string model = y.text("model_name_or_path", "");
  if (model.empty())
    throw ConfigError(y.where("model_name_or_path") +
                      " is not given: LLaMA-Factory trains the model it names; give its "
                      "directory");
  if (!fs::is_directory(model))
    throw ConfigError(y.where("model_name_or_path") + " is '" + model +
                      "', which is no directory here: ztrain reads local Hugging Face "
                      "directories and downloads nothing; run `huggingface-cli download " +
                      model + " --local-dir DIR` and give DIR");
  b.put("model", "from", model, "model_name_or_path");
  b.note("trust_remote_code",
         "no effect: ztrain runs no code from the model directory (config.json names one of "
         "its own architectures)");
  b.note("flash_attn", "no effect: attention is ztrain's own kernel, flash-attention's algorithm");
  unbuilt_keys(b);
  if (const std::string adapter = y.text("adapter_name_or_path", ""); !adapter.empty()) {
    if (adapter.find(',') != std::string::npos)
      throw ConfigError(y.where("adapter_name_or_path") +
                        " names several adapters; ztrain starts from one: merge the others "
                        "first (llamafactory-cli export) and give one");
    b.put("model", "adapter_from", adapter, "adapter_name_or_path");
  }
  // LLaMA-Factory turns gradient checkpointing on unless told not to.
  b.put("model", "activation_checkpointing", !y.flag("disable_gradient_checkpointing", false),
        "disable_gradient_checkpointing");
  if (const std::string ds = y.text("deepspeed", ""); !ds.empty()) {
    out.deepspeed = ds;
    out.deepspeed_where = y.where("deepspeed");
  }
}

void method_keys(Builder& b) {
  YamlMapping& y = b.yaml();
  const std::string stage = y.text("stage", "sft");
  if (stage != "sft" && stage != "pt")
    throw ConfigError(y.where("stage") + " is " + stage +
                      ": ztrain trains stages sft and pt; reward models, DPO, KTO and PPO are "
                      "not built");
  if (!y.flag("do_train", false))
    throw ConfigError(y.where("do_train") +
                      " is not true: ztrain --llamafactory trains; set do_train: true (ztrain "
                      "evaluates as it trains, on val_size's split)");
  const std::string method = y.text("finetuning_type", "lora");  // LLaMA-Factory's default
  b.put("model", "finetuning_type", method, "finetuning_type");
  // LLaMA-Factory reads a method's keys under that method only.
  const auto only_for = [&](const char* key, const char* wanted) {
    if (method == wanted) return true;
    b.note(key, std::string("no effect with finetuning_type ") + method +
                    " (LLaMA-Factory reads it for " + wanted + " only)");
    return false;
  };
  if (only_for("lora_rank", "lora") && y.get("lora_rank"))
    b.put("model", "lora_rank", y.integer("lora_rank", 8), "lora_rank");
  if (only_for("lora_alpha", "lora") && y.get("lora_alpha"))
    b.put("model", "lora_alpha", y.number("lora_alpha", 0), "lora_alpha");
  if (only_for("lora_dropout", "lora") && y.get("lora_dropout"))
    b.put("model", "lora_dropout", y.number("lora_dropout", 0), "lora_dropout");
  if (only_for("lora_target", "lora") && y.get("lora_target"))
    b.put("model", "lora_target", toml_names(names(y, "lora_target")), "lora_target");
  if (only_for("use_rslora", "lora") && y.get("use_rslora"))
    b.put("model", "use_rslora", y.flag("use_rslora", false), "use_rslora");
  for (const char* key : {"use_dora", "pissa_init", "create_new_adapter"})
    b.refuse_unless(key, "false", "not built in ztrain's LoRA; remove it");
  b.refuse_unless("additional_target", "",
                  "ztrain's LoRA trains its adapters alone; use finetuning_type freeze with "
                  "freeze_extra_modules to train whole modules");
  if (only_for("freeze_trainable_layers", "freeze") && y.get("freeze_trainable_layers"))
    b.put("model", "freeze_trainable_layers", y.integer("freeze_trainable_layers", 2),
          "freeze_trainable_layers");
  for (const char* key : {"freeze_trainable_modules", "freeze_extra_modules"})
    if (only_for(key, "freeze") && y.get(key)) b.put("model", key, toml_names(names(y, key)), key);
}

// stage pt: documents packed into cutoff_len blocks by default, as
// LLaMA-Factory packs them, in its preprocessing's shards and batches.
void pretrain_keys(Builder& b, bool neat) {
  YamlMapping& y = b.yaml();
  b.put("data", "stage", std::string("pt"), "stage");
  b.put("data", "packing", y.flag("packing", true) || neat, neat ? "neat_packing" : "packing");
  if (y.get("preprocessing_num_workers"))
    b.put("data", "preprocessing_num_workers", y.integer("preprocessing_num_workers", 1),
          "preprocessing_num_workers");
  if (y.get("preprocessing_batch_size"))
    b.put("data", "preprocessing_batch_size", y.integer("preprocessing_batch_size", 1000),
          "preprocessing_batch_size");
  b.refuse_unless("streaming", "false", "not built; ztrain reads the datasets whole");
  for (const char* key : {"dataloader_num_workers", "overwrite_cache"})
    b.note(key, "no effect: ztrain encodes the documents once per run");
}

void dataset_keys(Builder& b) {
  YamlMapping& y = b.yaml();
  b.put("data", "plugin", std::string("sft"), "stage");
  const std::vector<std::string> datasets = names(y, "dataset");
  if (datasets.empty())
    throw ConfigError(y.where("dataset") + " is not given: name the datasets of dataset_info.json");
  b.put("data", "dataset", toml_names(datasets), "dataset");
  b.put("data", "dataset_dir", y.text("dataset_dir", "data"), "dataset_dir");
  if (const std::vector<std::string> eval = names(y, "eval_dataset"); !eval.empty())
    b.put("data", "eval_dataset", toml_names(eval), "eval_dataset");
  // A name of LLaMA-Factory's registry or a .jinja file; the data source
  // refuses a name ztrain does not build, at this key's place.
  if (const std::string t = y.text("template", ""); !t.empty())
    b.put("data", "template", t, "template");
  if (y.get("enable_thinking"))
    b.put("data", "enable_thinking", y.flag("enable_thinking", true), "enable_thinking");
  if (y.get("default_system"))
    b.put("data", "default_system", y.text("default_system", ""), "default_system");
  if (y.get("tokenized_path"))
    b.put("data", "tokenized_path", y.text("tokenized_path", ""), "tokenized_path");
  // A row holds cutoff_len - 1 places: the example's tokens but the last
  // as inputs, all but the first as targets.
  const std::int64_t cutoff = y.integer("cutoff_len", 2048);
  if (cutoff < 2)
    throw ConfigError(y.where("cutoff_len") + " is " + std::to_string(cutoff) +
                      ": an example needs at least 2 tokens");
  b.put("data", "cutoff_len", cutoff, "cutoff_len");
  b.put("model", "seq_len", cutoff - 1, "cutoff_len");
  if (y.get("max_samples"))
    b.put("data", "max_samples", y.integer("max_samples", 0), "max_samples");
  if (y.get("val_size")) b.put("data", "val_size", y.number("val_size", 0), "val_size");
  for (const char* key : {"train_on_prompt", "mask_history"})
    if (y.get(key)) b.put("data", key, y.flag(key, false), key);
  const bool neat = y.flag("neat_packing", false);
  if (y.text("stage", "sft") == "pt") {
    pretrain_keys(b, neat);
    return;
  }
  if (y.flag("packing", neat) && !neat)
    throw ConfigError(y.where("packing") +
                      " is true without neat_packing: LLaMA-Factory's plain packing lets a "
                      "row's examples attend to each other, which ztrain does not train; set "
                      "neat_packing: true (ztrain's packing: each example sees itself alone)");
  if (neat) b.put("data", "packing", true, "neat_packing");
  b.refuse_unless("streaming", "false", "not built; ztrain reads the datasets whole");
  for (const char* key : {"preprocessing_num_workers", "preprocessing_batch_size",
                          "dataloader_num_workers", "overwrite_cache"})
    b.note(key, "no effect: ztrain encodes the examples on every core, once per run");
}

// transformers' TrainingArguments, at their defaults where absent.
void train_keys(Builder& b) {
  YamlMapping& y = b.yaml();
  b.put("train", "micro_batch_size", y.integer("per_device_train_batch_size", 8),
        "per_device_train_batch_size");
  b.put("train", "grad_accum", y.integer("gradient_accumulation_steps", 1),
        "gradient_accumulation_steps");
  b.put("train", "lr", y.number("learning_rate", 5e-5), "learning_rate");
  if (const std::int64_t steps = y.integer("max_steps", -1); steps > 0)
    b.put("train", "steps", steps, "max_steps");
  else
    b.put("train", "epochs", y.number("num_train_epochs", 3.0), "num_train_epochs");
  b.put("train", "epoch_steps", std::string("transformers"), "num_train_epochs");
  const std::string schedule = y.text("lr_scheduler_type", "linear");
  if (schedule != "linear" && schedule != "cosine" && schedule != "constant" &&
      schedule != "constant_with_warmup")
    throw ConfigError(y.where("lr_scheduler_type") + " is " + schedule +
                      ": ztrain has transformers' linear, cosine, constant and "
                      "constant_with_warmup; choose one of them");
  b.put("train", "schedule", "hf_" + schedule, "lr_scheduler_type");
  if (schedule != "constant") {
    if (const std::int64_t w = y.integer("warmup_steps", 0); w > 0)
      b.put("train", "warmup_steps", w, "warmup_steps");
    else
      b.put("train", "warmup_ratio", y.number("warmup_ratio", 0.0), "warmup_ratio");
  }
  if (y.flag("bf16", false) && y.flag("fp16", false))
    throw ConfigError(y.where("fp16") + " and " + y.where("bf16") + " are both true; choose one");
  const bool half = y.flag("bf16", false) || y.flag("fp16", false);
  b.put("train", "precision",
        std::string(y.flag("bf16", false)   ? "bf16"
                    : y.flag("fp16", false) ? "fp16"
                                            : "fp32"),
        y.flag("bf16", false) ? "bf16" : "fp16");
  if (half) b.put("train", "grad_accum_dtype", std::string("fp32"), "bf16");
  b.put("train", "weight_decay", y.number("weight_decay", 0.0), "weight_decay");
  b.put("train", "betas", toml::array{y.number("adam_beta1", 0.9), y.number("adam_beta2", 0.999)},
        "adam_beta2");
  b.put("train", "eps", y.number("adam_epsilon", 1e-8), "adam_epsilon");
  b.put("train", "grad_clip", y.number("max_grad_norm", 1.0), "max_grad_norm");
  b.refuse_unless("optim", "adamw_torch",
                  "ztrain's optimizer is AdamW (adamw_torch's arithmetic); remove optim");
  const std::int64_t seed = y.integer("seed", 42);
  b.put("train", "seed", seed, "seed");
  b.put("data", "seed", seed, "seed");
  b.put("comm", "timeout", static_cast<double>(y.integer("ddp_timeout", 1800)), "ddp_timeout");
  if (const std::string r = y.text("resume_from_checkpoint", ""); !r.empty())
    b.put("train", "resume", r, "resume_from_checkpoint");
}

void output_keys(Builder& b) {
  YamlMapping& y = b.yaml();
  const std::string out = y.text("output_dir", "");
  if (out.empty())
    throw ConfigError(y.where("output_dir") + " is not given: name the run's directory");
  b.put("train", "out_dir", out, "output_dir");
  b.put("train", "log_every", y.integer("logging_steps", 500), "logging_steps");
  const std::string save = y.text("save_strategy", "steps");
  if (save != "steps" && save != "no")
    throw ConfigError(y.where("save_strategy") + " is " + save +
                      ": ztrain checkpoints every save_steps steps (steps) or not at all (no)");
  b.put("train", "checkpoint_every", save == "no" ? 0 : y.integer("save_steps", 500),
        save == "no" ? "save_strategy" : "save_steps");
  // Unset, transformers keeps every checkpoint.
  b.put("train", "keep_last", y.integer("save_total_limit", 0), "save_total_limit");
  b.note("plot_loss", "`ztrain report OUTPUT_DIR` draws the loss and every other curve");
  b.note("overwrite_output_dir",
         "ztrain replaces an earlier run in output_dir only when given --overwrite");
  b.note("save_only_model",
         "ztrain's checkpoints hold the optimizer state (so they resume), and the run's end "
         "writes the model alone beside them");
  const std::vector<std::string> report = names(y, "report_to");
  for (const std::string& r : report)
    if (r != "none" && r != "tensorboard")
      throw ConfigError(y.where("report_to") + " names " + r +
                        ": ztrain writes metrics.jsonl and, with report_to tensorboard, "
                        "TensorBoard's files; remove " +
                        r);
  if (std::find(report.begin(), report.end(), "tensorboard") != report.end())
    b.put("train", "tensorboard", true, "report_to");
}

void eval_keys(Builder& b) {
  YamlMapping& y = b.yaml();
  const std::string strategy = y.text("eval_strategy", "no");
  if (strategy != "no" && strategy != "steps")
    throw ConfigError(y.where("eval_strategy") + " is " + strategy +
                      ": ztrain evaluates every eval_steps steps (steps) or not (no)");
  const std::int64_t every =
      strategy == "no" ? 0 : y.integer("eval_steps", y.integer("logging_steps", 500));
  b.put("train", "eval_every", every, strategy == "no" ? "eval_strategy" : "eval_steps");
  b.note("per_device_eval_batch_size",
         "ztrain evaluates in the training's batch shape ([train] eval_batches of them)");
}

}  // namespace

LlamaFactoryImport import_llamafactory(const fs::path& yaml_file) {
  const std::string name = yaml_file.string();
  YamlMapping y(load_yaml(yaml_file, "LLaMA-Factory YAML"), "", name, "LLaMA-Factory");
  LlamaFactoryImport out;
  Builder b(out.run, y, name);
  model_keys(b, out);
  method_keys(b);
  dataset_keys(b);
  train_keys(b);
  output_keys(b);
  eval_keys(b);
  y.finish();
  return out;
}

}  // namespace ztrain
