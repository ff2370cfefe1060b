#include "config/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

double nanogpt_at(const NanoGptSchedule& s, std::int64_t step) {
  if (step < s.warmup) return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup);
  if (s.decay == NanoGptSchedule::Decay::constant) return s.lr;
  const std::int64_t span = std::max<std::int64_t>(1, s.total - s.warmup - 1);
  const double ratio =
      std::clamp(static_cast<double>(step - s.warmup) / static_cast<double>(span), 0.0, 1.0);
  if (s.decay == NanoGptSchedule::Decay::linear) return s.lr - ratio * (s.lr - s.min_lr);
  return s.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (s.lr - s.min_lr);
}

// transformers' lr_lambda at step k (0-based, the Trainer's scheduler
// stepping after each optimizer step).
double hf_at(const HfSchedule& s, std::int64_t k) {
  const auto d = [](std::int64_t n) { return static_cast<double>(n); };
  if (k < s.warmup) return s.lr * d(k) / d(std::max<std::int64_t>(1, s.warmup));
  const double left = d(std::max<std::int64_t>(1, s.total - s.warmup));
  switch (s.decay) {
    case HfSchedule::Decay::constant:
      return s.lr;
    case HfSchedule::Decay::linear:
      return s.lr * std::max(0.0, d(s.total - k) / left);
    case HfSchedule::Decay::cosine:
      return s.lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * d(k - s.warmup) / left)));
  }
  return s.lr;
}

// DeepSpeed's warmup fraction at iteration i < steps (steps >= 2).
double warmup_fraction(WarmupType type, std::int64_t i, std::int64_t steps) {
  if (type == WarmupType::log)
    return std::log(static_cast<double>(i + 1)) / std::log(static_cast<double>(steps));
  return static_cast<double>(i) / static_cast<double>(steps);
}

// DeepSpeed's classes below, at scheduler iteration i >= 0 (what its
// get_lr computes after i + 1 calls of step()).

double warmup_at(const DsWarmupLR& s, std::int64_t i) {
  const std::int64_t steps = std::max<std::int64_t>(2, s.warmup_num_steps);
  const double gamma = i < steps ? warmup_fraction(s.warmup_type, i, steps) : 1.0;
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

double warmup_decay_at(const DsWarmupDecayLR& s, std::int64_t i) {
  const std::int64_t steps = std::max<std::int64_t>(2, s.warmup.warmup_num_steps);
  if (i < steps) return warmup_at(s.warmup, i);
  const double span = std::max<double>(1.0, static_cast<double>(s.total_num_steps - steps));
  const double gamma = std::max(0.0, static_cast<double>(s.total_num_steps - i) / span);
  return s.warmup.warmup_min_lr + (s.warmup.warmup_max_lr - s.warmup.warmup_min_lr) * gamma;
}

// WarmupCosineLR: the warmup's ratio, then the cosine's, whose progress
// stops at 1 (past total_num_steps, and at once when the warmup reaches
// it, the ratio stays at cos_min_ratio).
double warmup_cosine_ratio(const DsWarmupCosineLR& s, std::int64_t i) {
  const std::int64_t steps = std::max<std::int64_t>(2, s.warmup_num_steps);
  if (i < steps) {
    const double r = warmup_fraction(s.warmup_type, i, steps);
    return s.warmup_min_ratio + r * (1.0 - s.warmup_min_ratio);
  }
  const double done = static_cast<double>(i - steps + 1);
  const double span = static_cast<double>(std::max<std::int64_t>(1, s.total_num_steps - steps));
  const double cosine = (1.0 + std::cos(M_PI * std::min(1.0, done / span))) / 2.0;
  return std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
}

// OneCycle's position in the cycle, 0 at cycle_min_lr and 1 at the peak:
// continuous, or in stairs counted from the integer position (DeepSpeed
// quantises the batch offset, not the continuous scale, whose float can
// fall just under a stair).
double one_cycle_scale(const DsOneCycle& s, double batch) {
  const double total = s.cycle_first_step_size + s.cycle_second_step_size;
  const double cycle = std::floor(1.0 + batch / total);
  const double x = 1.0 + batch / total - cycle;
  const double ratio = s.cycle_first_step_size / total;
  const bool rising = x <= ratio;
  const std::int64_t stairs = rising ? s.first_stair_count : s.second_stair_count;
  if (stairs <= 0) return rising ? x / ratio : (x - 1.0) / (ratio - 1.0);
  const double at = std::fmod(batch, total);
  const double position =
      at <= s.cycle_first_step_size
          ? at * static_cast<double>(stairs) / s.cycle_first_step_size
          : (total - at) * static_cast<double>(stairs) / s.cycle_second_step_size;
  return std::floor(position) / static_cast<double>(stairs);
}

double one_cycle_at(const DsOneCycle& s, std::int64_t i) {
  const double total = s.cycle_first_step_size + s.cycle_second_step_size;
  if (static_cast<double>(i) < total)
    return s.cycle_min_lr +
           (s.cycle_max_lr - s.cycle_min_lr) * one_cycle_scale(s, static_cast<double>(i + 1));
  if (s.decay_step_size == 0 || s.decay_lr_rate == 0) return s.cycle_min_lr;
  const double interval = (static_cast<double>(i) - total + 1.0) / s.decay_step_size;
  return s.cycle_min_lr / (1.0 + s.decay_lr_rate * interval);
}

double range_test_at(const DsLRRangeTest& s, std::int64_t i) {
  double interval = static_cast<double>(i + 1) / s.step_size;
  if (s.staircase) interval = std::floor(interval);
  return s.min_lr * (1.0 + s.step_rate * interval);
}

// What the constructor leaves in the optimizer: the first step's lr.
struct Initial {
  double operator()(const NanoGptSchedule& s) const { return nanogpt_at(s, 0); }
  double operator()(const HfSchedule& s) const { return hf_at(s, 0); }
  double operator()(const DsWarmupLR& s) const { return s.warmup_min_lr; }
  double operator()(const DsWarmupDecayLR& s) const { return s.warmup.warmup_min_lr; }
  // DeepSpeed's constructor sets lr 0 (its ratio before the first step()).
  double operator()(const DsWarmupCosineLR&) const { return 0.0; }
  double operator()(const DsOneCycle& s) const { return s.cycle_min_lr; }
  double operator()(const DsLRRangeTest& s) const { return s.min_lr; }
};

struct At {
  std::int64_t i;  // DeepSpeed's iteration; nanoGPT's 0-based step is i + 1
  double operator()(const NanoGptSchedule& s) const { return nanogpt_at(s, i + 1); }
  double operator()(const HfSchedule& s) const { return hf_at(s, i + 1); }
  double operator()(const DsWarmupLR& s) const { return warmup_at(s, i); }
  double operator()(const DsWarmupDecayLR& s) const { return warmup_decay_at(s, i); }
  double operator()(const DsWarmupCosineLR& s) const { return s.lr * warmup_cosine_ratio(s, i); }
  double operator()(const DsOneCycle& s) const { return one_cycle_at(s, i); }
  double operator()(const DsLRRangeTest& s) const { return range_test_at(s, i); }
};

}  // namespace

double lr_at(const LrSchedule& schedule, std::int64_t applied) {
  if (applied == 0) return std::visit(Initial{}, schedule);
  return std::visit(At{applied - 1}, schedule);
}

void declare_schedule_options(OptionList& o) {
  o.number("lr", 3e-3,
           "peak learning rate (WarmupCosineLR: the optimizer's lr it scales; the other "
           "DeepSpeed schedules set their own)")
      .at_least(0);
  o.number("min_lr", 3e-4, "learning rate at the end of the decay (unset: lr / 10)").at_least(0);
  o.integer("warmup_steps", 30, "linear warmup steps from 0 to lr").at_least(0);
  o.number("warmup_ratio", 0,
           "transformers' schedules: warmup steps = ceil(warmup_ratio x steps) where "
           "warmup_steps is not given")
      .at_least(0)
      .at_most(1);
  o.string("schedule", "cosine",
           "nanoGPT's decay after warmup (cosine, linear, constant), transformers' Trainer's "
           "(hf_linear, hf_cosine, hf_constant, hf_constant_with_warmup), or DeepSpeed's "
           "scheduler (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest) with its "
           "[train.scheduler] parameters")
      .one_of({"cosine", "linear", "constant", "hf_linear", "hf_cosine", "hf_constant",
               "hf_constant_with_warmup", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
               "LRRangeTest"});
  o.number("scheduler.warmup_min_lr", 0.0, "WarmupLR, WarmupDecayLR: lr at the warmup's start")
      .at_least(0);
  o.number("scheduler.warmup_max_lr", 0.001,
           "WarmupLR, WarmupDecayLR: lr at the warmup's end (WarmupLR's unset: [train] lr)")
      .at_least(0);
  o.integer("scheduler.warmup_num_steps", 1000,
            "WarmupLR, WarmupDecayLR, WarmupCosineLR: warmup steps (1 counts as 2, as in "
            "DeepSpeed)")
      .at_least(1);
  o.string("scheduler.warmup_type", "log", "warmup curve: log (DeepSpeed's default) or linear")
      .one_of({"log", "linear"});
  o.integer("scheduler.total_num_steps", 0,
            "WarmupDecayLR, WarmupCosineLR: the step the decay ends at (0: [train] steps)")
      .at_least(0);
  o.number("scheduler.warmup_min_ratio", 0.0, "WarmupCosineLR: lr / [train] lr at the start")
      .at_least(0);
  o.number("scheduler.cos_min_ratio", 0.0001, "WarmupCosineLR: lr / [train] lr at the end")
      .at_least(0);
  o.number("scheduler.cycle_min_lr", 0.0, "OneCycle: lr at the cycle's ends").at_least(0);
  o.number("scheduler.cycle_max_lr", 0.0, "OneCycle: lr at the cycle's peak").at_least(0);
  o.number("scheduler.decay_lr_rate", 0.0, "OneCycle: decay after the cycle").at_least(0);
  o.number("scheduler.cycle_first_step_size", 2000, "OneCycle: steps up").at_least(1);
  o.number("scheduler.cycle_second_step_size", 2000, "OneCycle: steps down (unset: the first's)")
      .at_least(0);
  o.integer("scheduler.cycle_first_stair_count", 0, "OneCycle: stairs up (0: continuous)")
      .at_least(0);
  o.integer("scheduler.cycle_second_stair_count", 0, "OneCycle: stairs down (unset: the first's)")
      .at_least(0);
  o.integer("scheduler.decay_step_size", 0, "OneCycle: steps per decay interval (0: no decay)")
      .at_least(0);
  o.flag("scheduler.cycle_momentum", true,
         "OneCycle: cycle Adam's beta1 too (DeepSpeed's default; ztrain does not: set false)");
  o.number("scheduler.lr_range_test_min_lr", 1e-3, "LRRangeTest: the first lr").at_least(0);
  o.integer("scheduler.lr_range_test_step_size", 2000, "LRRangeTest: steps per interval")
      .at_least(1);
  o.number("scheduler.lr_range_test_step_rate", 1.0, "LRRangeTest: lr increase per interval")
      .at_least(0);
  o.flag("scheduler.lr_range_test_staircase", false, "LRRangeTest: whole intervals only");
}

namespace {

const std::map<std::string, std::set<std::string>>& keys_read() {
  static const std::map<std::string, std::set<std::string>> keys = {
      {"nanogpt", {"lr", "min_lr", "warmup_steps"}},
      {"hf_linear", {"lr", "warmup_steps", "warmup_ratio"}},
      {"hf_cosine", {"lr", "warmup_steps", "warmup_ratio"}},
      {"hf_constant_with_warmup", {"lr", "warmup_steps", "warmup_ratio"}},
      {"hf_constant", {"lr"}},
      {"WarmupLR",
       {"lr", "scheduler.warmup_min_lr", "scheduler.warmup_max_lr", "scheduler.warmup_num_steps",
        "scheduler.warmup_type"}},
      {"WarmupDecayLR",
       {"scheduler.warmup_min_lr", "scheduler.warmup_max_lr", "scheduler.warmup_num_steps",
        "scheduler.warmup_type", "scheduler.total_num_steps"}},
      {"WarmupCosineLR",
       {"lr", "scheduler.total_num_steps", "scheduler.warmup_min_ratio",
        "scheduler.warmup_num_steps", "scheduler.cos_min_ratio", "scheduler.warmup_type"}},
      {"OneCycle",
       {"scheduler.cycle_min_lr", "scheduler.cycle_max_lr", "scheduler.decay_lr_rate",
        "scheduler.cycle_first_step_size", "scheduler.cycle_second_step_size",
        "scheduler.cycle_first_stair_count", "scheduler.cycle_second_stair_count",
        "scheduler.decay_step_size", "scheduler.cycle_momentum"}},
      {"LRRangeTest",
       {"scheduler.lr_range_test_min_lr", "scheduler.lr_range_test_step_size",
        "scheduler.lr_range_test_step_rate", "scheduler.lr_range_test_staircase"}},
  };
  return keys;
}

// The keys_read() entry of schedule `name`.
std::string family(const std::string& name) {
  return is_deepspeed_schedule(name) || is_transformers_schedule(name) ? name : "nanogpt";
}

// Every schedule key: what any schedule reads.
const std::set<std::string>& schedule_keys() {
  static const std::set<std::string> all = [] {
    std::set<std::string> keys;
    for (const auto& [name, read] : keys_read()) keys.insert(read.begin(), read.end());
    return keys;
  }();
  return all;
}

// A key given that the named schedule does not read would be silently
// ignored: refused, naming it and the schedule.
void check_keys_read(const Options& t, const std::string& name) {
  const auto& read = keys_read().at(family(name));
  for (const auto& key : schedule_keys())
    if (t.given(key) && !read.contains(key))
      throw ConfigError(t.where(key) + ": [train] " + key + " is not read by schedule \"" + name +
                        "\"" + (key == "lr" ? " (its lr comes from [train.scheduler])" : "") +
                        "; remove it, or choose the schedule that takes it");
}

WarmupType warmup_type(const Options& t) {
  return t.get_string("scheduler.warmup_type") == "log" ? WarmupType::log : WarmupType::linear;
}

std::int64_t total_steps(const Options& t, std::int64_t steps) {
  const std::int64_t n = t.get_int("scheduler.total_num_steps");
  return n > 0 ? n : steps;
}

NanoGptSchedule nanogpt(const Options& t, const std::string& name, std::int64_t steps) {
  NanoGptSchedule s;
  s.decay = name == "linear"     ? NanoGptSchedule::Decay::linear
            : name == "constant" ? NanoGptSchedule::Decay::constant
                                 : NanoGptSchedule::Decay::cosine;
  s.lr = t.get_number("lr");
  // Unset, it follows lr (a tenth of it, the default run's 3e-4), so
  // lowering lr alone never contradicts it.
  s.min_lr = t.given("min_lr") ? t.get_number("min_lr") : s.lr / 10;
  s.warmup = t.get_int("warmup_steps");
  s.total = steps;
  if (s.min_lr > s.lr)
    throw ConfigError(t.where("min_lr") + ": [train] min_lr (" + std::to_string(s.min_lr) +
                      ") is above lr (" + std::to_string(s.lr) +
                      "); the schedule decays from lr to min_lr");
  return s;
}

// The Trainer's: warmup_steps where given, else ceil(warmup_ratio x
// steps) (TrainingArguments.get_warmup_steps); constant has none.
HfSchedule transformers(const Options& t, const std::string& name, std::int64_t steps) {
  HfSchedule s;
  s.decay = name == "hf_linear"   ? HfSchedule::Decay::linear
            : name == "hf_cosine" ? HfSchedule::Decay::cosine
                                  : HfSchedule::Decay::constant;
  s.lr = t.get_number("lr");
  s.total = steps;
  if (name != "hf_constant")
    s.warmup = t.given("warmup_steps")
                   ? t.get_int("warmup_steps")
                   : static_cast<std::int64_t>(
                         std::ceil(t.get_number("warmup_ratio") * static_cast<double>(steps)));
  return s;
}

// WarmupLR's warmup_max_lr defaults to the optimizer's lr, WarmupDecayLR's
// to 0.001 (DeepSpeed's signatures); lr and warmup_max_lr both given would
// leave lr unread.
DsWarmupLR warmup(const Options& t, bool lr_is_max) {
  if (lr_is_max && t.given("lr") && t.given("scheduler.warmup_max_lr"))
    throw ConfigError(t.where("lr") +
                      ": [train] lr is not read by WarmupLR when [train.scheduler] "
                      "warmup_max_lr is given (" +
                      t.where("scheduler.warmup_max_lr") + "); give one of them");
  const double max_lr = lr_is_max && !t.given("scheduler.warmup_max_lr")
                            ? t.get_number("lr")
                            : t.get_number("scheduler.warmup_max_lr");
  return {t.get_number("scheduler.warmup_min_lr"), max_lr, t.get_int("scheduler.warmup_num_steps"),
          warmup_type(t)};
}

DsOneCycle one_cycle(const Options& t) {
  if (t.get_bool("scheduler.cycle_momentum"))
    throw ConfigError(t.where("scheduler.cycle_momentum") +
                      ": OneCycle's cycle_momentum is true (DeepSpeed's default), which also "
                      "cycles Adam's beta1 between cycle_min_mom and cycle_max_mom; ztrain "
                      "cycles only the lr: set [train.scheduler] cycle_momentum = false");
  for (const char* key : {"scheduler.cycle_min_lr", "scheduler.cycle_max_lr"})
    if (!t.given(key))
      throw ConfigError(t.where("schedule") + ": OneCycle needs [train." +
                        std::string(key).replace(0, 10, "scheduler] ") +
                        " (DeepSpeed requires it too)");
  DsOneCycle s;
  s.cycle_min_lr = t.get_number("scheduler.cycle_min_lr");
  s.cycle_max_lr = t.get_number("scheduler.cycle_max_lr");
  s.decay_lr_rate = t.get_number("scheduler.decay_lr_rate");
  s.cycle_first_step_size = t.get_number("scheduler.cycle_first_step_size");
  s.cycle_second_step_size = t.given("scheduler.cycle_second_step_size")
                                 ? t.get_number("scheduler.cycle_second_step_size")
                                 : s.cycle_first_step_size;
  s.first_stair_count = t.get_int("scheduler.cycle_first_stair_count");
  s.second_stair_count = t.given("scheduler.cycle_second_stair_count")
                             ? t.get_int("scheduler.cycle_second_stair_count")
                             : s.first_stair_count;
  s.decay_step_size = static_cast<double>(t.get_int("scheduler.decay_step_size"));
  return s;
}

}  // namespace

LrSchedule schedule_of(const Options& t, std::int64_t steps) {
  const std::string name = t.get_string("schedule");
  check_keys_read(t, name);
  if (is_transformers_schedule(name)) return transformers(t, name, steps);
  if (!is_deepspeed_schedule(name)) return nanogpt(t, name, steps);
  if (name == "WarmupLR") return warmup(t, true);
  if (name == "WarmupDecayLR") return DsWarmupDecayLR{warmup(t, false), total_steps(t, steps)};
  if (name == "WarmupCosineLR")
    return DsWarmupCosineLR{t.get_number("lr"),
                            total_steps(t, steps),
                            t.get_number("scheduler.warmup_min_ratio"),
                            t.get_int("scheduler.warmup_num_steps"),
                            t.get_number("scheduler.cos_min_ratio"),
                            warmup_type(t)};
  if (name == "OneCycle") return one_cycle(t);
  return DsLRRangeTest{t.get_number("scheduler.lr_range_test_min_lr"),
                       static_cast<double>(t.get_int("scheduler.lr_range_test_step_size")),
                       t.get_number("scheduler.lr_range_test_step_rate"),
                       t.get_bool("scheduler.lr_range_test_staircase")};
}

std::string schedule_name(const LrSchedule& schedule) {
  struct Name {
    std::string operator()(const NanoGptSchedule& s) const {
      return s.decay == NanoGptSchedule::Decay::linear     ? "linear"
             : s.decay == NanoGptSchedule::Decay::constant ? "constant"
                                                           : "cosine";
    }
    std::string operator()(const HfSchedule& s) const {
      return s.decay == HfSchedule::Decay::linear   ? "hf_linear"
             : s.decay == HfSchedule::Decay::cosine ? "hf_cosine"
             : s.warmup > 0                         ? "hf_constant_with_warmup"
                                                    : "hf_constant";
    }
    std::string operator()(const DsWarmupLR&) const { return "WarmupLR"; }
    std::string operator()(const DsWarmupDecayLR&) const { return "WarmupDecayLR"; }
    std::string operator()(const DsWarmupCosineLR&) const { return "WarmupCosineLR"; }
    std::string operator()(const DsOneCycle&) const { return "OneCycle"; }
    std::string operator()(const DsLRRangeTest&) const { return "LRRangeTest"; }
  };
  return std::visit(Name{}, schedule);
}

namespace {

// The warmup length and the decay's end of a schedule (0: none).
struct Span {
  std::int64_t warmup = 0, total = 0;
};
Span span_of(const LrSchedule& schedule) {
  struct Of {
    Span operator()(const NanoGptSchedule& s) const { return {s.warmup, 0}; }
    Span operator()(const HfSchedule& s) const { return {s.warmup, 0}; }
    Span operator()(const DsWarmupLR& s) const { return {s.warmup_num_steps, 0}; }
    Span operator()(const DsWarmupDecayLR& s) const {
      return {s.warmup.warmup_num_steps, s.total_num_steps};
    }
    Span operator()(const DsWarmupCosineLR& s) const {
      return {s.warmup_num_steps, s.total_num_steps};
    }
    Span operator()(const DsOneCycle&) const { return {}; }
    Span operator()(const DsLRRangeTest&) const { return {}; }
  };
  return std::visit(Of{}, schedule);
}

}  // namespace

std::vector<std::string> schedule_warnings(const LrSchedule& schedule, std::int64_t steps) {
  std::vector<std::string> out;
  const Span s = span_of(schedule);
  const std::string name = schedule_name(schedule);
  if (s.total > 0 && s.total < s.warmup)
    out.push_back("[train.scheduler] total_num_steps " + std::to_string(s.total) +
                  " is less than warmup_num_steps " + std::to_string(s.warmup) + " (" + name +
                  "; DeepSpeed warns the same): the lr falls from the warmup's last value to its "
                  "end value at once");
  if (s.warmup > steps)
    out.push_back("the run's " + counted(steps, "step") + (steps == 1 ? " ends" : " end") +
                  " inside " + name + "'s warmup of " + counted(s.warmup, "step") +
                  ": the last lr is " + std::to_string(lr_at(schedule, steps - 1)) +
                  ", short of the peak");
  return out;
}

bool schedule_reads(const std::string& name, const std::string& key) {
  return keys_read().at(family(name)).contains(key);
}

bool is_transformers_schedule(const std::string& name) {
  return name.starts_with("hf_");
}

bool is_deepspeed_schedule(const std::string& name) {
  return name == "WarmupLR" || name == "WarmupDecayLR" || name == "WarmupCosineLR" ||
         name == "OneCycle" || name == "LRRangeTest";
}

}  // namespace ztrain
