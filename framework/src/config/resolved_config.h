// Every key of a run, defaults included: what it will run with.
//
// A run file names only what it changes; the rest are defaults of the host
// and of the plugins it picks. resolved_config validates every section
// against the host's and the chosen plugins' options and writes them all
// as TOML, each given value followed by where it came from ("# --set ...",
// "# run.toml:12:7") and each default as a comment, so that read back it
// gives the run exactly the keys it was given. The run writes it to
// out_dir/config.toml, `ztrain config` prints it, and it is itself a run
// file that reproduces the run.
//
// Errors: as validation (ConfigError, PluginError).
// Thread safety: pure; loads plugins through `loader`.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "loader/plugin_loader.h"

namespace ztrain {

struct ResolvedConfig {
  std::string toml;
  // The same keys as values: ("section.key", its TOML text; empty when
  // unset), plugins as "section.plugin". A checkpoint records them.
  std::vector<std::pair<std::string, std::string>> keys;
};

ResolvedConfig resolve_config(const RunConfig& config, const PluginLoader& loader);

}  // namespace ztrain
