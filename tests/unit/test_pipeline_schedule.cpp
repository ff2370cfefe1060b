// Pipeline schedules as plans (ztrain/pipeline/schedule.h): the built-in
// schedules pass the check on every small shape, idle exactly what their
// formulas say and hold the micro-batches they promise (and the bytes the
// executor holds for them, train/pipeline_step.h); the check refuses
// each way a plan can be wrong, naming the stage and the action; and a plan
// the built-ins do not write (weight gradients deferred, as a zero-bubble
// plugin would) runs and idles less than 1F1B.
#include <doctest/doctest.h>

#include <algorithm>

#include "support.h"
#include "train/pipeline_step.h"
#include "ztrain/error.h"
#include "ztrain/pipeline/schedule.h"

using namespace ztrain;
using namespace ztrain::pipeline;
using ztrain::test::message_of;

namespace {

SchedulePlan built(const std::string& name, ScheduleShape shape) {
  return builtin_schedule(name)->plan(shape);
}

std::string refusal(const SchedulePlan& plan) {
  return message_of<ConfigError>([&] { check_schedule(plan); });
}

bool has(const std::string& s, const std::string& part) {
  INFO("message: " << s);
  return s.find(part) != std::string::npos;
}

// Forward 1, backward 2 (1 + 1), messages free: a stage's micro-batch
// costs 3 a chunk.
constexpr ScheduleCosts kUniform{};
constexpr double kPerChunk = 3.0;

// The index of the first action of `kind` for micro-batch mb on stage s.
std::size_t find(const SchedulePlan& p, std::size_t s, ActionKind kind, std::size_t mb) {
  const auto& list = p.stages[s];
  for (std::size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == kind && list[i].micro_batch == mb) return i;
  FAIL("stage " << s << " has no such action");
  return 0;
}

}  // namespace

TEST_CASE("every built-in plan passes the check on every small shape") {
  for (std::size_t P = 1; P <= 4; ++P)
    for (std::size_t M = 1; M <= 9; ++M) {
      CAPTURE(P);
      CAPTURE(M);
      CHECK_NOTHROW(check_schedule(built("gpipe", {P, M, 1})));
      CHECK_NOTHROW(check_schedule(built("1f1b", {P, M, 1})));
      for (std::size_t V = 1; V <= 3 && M % P == 0; ++V) {
        CAPTURE(V);
        CHECK_NOTHROW(check_schedule(built("interleaved", {P, M, V})));
      }
    }
}

TEST_CASE("gpipe and 1f1b idle (P-1)/(M+P-1) of the step on every stage") {
  for (const char* name : {"gpipe", "1f1b"})
    for (std::size_t P = 1; P <= 4; ++P)
      for (std::size_t M = 1; M <= 8; ++M) {
        CAPTURE(name);
        CAPTURE(P);
        CAPTURE(M);
        const ScheduleTiming t = simulate_schedule(built(name, {P, M, 1}), kUniform);
        CHECK(t.step == doctest::Approx(kPerChunk * double(M + P - 1)));
        for (const StageTiming& s : t.stages) {
          CHECK(s.busy == doctest::Approx(kPerChunk * double(M)));
          CHECK(s.idle / t.step == doctest::Approx(double(P - 1) / double(M + P - 1)));
        }
        CHECK(t.bubble() == doctest::Approx(double(P - 1) / double(M + P - 1)));
      }
}

TEST_CASE("gpipe holds every micro-batch, 1f1b at most P-s on stage s") {
  for (std::size_t P = 1; P <= 4; ++P)
    for (std::size_t M = 1; M <= 8; ++M) {
      CAPTURE(P);
      CAPTURE(M);
      const ScheduleTiming g = simulate_schedule(built("gpipe", {P, M, 1}), kUniform);
      const ScheduleTiming o = simulate_schedule(built("1f1b", {P, M, 1}), kUniform);
      for (std::size_t s = 0; s < P; ++s) {
        CHECK(g.stages[s].peak_in_flight == M);
        CHECK(o.stages[s].peak_in_flight == std::min(P - s, M));
      }
    }
}

// The bytes a stage holds at its peak, walked by hand: 10 of working
// memory, 100 a micro-batch keeps from its forward to its backward, 1 a
// buffer between stages (an input, an output or a gradient).
TEST_CASE("a stage's activations: the working set, each micro-batch held, the buffers") {
  const StageBytes bytes{100, 10, 1};
  // 1F1B, 2 stages, 4 micro-batches. Stage 0 (F0 F1 B0 F2 B1 F3 B2 B3):
  // two micro-batches and their outputs, and the first gradient received
  // before B0. Stage 1 (F0 B0 F1 B1 ...): one micro-batch, its input, and
  // the input gradients it sent, kept to the step's end: 4 by B3.
  const SchedulePlan f1b = built("1f1b", {2, 4, 1});
  CHECK(stage_activations(f1b, 0, bytes) == 10 + 2 * 100 + 3);
  CHECK(stage_activations(f1b, 1, bytes) == 10 + 100 + 5);
  // GPipe: every micro-batch held; stage 0 its 4 outputs and a gradient,
  // stage 1 its 4 inputs and the first input gradient.
  const SchedulePlan gpipe = built("gpipe", {2, 4, 1});
  CHECK(stage_activations(gpipe, 0, bytes) == 10 + 4 * 100 + 5);
  CHECK(stage_activations(gpipe, 1, bytes) == 10 + 4 * 100 + 5);
}

TEST_CASE("interleaving over V chunks cuts the idle time by V") {
  // A chunk is 1/V of a stage's layers: at a chunk's costs 1 and 2, 1F1B's
  // stage costs V and 2V a micro-batch. Megatron's bubble: (P-1)/V of a
  // micro-batch's stage time.
  for (std::size_t P = 2; P <= 4; ++P)
    for (std::size_t V = 2; V <= 3; ++V)
      for (std::size_t M = P; M <= 3 * P; M += P) {
        CAPTURE(P);
        CAPTURE(V);
        CAPTURE(M);
        const ScheduleTiming t = simulate_schedule(built("interleaved", {P, M, V}), kUniform);
        const double busy = kPerChunk * double(M * V);
        for (const StageTiming& s : t.stages) {
          CHECK(s.busy == doctest::Approx(busy));
          CHECK(s.idle == doctest::Approx(kPerChunk * double(P - 1)));
        }
        const ScheduleCosts whole{double(V), double(V), double(V), 0.0};
        const ScheduleTiming flat = simulate_schedule(built("1f1b", {P, M, 1}), whole);
        CHECK(flat.stages[0].idle == doctest::Approx(double(V) * t.stages[0].idle));
      }
}

TEST_CASE("a message's transfer time delays the pipeline's fill and drain") {
  const ScheduleCosts slow{1.0, 1.0, 1.0, 0.5};
  for (std::size_t P = 1; P <= 4; ++P) {
    CAPTURE(P);
    const ScheduleTiming t = simulate_schedule(built("gpipe", {P, 4, 1}), slow);
    CHECK(t.step == doctest::Approx(kPerChunk * double(4 + P - 1) + 2 * 0.5 * double(P - 1)));
  }
}

TEST_CASE("the built-in schedules refuse shapes they cannot run, saying what to change") {
  CHECK(has(message_of<ConfigError>([] { builtin_schedule("zb-v"); }),
            "choose \"gpipe\", \"1f1b\" or \"interleaved\""));
  CHECK(has(message_of<ConfigError>([] { built("1f1b", {2, 4, 2}); }), "\"interleaved\""));
  CHECK(has(message_of<ConfigError>([] { built("gpipe", {2, 4, 3}); }), "one chunk a stage"));
  CHECK(has(message_of<ConfigError>([] {
              built("interleaved", {4, 6, 2});
            }),
            "grad_accum a multiple of 4"));
}

TEST_CASE("the check refuses a stage that never sends a gradient its neighbour waits for") {
  SchedulePlan p = built("1f1b", {2, 3, 1});
  auto& list = p.stages[1];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(find(p, 1, ActionKind::send_gradient, 2)));
  const std::string m = refusal(p);
  CHECK(
      has(m, "pipeline schedule '1f1b': stage 1 never runs the send of micro-batch 2's gradient"));
}

TEST_CASE("the check refuses a backward before its forward, and a compute run twice") {
  SchedulePlan p = built("gpipe", {1, 2, 1});
  // gpipe on one stage: F0 F1 B0 B1; swap F1 and B1.
  std::swap(p.stages[0][1], p.stages[0][3]);
  CHECK(has(refusal(p),
            "stage 0 runs the backward of micro-batch 1 (action 1) before the "
            "forward of micro-batch 1"));
  SchedulePlan twice = built("gpipe", {1, 2, 1});
  twice.stages[0][1].micro_batch = 0;
  CHECK(has(refusal(twice), "runs the forward of micro-batch 0 twice (actions 0 and 1)"));
}

TEST_CASE("the check refuses a compute before its receive, and a send before its compute") {
  SchedulePlan r = built("gpipe", {2, 1, 1});
  // Stage 1: recv act 0, F0, B0, send grad 0; the forward moved first.
  std::swap(r.stages[1][0], r.stages[1][1]);
  CHECK(has(refusal(r),
            "stage 1 runs the forward of micro-batch 0 (action 0) before the receive "
            "of micro-batch 0's activation"));
  SchedulePlan p = built("gpipe", {2, 1, 1});
  // Stage 0: F0, send act 0, recv grad 0, B0; the send moved first.
  std::swap(p.stages[0][0], p.stages[0][1]);
  CHECK(has(refusal(p),
            "stage 0 runs the send of micro-batch 0's activation (action 0) before "
            "the forward of micro-batch 0"));
  SchedulePlan g = built("gpipe", {2, 1, 1});
  // Stage 1: recv act 0, F0, B0, send grad 0; the send moved before B0.
  std::swap(g.stages[1][2], g.stages[1][3]);
  CHECK(has(refusal(g),
            "stage 1 runs the send of micro-batch 0's gradient (action 2) before the "
            "backward of micro-batch 0"));
}

TEST_CASE("the check refuses messages the first and last virtual stages have no neighbour for") {
  SchedulePlan p = built("1f1b", {2, 2, 1});
  p.stages[0].insert(p.stages[0].begin(), Action{ActionKind::recv_activation, 0, 0});
  CHECK(has(refusal(p),
            "stage 0 runs the receive of micro-batch 0's activation (action 0), "
            "which the first virtual stage has no neighbour for"));
}

TEST_CASE("the check refuses actions outside the step and a list per stage missing") {
  SchedulePlan p = built("1f1b", {2, 2, 1});
  p.stages[1][0].micro_batch = 7;
  CHECK(has(refusal(p), "stage 1 has action 0 for micro-batch 7, chunk 0 of a step of 2"));
  SchedulePlan short_of = built("1f1b", {2, 2, 1});
  short_of.stages.pop_back();
  CHECK(has(refusal(short_of), "lists 1 stages' actions for a pipeline of 2"));
}

TEST_CASE("the check refuses receives out of the order their sends were made") {
  SchedulePlan p = built("gpipe", {2, 3, 1});
  // Stage 1 receives micro-batch 1's activation before micro-batch 0's:
  // each compute still follows its own receive.
  auto& list = p.stages[1];
  const std::size_t r0 = find(p, 1, ActionKind::recv_activation, 0);
  const std::size_t r1 = find(p, 1, ActionKind::recv_activation, 1);
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(r1));
  list.insert(list.begin() + static_cast<std::ptrdiff_t>(r0),
              Action{ActionKind::recv_activation, 1, 0});
  const std::string m = refusal(p);
  CHECK(has(m,
            "stage 1's action 0 is the receive of micro-batch 1's activation, but the first "
            "message stage 0 sends it that way is for micro-batch 0"));
  CHECK(has(m, "arrive in the order they were sent"));
}

TEST_CASE("the check refuses a plan that would hang, naming what each stage waits for") {
  // Stage 0 waits for micro-batch 0's gradient before sending its
  // activation; stage 1 waits for that activation.
  SchedulePlan p{"crossed", {2, 1, 1}, {}};
  p.stages.push_back({{ActionKind::forward, 0, 0},
                      {ActionKind::recv_gradient, 0, 0},
                      {ActionKind::send_activation, 0, 0},
                      {ActionKind::backward, 0, 0}});
  p.stages.push_back({{ActionKind::recv_activation, 0, 0},
                      {ActionKind::forward, 0, 0},
                      {ActionKind::backward, 0, 0},
                      {ActionKind::send_gradient, 0, 0}});
  const std::string m = refusal(p);
  CHECK(has(m, "pipeline schedule 'crossed' would hang"));
  CHECK(has(m, "stage 0 at action 1, the receive of micro-batch 0's gradient"));
  CHECK(has(m, "stage 1 at action 0, the receive of micro-batch 0's activation"));
}

// A plan of the kind a zero-bubble plugin writes: 1F1B's backwards split
// into the input gradient, in place, and the weight gradient, deferred to
// fill the drain's idle time.
SchedulePlan deferred_weights(ScheduleShape shape) {
  SchedulePlan p = built("1f1b", shape);
  p.schedule = "deferred weights";
  for (auto& list : p.stages) {
    std::vector<Action> weights;
    for (Action& a : list)
      if (a.kind == ActionKind::backward) {
        a.kind = ActionKind::backward_input;
        weights.push_back({ActionKind::backward_weight, a.micro_batch, a.chunk});
      }
    list.insert(list.end(), weights.begin(), weights.end());
  }
  return p;
}

TEST_CASE("a plan with its weight gradients deferred runs, and idles less than 1f1b") {
  for (std::size_t P = 2; P <= 4; ++P) {
    CAPTURE(P);
    const ScheduleShape shape{P, 2 * P, 1};
    const ScheduleTiming zb = simulate_schedule(deferred_weights(shape), kUniform);
    const ScheduleTiming flat = simulate_schedule(built("1f1b", shape), kUniform);
    CHECK(zb.stages[0].busy == doctest::Approx(flat.stages[0].busy));
    CHECK(zb.step < flat.step);
    CHECK(zb.bubble() < flat.bubble());
  }
  SchedulePlan half = deferred_weights({2, 2, 1});
  auto& list = half.stages[0];
  list.pop_back();
  CHECK(has(refusal(half), "stage 0 never runs the weight gradient of micro-batch 1"));
  SchedulePlan both = deferred_weights({2, 2, 1});
  both.stages[0].push_back({ActionKind::backward, 0, 0});
  CHECK(has(refusal(both), "runs both the backward of micro-batch 0 and its halves"));
}

TEST_CASE("actions are named with their chunk where a stage holds several") {
  CHECK(describe({ActionKind::send_gradient, 3, 1}, {2, 4, 2}) ==
        "the send of micro-batch 3's gradient (chunk 1)");
  CHECK(describe({ActionKind::forward, 3, 0}, {2, 4, 1}) == "the forward of micro-batch 3");
}
