// The built-in pipeline schedules: GPipe, 1F1B and Megatron's interleaved
// 1F1B, each a plan writer over one order of forward and backward steps.
//
// A stage's plan is its sequence of forward and backward steps, each step
// wrapped in the messages it needs: a forward step receives its input (but
// on virtual stage 0) and sends its output (but from the last); a backward
// step receives its output's gradient (but on the last) and sends its
// input's (but from virtual stage 0). The schedules differ only in how the
// two kinds of steps interleave:
// - GPipe: all M forwards, then all M backwards.
// - 1F1B: w = min(P-s-1, M) forwards to fill the pipeline, then forward
//   and backward alternating until the forwards run out, then the last w
//   backwards. Stage s holds at most w + 1 micro-batches.
// - Interleaved (V chunks a stage): the forward steps visit micro-batches
//   in groups of P, each group through chunk 0, then chunk 1, ...; the
//   backward steps likewise through the chunks in reverse. Stage s warms up
//   with (P-s-1)*2 + (V-1)*P forward steps (all of them when M = P), then
//   alternates, then drains, as Megatron-LM's
//   forward_backward_pipelining_with_interleaving orders them.
#include <algorithm>

#include "ztrain/error.h"
#include "ztrain/pipeline/schedule.h"

namespace ztrain::pipeline {
namespace {

// One stage's plan, written step by step.
class StagePlan {
 public:
  StagePlan(const ScheduleShape& shape, std::size_t stage) : shape_(shape), stage_(stage) {}

  void forward(std::size_t mb, std::size_t chunk) {
    if (!first(chunk)) actions_.push_back({ActionKind::recv_activation, mb, chunk});
    actions_.push_back({ActionKind::forward, mb, chunk});
    if (!last(chunk)) actions_.push_back({ActionKind::send_activation, mb, chunk});
  }
  void backward(std::size_t mb, std::size_t chunk) {
    if (!last(chunk)) actions_.push_back({ActionKind::recv_gradient, mb, chunk});
    actions_.push_back({ActionKind::backward, mb, chunk});
    if (!first(chunk)) actions_.push_back({ActionKind::send_gradient, mb, chunk});
  }
  std::vector<Action> take() { return std::move(actions_); }

 private:
  std::size_t virtual_stage(std::size_t chunk) const { return chunk * shape_.stages + stage_; }
  bool first(std::size_t chunk) const { return virtual_stage(chunk) == 0; }
  bool last(std::size_t chunk) const { return virtual_stage(chunk) + 1 == shape_.virtual_stages(); }

  ScheduleShape shape_;
  std::size_t stage_;
  std::vector<Action> actions_;
};

void one_chunk(const std::string& schedule, const ScheduleShape& shape) {
  if (shape.chunks != 1)
    throw ConfigError("pipeline schedule '" + schedule + "' runs one chunk a stage, not " +
                      std::to_string(shape.chunks) +
                      "; choose \"interleaved\" to run several chunks a stage");
}

// The k-th forward (or backward) step of stage s as warm-up, alternation
// and drain order them: `warmup` forwards, then forward k+warmup with
// backward k, then the backwards left.
template <class Forward, class Backward>
std::vector<Action> warm_alternate_drain(StagePlan plan, std::size_t steps, std::size_t warmup,
                                         Forward&& fwd, Backward&& bwd) {
  for (std::size_t k = 0; k < warmup; ++k) fwd(plan, k);
  for (std::size_t k = 0; k + warmup < steps; ++k) {
    fwd(plan, k + warmup);
    bwd(plan, k);
  }
  for (std::size_t k = steps - warmup; k < steps; ++k) bwd(plan, k);
  return plan.take();
}

class GPipe final : public PipelineSchedule {
 public:
  std::string name() const override { return "gpipe"; }
  SchedulePlan plan(const ScheduleShape& shape) const override {
    one_chunk(name(), shape);
    SchedulePlan out{name(), shape, {}};
    for (std::size_t s = 0; s < shape.stages; ++s) {
      StagePlan p(shape, s);
      for (std::size_t mb = 0; mb < shape.micro_batches; ++mb) p.forward(mb, 0);
      for (std::size_t mb = 0; mb < shape.micro_batches; ++mb) p.backward(mb, 0);
      out.stages.push_back(p.take());
    }
    return out;
  }
};

class OneFOneB final : public PipelineSchedule {
 public:
  std::string name() const override { return "1f1b"; }
  SchedulePlan plan(const ScheduleShape& shape) const override {
    one_chunk(name(), shape);
    SchedulePlan out{name(), shape, {}};
    const std::size_t M = shape.micro_batches;
    for (std::size_t s = 0; s < shape.stages; ++s) {
      const std::size_t warmup = std::min(shape.stages - s - 1, M);
      out.stages.push_back(warm_alternate_drain(
          StagePlan(shape, s), M, warmup, [](StagePlan& p, std::size_t k) { p.forward(k, 0); },
          [](StagePlan& p, std::size_t k) { p.backward(k, 0); }));
    }
    return out;
  }
};

class Interleaved final : public PipelineSchedule {
 public:
  std::string name() const override { return "interleaved"; }
  SchedulePlan plan(const ScheduleShape& shape) const override {
    const std::size_t P = shape.stages, M = shape.micro_batches, V = shape.chunks;
    if (M % P != 0)
      throw ConfigError("pipeline schedule 'interleaved' runs micro-batches in groups of the " +
                        std::to_string(P) + " stages, but a step has " + std::to_string(M) +
                        "; make [train] grad_accum a multiple of " + std::to_string(P) +
                        ", or choose \"1f1b\"");
    SchedulePlan out{name(), shape, {}};
    const std::size_t steps = M * V;
    // Step k's micro-batch and chunk: groups of P micro-batches, each
    // through the chunks in turn (in reverse for backward).
    const auto mb = [P, V](std::size_t k) { return k / (P * V) * P + k % P; };
    const auto chunk = [P, V](std::size_t k) { return k % (P * V) / P; };
    for (std::size_t s = 0; s < P; ++s) {
      const std::size_t warmup = M == P ? steps : std::min((P - s - 1) * 2 + (V - 1) * P, steps);
      out.stages.push_back(warm_alternate_drain(
          StagePlan(shape, s), steps, warmup,
          [&](StagePlan& p, std::size_t k) { p.forward(mb(k), chunk(k)); },
          [&](StagePlan& p, std::size_t k) { p.backward(mb(k), V - 1 - chunk(k)); }));
    }
    return out;
  }
};

std::string subject(ActionKind k, std::size_t mb) {
  const std::string m = "micro-batch " + std::to_string(mb);
  switch (k) {
    case ActionKind::forward:
      return "the forward of " + m;
    case ActionKind::backward:
      return "the backward of " + m;
    case ActionKind::backward_input:
      return "the input gradient of " + m;
    case ActionKind::backward_weight:
      return "the weight gradient of " + m;
    case ActionKind::recv_activation:
      return "the receive of " + m + "'s activation";
    case ActionKind::send_activation:
      return "the send of " + m + "'s activation";
    case ActionKind::recv_gradient:
      return "the receive of " + m + "'s gradient";
    case ActionKind::send_gradient:
      return "the send of " + m + "'s gradient";
  }
  return "an action of unknown kind " + std::to_string(static_cast<int>(k)) + " on " + m;
}

}  // namespace

std::string describe(const Action& a, const ScheduleShape& shape) {
  return subject(a.kind, a.micro_batch) +
         (shape.chunks > 1 ? " (chunk " + std::to_string(a.chunk) + ")" : "");
}

bool is_builtin_schedule(std::string_view name) {
  return name == "gpipe" || name == "1f1b" || name == "interleaved";
}

std::unique_ptr<PipelineSchedule> builtin_schedule(std::string_view name) {
  if (name == "gpipe") return std::make_unique<GPipe>();
  if (name == "1f1b") return std::make_unique<OneFOneB>();
  if (name == "interleaved") return std::make_unique<Interleaved>();
  throw ConfigError("pipeline schedule \"" + std::string(name) +
                    "\" is not built in; choose \"gpipe\", \"1f1b\" or \"interleaved\"");
}

}  // namespace ztrain::pipeline
