// cpu_offload (ZeRO-Offload): a ZeRO stage whose optimizer state (fp32
// masters, m, v) and fp32 gradient shards live in host memory and are
// stepped there by the CPU AdamW; with stage 3 and offload_param the
// parameter shards live there too and are gathered per module onto the
// device. offload_optimizer.ratio keeps part of the optimizer shard on the
// device (DeepSpeed's partial offload); "auto" picks the smallest share that
// fits [device] memory_limit, then offloads the parameters if it must.
// Options and defaults are DeepSpeed's (zero_optimization.offload_optimizer
// and offload_param).
#include <cmath>
#include <string>

#include "ztrain/error.h"
#include "ztrain/shard/bucket_options.h"
#include "ztrain/shard/offload_options.h"
#include "ztrain/shard/param_gatherer.h"
#include "ztrain/shard/zero_strategy.h"
#include "ztrain/units.h"

namespace {

using namespace ztrain;

class CpuOffload final : public shard::ZeroStrategy {
 public:
  explicit CpuOffload(const Options& o)
      : ZeroStrategy(make_design(o)),
        auto_ratio_(o.keyword("offload_optimizer.ratio").has_value()) {}

  static void declare_options(OptionList& o) {
    o.integer("stage", 2,
              "ZeRO stage: 1 shards the optimizer state, 2 also the gradients, 3 also the "
              "parameters")
        .at_least(1)
        .at_most(3);
    shard::declare_bucket_options(o, 2);
    shard::declare_gather_options(o);
    o.string("offload_optimizer.device", "cpu",
             "where optimizer state and fp32 gradient shards live: \"cpu\" (host memory) or "
             "\"none\" (the device); for \"nvme\" use the nvme_offload strategy")
        .one_of({"cpu", "none", "nvme"});
    o.flag("offload_optimizer.pin_memory", false,
           "page-locked host buffers for faster copies (no effect on the cpu device)");
    o.number("offload_optimizer.ratio", 1.0,
             "share of the optimizer shard in host memory, the rest on the device; \"auto\": the "
             "smallest share with which the run fits [device] memory_limit")
        .at_least(0)
        .at_most(1)
        .one_of({"auto"});
    shard::declare_offload_param_options(o);
  }

 private:
  static shard::ZeroDesign make_design(const Options& o) {
    const auto stage = o.get_int("stage");
    check_nvme(o);
    check_stage_keys(o, stage);
    shard::ZeroDesign d;
    d.name = "cpu_offload";
    d.shard_params = stage == 3;
    d.param_tier = shard::offload_param_tier(o);
    d.gather = shard::gather_options(o);
    d.allgather_bucket = shard::allgather_bucket_size(o);
    d.reduce = stage == 1 ? shard::ReducePolicy::shard_after_backward
                          : shard::ReducePolicy::shard_during_backward;
    d.reduce_settings = shard::bucket_settings(o, d.name);
    const bool offload = o.get_string("offload_optimizer.device") == "cpu";
    d.optimizer.offload = offload ? Tier::host : Tier::device;
    d.optimizer.offload_ratio =
        o.keyword("offload_optimizer.ratio") ? 1.0 : o.get_number("offload_optimizer.ratio");
    return d;
  }

  // DeepSpeed's configs may name "nvme" here: say where that lives instead
  // of suggesting the nearest spelling.
  static void check_nvme(const Options& o) {
    for (const char* key : {"offload_optimizer.device", "offload_param.device"})
      if (o.get_string(key) == "nvme")
        throw ConfigError(o.where(key) + ": [strategy] " + key +
                          " = \"nvme\" is the nvme_offload strategy's: run with --strategy "
                          "zero3_nvme");
  }

  // Keys of another stage are errors, not silently ignored.
  static void check_stage_keys(const Options& o, std::int64_t stage) {
    const auto refuse = [&](const char* key, const std::string& why) {
      if (o.given(key))
        throw ConfigError(o.where(key) + ": [strategy] " + key + " " + why + ", but stage is " +
                          std::to_string(stage) + " (" + o.where("stage") + ")");
    };
    if (stage < 3) {
      for (const char* key : {"prefetch_bucket_size", "max_live_parameters",
                              "param_persistence_threshold", "max_reuse_distance"})
        refuse(key, "applies to stage 3, where parameters are gathered");
      if (o.get_string("offload_param.device") == "cpu")
        refuse("offload_param.device", "= \"cpu\" needs stage 3 (sharded parameters)");
    } else {
      refuse("allgather_bucket_size", "applies to stages 1 and 2, which all-gather parameters");
    }
  }

  // ratio "auto": the smallest share of the optimizer (in 1/32 steps) with
  // which the device tier's estimate fits the budget, then parameters on
  // the host if even all of the optimizer does not suffice.
  shard::ZeroDesign resolve(const EstimateArgs& a) const override {
    shard::ZeroDesign d = design();
    if (!auto_ratio_ || d.optimizer.offload == Tier::device) return d;
    if (!a.device_budget) {
      d.note = "ratio auto without [device] memory_limit: everything offloaded";
      return d;
    }
    const std::uint64_t budget = *a.device_budget;
    for (int k = 0; k <= 32; ++k) {
      d.optimizer.offload_ratio = k / 32.0;
      if (shard::device_bytes(d, a) <= budget) return noted(d, a, budget, "");
    }
    if (d.shard_params && d.param_tier == Tier::device) {
      d.param_tier = Tier::host;
      if (shard::device_bytes(d, a) <= budget)
        return noted(d, a, budget, ", and the parameter shards too");
    }
    d.note = "ratio auto: even with everything offloaded the device tier needs " +
             format_bytes(shard::device_bytes(d, a)) + " of its " + format_bytes(budget) +
             " budget";
    return d;
  }

  static shard::ZeroDesign noted(shard::ZeroDesign d, const EstimateArgs& a, std::uint64_t budget,
                                 const std::string& more) {
    d.note = "ratio auto: the smallest offload that fits the device tier's " +
             format_bytes(budget) + " budget" + more + "; it needs " +
             format_bytes(shard::device_bytes(d, a)) + " there";
    return d;
  }

  bool auto_ratio_;
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "cpu_offload", "0.1.0",
              "ZeRO-Offload: a ZeRO stage (1-3) with optimizer state and gradient shards in host "
              "memory, stepped by the CPU AdamW; stage 3 can keep parameter shards there too",
              CpuOffload)
