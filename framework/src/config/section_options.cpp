#include "config/section_options.h"

#include "ztrain/error.h"

namespace ztrain {

OptionList model_host_options() {
  OptionList o;
  o.optional_string("init_from",
                    "start from these weights (.safetensors with Hugging Face names, or "
                    "a directory holding model.safetensors)");
  o.optional_string("adapter_from",
                    "LoRA: start the adapters from this PEFT adapter directory "
                    "(adapter_config.json, adapter_model.safetensors; LLaMA-Factory's "
                    "adapter_name_or_path)");
  return o;
}

OptionList data_host_options() {
  OptionList o;
  o.integer("seed", 1234, "data seed: which sequences the run sees").at_least(0);
  return o;
}

Options plugin_options(const RunConfig& config, const std::string& section,
                       const LoadedPlugin& plugin, const OptionList& host_keys) {
  OptionList all;
  for (const auto& s : host_keys.specs()) all.add(s);
  for (const auto& s : plugin.options().specs()) {
    if (all.find(s.name))
      throw PluginError(plugin.file().string() + ": plugin '" + plugin.info().name +
                        "' declares option '" + s.name + "', which the host reserves in [" +
                        section + "]");
    all.add(s);
  }
  return config.validate(section, all, {"plugin"});
}

}  // namespace ztrain
