#include "commands/schedule_command.h"

#include <cstdio>

#include "config/config.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

using pipeline::ActionKind;

// A schedule and how it was found: built in, or a plugin's file.
struct FoundSchedule {
  std::shared_ptr<pipeline::PipelineSchedule> schedule;
  std::string origin;
};

FoundSchedule find_schedule(const ScheduleArgs& args, const PluginLoader& loader) {
  for (const std::string& o : args.overrides)
    if (!o.starts_with("schedule."))
      throw ConfigError("--set " + o +
                        ": `ztrain schedule` takes only a schedule plugin's "
                        "options, as --set schedule.KEY=VALUE");
  if (pipeline::is_builtin_schedule(args.schedule)) {
    if (!args.overrides.empty())
      throw ConfigError("--set " + args.overrides.front() + ": the built-in schedule '" +
                        args.schedule + "' takes no options");
    return {pipeline::builtin_schedule(args.schedule), "built in"};
  }
  const LoadedPlugin lib = [&] {
    try {
      return loader.load("schedule", args.schedule);
    } catch (const PluginError& e) {
      throw PluginError("'" + args.schedule +
                        "' is not a built-in schedule (gpipe, 1f1b, interleaved), and " + e.what());
    }
  }();
  RunConfig config = RunConfig::parse("", "the command line");
  for (const std::string& o : args.overrides) config.override_with(o);
  const Options options = config.validate("schedule", lib.options());
  return {lib.create<pipeline::PipelineSchedule>(options),
          "plugin " + lib.file().string() + " " + lib.info().version};
}

// "F3", "B3", "I3", "W3"; "F3.1" where a stage holds several chunks.
std::string compute_word(const pipeline::Action& a, const pipeline::ScheduleShape& shape) {
  const char* letter = a.kind == ActionKind::forward          ? "F"
                       : a.kind == ActionKind::backward       ? "B"
                       : a.kind == ActionKind::backward_input ? "I"
                                                              : "W";
  return letter + std::to_string(a.micro_batch) +
         (shape.chunks > 1 ? "." + std::to_string(a.chunk) : "");
}

bool is_compute(ActionKind k) {
  return k == ActionKind::forward || k == ActionKind::backward || k == ActionKind::backward_input ||
         k == ActionKind::backward_weight;
}

void print_orders(const pipeline::SchedulePlan& plan, std::ostream& out) {
  out << "each stage's computes in order (F forward, B backward, I and W its input and weight "
         "halves; the micro-batch"
      << (plan.shape.chunks > 1 ? ".chunk" : "") << "; receives and sends around them):\n";
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    out << "  stage " << s << ":";
    for (const pipeline::Action& a : plan.stages[s])
      if (is_compute(a.kind)) out << " " << compute_word(a, plan.shape);
    out << "\n";
  }
}

void print_timing(const pipeline::ScheduleTiming& t, const pipeline::ScheduleShape& shape,
                  std::ostream& out) {
  const char* held = shape.chunks > 1 ? "micro-batch chunks'" : "micro-batches'";
  out << "on a clock where a chunk's forward takes 1 and its backward 2 (input 1, weight 1), "
         "messages nothing:\n";
  char line[160];
  std::snprintf(line, sizeof line, "  step %g\n", t.step);
  out << line;
  for (std::size_t s = 0; s < t.stages.size(); ++s) {
    const pipeline::StageTiming& st = t.stages[s];
    std::snprintf(line, sizeof line,
                  "  stage %zu: busy %g, idle %g (%.1f %% of the step), at most %zu %s "
                  "activations held\n",
                  s, st.busy, st.idle, 100.0 * st.idle / t.step, st.peak_in_flight, held);
    out << line;
  }
  std::snprintf(line, sizeof line, "  the most idle stage idles %.1f %% of the step\n",
                100.0 * t.bubble());
  out << line;
}

}  // namespace

void show_schedule(const ScheduleArgs& args, const PluginLoader& loader, std::ostream& out) {
  const FoundSchedule found = find_schedule(args, loader);
  const pipeline::SchedulePlan plan = found.schedule->plan(args.shape);
  if (plan.shape != args.shape)
    throw ConfigError("pipeline schedule '" + args.schedule + "' wrote a plan for another shape (" +
                      std::to_string(plan.shape.stages) + " stages, " +
                      std::to_string(plan.shape.micro_batches) + " micro-batches) than asked");
  const pipeline::ScheduleTiming timing = pipeline::simulate_schedule(plan, {});
  out << "schedule '" << args.schedule << "' (" << found.origin << "): " << args.shape.stages
      << " stage(s), " << args.shape.micro_batches << " micro-batch(es), " << args.shape.chunks
      << " chunk(s) a stage: checked, every micro-batch forward and backward once on each "
         "stage, and no stage waits forever\n";
  print_orders(plan, out);
  print_timing(timing, args.shape, out);
}

}  // namespace ztrain
