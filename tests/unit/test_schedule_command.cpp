// `ztrain schedule` (commands/schedule_command.h): a built-in schedule's
// plan printed stage by stage with its idle time; a schedule plugin's plan
// checked like any other, so a plugin whose plan would hang is refused
// naming what each stage waits for; options only for plugins; an unknown
// name lists the built-in ones.
#include <doctest/doctest.h>

#include <sstream>

#include "commands/schedule_command.h"
#include "support.h"

using namespace ztrain;
using ztrain::test::message_of;

namespace {

PluginLoader test_loader() {
  return PluginLoader({test::test_plugin_dir()}, nullptr);
}

bool has(const std::string& s, const std::string& part) {
  INFO("output: " << s);
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a built-in schedule's plan: each stage's order, and its idle time") {
  std::ostringstream out;
  show_schedule({"1f1b", {4, 8, 1}, {}}, test_loader(), out);
  const std::string s = out.str();
  CHECK(has(s,
            "schedule '1f1b' (built in): 4 stage(s), 8 micro-batch(es), 1 chunk(s) a stage: "
            "checked"));
  CHECK(has(s, "  stage 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\n"));
  CHECK(has(s, "  stage 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n"));
  CHECK(has(s, "  step 33\n"));
  CHECK(has(s,
            "  stage 0: busy 24, idle 9 (27.3 % of the step), at most 4 micro-batches' "
            "activations held\n"));
  std::ostringstream interleaved;
  show_schedule({"interleaved", {2, 4, 2}, {}}, test_loader(), interleaved);
  CHECK(has(interleaved.str(), "  stage 1: F0.0 F1.0 F0.1 B0.1 F1.1 B1.1"));
  CHECK(has(interleaved.str(), "micro-batch chunks' activations held"));
}

TEST_CASE("a schedule plugin's plan is checked like any other") {
  std::ostringstream out;
  const std::string m = message_of<ConfigError>([&] {
    show_schedule({"hanging", {2, 1, 1}, {"schedule.delay=1"}}, test_loader(), out);
  });
  CHECK(has(m, "pipeline schedule 'hanging' would hang"));
  CHECK(has(m, "stage 0 at action 1, the receive of micro-batch 0's gradient"));
  CHECK(out.str().empty());
  CHECK(has(message_of<ConfigError>([&] {
              show_schedule({"hanging", {2, 1, 1}, {"schedule.delay=-1"}}, test_loader(), out);
            }),
            "delay"));
}

TEST_CASE("options go to plugins alone, and an unknown name lists the built-in schedules") {
  std::ostringstream out;
  CHECK(has(message_of<ConfigError>([&] {
              show_schedule({"1f1b", {2, 2, 1}, {"schedule.delay=1"}}, test_loader(), out);
            }),
            "the built-in schedule '1f1b' takes no options"));
  CHECK(has(message_of<ConfigError>([&] {
              show_schedule({"hanging", {2, 1, 1}, {"train.lr=1"}}, test_loader(), out);
            }),
            "takes only a schedule plugin's options"));
  CHECK(has(message_of<PluginError>([&] {
              show_schedule({"zb-v", {2, 2, 1}, {}}, test_loader(), out);
            }),
            "'zb-v' is not a built-in schedule (gpipe, 1f1b, interleaved), and no schedule plugin "
            "named 'zb-v'"));
}
