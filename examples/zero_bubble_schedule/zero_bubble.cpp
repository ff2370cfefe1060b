// zero_bubble: 1F1B with each backward split in two, the input gradient
// where 1F1B runs the backward (so the previous stage gets its gradient as
// early) and the weight gradient deferred into the drain, where 1F1B's
// stage s waits between backwards: the idea of ZB-H1 (Qi et al., "Zero
// Bubble Pipeline Parallelism", 2024). Stage s defers up to d = P-s-1 weight
// gradients, one more micro-batch's activations held for each (at most
// 2(P-s)-1 micro-batches, against 1F1B's P-s), and empties the deferral
// over the drain: after each of its input gradients, no more left than
// the drain has steps to come.
//
// An example of a schedule written outside ztrain against its installed
// SDK: the plan is data (ztrain/pipeline/schedule.h), which the host checks
// before any run, whoever wrote it.
#include <ztrain/error.h>
#include <ztrain/pipeline/schedule.h>
#include <ztrain/plugin.h>

#include <algorithm>
#include <deque>

namespace {

using namespace ztrain;
using namespace ztrain::pipeline;

// One stage's actions, written step by step: each compute with the
// receive before it and the send after it that its neighbours need.
class Stage {
 public:
  Stage(const ScheduleShape& shape, std::size_t s) : first_(s == 0), last_(s + 1 == shape.stages) {}
  void forward(std::size_t mb) {
    if (!first_) out_.push_back({ActionKind::recv_activation, mb, 0});
    out_.push_back({ActionKind::forward, mb, 0});
    if (!last_) out_.push_back({ActionKind::send_activation, mb, 0});
  }
  void input_gradient(std::size_t mb) {
    if (!last_) out_.push_back({ActionKind::recv_gradient, mb, 0});
    out_.push_back({ActionKind::backward_input, mb, 0});
    if (!first_) out_.push_back({ActionKind::send_gradient, mb, 0});
    deferred_.push_back(mb);
  }
  // The oldest deferred weight gradients, until `keep` are left.
  void weight_gradients(std::size_t keep) {
    for (; deferred_.size() > keep; deferred_.pop_front())
      out_.push_back({ActionKind::backward_weight, deferred_.front(), 0});
  }
  std::vector<Action> take() { return std::move(out_); }

 private:
  bool first_, last_;
  std::vector<Action> out_;
  std::deque<std::size_t> deferred_;
};

class ZeroBubble final : public PipelineSchedule {
 public:
  explicit ZeroBubble(const Options&) {}
  static void declare_options(OptionList&) {}
  std::string name() const override { return "zero_bubble"; }

  SchedulePlan plan(const ScheduleShape& shape) const override {
    if (shape.chunks != 1)
      throw ConfigError("pipeline schedule 'zero_bubble' runs one chunk a stage, not " +
                        std::to_string(shape.chunks));
    SchedulePlan out{name(), shape, {}};
    const std::size_t M = shape.micro_batches;
    for (std::size_t s = 0; s < shape.stages; ++s) {
      const std::size_t warmup = std::min(shape.stages - s - 1, M);
      Stage stage(shape, s);
      for (std::size_t k = 0; k < warmup; ++k) stage.forward(k);
      for (std::size_t k = 0; k + warmup < M; ++k) {
        stage.forward(k + warmup);
        stage.input_gradient(k);
        stage.weight_gradients(warmup);
      }
      for (std::size_t k = M - warmup; k < M; ++k) {
        stage.input_gradient(k);
        stage.weight_gradients(M - k - 1);
      }
      out.stages.push_back(stage.take());
    }
    return out;
  }
};

}  // namespace

ZTRAIN_PLUGIN("schedule", "zero_bubble", "0.1.0",
              "1F1B with the weight gradients deferred into the drain (ZB-H1's idea)", ZeroBubble)
