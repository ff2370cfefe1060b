#include "ztrain/shard/bucket_options.h"

#include "ztrain/error.h"

namespace ztrain::shard {

void declare_bucket_options(OptionList& o, int stage) {
  if (stage == 1)
    o.flag("overlap_comm", false,
           "two gradient buckets in flight while reducing after backward (false: one at a time)");
  else
    o.flag("overlap_comm", true,
           "reduce each gradient bucket while the next module's backward runs (false: wait for "
           "each at once)");
  o.flag("contiguous_gradients", true,
         "gradients are copied into contiguous buckets (always so here; false is refused)");
  o.integer("reduce_bucket_size", 1000000,
            "elements per gradient bucket; buckets also end at module boundaries (DeepSpeed's "
            "code defaults to 5e8, which holds every gradient of a small model at once)")
      .at_least(1);
  if (stage < 3)
    o.integer("allgather_bucket_size", 500000000,
              "elements per all-gather of the updated parameters")
        .at_least(1);
}

ReduceSettings bucket_settings(const Options& o) {
  if (!o.get_bool("contiguous_gradients"))
    throw ConfigError(
        "[strategy] contiguous_gradients = false: ztrain's gradient buckets are always "
        "contiguous buffers; remove the key");
  return {static_cast<std::uint64_t>(o.get_int("reduce_bucket_size")), 1u << 18,
          o.get_bool("overlap_comm")};
}

std::uint64_t allgather_bucket_size(const Options& o) {
  return static_cast<std::uint64_t>(o.get_int("allgather_bucket_size"));
}

}  // namespace ztrain::shard
