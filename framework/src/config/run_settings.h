// RunSettings: the host's own sections of the run file ([train],
// [train.fp16], [device], [comm], [parallel], and [data] seed), validated and with the
// batch identity resolved for a world size.
//
// Batch identity: global_batch_size = micro_batch_size * grad_accum * world.
// Any two given, the third is derived; all three given must agree; none
// given means micro_batch_size 8, grad_accum 1. A contradiction is a
// ConfigError before anything runs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "config/config.h"
#include "config/lr_schedule.h"
#include "ztrain/dtype.h"
#include "ztrain/options.h"
#include "ztrain/sequence/split.h"
#include "ztrain/strategy.h"

namespace ztrain {

// [train.fp16]: the loss scaler's settings, with DeepSpeed's meaning
// (train/loss_scaler.h).
struct LossScalerSettings {
  double loss_scale = 0;  // 0: dynamic
  std::int64_t initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
};

// Text sampled from the model during training ([train] sample_*), as
// llm.c prints samples: every `every` steps, `tokens` tokens continuing
// `prompt` (after the data's document-start token).
struct SampleSettings {
  std::int64_t every = 0;  // 0: never
  std::string prompt;
  int tokens = 64;
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: every token
};

struct TrainSettings {
  std::int64_t steps = 0;
  // [train] epochs where it decides the length (0: steps does): steps_from_epochs
  // sets steps and the schedule once the data's size is known.
  double epochs = 0;
  std::int64_t micro_batch = 0;
  std::int64_t grad_accum = 0;
  std::int64_t global_batch = 0;
  LrSchedule schedule;
  OptimizerSettings optimizer;
  double grad_clip = 0;
  DType precision = DType::f32;
  DType grad_dtype = DType::f32;        // grad_accum_dtype, resolved
  DType activation_dtype = DType::f32;  // activation_dtype, resolved
  std::uint64_t seed = 0;
  std::int64_t log_every = 0, print_every = 0, eval_every = 0, eval_batches = 0;
  SampleSettings sample;
  std::filesystem::path out_dir;
  bool save_final = true;
  std::int64_t checkpoint_every = 0;      // 0: only on a stop request
  std::int64_t keep_last = 2;             // 0: all
  std::string checkpoint_write = "auto";  // "auto", "background", "in_step"
  std::string resume;                     // empty: start fresh; "latest", or a path
  std::filesystem::path export_to;        // empty: none
  std::filesystem::path tensorboard_dir;  // empty: no TensorBoard files
  DType export_dtype = DType::f32;
  // The loss scaler: [train.fp16] when precision is fp16, else static 1.
  LossScalerSettings scaler;
};

struct DeviceSettings {
  std::string kind;        // cpu or cuda ("auto" resolved)
  std::string kind_where;  // where the kind was set, for errors about it
  std::optional<std::uint64_t> memory_limit;
  int threads = 0;
  bool tf32 = false;
  bool pin_memory = true;
  bool guard = false;               // cpu: the device tier page-protected between uses
  std::string bind_cores = "auto";  // auto, on or off (job/core_share.h)
};

struct CommSettings {
  std::string backend;
  double timeout_s = 0;
  bool shared_memory = true;  // collectives through shm_communicator.h on one host
};

// [parallel]: the device mesh's degrees (job/mesh_plan.h); the data
// degree is what they leave of the world. Sequence (Ulysses), context
// (ring attention) and tensor run; every other degree above 1 is refused
// naming its key: those dimensions are being built.
struct ParallelSettings {
  int tensor = 1;
  int sequence = 1;
  int context = 1;
  int pipeline = 1;
  int expert = 1;
  // Megatron's sequence parallelism inside the tensor group.
  bool tensor_sequence = false;
  // Pipeline parallelism: the schedule (a built-in one's name), the model
  // chunks each stage holds (interleaving) and how modules are weighed
  // into stages (pipeline/stage_partition.h).
  std::string pipeline_schedule = "1f1b";
  int pipeline_chunks = 1;
  std::string pipeline_partition = "parameters";
  // The ranks one copy of the data-parallel model spans.
  int model_ranks() const { return tensor * sequence * context * pipeline; }
  // How each sequence is split across ranks: sequence (Ulysses) and
  // context (ring attention).
  SequenceSplit split() const { return {sequence, context}; }
  // The [parallel] key a message about the split names: context when the
  // ring splits, else sequence.
  std::string split_key() const { return context > 1 ? "context" : "sequence"; }
};

struct RunSettings {
  TrainSettings train;
  DeviceSettings device;
  CommSettings comm;
  ParallelSettings parallel;
};

OptionList train_options();
// "fp32" | "bf16" | "fp16" -> DType (ConfigError naming `where` otherwise).
DType parse_precision(const std::string& name, const std::string& where);
// The config's name of a precision: "fp32", "bf16" or "fp16".
const char* precision_label(DType t);
OptionList device_options();
OptionList comm_options();
OptionList parallel_options();

// [comm] alone: the communicator is needed before the world size is known.
CommSettings resolve_comm(const RunConfig& config);
// [train] out_dir alone: the run's directory is locked before the run is
// assembled.
std::filesystem::path resolve_out_dir(const RunConfig& config);
RunSettings resolve_settings(const RunConfig& config, int world);
// With [train] epochs: the steps that pass `sequences` training sequences
// (the data source's count; unset: endless, a ConfigError) that many
// times at the global batch, rounded up, and the schedule over them; the
// line the run prints saying so.
std::string steps_from_epochs(RunSettings& s, const RunConfig& config,
                              std::optional<std::uint64_t> sequences);
ParallelSettings resolve_parallel(const RunConfig& config);

}  // namespace ztrain
