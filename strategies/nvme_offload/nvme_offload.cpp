// nvme_offload (ZeRO-Infinity): ZeRO-3 whose optimizer state (fp32 masters,
// m, v) lives in per-rank swap files under offload_optimizer.nvme_path and
// is stepped sub_group_size elements at a time through buffer_count host
// buffers (the next sub-groups read while one is stepped and the last
// written back); the fp32 gradient shard stays in host memory. The
// parameter shards stay on the device, or with offload_param.device =
// "cpu" in host memory, or with "nvme" in per-rank swap files under
// offload_param.nvme_path, read for each gather. Options and defaults are
// DeepSpeed's (offload_optimizer, offload_param, sub_group_size, aio);
// sub_group_size "auto" sizes the sub-groups to the shard and to this
// machine's RAM (the zero3_nvme preset's choice).
#include "ztrain/shard/aio.h"
#include "ztrain/shard/bucket_options.h"
#include "ztrain/shard/offload_options.h"
#include "ztrain/shard/param_gatherer.h"
#include "ztrain/shard/zero_strategy.h"
#include "ztrain/units.h"

namespace {

using namespace ztrain;

class NvmeOffload final : public shard::ZeroStrategy {
 public:
  explicit NvmeOffload(const Options& o)
      : ZeroStrategy(make_design(o)), auto_sub_group_(o.keyword("sub_group_size").has_value()) {}

  static void declare_options(OptionList& o) {
    shard::declare_bucket_options(o, 3);
    shard::declare_gather_options(o);
    o.string("offload_optimizer.device", "nvme",
             "where the optimizer state lives: \"nvme\" (swap files under nvme_path)")
        .one_of({"nvme"});
    o.string("offload_optimizer.nvme_path", "/local_nvme",
             "directory on a local NVMe drive for the per-rank swap files (removed at exit)");
    o.integer("offload_optimizer.buffer_count", 4,
              "host buffers the optimizer's sub-groups stream through (1: read, step and write "
              "each in turn)")
        .at_least(1);
    o.flag("offload_optimizer.pin_memory", false,
           "page-locked host buffers for faster copies (no effect on the cpu device)");
    o.integer("sub_group_size", 1000000000,
              "elements of optimizer state stepped at a time; \"auto\": a sixteenth of the "
              "rank's shard, within 2^22 to 1e9 elements and an eighth of the rank's RAM for the "
              "buffers")
        .at_least(1)
        .one_of({"auto"});
    shard::declare_offload_param_options(o);
    shard::declare_aio_options(o);
  }

 private:
  static shard::ZeroDesign make_design(const Options& o) {
    shard::ZeroDesign d;
    d.name = "nvme_offload";
    d.shard_params = true;
    d.param_tier = shard::offload_param_tier(o);
    d.param_swap_dir = shard::offload_param_path(o);
    d.gather = shard::gather_options(o);
    shard::offload_param_buffers(o, d.gather);
    d.reduce = shard::ReducePolicy::shard_during_backward;
    d.reduce_settings = shard::bucket_settings(o, d.name);
    d.optimizer.offload = Tier::nvme;
    d.optimizer.offload_ratio = 1;
    d.swap.dir = o.get_string("offload_optimizer.nvme_path");
    if (!o.keyword("sub_group_size"))
      d.swap.sub_group_size = static_cast<std::uint64_t>(o.get_int("sub_group_size"));
    d.swap.buffer_count = static_cast<int>(o.get_int("offload_optimizer.buffer_count"));
    d.swap.aio = shard::aio_options(o);
    return d;
  }

  shard::ZeroDesign resolve(const EstimateArgs& a) const override {
    shard::ZeroDesign d = design();
    if (!auto_sub_group_) return d;
    d.swap.sub_group_size = shard::auto_sub_group(d, a);
    d.note = "sub_group_size auto, for a " +
             (a.host_budget ? format_bytes(*a.host_budget) + " share of this machine's RAM"
                            : std::string("machine of unknown RAM"));
    return d;
  }

  bool auto_sub_group_;
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "nvme_offload", "0.1.0",
              "ZeRO-Infinity: ZeRO-3 with the optimizer state in swap files on an NVMe drive, "
              "stepped sub-group by sub-group through host buffers",
              NvmeOffload)
