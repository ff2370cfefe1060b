// The gradient and parameter bucket options every strategy takes, with
// DeepSpeed's names and meanings (sizes in elements), declared and read in
// one place so ddp, zero1-3, the offload strategies and third-party stages
// agree: overlap_comm, contiguous_gradients (always true here: false is
// refused), reduce_bucket_size and, for stages that all-gather updated
// parameters, allgather_bucket_size.
//
// Errors: bucket_settings raises ConfigError, naming the strategy, for
// contiguous_gradients = false.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "ztrain/export.h"
#include "ztrain/options.h"
#include "ztrain/shard/reduce_plan.h"

namespace ztrain::shard {

// stage: 0 (ddp), 1, 2 or 3. overlap_comm defaults as DeepSpeed's stages
// do (off for stage 1, on elsewhere); stage 1 reduces after backward, so
// there it only chooses two buckets in flight over one, and ddp without it
// reduces every bucket after backward. Stages 1 and 2 all-gather the
// updated parameters and take allgather_bucket_size.
ZTRAIN_API void declare_bucket_options(OptionList& o, int stage);
ZTRAIN_API ReduceSettings bucket_settings(const Options& o, const std::string& strategy);
ZTRAIN_API std::uint64_t allgather_bucket_size(const Options& o);

}  // namespace ztrain::shard
