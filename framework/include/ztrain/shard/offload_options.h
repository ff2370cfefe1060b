// The parameter-offload options the offload strategies share, with
// DeepSpeed's names: offload_param.device ("cpu" keeps a stage-3 rank's
// parameter shard in host memory; "none" on the device) and
// offload_param.pin_memory. Declared and read in one place so cpu_offload
// and nvme_offload accept and refuse the same values.
//
// Errors: offload_param_tier raises ConfigError naming the key for
// "nvme", which DeepSpeed's configs may ask for and ztrain does not offer
// yet, saying to use "cpu".
// Thread safety: pure functions.
#pragma once

#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/options.h"

namespace ztrain::shard {

ZTRAIN_API void declare_offload_param_options(OptionList& o);
// Where the parameter shards live: Tier::host for "cpu", Tier::device for
// "none".
ZTRAIN_API Tier offload_param_tier(const Options& o);

}  // namespace ztrain::shard
