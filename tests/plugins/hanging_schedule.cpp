// A schedule plugin whose plan would hang: stage 0 waits for micro-batch
// 0's gradient before it sends that micro-batch's activation (test).
#include "ztrain/pipeline/schedule.h"
#include "ztrain/plugin.h"

namespace {
using namespace ztrain::pipeline;

class Hanging final : public PipelineSchedule {
 public:
  explicit Hanging(const ztrain::Options&) {}
  static void declare_options(ztrain::OptionList& o) {
    o.integer("delay", 0, "unused (test)").at_least(0);
  }
  std::string name() const override { return "hanging"; }
  SchedulePlan plan(const ScheduleShape& shape) const override {
    SchedulePlan p{name(), shape, {}};
    p.stages.push_back({{ActionKind::forward, 0, 0},
                        {ActionKind::recv_gradient, 0, 0},
                        {ActionKind::send_activation, 0, 0},
                        {ActionKind::backward, 0, 0}});
    p.stages.push_back({{ActionKind::recv_activation, 0, 0},
                        {ActionKind::forward, 0, 0},
                        {ActionKind::backward, 0, 0},
                        {ActionKind::send_gradient, 0, 0}});
    return p;
  }
};
}  // namespace

ZTRAIN_PLUGIN("schedule", "hanging", "0.0.1", "a plan that would hang (test)", Hanging)
