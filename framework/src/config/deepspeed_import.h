// A DeepSpeed config (ds_config.json) read as ztrain options.
//
// `ztrain --deepspeed ds.json RUN.toml` trains the run under the strategy
// and training settings the DeepSpeed config describes: the batch keys,
// gradient clipping, fp16/bf16 (with the loss scaler's keys), ZeRO's stage,
// offload and bucket keys, aio and the optimizer's (and scheduler's)
// parameters become [train] keys and a [strategy] table (ddp, zero1-3,
// cpu_offload or nvme_offload); each value's origin is the DeepSpeed key
// it came from ("ds.json: zero_optimization.stage"), so ztrain's own
// checks name the key the user wrote. "auto" resolves as the Hugging Face
// Trainer resolves it: the batch keys, gradient clipping, precision and
// optimizer values are the run's; reduce_bucket_size is hidden²,
// stage3_prefetch_bucket_size 0.9·hidden², and
// stage3_param_persistence_threshold 10·hidden, with hidden the run's
// [model] n_embd; each resolution is a note the run prints. A DeepSpeed key
// ztrain has no counterpart for is an error naming it, a key that has no
// effect here a warning saying why, and contradictions (fp16 and bf16
// both enabled, offload_param below stage 3, NVMe offload below stage 3)
// errors naming both keys. Keys that are not DeepSpeed's are errors too.
//
// Errors: ConfigError as above, and for a file that is missing or not JSON.
// Thread safety: pure function of its arguments.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"

namespace ztrain {

struct ImportedConfig {
  toml::table train;     // [train] keys (fp16 nested)
  toml::table strategy;  // the whole [strategy] table
  toml::table device;    // [device] keys (Accelerate: kind)
  toml::table model;     // [model] keys (Accelerate's FSDP: checkpointing)
  toml::table parallel;  // [parallel] keys (sequence_parallel_size, autotp_size)
  toml::table data;      // [data] keys (LLaMA-Factory's datasets)
  toml::table comm;      // [comm] keys (LLaMA-Factory's ddp_timeout)
  // "train.grad_clip" -> "ds.json: gradient_clipping", for every key set.
  std::map<std::string, std::string> origins;
  std::vector<std::string> notes;     // what each "auto" became, what replaced the run's
  std::vector<std::string> warnings;  // keys with no effect here
  // The run's keys the imported scheduler leaves unread ("train.warmup_steps"
  // under WarmupDecayLR): removed from the run before the import lands.
  std::vector<std::string> superseded;
  // The run's keys an "auto" took its value from ("train.warmup_steps"): a
  // --set of one is what the auto read, not a key left unread.
  std::vector<std::string> consumed;
};

// `run`: the run file as loaded (its model, --set overrides), which "auto"
// takes its values from. A key of the run the import replaces is named in
// a note with both values; a run key the imported scheduler does not read
// is in `superseded`, with a note.
ImportedConfig import_deepspeed(const std::filesystem::path& json_file, const RunConfig& run);
// The same from a config's text; `name` labels its keys in messages.
ImportedConfig import_deepspeed_text(const std::string& text, const std::string& name,
                                     const RunConfig& run);

// The import's notes and warnings as TOML comments: what `ztrain
// convert-deepspeed` prints above the whole run it makes.
std::string imported_notes(const ImportedConfig& c, const std::filesystem::path& json_file);
// Those comments and the import alone as TOML ([train] and [strategy]).
std::string imported_toml(const ImportedConfig& c, const std::filesystem::path& json_file);

}  // namespace ztrain
