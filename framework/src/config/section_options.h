// The options of each run-file section, validated: the host's keys of a
// section together with its plugin's declared options.
//
// The run, `estimate` and `config` all validate a run file through these,
// so each accepts and refuses the same keys.
//
// Errors: ConfigError for a key the section does not accept or a value out
// of range; PluginError when a plugin declares a key the host reserves.
// Thread safety: pure functions.
#pragma once

#include <string>

#include "config/config.h"
#include "loader/plugin_loader.h"
#include "ztrain/options.h"

namespace ztrain {

// Keys of [model] and [data] the host reads itself.
OptionList model_host_options();
OptionList data_host_options();
// The plugin's options plus the host's keys of the same section.
Options plugin_options(const RunConfig& config, const std::string& section,
                       const LoadedPlugin& plugin, const OptionList& host_keys);

}  // namespace ztrain
