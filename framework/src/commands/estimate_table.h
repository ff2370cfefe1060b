// `ztrain estimate --all`: sizing a run before renting the machines.
//
// For every strategy preset (configs/strategies/*.toml beside the run
// file, installed, or in the source tree) the run is estimated as
// `ztrain estimate` does, without allocating anything proportional to the
// model, with activation checkpointing off and on: bytes per device (model
// states by category, activations both ways), per host (host tier times
// the devices on a node) and on NVMe, and whether it fits a device of
// `device_memory` bytes, with the margin (or the shortfall); and the
// smallest sequence-parallel degree (one dividing a node's devices, the
// world, the heads and the sequence) at which it would, at the run's
// micro-batch.
//
// Errors: ConfigError for a run file or preset that does not load, and for
// a run that names its strategy (--strategy, --deepspeed).
// Thread safety: one call at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>

#include "train/trainer.h"

namespace ztrain {

struct SizingArgs {
  TrainArgs run;  // without a strategy or DeepSpeed config: every preset is tried
  int world = 1;
  int gpus_per_node = 1;
  std::optional<std::uint64_t> device_memory;  // none: [device] memory_limit, else unknown
};

void estimate_all(const SizingArgs& args, std::ostream& os);

}  // namespace ztrain
