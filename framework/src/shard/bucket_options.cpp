#include "ztrain/shard/bucket_options.h"

#include "ztrain/error.h"

namespace ztrain::shard {

void declare_bucket_options(OptionList& o, int stage) {
  if (stage == 1)
    o.flag("overlap_comm", false,
           "two gradient buckets in flight while reducing after backward (false: one at a time)");
  else if (stage == 0)
    o.flag("overlap_comm", true,
           "reduce gradient buckets while backward runs (false: all at the end of backward)");
  else
    o.flag("overlap_comm", true,
           "reduce each gradient bucket while the next module's backward runs (false: wait for "
           "each at once)");
  o.flag("contiguous_gradients", true,
         "gradients are copied into contiguous buckets (always so here; false is refused)");
  o.integer("reduce_bucket_size", 1000000,
            "elements per gradient bucket; buckets also end at module boundaries, and the first "
            "holds at most 256K so communication starts early (DeepSpeed's code defaults to 5e8, "
            "which holds every gradient of a small model at once)")
      .at_least(1);
  if (stage == 1 || stage == 2)
    o.integer("allgather_bucket_size", 500000000,
              "elements per all-gather of the updated parameters")
        .at_least(1);
}

ReduceSettings bucket_settings(const Options& o, const std::string& strategy) {
  if (!o.get_bool("contiguous_gradients"))
    throw ConfigError(o.where("contiguous_gradients") +
                      ": [strategy] contiguous_gradients = false: " + strategy +
                      "'s gradient buckets are always contiguous buffers; remove the key");
  return {static_cast<std::uint64_t>(o.get_int("reduce_bucket_size")), 1u << 18,
          o.get_bool("overlap_comm")};
}

std::uint64_t allgather_bucket_size(const Options& o) {
  return static_cast<std::uint64_t>(o.get_int("allgather_bucket_size"));
}

}  // namespace ztrain::shard
