// LLaMA-Factory's training YAML (what `llamafactory-cli train` reads) as a
// ztrain run: `ztrain --llamafactory train.yaml`.
//
// Each key becomes the run key that means what it means in LLaMA-Factory
// (and, for the Trainer's, in transformers' TrainingArguments), each
// value's origin the YAML key's place ("train.yaml:12:16:
// learning_rate"): model_name_or_path is [model] from (a local Hugging
// Face directory; a hub name is refused with the command that downloads
// it); stage sft is the `sft` data source with dataset, dataset_dir,
// cutoff_len (rows of cutoff_len - 1 positions), max_samples, val_size,
// train_on_prompt, mask_history and neat_packing; stage pt is its stage
// "pt" (documents packed into cutoff_len blocks unless packing is false,
// in preprocessing_num_workers shards of preprocessing_batch_size rows); finetuning_type and its
// lora_* and freeze_* keys are [model]'s; the batch, learning rate,
// epochs or max_steps, lr_scheduler_type (transformers' schedules,
// hf_*), warmup, precision, AdamW's and clipping's values, seed, output,
// logging, saving and evaluation keys are [train]'s; ddp_timeout is
// [comm] timeout; deepspeed names the DeepSpeed config read as --deepspeed
// reads it. What LLaMA-Factory and transformers default is set as they
// default it (finetuning_type lora, weight_decay 0, adam_beta2 0.999, the
// linear schedule, 8 sequences a device, seed 42, every checkpoint kept,
// gradient checkpointing on), so an absent key means what it means there.
//
// A key ztrain does not build is refused naming it and saying what to do;
// a key that changes nothing here (worker counts, plot_loss,
// trust_remote_code) is a note saying why; an unknown key is an error, so a
// typo is never a different run. `template`, `enable_thinking` and
// `tokenized_path` are
// [data]'s: the sft source encodes with LLaMA-Factory's named templates
// that ztrain builds (each held id for id to LLaMA-Factory's own code) and
// refuses the others at the YAML key's place; `--set data.template="auto"`
// (the model directory's own chat template) or a .jinja file replaces it.
//
// Errors: ConfigError as above, and for a file that is missing or not YAML.
// Thread safety: pure function of its argument and the file system.
#pragma once

#include <filesystem>

#include "config/deepspeed_import.h"

namespace ztrain {

struct LlamaFactoryImport {
  ImportedConfig run;               // [model], [data], [train], [comm] with origins
  std::filesystem::path deepspeed;  // the YAML's deepspeed config; empty: none
  std::string deepspeed_where;      // its key's place, for messages
};

LlamaFactoryImport import_llamafactory(const std::filesystem::path& yaml_file);

}  // namespace ztrain
