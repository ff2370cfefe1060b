// zero2 (ZeRO stage 2): full parameters on every rank; gradients exist whole
// only in bucket buffers while backward fills them, then are
// reduce-scattered so each rank keeps the averaged gradients of its own
// shard, whose optimizer state it holds; the stepped shards are
// all-gathered. 2 psi (N-1)/N elements sent per step; gradients psi/N
// elements plus the buckets in flight.
#include "ztrain/shard/bucket_options.h"
#include "ztrain/shard/zero_strategy.h"

namespace {

using namespace ztrain;

class Zero2 final : public shard::ZeroStrategy {
 public:
  explicit Zero2(const Options& o) : ZeroStrategy(design(o)) {}
  static void declare_options(OptionList& o) { shard::declare_bucket_options(o, 2); }

 private:
  static shard::ZeroDesign design(const Options& o) {
    shard::ZeroDesign d;
    d.name = "zero2";
    d.allgather_bucket = shard::allgather_bucket_size(o);
    d.reduce = shard::ReducePolicy::shard_during_backward;
    d.reduce_settings = shard::bucket_settings(o, d.name);
    return d;
  }
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "zero2", "0.1.0",
              "ZeRO stage 2: optimizer state and gradients sharded 1/N; gradient buckets "
              "reduce-scattered during backward",
              Zero2)
