// Hugging Face Accelerate's config file (what `accelerate config` writes,
// default_config.yaml) onto a run, as `accelerate launch` would run it.
//
// distributed_type picks the strategy: NO and MULTI_CPU/MULTI_GPU are ddp
// (MULTI_GPU on the GPUs, unless use_cpu), DEEPSPEED is its deepspeed_config
// (zero_stage and the offload devices, or deepspeed_config_file, read as
// --deepspeed reads a file), FSDP its fsdp_sharding_strategy (FULL_SHARD
// zero3, SHARD_GRAD_OP zero2, NO_SHARD ddp; HYBRID_* on one machine are
// those), fsdp_offload_params cpu_offload. mixed_precision is the run's
// precision.
//
// The launch is accelerate launch's: num_processes ranks in all. On one
// machine they start here (for MULTI_CPU too, where accelerate launch
// itself starts one process and leaves the rest to an mpirun around it).
// On num_machines > 1, each machine runs ztrain with its own machine_rank
// and starts num_processes / num_machines ranks, numbered from
// machine_rank times that, meeting at main_process_ip:main_process_port
// (torchrun's static rendezvous, as accelerate launch runs torchrun);
// DEEPSPEED with a deepspeed_multinode_launcher other than "standard"
// instead starts every machine's ranks from machine 0 through
// deepspeed_hostfile and its inclusion or exclusion filter, as the
// deepspeed launcher would. What ztrain does not do (fp8, XLA, Megatron-LM,
// a GPU list) is refused naming the key with file:line:col; keys that
// change nothing here are warnings saying why; an unknown key is an error.
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

// How `accelerate launch` starts a file's ranks.
struct AccelerateLaunch {
  int processes = 1;     // num_processes: the ranks of the job (1 for NO)
  int machines = 1;      // num_machines
  int machine_rank = 0;  // this machine's place among them
  std::string main_ip;   // where the machines meet (machines > 1)
  int main_port = 29500;
  // DEEPSPEED's own multi-machine launch: a DeepSpeed hostfile (empty:
  // none) and one of its filters, read from machine 0.
  std::filesystem::path hostfile;
  std::string include, exclude;

  // The ranks each machine starts.
  int per_machine() const { return processes / machines; }
};
// Every check that would refuse the run at the file's world size is made
// here too, before any rank starts.
AccelerateLaunch accelerate_launch(const std::filesystem::path& yaml_file);

}  // namespace ztrain
