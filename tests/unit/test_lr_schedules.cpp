// DeepSpeed's learning-rate schedulers, against DeepSpeed's own classes.
//
// tests/data/lr_schedules/deepspeed.json holds, for a grid of scheduler
// configs, the lr DeepSpeed's classes gave each optimizer step (its
// engine's order: the step, then scheduler.step()), or the error its
// constructor raised (make_golden.py there regenerates it). Each case goes
// the way a user's file goes: a DeepSpeed JSON config through the import
// onto a run file, resolved as a run resolves it; the lr of every step must
// be DeepSpeed's, and a config DeepSpeed refuses is refused here.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "config/deepspeed_import.h"
#include "config/lr_schedule.h"
#include "config/run_settings.h"
#include "support.h"
#include "train/run_assembly.h"
#include "ztrain/error.h"

using namespace ztrain;
using nlohmann::json;

namespace {

json golden() {
  std::ifstream in(test::source_dir() / "tests/data/lr_schedules/deepspeed.json");
  REQUIRE(in);
  return json::parse(in);
}

// The schedule of run file `run_toml` with DeepSpeed config `ds` given as
// --deepspeed, loaded as a run loads them (load_run_config), resolved.
LrSchedule with_deepspeed(const std::string& run_toml, const std::string& ds,
                          const std::string& name, const test::TempDir& dir) {
  TrainArgs args;
  args.config = dir / (name + ".toml");
  args.deepspeed = dir / (name + ".json");
  std::ofstream(args.config) << run_toml;
  std::ofstream(args.deepspeed) << ds;
  return resolve_settings(load_run_config(args), 1).train.schedule;
}

// The case as a DeepSpeed config onto a run of 1000 steps.
LrSchedule imported(const json& c, const test::TempDir& dir) {
  json ds = {{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", c.at("optimizer_lr")}}}}},
             {"scheduler", {{"type", c.at("type")}}}};
  ds["scheduler"]["params"] = c.at("params");  // null stays null, as in the file
  return with_deepspeed("[train]\nsteps = 1000\n", ds.dump(), c.at("name"), dir);
}

bool close(double got, double want) {
  return std::fabs(got - want) <= 1e-12 * std::max(std::fabs(want), 1e-300) ||
         std::fabs(got - want) < 1e-18;
}

}  // namespace

TEST_CASE("DeepSpeed's schedulers: the lr of every step as DeepSpeed's classes give it") {
  const json g = golden();
  test::TempDir dir;
  int compared = 0, refused = 0;
  for (const json& c : g.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    if (c.contains("error")) {
      // DeepSpeed refuses the config; so must the import or the run.
      CHECK_THROWS_AS(imported(c, dir), ConfigError);
      ++refused;
      continue;
    }
    json as_run = c;
    if (c.at("type") == "OneCycle" && c.contains("beta1")) {
      // cycle_momentum true: refused here, naming the key. DeepSpeed's lr
      // does not depend on the momentum cycle, so the same lr must come
      // with it off.
      const std::string why = test::message_of<ConfigError>([&] { imported(c, dir); });
      CHECK(why.find("cycle_momentum") != std::string::npos);
      ++refused;
      as_run["params"]["cycle_momentum"] = false;
    }
    const LrSchedule s = imported(as_run, dir);
    CHECK(schedule_name(s) == c.at("type").get<std::string>());
    const auto& want = c.at("lr");
    for (std::size_t k = 0; k < want.size(); ++k) {
      const double got = lr_at(s, static_cast<std::int64_t>(k));
      INFO("step " << k + 1 << ": ztrain " << got << ", DeepSpeed " << want[k].get<double>());
      CHECK(close(got, want[k].get<double>()));
    }
    ++compared;
  }
  MESSAGE(compared << " schedules compared step by step, " << refused << " refused as DeepSpeed "
                   << "refuses them (or naming what ztrain does not do)");
  CHECK(compared >= 60);
  CHECK(refused >= 10);
}

TEST_CASE("an imported scheduler takes DeepSpeed's defaults, not the run file's parameters") {
  test::TempDir dir;
  const auto w = std::get<DsWarmupLR>(with_deepspeed(
      "[train]\nsteps = 20\nschedule = \"WarmupLR\"\n[train.scheduler]\nwarmup_type = "
      "\"linear\"\nwarmup_num_steps = 9\n",
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}}})", "defaults",
      dir));
  CHECK(w.warmup_type == WarmupType::log);  // DeepSpeed's default: the file gives none
  CHECK(w.warmup_num_steps == 4);
  // total_num_steps 0 is refused: DeepSpeed would end the decay at the
  // warmup's end, which [train.scheduler] reads as "the run's steps".
  std::ofstream(dir / "zero.json")
      << R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 0}}})";
  CHECK(test::message_of<ConfigError>([&] {
          import_deepspeed(dir / "zero.json", RunConfig::parse("", "run.toml"));
        }).find("zero.json: scheduler.params.total_num_steps is 0") != std::string::npos);
}

TEST_CASE("a run file names DeepSpeed's schedulers with their own parameters") {
  const auto schedule = [](const std::string& toml) {
    return resolve_settings(RunConfig::parse(toml, "run.toml"), 1).train.schedule;
  };
  // WarmupLR's peak is the optimizer's lr unless warmup_max_lr is given.
  const auto w = std::get<DsWarmupLR>(
      schedule("[train]\nlr = 2e-3\nschedule = \"WarmupLR\"\n[train.scheduler]\n"
               "warmup_num_steps = 4\nwarmup_type = \"linear\"\n"));
  CHECK(w.warmup_max_lr == 2e-3);
  CHECK(lr_at(w, 0) == 0.0);
  CHECK(lr_at(w, 5) == doctest::Approx(2e-3));
  // total_num_steps unset: the run's steps.
  const auto d =
      std::get<DsWarmupDecayLR>(schedule("[train]\nsteps = 50\nschedule = \"WarmupDecayLR\"\n"));
  CHECK(d.total_num_steps == 50);
  CHECK(d.warmup.warmup_max_lr == 0.001);  // DeepSpeed's default, not the optimizer's
  const auto refused = [&](const std::string& toml) {
    return test::message_of<ConfigError>([&] { schedule(toml); });
  };
  // A key the named schedule does not read is refused, naming it.
  CHECK(refused("[train]\nschedule = \"WarmupDecayLR\"\nwarmup_steps = 10\n")
            .find("run.toml:3:1: [train] warmup_steps is not read by schedule \"WarmupDecayLR\"") !=
        std::string::npos);
  CHECK(refused("[train]\nschedule = \"cosine\"\n[train.scheduler]\ncos_min_ratio = 0.1\n")
            .find("scheduler.cos_min_ratio is not read by schedule \"cosine\"") !=
        std::string::npos);
  CHECK(refused("[train]\nlr = 1e-3\nschedule = \"WarmupLR\"\n[train.scheduler]\n"
                "warmup_max_lr = 2e-3\n")
            .find("lr is not read by WarmupLR when") != std::string::npos);
  CHECK(refused("[train]\nschedule = \"OneCycle\"\n[train.scheduler]\ncycle_min_lr = 1e-4\n"
                "cycle_max_lr = 1e-3\n")
            .find("cycle_momentum") != std::string::npos);
  CHECK(refused("[train]\nschedule = \"OneCycle\"\n[train.scheduler]\ncycle_momentum = false\n"
                "cycle_min_lr = 1e-4\n")
            .find("OneCycle needs [train.scheduler] cycle_max_lr") != std::string::npos);
}

TEST_CASE("a run that ends inside its warmup is warned about, counted in words") {
  const auto warnings = [](const std::string& toml) {
    const auto s = resolve_settings(RunConfig::parse(toml, "run.toml"), 1).train;
    return schedule_warnings(s.schedule, s.steps);
  };
  auto w = warnings("[train]\nsteps = 1\nwarmup_steps = 4\n");
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("the run's 1 step ends inside") == 0);
  CHECK(w[0].find("warmup of 4 steps") != std::string::npos);
  w = warnings("[train]\nsteps = 3\nwarmup_steps = 4\n");
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("the run's 3 steps end inside") == 0);
  CHECK(warnings("[train]\nsteps = 5\nwarmup_steps = 4\n").empty());
}

// transformers 5.25's get_scheduler(name, SGD(lr = 2e-4), num_warmup_steps
// = ceil(10 x 0.15) = 2, num_training_steps = 10): the lr of each of the
// ten optimizer steps (the Trainer steps the scheduler after each).
TEST_CASE("transformers' schedules: the lr of every step as the Trainer gives it") {
  const std::pair<const char*, std::vector<double>> cases[] = {
      {"hf_linear",
       {0.0, 0.0001, 0.0002, 0.000175, 0.00015000000000000001, 0.000125, 0.0001,
        7.500000000000001e-05, 5e-05, 2.5e-05}},
      {"hf_cosine",
       {0.0, 0.0001, 0.0002, 0.0001923879532511287, 0.00017071067811865476, 0.000138268343236509,
        0.0001, 6.173165676349103e-05, 2.9289321881345254e-05, 7.612046748871327e-06}},
      {"hf_constant", std::vector<double>(10, 0.0002)},
      {"hf_constant_with_warmup",
       {0.0, 0.0001, 0.0002, 0.0002, 0.0002, 0.0002, 0.0002, 0.0002, 0.0002, 0.0002}}};
  for (const auto& [name, want] : cases) {
    CAPTURE(name);
    const std::string ratio = std::string(name) == "hf_constant" ? "" : "warmup_ratio = 0.15\n";
    const auto s =
        resolve_settings(RunConfig::parse("[train]\nsteps = 10\nlr = 2e-4\nschedule = \"" +
                                              std::string(name) + "\"\n" + ratio,
                                          "run.toml"),
                         1)
            .train.schedule;
    for (std::size_t k = 0; k < want.size(); ++k) {
      CAPTURE(k);
      CHECK(close(lr_at(s, static_cast<std::int64_t>(k)), want[k]));
    }
  }
  // warmup_steps, where given, wins over warmup_ratio (the Trainer's rule);
  // nanoGPT's schedules read neither ratio nor it alone.
  const auto w = std::get<HfSchedule>(
      resolve_settings(RunConfig::parse("[train]\nsteps = 10\nschedule = \"hf_linear\"\n"
                                        "warmup_steps = 4\nwarmup_ratio = 0.5\n",
                                        "run.toml"),
                       1)
          .train.schedule);
  CHECK(w.warmup == 4);
  CHECK(test::message_of<ConfigError>([] {
          resolve_settings(RunConfig::parse("[train]\nwarmup_ratio = 0.1\n", "run.toml"), 1);
        }).find("warmup_ratio is not read by schedule \"cosine\"") != std::string::npos);
}
