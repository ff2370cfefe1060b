#include "core/hold_points.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

namespace ztrain {
namespace {

std::map<std::string, double>& planned() {
  static std::map<std::string, double> holds;
  return holds;
}

}  // namespace

const std::vector<std::string>& hold_point_names() {
  static const std::vector<std::string> names = {
      "lock_release", "checkpoint_located", "checkpoint_opened", "swap_created", "meeting_met"};
  return names;
}

void plan_holds(const std::map<std::string, double>& holds) {
  planned() = holds;
}

void hold_point(const char* point) {
  static std::mutex mu;
  double seconds = 0;
  {
    const std::lock_guard lock(mu);
    const auto it = planned().find(point);
    if (it == planned().end()) return;
    seconds = it->second;
    planned().erase(it);
  }
  std::fprintf(stderr, "test: holding at %s for %g s\n", point, seconds);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace ztrain
