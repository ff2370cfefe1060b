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
  o.integer("offload_param.buffer_count", 5,
            "\"nvme\": gathers that may hold a host buffer of parameters read from disk at "
            "once (prefetch waits for the oldest beyond it)")
      .at_least(1);
  o.integer("offload_param.buffer_size", 100000000,
            "\"nvme\": elements per such buffer; must hold a rank's part of the parameters one "
            "module gathers together")
      .at_least(1);
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

void offload_param_buffers(const Options& o, GatherOptions& gather) {
  gather.read_buffers = static_cast<std::uint64_t>(o.get_int("offload_param.buffer_count"));
  gather.read_buffer_size = static_cast<std::uint64_t>(o.get_int("offload_param.buffer_size"));
}

}  // namespace ztrain::shard
