// Pipeline schedules as data: what each stage of a pipeline does in one
// step, in order, so that a schedule is checked before anything runs and
// read alike by the run and by `estimate` (as the gather and reduce plans
// are).
//
// The model is cut into P x V consecutive pieces, its virtual stages. Stage
// s (the pipeline rank) holds chunks c = 0..V-1, chunk c being virtual
// stage c*P + s (Megatron's interleaving; with V = 1 stage s is virtual
// stage s). A step runs each of its M micro-batches forward through the
// virtual stages in order and backward through them in reverse.
//
// A plan lists each stage's actions, each naming its micro-batch and the
// chunk that runs it:
// - forward: the chunk's layers on the micro-batch.
// - backward: the gradients of the chunk's inputs and of its parameters;
//   or the same split in two, backward_input then backward_weight (what a
//   zero-bubble schedule defers to fill its idle time). The sends wait
//   only for the input gradient.
// - recv_activation / send_activation: the chunk's input from the previous
//   virtual stage (not on virtual stage 0); its output to the next (not on
//   the last).
// - recv_gradient / send_gradient: the gradient of the chunk's output from
//   the next virtual stage (not on the last); of its input to the previous
//   (not on virtual stage 0).
//
// What an executor keeps and the checker assumes: a send never waits (its
// buffer is the executor's until it is received); a receive waits for its
// send; and between two stages the messages of one direction arrive in the
// order they were sent, so a plan's receives list them in that order.
//
// check_schedule proves a plan runs: on every stage each of its (micro-
// batch, chunk) pairs goes forward once and backward once after it, every
// compute is preceded by the receive it needs and followed by the send its
// neighbour needs, and the stages together finish (simulated, so a plan
// that would hang is refused before step 1). simulate_schedule times a plan
// with given compute costs: each stage's busy and idle time, the step's
// length, and the most micro-batches whose activations a stage holds at
// once (what a schedule trades against its idle time).
//
// A schedule is a policy that writes plans: the built-in ones and any a
// plugin brings implement PipelineSchedule (a plugin of kind "schedule":
// ZTRAIN_PLUGIN("schedule", NAME, ...), examples/zero_bubble_schedule);
// the host checks whatever plan it gets.
//
// Thread safety: plans and schedules are immutable values; the functions
// are pure. Errors: ConfigError naming the schedule, the stage, the action's
// place in its list and what is wrong; for a shape a schedule cannot run,
// what to change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ztrain/export.h"
#include "ztrain/plugin.h"

namespace ztrain::pipeline {

struct ScheduleShape {
  std::size_t stages = 1;         // P: the pipeline's ranks
  std::size_t micro_batches = 1;  // M: the step's micro-batches (gradient accumulation)
  std::size_t chunks = 1;         // V: model chunks per stage (interleaving)
  std::size_t virtual_stages() const { return stages * chunks; }
  bool operator==(const ScheduleShape&) const = default;
};

enum class ActionKind : std::uint8_t {
  forward,
  backward,
  backward_input,
  backward_weight,
  recv_activation,
  send_activation,
  recv_gradient,
  send_gradient,
};

struct Action {
  ActionKind kind;
  std::size_t micro_batch = 0;
  std::size_t chunk = 0;
  bool operator==(const Action&) const = default;
};

// "the forward of micro-batch 3 (chunk 1)"; the chunk is named only where
// a stage holds more than one.
ZTRAIN_API std::string describe(const Action& a, const ScheduleShape& shape);

struct SchedulePlan {
  std::string schedule;  // the name errors give it
  ScheduleShape shape;
  std::vector<std::vector<Action>> stages;  // [stage][order]
};

// A policy writing plans. plan() throws ConfigError for a shape it cannot
// run, saying what to change.
class ZTRAIN_API PipelineSchedule : public Plugin {
 public:
  virtual std::string name() const = 0;
  virtual SchedulePlan plan(const ScheduleShape& shape) const = 0;
};

// The built-in schedules, by the name `[parallel] pipeline_schedule` takes:
// - "gpipe": every micro-batch forward, then every one backward; a stage
//   holds all M micro-batches' activations.
// - "1f1b": PipeDream-flush: stage s runs P-s-1 forwards, then alternates
//   one forward and one backward, then drains; it holds at most P-s
//   micro-batches. Both idle (P-1)/(M+P-1) of the step with uniform costs.
// - "interleaved": Megatron's interleaved 1F1B over V chunks a stage, the
//   idle time cut by V; M must be a multiple of P.
// gpipe and 1f1b take V = 1. ConfigError for another name, listing these.
ZTRAIN_API std::unique_ptr<PipelineSchedule> builtin_schedule(std::string_view name);
// Whether `name` is one of them.
ZTRAIN_API bool is_builtin_schedule(std::string_view name);

// Throws ConfigError at the first thing wrong with `plan` (above).
ZTRAIN_API void check_schedule(const SchedulePlan& plan);

// Seconds (or any unit) of one chunk's compute on one micro-batch, and of
// a message from its send to its receive.
struct ScheduleCosts {
  double forward = 1.0;
  double backward_input = 1.0;
  double backward_weight = 1.0;  // backward = backward_input + backward_weight
  double transfer = 0.0;
};

struct StageTiming {
  double busy = 0;                 // computing
  double idle = 0;                 // the step's length less busy
  std::size_t peak_in_flight = 0;  // (micro-batch, chunk) pairs forward but not yet backward
};

struct ScheduleTiming {
  double step = 0;  // from the first action to the last stage's end
  std::vector<StageTiming> stages;
  // The largest share of the step a stage idles.
  double bubble() const {
    double most = 0;
    for (const StageTiming& s : stages) most = s.idle / step > most ? s.idle / step : most;
    return most;
  }
};

// The plan run with `costs`, each stage as soon as its receives allow.
// Refuses what check_schedule refuses, checking the plan as it runs it.
ZTRAIN_API ScheduleTiming simulate_schedule(const SchedulePlan& plan, const ScheduleCosts& costs);

}  // namespace ztrain::pipeline
