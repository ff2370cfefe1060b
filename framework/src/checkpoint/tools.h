// What `ztrain checkpoint info` and `ztrain export CHECKPOINT` do with a
// checkpoint outside a run.
//
// checkpoint_info prints the step, the writing run's world size, strategy
// and precision, the model and its parameter count, then reads every
// block of state and checks its checksum. export_checkpoint writes the
// master weights with Hugging Face names (ztrain/weights.h's layout),
// reading one parameter at a time from the rank files: no rank, no
// strategy and no optimizer state in memory. The model is rebuilt from the
// configuration the manifest records, through the plugins `loader` finds.
// Both open the checkpoint with Checkpoint::open: a run still training in
// that directory does not prune it while they read.
//
// Errors: DataError for a missing or corrupt checkpoint (naming the file
// and range); ConfigError for an export onto an existing file without
// `overwrite`.
// Thread safety: single-threaded tools.
#pragma once

#include <filesystem>
#include <ostream>

#include "loader/plugin_loader.h"
#include "ztrain/dtype.h"

namespace ztrain {

// Returns false when a checksum fails (after printing which).
bool checkpoint_info(const std::filesystem::path& path, const PluginLoader& loader,
                     std::ostream& os);
// Returns the checkpoint directory it read (the one `latest` named, for a
// run directory).
std::filesystem::path export_checkpoint(const std::filesystem::path& path,
                                        const std::filesystem::path& out, DType dtype,
                                        bool overwrite, const PluginLoader& loader);
// Whether `path` names a checkpoint (or a run directory with `latest`).
bool is_checkpoint(const std::filesystem::path& path);

}  // namespace ztrain
