// The gradient and parameter bucket options every ZeRO stage takes, with
// DeepSpeed's names and meanings (sizes in elements), declared and read in
// one place so zero1, zero2, zero3 and third-party stages agree:
// overlap_comm, contiguous_gradients (always true here: false is refused),
// reduce_bucket_size and, for stages that all-gather updated parameters,
// allgather_bucket_size.
//
// Errors: bucket_settings raises ConfigError for contiguous_gradients = false.
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "ztrain/export.h"
#include "ztrain/options.h"
#include "ztrain/shard/shard_grad_reducer.h"

namespace ztrain::shard {

// stage: 1, 2 or 3. overlap_comm defaults as DeepSpeed's stages do (off
// for stage 1, on for 2 and 3); stage 1 reduces after backward, so there it
// only chooses two buckets in flight over one. Stages 1 and 2 all-gather
// the updated parameters and take allgather_bucket_size.
ZTRAIN_API void declare_bucket_options(OptionList& o, int stage);
ZTRAIN_API ReduceSettings bucket_settings(const Options& o);
ZTRAIN_API std::uint64_t allgather_bucket_size(const Options& o);

}  // namespace ztrain::shard
