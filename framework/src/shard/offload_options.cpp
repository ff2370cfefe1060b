#include "ztrain/shard/offload_options.h"

#include <string>

#include "ztrain/error.h"

namespace ztrain::shard {

void declare_offload_param_options(OptionList& o) {
  // "nvme" is accepted here so that offload_param_tier, not a spelling
  // suggestion, answers it.
  o.string("offload_param.device", "none",
           "stage 3: \"cpu\" keeps the parameter shards in host memory, gathered per module "
           "(\"nvme\" is not offered yet)")
      .one_of({"cpu", "none", "nvme"});
  o.flag("offload_param.pin_memory", false,
         "page-locked host buffers for faster copies (no effect on the cpu device)");
}

Tier offload_param_tier(const Options& o) {
  const std::string device = o.get_string("offload_param.device");
  if (device == "nvme")
    throw ConfigError(o.where("offload_param.device") +
                      ": [strategy] offload_param.device = \"nvme\": parameter shards in swap "
                      "files are not offered yet; use \"cpu\" to keep them in host memory");
  return device == "cpu" ? Tier::host : Tier::device;
}

}  // namespace ztrain::shard
