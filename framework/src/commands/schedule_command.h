// `ztrain schedule NAME --stages P --micro-batches M [--chunks V]`: a
// pipeline schedule's plan for one shape, as a run would get it: checked
// (ztrain/pipeline/schedule.h's check_schedule, so a plan that would hang
// or run a micro-batch twice is refused with the stage and action), then
// each stage's computes in order and its idle time on a clock where a
// chunk's forward takes 1 and its backward 2. NAME is a built-in schedule
// or a plugin of kind "schedule" (name or file), whose options come from
// `--set schedule.KEY=VALUE`. What a schedule's author runs before a
// pipeline does, and what a user compares schedules by.
//
// Thread safety: main thread. Errors: ConfigError (a shape or option the
// schedule refuses, a plan the check refuses), PluginError (no such
// plugin).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "loader/plugin_loader.h"
#include "ztrain/pipeline/schedule.h"

namespace ztrain {

struct ScheduleArgs {
  std::string schedule;
  pipeline::ScheduleShape shape;
  std::vector<std::string> overrides;  // "schedule.KEY=VALUE"
};

void show_schedule(const ScheduleArgs& args, const PluginLoader& loader, std::ostream& out);

}  // namespace ztrain
