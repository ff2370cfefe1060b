// hybrid_shard: ZeRO-3 within groups, replicas across them (PyTorch FSDP's
// HYBRID_SHARD). Parameters, gradients and AdamW state are sharded over
// groups of shard_group_size consecutive ranks, and each of the
// world / shard_group_size groups holds a whole copy. Collectives that run
// every micro-step (gathers, gradient reduce-scatters) stay within a group,
// which on a cluster is one node's fast links; only the once-per-step
// average of each gradient shard crosses between groups. Memory per rank
// is that of zero3 at a world of shard_group_size.
//
// An example of a strategy written outside ztrain against its installed
// SDK: the mechanism (sub-communicators, the average across groups, each
// copy saving its part of a checkpoint) is the shard toolkit's
// ZeroStrategy; this file only chooses the design.
#include <ztrain/plugin.h>
#include <ztrain/shard/bucket_options.h>
#include <ztrain/shard/param_gatherer.h>
#include <ztrain/shard/zero_strategy.h>

namespace {

using namespace ztrain;

class HybridShard final : public shard::ZeroStrategy {
 public:
  explicit HybridShard(const Options& o) : ZeroStrategy(design(o)) {}
  static void declare_options(OptionList& o) {
    o.integer("shard_group_size", 0,
              "ranks that shard one copy of the state (a divisor of the world size, such as "
              "the ranks of one node); 0: every rank, which is zero3")
        .at_least(0);
    shard::declare_bucket_options(o, 3);
    shard::declare_gather_options(o);
  }

 private:
  static shard::ZeroDesign design(const Options& o) {
    shard::ZeroDesign d;
    d.name = "hybrid_shard";
    d.shard_params = true;
    d.shard_group_size = static_cast<int>(o.get_int("shard_group_size"));
    d.gather = shard::gather_options(o);
    d.reduce = shard::ReducePolicy::shard_during_backward;
    d.reduce_settings = shard::bucket_settings(o, d.name);
    return d;
  }
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "hybrid_shard", "0.1.0",
              "ZeRO-3 within groups of shard_group_size ranks, a whole copy of the state per "
              "group (FSDP's HYBRID_SHARD): only the per-step gradient average crosses groups",
              HybridShard)
