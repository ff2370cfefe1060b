// Hugging Face Accelerate's config file (what `accelerate config` writes,
// default_config.yaml) onto a run, as `accelerate launch` would run it.
//
// distributed_type picks the strategy: NO and MULTI_CPU/MULTI_GPU are ddp
// (MULTI_GPU on the GPUs, unless use_cpu), DEEPSPEED is its deepspeed_config
// (zero_stage and the offload devices, or deepspeed_config_file, read as
// --deepspeed reads a file), FSDP its fsdp_sharding_strategy (FULL_SHARD
// zero3, SHARD_GRAD_OP zero2, NO_SHARD ddp; HYBRID_* on one machine are
// those), fsdp_offload_params cpu_offload. mixed_precision is the run's
// precision; num_processes the ranks this machine starts. What ztrain does
// not do (several machines from one file, fp8, XLA, Megatron-LM, a GPU
// list) is refused naming the key with file:line:col; keys that change
// nothing here are warnings saying why; an unknown key is an error.
//
// Errors: ConfigError. Thread safety: pure functions.
#pragma once

#include <filesystem>

#include "config/config.h"
#include "config/deepspeed_import.h"

namespace ztrain {

// The run's [train], [strategy] and [device] values from the file, with
// origins and notes as import_deepspeed gives them.
ImportedConfig import_accelerate(const std::filesystem::path& yaml_file, const RunConfig& run);

// The ranks `accelerate launch` would start on this machine (1 for NO).
int accelerate_processes(const std::filesystem::path& yaml_file);

}  // namespace ztrain
