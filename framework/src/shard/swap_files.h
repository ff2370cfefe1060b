// The NVMe tier's swap files on disk: their names, and the sweep of those a
// killed run left behind.
//
// A swap file is named ztrain-swap@HOST@PID@NAME ('@' is in no host name
// and in none of ours), so a run can tell whose each file in nvme_path is.
// A run killed by SIGKILL (or a crash) cannot remove its files, which hold
// gigabytes; the next run in that directory removes those of processes of
// its host that no longer run, and names the others (live runs', other
// hosts') when the disk has no room. Files named ztrain-PID-NAME, as ztrain
// named them before, count as this host's.
//
// Internal to libztrain (hidden). Thread safety: a pure function of the directory;
// ranks sweeping one directory at once each remove what is still there.
#pragma once

#include <filesystem>
#include <string>

namespace ztrain::shard {

// This process's swap file for `name` ("rank0.optimizer").
std::string swap_file_name(const std::string& name);

struct SwapSweep {
  std::string removed;  // what was removed, as a note; empty: nothing
  std::string others;   // other runs' swap files still there, with sizes; empty: none
};

// Removes from `dir` the swap files of this host's processes that no longer
// run, and lists those of other runs.
SwapSweep sweep_swap_files(const std::filesystem::path& dir);

}  // namespace ztrain::shard
