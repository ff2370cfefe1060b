// The loss scaler as a state machine, against sequences worked out by hand
// from DeepSpeed's DynamicLossScaler.update_scale (loss_scaler.py): overflow
// patterns -> the scale after each step, the hysteresis and the abort.
#include <doctest/doctest.h>

#include <vector>

#include "support.h"
#include "train/loss_scaler.h"
#include "ztrain/error.h"

using namespace ztrain;

namespace {

struct Case {
  const char* name;
  LossScalerSettings settings;
  std::vector<bool> overflows;
  std::vector<double> scales;  // after each update
};

}  // namespace

TEST_CASE("dynamic loss scale: doubling windows, halving with hysteresis, its consecutive form") {
  const std::vector<Case> cases{
      // Window 2 from iteration 0 (last overflow -1): doubles after steps 1, 3, 5.
      {"clean steps double every window",
       {0, 4, 2, 1, false, 1},
       {0, 0, 0, 0, 0},
       {16, 32, 32, 64, 64}},
      // Hysteresis 1: every overflow halves.
      {"no hysteresis", {0, 4, 1000, 1, false, 1}, {1, 1, 0, 1}, {8, 4, 4, 2}},
      // Hysteresis 2: the first overflow only counts down, the second halves,
      // and the counter stays at 1 until a window refills it.
      {"hysteresis 2", {0, 4, 1000, 2, false, 1}, {1, 1, 1, 0, 1}, {16, 8, 4, 4, 2}},
      // Window counted from the last overflow: halve at 0, double 3 steps later.
      {"window restarts at an overflow",
       {0, 4, 3, 1, false, 1},
       {1, 0, 0, 0, 0},
       {8, 8, 8, 16, 16}},
      // Non-consecutive: a clean step between two overflows does not refill.
      {"hysteresis not refilled by one clean step",
       {0, 4, 1000, 2, false, 1},
       {1, 0, 1},
       {16, 16, 8}},
      // Consecutive: it does.
      {"consecutive hysteresis refills on clean steps",
       {0, 4, 1000, 2, true, 1},
       {1, 0, 1, 0, 1, 1},
       {16, 16, 16, 16, 16, 8}},
      // The refill at a window boundary restores the counter.
      {"window refills hysteresis", {0, 4, 2, 2, false, 1}, {1, 0, 0, 1, 1}, {16, 16, 32, 32, 16}},
      // Never below the minimum.
      {"floor at min_loss_scale", {0, 2, 1000, 1, false, 2}, {1}, {2}},
      // Static: nothing moves, overflow or not.
      {"static scale", {128, 16, 2, 1, false, 1}, {1, 0, 0, 1}, {128, 128, 128, 128}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    LossScaler s(c.settings);
    REQUIRE(c.overflows.size() == c.scales.size());
    for (std::size_t i = 0; i < c.overflows.size(); ++i) {
      CAPTURE(i);
      CHECK(s.update(c.overflows[i]) == c.scales[i]);
    }
  }
}

TEST_CASE("an overflow at the minimum loss scale stops the run") {
  LossScaler s({0, 1, 1000, 1, false, 1});
  CHECK(s.scale() == 2);
  CHECK(s.update(true) == 1);
  const std::string msg = test::message_of<NumericsError>([&] { s.update(true); });
  CHECK(msg.find("minimum loss scale") != std::string::npos);
  // With hysteresis left, the overflow at the minimum only counts down.
  LossScaler h({0, 0, 1000, 2, false, 1});
  CHECK(h.update(true) == 1);
  CHECK_THROWS_AS(h.update(true), NumericsError);
}

TEST_CASE("the initial scale is 2^initial_scale_power, and static scales are taken as given") {
  CHECK(LossScaler({0, 16, 1000, 2, false, 1}).scale() == 65536);
  CHECK(LossScaler({0, 16, 1000, 2, false, 1}).dynamic());
  CHECK(LossScaler({1, 16, 1000, 2, false, 1}).scale() == 1);
  CHECK_FALSE(LossScaler({1, 16, 1000, 2, false, 1}).dynamic());
}
