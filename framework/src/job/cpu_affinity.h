// The CPUs this process may run on, with the physical core and package of
// each (from sysfs), and binding every thread of the process to a set of
// them. job/core_share.h decides which set; this file only reads and
// writes what the kernel holds.
//
// Thread safety: allowed_cpus anywhere. bind_process changes the affinity
// of every thread the process has when it is called, and threads started
// later inherit it from their creators; a thread being created while it
// runs may keep the old set, so call it before the run starts its
// workers (the communicator's thread, made earlier, is among those it
// finds).
// Errors: none thrown. Where sysfs has no topology (some containers),
// each CPU counts as its own core of package 0; bind_process returns why
// the kernel refused a thread ("" when every thread took the set).
#pragma once

#include <string>
#include <vector>

namespace ztrain {

// One logical CPU: its number, and the package and core it belongs to
// (two CPUs with the same package and core are SMT siblings).
struct CpuSlot {
  int cpu = 0;
  int package = 0;
  int core = 0;
};

// This process's allowed CPUs (sched_getaffinity), by CPU number.
std::vector<CpuSlot> allowed_cpus();

// Binds every thread of this process to `cpus` (a nonempty set of CPU
// numbers). Returns "" on success, else the kernel's refusal with the
// CPUs named; threads already bound keep the new set.
std::string bind_process(const std::vector<int>& cpus);

// "0-3,8" for {0, 1, 2, 3, 8}: sorted runs, as the kernel's cpulist files
// write them.
std::string cpu_list_text(std::vector<int> cpus);

}  // namespace ztrain
