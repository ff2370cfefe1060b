// A pipeline plan checked, then run on a clock.
//
// The check has two halves. Each stage's list alone: every (micro-batch,
// chunk) it holds appears in the actions it must have, once each, in an
// order that lets it run (the receive before the compute that reads it,
// the send after the compute that makes it). Then the stages together: a
// simulation in which a send never waits and a receive waits for the
// oldest message on its channel (one channel per ordered pair of stages and
// direction), which must be the one it names. Sweeping the stages, each
// runs until it would wait; a sweep in which no stage moves while some have
// actions left is a hang, reported with what every waiting stage waits for.
// The times do not depend on the sweep's order: a stage's clock advances by
// its own computes and to the send time of what it receives, a max-plus
// recurrence over the plan alone.
#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <tuple>

#include "ztrain/error.h"
#include "ztrain/pipeline/schedule.h"

namespace ztrain::pipeline {
namespace {

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kKinds = 8;

std::size_t at(ActionKind k) {
  return static_cast<std::size_t>(k);
}

// Where each kind of action of one (micro-batch, chunk) pair sits in its
// stage's list; kNone where it does not.
struct PairActions {
  std::size_t index[kKinds] = {kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone};
  std::size_t of(ActionKind k) const { return index[at(k)]; }
  bool has(ActionKind k) const { return of(k) != kNone; }
  // The action that makes the input gradient: backward, or its first half.
  std::size_t input_gradient() const {
    return has(ActionKind::backward) ? of(ActionKind::backward) : of(ActionKind::backward_input);
  }
};

class StageCheck {
 public:
  StageCheck(const SchedulePlan& plan, std::size_t stage)
      : plan_(plan), stage_(stage), pairs_(plan.shape.micro_batches * plan.shape.chunks) {}

  void run() {
    const std::vector<Action>& list = plan_.stages[stage_];
    for (std::size_t i = 0; i < list.size(); ++i) record(list[i], i);
    for (std::size_t mb = 0; mb < plan_.shape.micro_batches; ++mb)
      for (std::size_t c = 0; c < plan_.shape.chunks; ++c) check_pair(mb, c);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError("pipeline schedule '" + plan_.schedule + "': stage " +
                      std::to_string(stage_) + " " + what +
                      "; a schedule must give each stage every micro-batch's forward and "
                      "backward once, with the receives and sends its neighbours need");
  }
  std::string named(ActionKind k, std::size_t mb, std::size_t c) const {
    return describe({k, mb, c}, plan_.shape);
  }

  void record(const Action& a, std::size_t i) {
    if (at(a.kind) >= kKinds || a.micro_batch >= plan_.shape.micro_batches ||
        a.chunk >= plan_.shape.chunks)
      fail("has action " + std::to_string(i) + " for micro-batch " + std::to_string(a.micro_batch) +
           ", chunk " + std::to_string(a.chunk) + " of a step of " +
           std::to_string(plan_.shape.micro_batches) + " micro-batches and " +
           std::to_string(plan_.shape.chunks) + " chunk(s) a stage");
    std::size_t& slot = pairs_[a.micro_batch * plan_.shape.chunks + a.chunk].index[at(a.kind)];
    if (slot != kNone)
      fail("runs " + describe(a, plan_.shape) + " twice (actions " + std::to_string(slot) +
           " and " + std::to_string(i) + ")");
    slot = i;
  }

  // `first` must come before `then`, both present.
  void ordered(const PairActions& p, ActionKind first, std::size_t then, ActionKind then_kind,
               std::size_t mb, std::size_t c) const {
    if (p.of(first) > then)
      fail("runs " + named(then_kind, mb, c) + " (action " + std::to_string(then) + ") before " +
           named(first, mb, c));
  }

  // Present exactly where `needed` says.
  void presence(const PairActions& p, ActionKind k, bool needed, std::size_t mb,
                std::size_t c) const {
    if (needed && !p.has(k)) fail("never runs " + named(k, mb, c));
    if (!needed && p.has(k))
      fail("runs " + named(k, mb, c) + " (action " + std::to_string(p.of(k)) + "), which " +
           (k == ActionKind::recv_activation || k == ActionKind::send_gradient
                ? "the first virtual stage has no neighbour for"
                : "the last virtual stage has no neighbour for"));
  }

  void check_backward(const PairActions& p, std::size_t mb, std::size_t c) const {
    const bool whole = p.has(ActionKind::backward);
    const bool split = p.has(ActionKind::backward_input) || p.has(ActionKind::backward_weight);
    if (whole && split) fail("runs both " + named(ActionKind::backward, mb, c) + " and its halves");
    if (!whole) {
      presence(p, ActionKind::backward_input, true, mb, c);
      presence(p, ActionKind::backward_weight, true, mb, c);
      ordered(p, ActionKind::backward_input, p.of(ActionKind::backward_weight),
              ActionKind::backward_weight, mb, c);
    }
    const ActionKind grad = whole ? ActionKind::backward : ActionKind::backward_input;
    ordered(p, ActionKind::forward, p.input_gradient(), grad, mb, c);
  }

  void check_pair(std::size_t mb, std::size_t c) const {
    const PairActions& p = pairs_[mb * plan_.shape.chunks + c];
    const std::size_t v = c * plan_.shape.stages + stage_;
    const bool first = v == 0, last = v + 1 == plan_.shape.virtual_stages();
    presence(p, ActionKind::forward, true, mb, c);
    check_backward(p, mb, c);
    presence(p, ActionKind::recv_activation, !first, mb, c);
    presence(p, ActionKind::send_activation, !last, mb, c);
    presence(p, ActionKind::recv_gradient, !last, mb, c);
    presence(p, ActionKind::send_gradient, !first, mb, c);
    const ActionKind grad =
        p.has(ActionKind::backward) ? ActionKind::backward : ActionKind::backward_input;
    if (!first) {
      ordered(p, ActionKind::recv_activation, p.of(ActionKind::forward), ActionKind::forward, mb,
              c);
      ordered(p, grad, p.of(ActionKind::send_gradient), ActionKind::send_gradient, mb, c);
    }
    if (!last) {
      ordered(p, ActionKind::forward, p.of(ActionKind::send_activation),
              ActionKind::send_activation, mb, c);
      ordered(p, ActionKind::recv_gradient, p.input_gradient(), grad, mb, c);
    }
  }

  const SchedulePlan& plan_;
  std::size_t stage_;
  std::vector<PairActions> pairs_;
};

// A message on its way: whom it is for (micro-batch, the receiver's chunk)
// and when it was sent.
struct Message {
  std::size_t micro_batch, chunk;
  double sent;
};

// The stages run together on a clock (the paragraph above).
class Simulation {
 public:
  Simulation(const SchedulePlan& plan, const ScheduleCosts& costs)
      : plan_(plan),
        costs_(costs),
        next_(plan.stages.size(), 0),
        clock_(plan.stages.size(), 0.0),
        in_flight_(plan.stages.size(), 0) {
    timing_.stages.resize(plan.stages.size());
  }

  ScheduleTiming run() {
    for (bool moved = true; moved;) {
      moved = false;
      for (std::size_t s = 0; s < plan_.stages.size(); ++s)
        while (next_[s] < plan_.stages[s].size() && step(s)) moved = true;
    }
    for (std::size_t s = 0; s < plan_.stages.size(); ++s)
      if (next_[s] < plan_.stages[s].size()) hang();
    timing_.step = *std::max_element(clock_.begin(), clock_.end());
    for (StageTiming& t : timing_.stages) t.idle = timing_.step - t.busy;
    return std::move(timing_);
  }

 private:
  using Channel = std::tuple<std::size_t, std::size_t, bool>;  // from, to, gradient

  // Where the neighbour of stage s's chunk c is: one virtual stage on
  // (activations) or back (gradients).
  std::pair<std::size_t, std::size_t> neighbour(std::size_t s, std::size_t c, bool ahead) const {
    const std::size_t P = plan_.shape.stages, v = c * P + s;
    const std::size_t w = ahead ? v + 1 : v - 1;
    return {w % P, w / P};
  }

  // Runs stage s's next action; false where it must wait.
  bool step(std::size_t s) {
    const Action& a = plan_.stages[s][next_[s]];
    switch (a.kind) {
      case ActionKind::recv_activation:
      case ActionKind::recv_gradient:
        if (!receive(s, a)) return false;
        break;
      case ActionKind::send_activation:
      case ActionKind::send_gradient:
        send(s, a);
        break;
      default:
        compute(s, a);
    }
    ++next_[s];
    return true;
  }

  void compute(std::size_t s, const Action& a) {
    double cost = costs_.forward;
    if (a.kind == ActionKind::backward) cost = costs_.backward_input + costs_.backward_weight;
    if (a.kind == ActionKind::backward_input) cost = costs_.backward_input;
    if (a.kind == ActionKind::backward_weight) cost = costs_.backward_weight;
    clock_[s] += cost;
    timing_.stages[s].busy += cost;
    if (a.kind == ActionKind::forward) {
      timing_.stages[s].peak_in_flight =
          std::max(timing_.stages[s].peak_in_flight, ++in_flight_[s]);
    } else if (a.kind != ActionKind::backward_input) {
      --in_flight_[s];
    }
  }

  void send(std::size_t s, const Action& a) {
    const bool gradient = a.kind == ActionKind::send_gradient;
    const auto [to, chunk] = neighbour(s, a.chunk, !gradient);
    channels_[{s, to, gradient}].push_back({a.micro_batch, chunk, clock_[s]});
  }

  bool receive(std::size_t s, const Action& a) {
    const bool gradient = a.kind == ActionKind::recv_gradient;
    const std::size_t from = neighbour(s, a.chunk, gradient).first;
    std::deque<Message>& queue = channels_[{from, s, gradient}];
    if (queue.empty()) return false;
    const Message m = queue.front();
    if (m.micro_batch != a.micro_batch || m.chunk != a.chunk)
      throw ConfigError("pipeline schedule '" + plan_.schedule + "': stage " + std::to_string(s) +
                        "'s action " + std::to_string(next_[s]) + " is " +
                        describe(a, plan_.shape) + ", but the first message stage " +
                        std::to_string(from) + " sends it that way is for micro-batch " +
                        std::to_string(m.micro_batch) +
                        (plan_.shape.chunks > 1 ? ", chunk " + std::to_string(m.chunk) : "") +
                        "; messages between two stages arrive in the order they were sent, so "
                        "receive them in that order");
    queue.pop_front();
    clock_[s] = std::max(clock_[s], m.sent + costs_.transfer);
    return true;
  }

  [[noreturn]] void hang() const {
    std::string waits;
    for (std::size_t s = 0; s < plan_.stages.size(); ++s)
      if (next_[s] < plan_.stages[s].size())
        waits += (waits.empty() ? "" : "; ") + std::string("stage ") + std::to_string(s) +
                 " at action " + std::to_string(next_[s]) + ", " +
                 describe(plan_.stages[s][next_[s]], plan_.shape);
    throw ConfigError("pipeline schedule '" + plan_.schedule +
                      "' would hang: every stage left waits for a message no stage will send (" +
                      waits + "); order each stage's receives after the sends they wait for");
  }

  const SchedulePlan& plan_;
  const ScheduleCosts& costs_;
  std::vector<std::size_t> next_;
  std::vector<double> clock_;
  std::vector<std::size_t> in_flight_;
  std::map<Channel, std::deque<Message>> channels_;
  ScheduleTiming timing_;
};

}  // namespace

namespace {

// The first half of the check: the shape, and each stage's list alone.
void check_stages(const SchedulePlan& plan) {
  const ScheduleShape& shape = plan.shape;
  if (shape.stages < 1 || shape.micro_batches < 1 || shape.chunks < 1)
    throw ConfigError("pipeline schedule '" + plan.schedule + "' is for " +
                      std::to_string(shape.stages) + " stage(s), " +
                      std::to_string(shape.micro_batches) + " micro-batch(es) and " +
                      std::to_string(shape.chunks) + " chunk(s) a stage; each must be 1 or more");
  if (plan.stages.size() != shape.stages)
    throw ConfigError("pipeline schedule '" + plan.schedule + "' lists " +
                      std::to_string(plan.stages.size()) + " stages' actions for a pipeline of " +
                      std::to_string(shape.stages) + "; give one list a stage");
  for (std::size_t s = 0; s < shape.stages; ++s) StageCheck(plan, s).run();
}

}  // namespace

// The second half, the stages together, is a simulation on any clock: its
// refusals (a hang, a receive out of order) do not depend on the costs.
void check_schedule(const SchedulePlan& plan) {
  check_stages(plan);
  Simulation(plan, ScheduleCosts{}).run();
}

ScheduleTiming simulate_schedule(const SchedulePlan& plan, const ScheduleCosts& costs) {
  check_stages(plan);
  return Simulation(plan, costs).run();
}

}  // namespace ztrain::pipeline
