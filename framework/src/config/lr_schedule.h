// The learning-rate schedules a run names ([train] schedule), and the lr
// each applied optimizer step uses.
//
// nanoGPT's ("cosine", "linear", "constant"): linear warmup from
// lr/warmup to lr over `warmup_steps`, then cosine, linear or no decay to
// min_lr at the run's last step (llm.c's convention: step s of warmup
// uses lr * (s+1) / warmup).
//
// transformers' Trainer's ("hf_linear", "hf_cosine", "hf_constant",
// "hf_constant_with_warmup": get_scheduler's linear, cosine, constant and
// constant_with_warmup, what LLaMA-Factory's lr_scheduler_type names):
// linear warmup from 0 over warmup_steps (or ceil(warmup_ratio x steps),
// as the Trainer computes it), then linear or cosine decay to 0 at the
// run's last step, or none; the Trainer's step numbering: applied step k
// (0-based) uses lr x lambda(k), so the first step of a warmup runs at 0.
//
// DeepSpeed's ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
// "LRRangeTest"), each with the parameters of its class in
// deepspeed.runtime.lr_schedules, their defaults and its arithmetic, and
// DeepSpeed's step numbering: the engine calls the scheduler's step()
// after each applied optimizer step, so applied step k (0-based) runs at
// the scheduler's iteration k - 1, and step 0 at the value the
// constructor leaves in the optimizer (iteration -1).
// tests/data/lr_schedules/deepspeed.json holds DeepSpeed's own values for
// a grid of parameters; the unit test compares every step.
//
// The run file's side: [train] schedule names one of them; nanoGPT's take
// [train] lr, min_lr and warmup_steps, DeepSpeed's take [train.scheduler]
// with the parameters of DeepSpeed's class under their DeepSpeed names
// and defaults (WarmupCosineLR also [train] lr, the optimizer's lr it
// scales). A key given that the named schedule does not read is a
// ConfigError naming it, as is what ztrain does not do (OneCycle's
// momentum cycle).
//
// Thread safety: values; lr_at is a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "ztrain/options.h"

namespace ztrain {

struct NanoGptSchedule {
  enum class Decay : std::uint8_t { cosine, linear, constant };
  Decay decay = Decay::cosine;
  double lr = 0, min_lr = 0;
  std::int64_t warmup = 0, total = 0;
};

struct HfSchedule {
  enum class Decay : std::uint8_t { linear, cosine, constant } decay = Decay::linear;
  double lr = 0;
  std::int64_t warmup = 0, total = 0;
};

enum class WarmupType : std::uint8_t { log, linear };

// DeepSpeed's warmup: from warmup_min_lr to warmup_max_lr over
// warmup_num_steps (at least 2), by log(i + 1) / log(steps) or i / steps.
// (WarmupLR's warmup_max_lr defaults to the optimizer's lr, [train] lr;
// WarmupDecayLR's to 0.001, as in DeepSpeed.)
struct DsWarmupLR {
  double warmup_min_lr = 0.0, warmup_max_lr = 0.001;
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
};

// The warmup, then linear decay to warmup_min_lr at total_num_steps.
struct DsWarmupDecayLR {
  DsWarmupLR warmup;
  std::int64_t total_num_steps = 0;
};

// A ratio of the optimizer's lr: warmup from warmup_min_ratio to 1, then
// cosine to cos_min_ratio at total_num_steps.
struct DsWarmupCosineLR {
  double lr = 0;  // the optimizer's (DeepSpeed: optimizer.params.lr)
  std::int64_t total_num_steps = 0;
  double warmup_min_ratio = 0.0;
  std::int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 0.0001;
  WarmupType warmup_type = WarmupType::log;
};

// Smith's one cycle: up from cycle_min_lr to cycle_max_lr over the first
// step size, down over the second (in stair_count flat stairs each, when
// given), then cycle_min_lr / (1 + rate * i / decay_step_size) (no decay
// when either is 0). The momentum cycle is not offered (cycle_momentum is
// refused at configuration).
struct DsOneCycle {
  double cycle_min_lr = 0, cycle_max_lr = 0, decay_lr_rate = 0.0;
  double cycle_first_step_size = 2000, cycle_second_step_size = 2000;
  std::int64_t first_stair_count = 0, second_stair_count = 0;
  double decay_step_size = 0;
};

// The range test: lr_range_test_min_lr * (1 + rate * (i + 1) / size),
// the interval floored with staircase.
struct DsLRRangeTest {
  double min_lr = 1e-3, step_size = 2000, step_rate = 1.0;
  bool staircase = false;
};

using LrSchedule = std::variant<NanoGptSchedule, HfSchedule, DsWarmupLR, DsWarmupDecayLR,
                                DsWarmupCosineLR, DsOneCycle, DsLRRangeTest>;

// The lr of the optimizer step after `applied` applied steps (steps an
// fp16 overflow skipped do not count, as in DeepSpeed, whose engine steps
// the scheduler only after an applied step).
double lr_at(const LrSchedule& schedule, std::int64_t applied);

// [train] schedule, lr, min_lr, warmup_steps and [train.scheduler].
void declare_schedule_options(OptionList& o);
// The schedule the validated [train] options name, for a run of `steps`
// steps (DeepSpeed's total_num_steps defaults to it).
LrSchedule schedule_of(const Options& train, std::int64_t steps);
bool is_deepspeed_schedule(const std::string& name);
bool is_transformers_schedule(const std::string& name);
// Whether schedule `name` reads [train] `key` ("lr", "scheduler.cos_min_ratio").
bool schedule_reads(const std::string& name, const std::string& key);
// What a run of `steps` steps should hear about its schedule: a warmup
// longer than the run (a warning, not an error: shortening a run with
// --set train.steps is how one tries a config), DeepSpeed's own warning
// when total_num_steps is below the warmup.
std::vector<std::string> schedule_warnings(const LrSchedule& schedule, std::int64_t steps);
// The schedule's name as the run file gives it ("cosine", "WarmupLR").
std::string schedule_name(const LrSchedule& schedule);

}  // namespace ztrain
