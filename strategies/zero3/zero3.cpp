// zero3 (ZeRO stage 3): parameters, gradients and optimizer state all
// sharded 1/N. Each module's parameters are all-gathered before it runs
// (prefetched along the first step's trace) and released after; gradients
// are reduce-scattered in buckets during backward as in zero2; the optimizer
// steps the shard in place. 3 psi (N-1)/N elements sent per step: parameters
// gathered for forward and again for backward, gradients reduce-scattered.
#include "ztrain/shard/bucket_options.h"
#include "ztrain/shard/param_gatherer.h"
#include "ztrain/shard/zero_strategy.h"

namespace {

using namespace ztrain;

class Zero3 final : public shard::ZeroStrategy {
 public:
  explicit Zero3(const Options& o) : ZeroStrategy(design(o)) {}
  static void declare_options(OptionList& o) {
    shard::declare_bucket_options(o, 3);
    shard::declare_gather_options(o);
  }

 private:
  static shard::ZeroDesign design(const Options& o) {
    shard::ZeroDesign d;
    d.name = "zero3";
    d.shard_params = true;
    d.gather = shard::gather_options(o);
    d.reduce = shard::ReducePolicy::shard_during_backward;
    d.reduce_settings = shard::bucket_settings(o, d.name);
    return d;
  }
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "zero3", "0.1.0",
              "ZeRO stage 3: parameters, gradients and optimizer state sharded 1/N; each "
              "module's parameters gathered before use and released after",
              Zero3)
