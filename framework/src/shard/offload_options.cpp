#include "ztrain/shard/offload_options.h"

#include <string>

namespace ztrain::shard {

void declare_offload_param_options(OptionList& o) {
  o.string("offload_param.device", "none",
           "stage 3: where the parameter shards live between gathers: \"cpu\" (host memory), "
           "\"nvme\" (swap files under offload_param.nvme_path; nvme_offload only) or \"none\" "
           "(the device)")
      .one_of({"cpu", "none", "nvme"});
  o.string("offload_param.nvme_path", "/local_nvme",
           "directory on a local NVMe drive for the per-rank parameter swap files (removed at "
           "exit)");
  o.flag("offload_param.pin_memory", false,
         "page-locked host buffers for faster copies (no effect on the cpu device)");
}

Tier offload_param_tier(const Options& o) {
  const std::string device = o.get_string("offload_param.device");
  if (device == "nvme") return Tier::nvme;
  return device == "cpu" ? Tier::host : Tier::device;
}

std::filesystem::path offload_param_path(const Options& o) {
  return o.get_string("offload_param.nvme_path");
}

}  // namespace ztrain::shard
