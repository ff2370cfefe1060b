#include "job/cpu_affinity.h"

#include <sched.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

namespace ztrain {
namespace {

// A CPU set sized for `cpus` CPUs, freed on scope exit.
struct CpuSet {
  explicit CpuSet(int cpus) : size(CPU_ALLOC_SIZE(cpus)), set(CPU_ALLOC(cpus), &free_set) {
    CPU_ZERO_S(size, set.get());
  }
  static void free_set(cpu_set_t* s) { CPU_FREE(s); }
  std::size_t size;
  std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> set;
};

// One integer from a sysfs file, `fallback` where there is none.
int sysfs_int(const std::string& path, int fallback) {
  std::ifstream in(path);
  int value = 0;
  return in >> value ? value : fallback;
}

}  // namespace

std::vector<CpuSlot> allowed_cpus() {
  // The kernel refuses a set smaller than its own CPU count (EINVAL):
  // grow until it fits.
  for (int cpus = 1024; cpus <= (1 << 20); cpus *= 2) {
    CpuSet s(cpus);
    if (sched_getaffinity(0, s.size, s.set.get()) != 0) {
      if (errno == EINVAL) continue;
      return {};
    }
    std::vector<CpuSlot> slots;
    for (int cpu = 0; cpu < cpus; ++cpu) {
      if (!CPU_ISSET_S(cpu, s.size, s.set.get())) continue;
      const std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
      slots.push_back(
          {cpu, sysfs_int(topo + "physical_package_id", 0), sysfs_int(topo + "core_id", cpu)});
    }
    return slots;
  }
  return {};
}

std::string bind_process(const std::vector<int>& cpus) {
  const int top = *std::max_element(cpus.begin(), cpus.end());
  CpuSet s(std::max(1024, top + 1));
  for (int cpu : cpus) CPU_SET_S(static_cast<std::size_t>(cpu), s.size, s.set.get());
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    // A thread that ended since the listing (ESRCH) needs no binding.
    if (sched_setaffinity(tid, s.size, s.set.get()) != 0 && errno != ESRCH)
      return "binding thread " + std::to_string(tid) + " to CPUs " + cpu_list_text(cpus) +
             " failed: " + std::strerror(errno);
  }
  if (ec) return "listing /proc/self/task failed: " + ec.message();
  return "";
}

std::string cpu_list_text(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  std::string text;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    text += (text.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) text += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace ztrain
