// The parameter-offload options the offload strategies share, with
// DeepSpeed's names: offload_param.device ("cpu" keeps a stage-3 rank's
// parameter shard in host memory, "nvme" in a swap file under
// offload_param.nvme_path, read through buffer_count host buffers of
// buffer_size elements, "none" on the device) and offload_param.pin_memory. Declared and read in
// one place so cpu_offload and nvme_offload accept the same keys (cpu_offload refuses "nvme", which
// needs the optimizer in swap files too).
//
// Thread safety: pure functions.
#pragma once

#include <filesystem>

#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/options.h"
#include "ztrain/shard/param_gatherer.h"

namespace ztrain::shard {

ZTRAIN_API void declare_offload_param_options(OptionList& o);
// Where the parameter shards live: Tier::host for "cpu", Tier::nvme for
// "nvme", Tier::device for "none".
ZTRAIN_API Tier offload_param_tier(const Options& o);
// offload_param.nvme_path.
ZTRAIN_API std::filesystem::path offload_param_path(const Options& o);
// offload_param.buffer_count and buffer_size, the host buffers a swapped
// shard's gathers read into, set in `gather`.
ZTRAIN_API void offload_param_buffers(const Options& o, GatherOptions& gather);

}  // namespace ztrain::shard
